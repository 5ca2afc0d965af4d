package cuda

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"

static inline void symm_zero_host(uintptr_t p, size_t n) { memset((void *)p, 0, n); }

#cgo noescape symm_launch_words
#cgo nocallback symm_launch_words
#define SYMM_MAX_KERNEL_ARGS 16
// symm_launch_words launches f with n parameters whose values are the
// words at vals (each parameter's value in the low bytes of its word:
// little-endian): the array of pointers the driver wants is built here, on
// the C stack, so that Go passes one pointer-free array and allocates
// nothing.
static inline CUresult symm_launch_words(void *fn, uintptr_t f, unsigned gx, unsigned bx, unsigned shmem,
                                         uintptr_t stream, const uint64_t *vals, int n) {
  void *params[SYMM_MAX_KERNEL_ARGS];
  for (int i = 0; i < n && i < SYMM_MAX_KERNEL_ARGS; i++) params[i] = (void *)&vals[i];
  return symm_cuLaunchKernel(fn, f, gx, 1, 1, bx, 1, 1, shmem, stream, params);
}
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// enterFor resolves optional function id and enters device dev's context:
// the common start of the calls below. The caller ends with s.leave.
func enterFor(id fnID, dev int) (unsafe.Pointer, ctxScope, error) {
	d, err := loaded()
	if err != nil {
		return nil, ctxScope{}, err
	}
	return d.enterFor(id, dev)
}

// enterFor is the package's enterFor on driver d.
func (d *driver) enterFor(id fnID, dev int) (unsafe.Pointer, ctxScope, error) {
	fn, err := d.need(id)
	if err != nil {
		return nil, ctxScope{}, err
	}
	s, err := d.enter(dev)
	return fn, s, err
}

// ModuleLoad loads a CUBIN (from package kernels) into device dev's primary
// context and returns the module handle.
func ModuleLoad(dev int, image []byte) (uintptr, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuModuleLoadData on device %d: empty image", dev)
	}
	fn, s, err := enterFor(fnModuleLoadData, dev)
	if err != nil {
		return 0, err
	}
	img := C.CBytes(image) // the driver reads it during the call; C memory by cgo's rules
	defer C.free(img)
	o := C.symm_cuModuleLoadData(fn, img)
	if r := Result(o.r); r != Success {
		err = fmt.Errorf("cuModuleLoadData(%d bytes) on device %d: %w", len(image), dev, r)
	}
	return uintptr(o.v), s.leave(err)
}

// ModuleUnload unloads a module of device dev.
func ModuleUnload(dev int, module uintptr) error {
	fn, s, err := enterFor(fnModuleUnload, dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuModuleUnload(fn, C.uintptr_t(module))); r != Success {
		err = fmt.Errorf("cuModuleUnload(%#x) on device %d: %w", module, dev, r)
	}
	return s.leave(err)
}

// ModuleFunction returns the kernel called name (extern "C") of a module.
func ModuleFunction(dev int, module uintptr, name string) (uintptr, error) {
	fn, s, err := enterFor(fnModuleGetFunction, dev)
	if err != nil {
		return 0, err
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	o := C.symm_cuModuleGetFunction(fn, C.uintptr_t(module), cname)
	if r := Result(o.r); r != Success {
		err = fmt.Errorf("cuModuleGetFunction(%q) on device %d: %w", name, dev, r)
	}
	return uintptr(o.v), s.leave(err)
}

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z uint32 }

