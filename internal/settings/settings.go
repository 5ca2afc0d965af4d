package settings

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Reader is who reads a setting.
type Reader string

// The readers of settings.
const (
	Library Reader = "library"   // libsymm.so (and the symm tool, which links it)
	Python  Reader = "Python"    // the Python package, before or around loading the library
	Tool    Reader = "symm tool" // only the command-line tool
	Tests   Reader = "tests"     // fault injection and test hooks
)

// Setting is one environment variable.
type Setting struct {
	Name    string
	Reader  Reader
	When    string // when its value is read
	Default string // as users read it: "" when there is none
	Want    string // what a value must be: the end of a refusal's message
	Help    string // one line of the README's table, at most HelpMax characters
}

// HelpMax bounds a setting's help: a table cell users can read; detail goes
// to docs/SETTINGS.md.
const HelpMax = 300

// Error is a refused value: Name=Value and what Name accepts.
type Error struct{ Name, Value, Want string }

func (e *Error) Error() string { return fmt.Sprintf("%s=%q: %s", e.Name, e.Value, e.Want) }

// Get is the setting's value, "" when unset.
func (s *Setting) Get(getenv func(string) string) string { return getenv(s.Name) }

// Refuse is the error for value v of s.
func (s *Setting) Refuse(v string) *Error { return &Error{Name: s.Name, Value: v, Want: s.Want} }

// Flag reads a switch: "1" on, "0" off, unset def; anything else is refused.
func (s *Setting) Flag(getenv func(string) string, def bool) (bool, error) {
	switch v := s.Get(getenv); v {
	case "":
		return def, nil
	case "0":
		return false, nil
	case "1":
		return true, nil
	default:
		return false, s.Refuse(v)
	}
}

// Word reads one of words ("" when unset); anything else is refused.
func (s *Setting) Word(getenv func(string) string, words ...string) (string, error) {
	v := s.Get(getenv)
	if v == "" || slices.Contains(words, v) {
		return v, nil
	}
	return "", s.Refuse(v)
}

// Uint reads a whole number in [lo, hi] written in base (0: Go's prefixes);
// set is false when the variable is unset. s.Want may hold two %d verbs,
// given lo and hi, so that the message states the bounds the caller uses.
func (s *Setting) Uint(getenv func(string) string, base int, lo, hi uint64) (n uint64, set bool, err error) {
	v := s.Get(getenv)
	if v == "" {
		return 0, false, nil
	}
	n, perr := strconv.ParseUint(v, base, 64)
	if perr != nil || n < lo || n > hi {
		e := s.Refuse(v)
		if strings.Count(s.Want, "%d") == 2 {
			e.Want = fmt.Sprintf(s.Want, lo, hi)
		}
		return 0, true, e
	}
	return n, true, nil
}

// Lookup is the setting called name, nil when there is none.
func Lookup(name string) *Setting {
	for _, s := range All {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Markdown is the README's table of settings: one row per setting, in the
// order of All.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| variable | meaning | default | read by, when |\n| --- | --- | --- | --- |\n")
	for _, s := range All {
		def := s.Default
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s, %s |\n", s.Name, s.Help, def, s.Reader, s.When)
	}
	return b.String()
}
