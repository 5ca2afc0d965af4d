package main

/*
#include <stdlib.h>
#include "../include/symm.h"

// A caller's segment allocator (symm_segment_allocator_t), called from Go.
static inline void *symmshim_segs_alloc(const symm_segment_allocator_t *a, size_t size, int dev) {
  return a->alloc(size, dev, a->ctx);
}
static inline void symmshim_segs_free(const symm_segment_allocator_t *a, uintptr_t ptr, size_t size, int dev) {
  a->free((void *)ptr, size, dev, a->ctx);
}
static inline void symmshim_segs_release(const symm_segment_allocator_t *a) {
  if (a->release != NULL) a->release(a->ctx);
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// cSegs is a private pool's segment allocator given through the C ABI
// (symm_pool_create_pool): a copy of the caller's struct, in C memory (it
// holds C pointers only, and the pool keeps it for its life).
type cSegs struct{ a *C.symm_segment_allocator_t }

func newCSegs(a *C.symm_segment_allocator_t) cSegs {
	c := (*C.symm_segment_allocator_t)(C.malloc(C.size_t(unsafe.Sizeof(*a))))
	*c = *a
	return cSegs{c}
}

func (s cSegs) Alloc(dev int, size uint64) (uintptr, error) {
	p := C.symmshim_segs_alloc(s.a, C.size_t(size), C.int(dev))
	if p == nil {
		return 0, fmt.Errorf("%w: the pool's segment allocator gave no %d bytes on device %d", allocator.ErrOutOfMemory, size, dev)
	}
	return uintptr(p), nil
}

func (s cSegs) Free(dev int, ptr uintptr, size uint64) error {
	C.symmshim_segs_free(s.a, C.uintptr_t(ptr), C.size_t(size), C.int(dev))
	return nil
}

func (s cSegs) Close() {
	C.symmshim_segs_release(s.a)
	C.free(unsafe.Pointer(s.a))
}

// The exports of symm_pool_create_pool and its kin (wrappers.cpp calls them).

func poolID(first, second C.uint64_t) allocator.PoolID {
	return allocator.PoolID{First: uint64(first), Second: uint64(second)}
}

//export goPoolCreatePool
func goPoolCreatePool(device C.int, first, second C.uint64_t, segs *C.symm_segment_allocator_t) (code C.int) {
	const fn = "symm_pool_create_pool"
	var sa allocator.SegmentAllocator
	if segs != nil {
		sa = newCSegs(segs)
	}
	defer guard(fn, &code)
	p, err := getPool()
	if err == nil {
		err = p.CreateOrIncrefPool(int(device), poolID(first, second), sa)
	} else if sa != nil {
		sa.Close()
	}
	if err != nil {
		return fail(fn, err)
	}
	return C.SYMM_OK
}

//export goPoolUseCount
func goPoolUseCount(device C.int, first, second C.uint64_t) (n C.int) {
	const fn = "symm_pool_use_count"
	code := C.int(C.SYMM_OK)
	defer func() {
		if code != C.SYMM_OK {
			n = -1
		}
	}()
	defer guard(fn, &code)
	p, err := getPool()
	var uses int
	if err == nil {
		uses, err = p.UseCount(int(device), poolID(first, second))
	}
	if err != nil {
		code = fail(fn, err)
		return -1
	}
	return C.int(uses)
}

// goPoolSetPool is symm_pool_set_use_on_oom (op setPoolUseOnOOM, with on)
// and symm_pool_set_no_split (op setPoolNoSplit).
//
//export goPoolSetPool
func goPoolSetPool(op C.int, device C.int, first, second C.uint64_t, on C.int) (code C.int) {
	fn := "symm_pool_set_no_split"
	if op == setPoolUseOnOOM {
		fn = "symm_pool_set_use_on_oom"
	}
	defer guard(fn, &code)
	p, err := getPool()
	if err == nil && op == setPoolUseOnOOM {
		err = p.SetUseOnOOM(int(device), poolID(first, second), on != 0)
	} else if err == nil {
		err = p.SetNoSplit(int(device), poolID(first, second))
	}
	if err != nil {
		return fail(fn, err)
	}
	return C.SYMM_OK
}

//export goPoolEmptyPool
func goPoolEmptyPool(first, second C.uint64_t) (code C.int) {
	const fn = "symm_pool_empty_pool"
	defer deliverSegmentEvents()
	defer guard(fn, &code)
	p, err := getPool()
	if err == nil {
		err = p.EmptyPool(poolID(first, second))
	}
	if err != nil {
		return fail(fn, err)
	}
	return C.SYMM_OK
}

// goPoolAllocOnOOM serves an allocation of the default pool that failed
// with out-of-memory from a use_on_oom pool's free block; 0 (the failure's
// last error kept) when none fits.
//
//export goPoolAllocOnOOM
func goPoolAllocOnOOM(size C.size_t, device C.int, stream C.uintptr_t, bsize *C.uint64_t) C.uintptr_t {
	defer func() { recovered("symm_pool_alloc", recover()) }()
	p := lib.pool.Load()
	if p == nil {
		return 0
	}
	ptr, n, ok := p.AllocOnOOM(int(device), uintptr(stream), uint64(size))
	if !ok {
		return 0
	}
	*bsize = C.uint64_t(n)
	return C.uintptr_t(ptr)
}
