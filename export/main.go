package main

/*
#include <stdlib.h>
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/internal/env"
	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/internal/version"
)

func main() {}

// lib is the process's one pool. The pointer is set once, by init; the
// cached path reads it with one atomic load.
var lib struct {
	pool    atomic.Pointer[allocator.Pool]
	backend atomic.Int32 // backendCUDA or backendHost (codes.go)
	mu      sync.Mutex   // serializes initialization
	// expandable is symm_pool_set_expandable's choice before init:
	// 0 none (SYMM_POOL_EXPANDABLE decides), 1 off, 2 on. Under mu.
	expandable atomic.Int32
}

// errNoDevice marks "no CUDA driver or GPU" so it maps to SYMM_ERR_NO_DEVICE.
var errNoDevice = errors.New("no CUDA device")

// noDevice keeps the cuda package's message and adds the errNoDevice mark.
type noDevice struct{ err error }

func (e noDevice) Error() string        { return e.err.Error() }
func (e noDevice) Unwrap() error        { return e.err }
func (e noDevice) Is(target error) bool { return target == errNoDevice }

// getPool returns the pool, creating it on first use from the environment.
func getPool() (*allocator.Pool, error) {
	if p := lib.pool.Load(); p != nil {
		return p, nil
	}
	return initPool()
}

func initPool() (*allocator.Pool, error) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if p := lib.pool.Load(); p != nil {
		return p, nil
	}
	b, kind, err := newBackend(getenv)
	if err != nil {
		return nil, err
	}
	// The environment's settings, or what symm_pool_set_allocator_settings
	// calls made of them before the pool existed (settings.go).
	// symm_pool_set_expandable wins over the environment: it answers for
	// SYMM_POOL_EXPANDABLE, so that the configuration gets expandable
	// segments' defaults (chunk, free pages) exactly as the variable would.
	getenv, called := settingsGetenv(), lib.expandable.Load()
	if called != 0 {
		env := getenv
		getenv = func(k string) string {
			if k == settings.PoolExpandable.Name {
				return map[int32]string{1: "0", 2: "1"}[called]
			}
			return env(k)
		}
	}
	cfg, warns, err := allocator.ConfigFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	if called != 0 { // the call, not the variable, overrode any PyTorch setting
		warns = slices.DeleteFunc(warns, func(w string) bool { return strings.HasPrefix(w, "SYMM_POOL_EXPANDABLE=") })
	}
	configWarnings.warn(warns)
	front, frontMax, err := frontCacheWanted(getenv)
	if err != nil {
		return nil, err
	}
	// SYMM_PUBLISH is refused like every other 0/1 setting, before the
	// pool exists: nothing is made for a bad value.
	publishOn, err := settings.Publish.Flag(getenv, true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", allocator.ErrInvalid, err)
	}
	if front {
		cfg.Front = cFront{}
	}
	p, err := allocator.New(b, cfg)
	if err != nil {
		return nil, err
	}
	lib.backend.Store(kind)
	publishRoutes(p)
	lib.pool.Store(p)
	if publishOn {
		startPublishing(p, backendNames[kind])
	}
	if front {
		C.symmshim_front_enable(1, C.uint64_t(frontMax), C.uint64_t(allocator.SmallMax))
	}
	return p, nil
}

// configWarnings prints the pool configuration's warnings (PyTorch settings
// that libsymm ignores, or that SYMM_POOL_ variables override) to standard
// error.
var configWarnings = &onceWarner{w: os.Stderr}

// onceWarner prints one batch of warnings, once per process, even when the
// pool's creation fails and is tried again at the next call.
type onceWarner struct {
	once sync.Once
	w    io.Writer
}

func (o *onceWarner) warn(warns []string) {
	o.once.Do(func() { o.warnAlways(warns) })
}

// warnAlways prints warns now: a settings call's, each call saying what it
// ignores.
func (o *onceWarner) warnAlways(warns []string) {
	for _, w := range warns {
		fmt.Fprintln(o.w, "symm: "+w)
	}
}

// getenv reads a setting through the environment's one reader (package
// env: the C environment, which sees what a program sets after load).
var getenv = env.Get

// newBackend picks the backend SYMM_DEVICE names: "cuda" (the default) or
// "host". There is no silent fallback from cuda to host: PyTorch would take
// a host pointer for device memory.
func newBackend(getenv func(string) string) (allocator.Backend, int32, error) {
	dev, err := settings.Device.Word(getenv, "cuda", "host")
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", allocator.ErrInvalid, err)
	}
	switch dev {
	case "", "cuda":
		var opts []cuda.Option
		if lib := settings.CUDALib.Get(getenv); lib != "" {
			opts = append(opts, cuda.WithLibrary(lib))
		}
		b, err := cuda.NewBackend(opts...)
		if err != nil {
			return nil, 0, noDevice{err}
		}
		return b, backendCUDA, nil
	case "host":
		n := 1
		if k, set, err := settings.HostDevices.Uint(getenv, 10, 1, 64); err != nil {
			return nil, 0, fmt.Errorf("%w: %w", allocator.ErrInvalid, err)
		} else if set {
			n = int(k)
		}
		var capacity uint64
		if v := settings.HostMemory.Get(getenv); v != "" {
			c, err := allocator.ParseSize(v)
			if err != nil {
				return nil, 0, fmt.Errorf("SYMM_HOST_MEMORY: %w", err)
			}
			capacity = c
		}
		b, err := host.New(n, capacity)
		if err != nil {
			return nil, 0, err
		}
		// SYMM_HOST_FAULTS: backend allocations and event creations fail at
		// random (fault-injection tests).
		if v := settings.HostFaults.Get(getenv); v != "" {
			rate, seed, err := host.ParseFaults(v)
			if err != nil {
				return nil, 0, err
			}
			if err := b.WithFaults(rate, seed, hostFaultOps); err != nil {
				return nil, 0, err
			}
		}
		return b, backendHost, nil
	default: // Word refused every other value
		return nil, 0, fmt.Errorf("%w: %w", allocator.ErrInvalid, settings.Device.Refuse(dev))
	}
}

// hostFaultOps are the pool backend's operations SYMM_HOST_FAULTS fails:
// segment allocations and event creations (a block whose event could not be
// recorded at free time waits until processPending records one).
const hostFaultOps = host.FaultAlloc | host.FaultEvents

// fail records err as the thread's last error, prefixed with the C function
// name, and returns its code.
func fail(fn string, err error) C.int {
	code := errCode(err)
	setError(code, fn+": "+err.Error())
	return code
}

// lastError reads the calling thread's last error (for tests).
func lastError() (int, string) {
	return int(C.symm_last_error_code()), C.GoString(C.symm_last_error())
}

func clearError() { C.symm_clear_error() }

func setError(code C.int, msg string) {
	C.symmshim_set_error(code, (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// recovered turns a panic into SYMM_ERR_INTERNAL; use as
// defer func() { recovered(fn, recover()) }() — no panic crosses into C.
func recovered(fn string, r any) bool {
	if r == nil {
		return false
	}
	setError(C.SYMM_ERR_INTERNAL, fmt.Sprintf("%s: internal error (please report): %v", fn, r))
	return true
}

// versionC is the version as a C string, made once and never freed:
// symm_version() returns it.
var versionC = C.CString(version.Version)

//export goVersion
func goVersion() *C.char { return versionC }
