package main

/*
#include "../include/symm.h"
*/
import "C"

import (
	"errors"
	"os"
	"syscall"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/internal/errs"
	"github.com/libsymm/libsymm/store"
	"github.com/libsymm/libsymm/symmetric"
)

// errCode maps an error to its SYMM_ERR_* code: the one mapping of every
// package's sentinels (allocator's and symmetric's ErrInvalid and
// ErrUnknownPointer are internal/errs' values), for the pool's calls and the
// symmetric ones alike; failStore refines what it leaves INTERNAL. The
// cases are tried in order: an error that carries several marks gets the
// first (a peer's failure before the out-of-memory it may wrap).
func errCode(err error) C.int {
	var r cuda.Result
	switch {
	case errors.Is(err, errs.ErrUnknownPointer):
		return C.SYMM_ERR_UNKNOWN_POINTER
	case errors.Is(err, errs.ErrInvalid):
		return C.SYMM_ERR_INVALID
	case errors.Is(err, symmetric.ErrMeetingMismatch):
		return C.SYMM_ERR_MISMATCH
	case errors.Is(err, store.ErrTimeout), errors.Is(err, symmetric.ErrSignalTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		return C.SYMM_ERR_TIMEOUT
	case errors.Is(err, symmetric.ErrPeerFailed), errors.Is(err, store.ErrClosed):
		return C.SYMM_ERR_PEER
	case errors.Is(err, symmetric.ErrNoKernels), errors.Is(err, symmetric.ErrNoDevice):
		return C.SYMM_ERR_NO_DEVICE
	case errors.Is(err, syscall.ENOMEM):
		return C.SYMM_ERR_OUT_OF_MEMORY // mmap of a block the host cannot back
	case errors.Is(err, errNoDevice):
		return C.SYMM_ERR_NO_DEVICE
	case allocator.IsOutOfMemory(err):
		return C.SYMM_ERR_OUT_OF_MEMORY
	case errors.Is(err, allocator.ErrBusy):
		return C.SYMM_ERR_BUSY
	case errors.As(err, &r):
		return C.SYMM_ERR_DRIVER
	case errors.Is(err, host.ErrInjectedFault):
		// SYMM_HOST_FAULTS stands for a failing backend (as a CUDA
		// driver error would be), not a bug in libsymm (SYMM_ERR_INTERNAL).
		return C.SYMM_ERR_DRIVER
	}
	return C.SYMM_ERR_INTERNAL
}
