package main

/*
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// Private pools (CUDA graphs), segment-serving mode (torch.cuda.MemPool) and
// memory history/snapshots. shim.cpp decides which allocations are routed
// where (the capture filters and PyTorch's mode live there, in C++); these
// exports only carry the calls to the pool.

//export goPoolAllocIn
func goPoolAllocIn(size C.size_t, device C.int, stream C.uintptr_t, first, second C.uint64_t, bsize *C.uint64_t) C.uintptr_t {
	ptr, n := poolAllocIn(uint64(size), int(device), uintptr(stream), allocator.PoolID{First: uint64(first), Second: uint64(second)})
	*bsize = C.uint64_t(n)
	return C.uintptr_t(ptr)
}

//export goPoolAllocSegment
func goPoolAllocSegment(size C.size_t, device C.int, stream C.uintptr_t, bsize *C.uint64_t) C.uintptr_t {
	ptr, n := poolAllocSegment(uint64(size), int(device), uintptr(stream))
	*bsize = C.uint64_t(n)
	return C.uintptr_t(ptr)
}

func poolAllocIn(size uint64, device int, stream uintptr, id allocator.PoolID) (ptr uintptr, bsize uint64) {
	defer func() {
		if recovered("symm_pool_alloc", recover()) {
			ptr, bsize = 0, 0
		}
	}()
	p, err := getPool()
	if err == nil {
		ptr, bsize, err = p.AllocIn(device, stream, size, id)
	}
	if err != nil {
		fail("symm_pool_alloc", fmt.Errorf("in private pool %v: %w", id, err))
		return 0, 0
	}
	return ptr, bsize
}

func poolAllocSegment(size uint64, device int, stream uintptr) (ptr uintptr, bsize uint64) {
	defer func() {
		if recovered("symm_pool_alloc", recover()) {
			ptr, bsize = 0, 0
		}
	}()
	p, err := getPool()
	if err == nil {
		ptr, bsize, err = p.AllocSegment(device, stream, size)
	}
	if err != nil {
		fail("symm_pool_alloc", err)
		return 0, 0
	}
	return ptr, bsize
}

// goPoolRoute begins (op 0) or ends (op 1) routing allocations to a private
// pool, or releases one (op 2, strict or not); *dropped is set to 1 when a
// release ended the pool's routing too (its last use went while a capture was
// still open), so that the shim forgets its filters.
//
//export goPoolRoute
func goPoolRoute(fn *C.char, op C.int, device C.int, first, second C.uint64_t, strict C.int, dropped *C.int) (code C.int) {
	name := C.GoString(fn)
	defer guard(name, &code)
	p, err := getPool()
	if err != nil {
		return fail(name, err)
	}
	id := allocator.PoolID{First: uint64(first), Second: uint64(second)}
	switch op {
	case 0:
		err = p.BeginAllocateToPool(int(device), id)
	case 1:
		err = p.EndAllocateToPool(int(device), id)
	default:
		err = p.ReleasePool(int(device), id, strict != 0)
		if err == nil && dropped != nil {
			*dropped = 1
			if pools, perr := p.Pools(int(device)); perr == nil {
				for _, pi := range pools {
					if pi.ID == id && pi.Active > 0 {
						*dropped = 0
					}
				}
			}
		}
	}
	if err != nil {
		return fail(name, err)
	}
	return C.SYMM_OK
}

//export goPoolRecordHistory
func goPoolRecordHistory(enabled C.int, maxEntries C.size_t) (code C.int) {
	defer guard("symm_pool_record_history", &code)
	p, err := getPool()
	if err == nil {
		n := uint64(maxEntries)
		if n > 1<<31 {
			n = 1 << 31 // PyTorch's default is sys.maxsize: a bound, not a buffer
		}
		err = p.RecordHistory(enabled != 0, int(n), false)
	}
	if err != nil {
		return fail("symm_pool_record_history", err)
	}
	return C.SYMM_OK
}

//export goPoolSnapshot
func goPoolSnapshot(buf *C.char, capacity C.size_t, n *C.size_t) (code C.int) {
	defer guard("symm_pool_snapshot", &code)
	p, err := getPool()
	if err != nil {
		return fail("symm_pool_snapshot", err)
	}
	raw, err := p.SnapshotJSON()
	if err != nil {
		return fail("symm_pool_snapshot", err)
	}
	*n = C.size_t(len(raw))
	if buf == nil || capacity == 0 {
		return C.SYMM_OK // a size query
	}
	if uint64(capacity) < uint64(len(raw))+1 {
		return fail("symm_pool_snapshot", fmt.Errorf("%w: the buffer holds %d bytes; the snapshot needs %d (and a NUL)", allocator.ErrInvalid, capacity, len(raw)))
	}
	dst := cBytes(unsafe.Pointer(buf), capacity, len(raw)+1)
	dst[copy(dst, raw)] = 0
	return C.SYMM_OK
}
