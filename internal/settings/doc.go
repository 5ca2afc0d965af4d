// Package settings is the one registry of libsymm's environment variables:
// each one's name, who reads it and when, its default, what a value must be
// and the line of help users read (the README's table and `symm settings`
// print this table; a test holds the README to it).
//
// Every Go reader of a setting goes through its *Setting here (Get, Flag,
// Word, Uint), with a getenv that is the C environment in the library
// (package env: it sees what a program sets after load) and a map in tests.
// A refused value is an *Error naming the variable, the value and what it
// accepts; callers wrap it with their package's ErrInvalid. Settings that
// Python reads before the library is loaded (Reader Python) are listed here
// for their documentation; Python parses those, and asks the library for
// the library's own.
package settings