// Launch enqueues kernel f on stream (0: the legacy default stream) of
// device dev. Each argument is one kernel parameter, by the C type its Go
// type stands for: uint32/int32/float32 (4 bytes), uint64/int64/uintptr/
// float64 (8 bytes; device pointers are uintptr).
func Launch(dev int, f uintptr, grid, block Dim3, sharedMem uint32, stream uintptr, args ...any) error {
	vals := make([]byte, 8*len(args))
	for i, a := range args {
		v := vals[8*i : 8*i+8]
		switch x := a.(type) {
		case uint32:
			binary.LittleEndian.PutUint32(v, x)
		case int32:
			binary.LittleEndian.PutUint32(v, uint32(x))
		case float32:
			binary.LittleEndian.PutUint32(v, math.Float32bits(x))
		case uint64:
			binary.LittleEndian.PutUint64(v, x)
		case int64:
			binary.LittleEndian.PutUint64(v, uint64(x))
		case uintptr:
			binary.LittleEndian.PutUint64(v, uint64(x))
		case float64:
			binary.LittleEndian.PutUint64(v, math.Float64bits(x))
		default:
			return fmt.Errorf("cuLaunchKernel: argument %d has type %T; want uint32, int32, float32, uint64, int64, uintptr or float64", i, a)
		}
	}
	// The values and the array of pointers to them live in C memory: cgo
	// forbids passing Go memory that holds Go pointers.
	n := len(args)
	cvals := C.malloc(C.size_t(8*n + 1))
	defer C.free(cvals)
	if n > 0 {
		C.memcpy(cvals, unsafe.Pointer(&vals[0]), C.size_t(8*n))
	}
	cptrs := C.malloc(C.size_t(n+1) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(cptrs)
	ptrs := unsafe.Slice((*unsafe.Pointer)(cptrs), n+1)
	for i := range n {
		ptrs[i] = unsafe.Add(cvals, 8*i)
	}
	fn, s, err := enterFor(fnLaunchKernel, dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuLaunchKernel(fn, C.uintptr_t(f), C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(sharedMem), streamArg(stream), (*unsafe.Pointer)(cptrs))); r != Success {
		err = fmt.Errorf("cuLaunchKernel(grid %v, block %v) on device %d: %w", grid, block, dev, r)
	}
	return s.leave(err)
}

// Flags of cuMemHostAlloc.
const (
	memHostAllocPortable  = 0x1 // CU_MEMHOSTALLOC_PORTABLE: pinned for every context
	memHostAllocDeviceMap = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP: mapped into the device's address space
)

// HostAllocMapped allocates n bytes of pinned host memory that kernels of
// every context can read and write (status words that the host polls
// without a driver call). It returns the host address and the address
// kernels use (the same under unified addressing). The memory is zeroed.
func HostAllocMapped(dev int, n uint64) (host, device uintptr, err error) {
	fn, s, err := enterFor(fnMemHostAlloc, dev)
	if err != nil {
		return 0, 0, err
	}
	o := C.symm_cuMemHostAlloc(fn, C.size_t(n), memHostAllocPortable|memHostAllocDeviceMap)
	if r := Result(o.r); r != Success {
		return 0, 0, s.leave(fmt.Errorf("cuMemHostAlloc(%d bytes, portable|devicemap) on device %d: %w", n, dev, r))
	}
	host = uintptr(o.v)
	d, _ := loaded()
	get, err := d.need(fnMemHostGetDevicePointer)
	if err == nil {
		g := C.symm_cuMemHostGetDevicePointer(get, C.uintptr_t(host))
		if r := Result(g.r); r != Success {
			err = fmt.Errorf("cuMemHostGetDevicePointer(%#x) on device %d: %w", host, dev, r)
		}
		device = uintptr(g.v)
	}
	if err != nil {
		if free, ferr := d.need(fnMemFreeHost); ferr == nil {
			C.symm_cuMemFreeHost(free, C.uintptr_t(host))
		}
		return 0, 0, s.leave(err)
	}
	C.symm_zero_host(C.uintptr_t(host), C.size_t(n))
	return host, device, s.leave(nil)
}

// HostFree frees memory from HostAllocMapped.
func HostFree(dev int, host uintptr) error {
	fn, s, err := enterFor(fnMemFreeHost, dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuMemFreeHost(fn, C.uintptr_t(host))); r != Success {
		err = fmt.Errorf("cuMemFreeHost(%#x) on device %d: %w", host, dev, r)
	}
	return s.leave(err)
}

// MaxKernelArgs is the most parameters LaunchWords passes.
const MaxKernelArgs = 16

// LaunchWords is Launch for the hot paths (signals, all-reduce): a 1-D
// grid, each parameter's value in the low bytes of one word (int32 and
// uint32 as uint64(uint32(v)), pointers as uint64), no Go allocation.
func LaunchWords(dev int, f uintptr, grid, block uint32, stream uintptr, words []uint64) error {
	if len(words) == 0 || len(words) > MaxKernelArgs {
		return fmt.Errorf("cuLaunchKernel: %d arguments; want 1 to %d", len(words), MaxKernelArgs)
	}
	fn, s, err := enterFor(fnLaunchKernel, dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_launch_words(fn, C.uintptr_t(f), C.uint(grid), C.uint(block), 0, streamArg(stream),
		(*C.uint64_t)(unsafe.Pointer(&words[0])), C.int(len(words)))); r != Success {
		err = launchError(grid, block, dev, r)
	}
	return s.leave(err)
}

// launchError is built only on failure (it allocates).
func launchError(grid, block uint32, dev int, r Result) error {
	return fmt.Errorf("cuLaunchKernel(grid %d, block %d) on device %d: %w", grid, block, dev, r)
}
