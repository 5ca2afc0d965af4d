// Package version holds libsymm's version. The number is set in one place,
// the file VERSION beside this one (`make set-version V=x.y.z` changes it and
// the header's SYMM_VERSION): Go embeds it, the C library's symm_version()
// returns Go's, the Python package reads it (python/VERSION is a link to it),
// and the wheel and symm.pc are stamped with it at build time. A test keeps
// the header's copy equal.
package version
