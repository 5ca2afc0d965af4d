// Package version holds libsymm's version, as the C library
// (export/shim.cpp, symm_version) and the Python package
// (python/pyproject.toml) also state it; a test keeps the three equal.
package version

// Version of libsymm.
const Version = "0.1.0"
