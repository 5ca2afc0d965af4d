package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Lib is a library opened with dlopen.
//
// Every dlopen/dlsym/dlclose runs with the goroutine locked to its OS thread:
// dlerror reports the last error of the calling thread, so the call and the
// dlerror that explains it must run on the same thread.
type Lib struct {
	path   string
	handle unsafe.Pointer // from dlopen; never a Go pointer
}

// Open opens path with RTLD_NOW (every symbol the library itself needs is
// bound now, so a broken install fails here and not in the middle of a call)
// and RTLD_LOCAL (its symbols do not leak into later lookups by others).
// When the process already has the library (PyTorch loaded libcuda), dlopen
// returns the same handle with its reference count raised.
func Open(path string) (*Lib, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	C.dlerror() // clear a stale error of this thread
	h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("dlopen %s: %s", path, dlErrorText())
	}
	return &Lib{path: path, handle: h}, nil
}

// Lookup returns the address of symbol, or an error when the library does
// not define it (or defines it as NULL, which is no use to a caller either).
func (l *Lib) Lookup(symbol string) (unsafe.Pointer, error) {
	csym := C.CString(symbol)
	defer C.free(unsafe.Pointer(csym))

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	C.dlerror()
	p := C.dlsym(l.handle, csym)
	if msg := dlErrorText(); msg != "" {
		return nil, fmt.Errorf("dlsym %s in %s: %s", symbol, l.path, msg)
	}
	if p == nil {
		return nil, fmt.Errorf("dlsym %s in %s: symbol is NULL", symbol, l.path)
	}
	return p, nil
}

// Path is the name the library was opened by.
func (l *Lib) Path() string { return l.path }

// Close drops this handle's reference.
func (l *Lib) Close() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	C.dlerror()
	if C.dlclose(l.handle) != 0 {
		return fmt.Errorf("dlclose %s: %s", l.path, dlErrorText())
	}
	l.handle = nil
	return nil
}

// dlErrorText returns and clears the calling thread's dlerror message, or ""
// when there is none. The caller holds the OS thread locked.
func dlErrorText() string {
	msg := C.dlerror()
	if msg == nil {
		return ""
	}
	return C.GoString(msg)
}
