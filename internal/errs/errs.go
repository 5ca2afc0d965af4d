// Package errs holds the error sentinels that more than one package of
// libsymm marks its errors with, defined once so that errors.Is answers the
// same whichever package's name a caller uses (allocator.ErrInvalid and
// symmetric.ErrInvalid are this package's values). export's errCode maps
// each onto one SYMM_ERR_* code of include/symm.h.
package errs

import "errors"

// ErrInvalid marks bad arguments (SYMM_ERR_INVALID).
var ErrInvalid = errors.New("invalid argument")

// ErrUnknownPointer marks a free, record_stream or lookup of a pointer that
// was not handed out or was already taken back (SYMM_ERR_UNKNOWN_POINTER).
var ErrUnknownPointer = errors.New("unknown pointer")
