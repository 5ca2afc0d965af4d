package kernels

/*
#include <stdlib.h>
#include <stddef.h>

typedef int nvrtcResult;
typedef void *nvrtcProgram;

static inline nvrtcResult symm_nvrtcCreateProgram(void *fn, nvrtcProgram *p, const char *src, const char *name) {
  return ((nvrtcResult(*)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *))fn)(
      p, src, name, 0, NULL, NULL);
}
static inline nvrtcResult symm_nvrtcCompileProgram(void *fn, nvrtcProgram p, int n, const char *const *opts) {
  return ((nvrtcResult(*)(nvrtcProgram, int, const char *const *))fn)(p, n, opts);
}
static inline nvrtcResult symm_nvrtcGetSize(void *fn, nvrtcProgram p, size_t *n) {
  return ((nvrtcResult(*)(nvrtcProgram, size_t *))fn)(p, n);
}
static inline nvrtcResult symm_nvrtcGetBytes(void *fn, nvrtcProgram p, char *out) {
  return ((nvrtcResult(*)(nvrtcProgram, char *))fn)(p, out);
}
static inline nvrtcResult symm_nvrtcDestroyProgram(void *fn, nvrtcProgram *p) {
  return ((nvrtcResult(*)(nvrtcProgram *))fn)(p);
}
static inline nvrtcResult symm_nvrtcVersion(void *fn, int *major, int *minor) {
  return ((nvrtcResult(*)(int *, int *))fn)(major, minor);
}
static inline const char *symm_nvrtcGetErrorString(void *fn, nvrtcResult r) {
  return ((const char *(*)(nvrtcResult))fn)(r);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/libsymm/libsymm/internal/dl"
	"github.com/libsymm/libsymm/topology"
)

// ErrNoNVRTC is wrapped by Open's error when no NVRTC library loads.
var ErrNoNVRTC = errors.New("kernels: NVRTC not found (set SYMM_NVRTC_LIB, or pip install nvidia-cuda-nvrtc)")

// NVRTC is an opened NVRTC library. Safe for concurrent use: NVRTC programs
// are independent.
type NVRTC struct {
	lib  *dl.Lib
	path string
	fn   struct {
		create, compile, logSize, log, cubinSize, cubin, destroy, errString, version unsafe.Pointer
	}
}

// Open finds and opens NVRTC (dirs: site-packages directories to look in).
func Open(dirs []string) (*NVRTC, error) {
	l, path, err := topology.OpenFirst("nvrtc", dirs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoNVRTC, err)
	}
	n := &NVRTC{lib: l, path: path}
	for _, s := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"nvrtcCreateProgram", &n.fn.create},
		{"nvrtcCompileProgram", &n.fn.compile},
		{"nvrtcGetProgramLogSize", &n.fn.logSize},
		{"nvrtcGetProgramLog", &n.fn.log},
		{"nvrtcGetCUBINSize", &n.fn.cubinSize},
		{"nvrtcGetCUBIN", &n.fn.cubin},
		{"nvrtcDestroyProgram", &n.fn.destroy},
		{"nvrtcGetErrorString", &n.fn.errString},
		{"nvrtcVersion", &n.fn.version},
	} {
		p, err := l.Lookup(s.name)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("kernels: %s is not a usable NVRTC (CUBIN output needs NVRTC 11.1 or later): %w", path, err)
		}
		*s.dst = p
	}
	return n, nil
}

// Version is NVRTC's version, "13.0".
func (n *NVRTC) Version() string {
	var major, minor C.int
	if r := C.symm_nvrtcVersion(n.fn.version, &major, &minor); r != 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", major, minor)
}

// Path is the file NVRTC was opened from.
func (n *NVRTC) Path() string { return n.path }

// Close releases the library.
func (n *NVRTC) Close() error { return n.lib.Close() }

// CompileError is a compilation that NVRTC refused: its result and log.
type CompileError struct {
	Name, Arch, Result, Log string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("kernels: compiling %s for %s: %s\n%s", e.Name, e.Arch, e.Result, e.Log)
}

// Compile compiles src (CUDA C++, kernels declared extern "C" so that their
// names are not mangled) for compute capability major.minor and returns the
// CUBIN, ready for cuModuleLoadData. name names the source in messages.
func (n *NVRTC) Compile(src, name string, major, minor int) ([]byte, error) {
	if major < 3 || major > 20 || minor < 0 || minor > 9 {
		return nil, fmt.Errorf("kernels: compute capability %d.%d is not one NVRTC knows", major, minor)
	}
	arch := fmt.Sprintf("sm_%d%d", major, minor)
	csrc, cname := C.CString(src), C.CString(name)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	opts := []string{"--gpu-architecture=" + arch, "--std=c++17"}
	copts := C.malloc(C.size_t(len(opts)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(copts)
	optv := unsafe.Slice((**C.char)(copts), len(opts))
	for i, o := range opts {
		optv[i] = C.CString(o)
		defer C.free(unsafe.Pointer(optv[i]))
	}

	var prog C.nvrtcProgram
	if r := C.symm_nvrtcCreateProgram(n.fn.create, &prog, csrc, cname); r != 0 {
		return nil, fmt.Errorf("kernels: nvrtcCreateProgram(%s): %s", name, n.errString(r))
	}
	defer C.symm_nvrtcDestroyProgram(n.fn.destroy, &prog)
	if r := C.symm_nvrtcCompileProgram(n.fn.compile, prog, C.int(len(opts)), (**C.char)(copts)); r != 0 {
		log, _ := n.bytes(prog, n.fn.logSize, n.fn.log)
		return nil, &CompileError{Name: name, Arch: arch, Result: n.errString(r), Log: trimNUL(log)}
	}
	cubin, err := n.bytes(prog, n.fn.cubinSize, n.fn.cubin)
	if err != nil {
		return nil, fmt.Errorf("kernels: reading the CUBIN of %s: %w", name, err)
	}
	if len(cubin) < 4 || string(cubin[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("kernels: NVRTC returned %d bytes for %s that are not a CUBIN (ELF)", len(cubin), name)
	}
	return cubin, nil
}

// bytes reads one of the program's outputs through its size and copy calls.
func (n *NVRTC) bytes(prog C.nvrtcProgram, sizeFn, copyFn unsafe.Pointer) ([]byte, error) {
	var size C.size_t
	if r := C.symm_nvrtcGetSize(sizeFn, prog, &size); r != 0 {
		return nil, errors.New(n.errString(r))
	}
	if size == 0 {
		return nil, nil
	}
	buf := C.malloc(size) // C memory: NVRTC writes into it without Go's pointer rules
	defer C.free(buf)
	if r := C.symm_nvrtcGetBytes(copyFn, prog, (*C.char)(buf)); r != 0 {
		return nil, errors.New(n.errString(r))
	}
	return C.GoBytes(buf, C.int(size)), nil
}

func (n *NVRTC) errString(r C.nvrtcResult) string {
	if s := C.symm_nvrtcGetErrorString(n.fn.errString, r); s != nil {
		return fmt.Sprintf("%s (%d)", C.GoString(s), int(r))
	}
	return fmt.Sprintf("NVRTC error %d", int(r))
}

func trimNUL(b []byte) string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return string(b)
}
