package main

/*
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/cuda"
)

// Facts the C++ side of libsymm and its PyTorch extension read here rather
// than keep copies of: PyTorch's allocator settings made at run time, the
// memory fraction, and the CUDA driver's functions (the cuda package is the
// one loader of libcuda).

// pendingSettings is the settings text made of the environment's and every
// symm_pool_set_allocator_settings call before the pool existed (""
// without any call): initPool makes the pool from it instead of the
// environment's text. Under lib.mu.
var pendingSettings struct {
	set  bool
	text string
}

// settingsGetenv is getenv with PyTorch's settings variables replaced by the
// calls' merged text, when there were calls before the pool. Under lib.mu.
func settingsGetenv() func(string) string {
	if !pendingSettings.set {
		return getenv
	}
	text := pendingSettings.text
	return func(k string) string {
		switch k {
		case allocator.EnvTorchCUDAAllocConf:
			return text
		case allocator.EnvTorchAllocConf:
			return ""
		}
		return getenv(k)
	}
}

// envTorchSettings is the settings text torch 2.11 reads from the
// environment: PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF.
func envTorchSettings() string {
	if t := getenv(allocator.EnvTorchCUDAAllocConf); t != "" {
		return t
	}
	return getenv(allocator.EnvTorchAllocConf)
}

//export goPoolSetAllocatorSettings
func goPoolSetAllocatorSettings(text *C.char) (code C.int) {
	const fn = "symm_pool_set_allocator_settings"
	defer guard(fn, &code)
	s := C.GoString(text)
	lib.mu.Lock()
	p := lib.pool.Load()
	if p == nil {
		base := envTorchSettings()
		if pendingSettings.set {
			base = pendingSettings.text
		}
		merged, err := allocator.MergeTorchSettings(base, s)
		if err == nil {
			pendingSettings.set, pendingSettings.text = true, merged
		}
		lib.mu.Unlock()
		if err != nil {
			return fail(fn, err)
		}
		return C.SYMM_OK
	}
	lib.mu.Unlock()
	warns, err := p.ApplyTorchSettings(s)
	if err != nil {
		return fail(fn, err)
	}
	configWarnings.warnAlways(warns)
	return C.SYMM_OK
}

//export goPoolMemoryFraction
func goPoolMemoryFraction(device C.int, out *C.double) (code C.int) {
	const fn = "symm_pool_memory_fraction"
	defer guard(fn, &code)
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	f, err := p.MemoryFraction(int(device))
	if err != nil {
		return fail(fn, err)
	}
	*out = C.double(f)
	return C.SYMM_OK
}

// goDriverProc is symm_driver_proc: the driver function name of the
// process's CUDA driver, once the pool runs on it; NULL on the host backend
// (nothing there is a CUDA stream or allocation), when the pool cannot be
// made (the last error says why), or when the driver lacks the function (no
// error set).
//
//export goDriverProc
func goDriverProc(name *C.char) (fnp unsafe.Pointer) {
	const fn = "symm_driver_proc"
	defer func() {
		if recovered(fn, recover()) {
			fnp = nil
		}
	}()
	if _, err := getPool(); err != nil {
		fail(fn, err)
		return nil
	}
	if lib.backend.Load() != backendCUDA {
		return nil
	}
	f, err := cuda.Proc(C.GoString(name))
	if err != nil {
		fail(fn, err)
		return nil
	}
	return f // nil: the driver has no such function (no error: the caller names it)
}
