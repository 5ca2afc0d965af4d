package main

/*
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import "github.com/libsymm/libsymm/allocator"

// Private pools (CUDA graphs), segment-serving mode (torch.cuda.MemPool) and
// memory history/snapshots. The C++ shim decides which allocations are routed
// where (the capture filters in routes.cpp, PyTorch's mode in torchmode.cpp);
// these exports only carry the calls to the pool.

//export goPoolAllocIn
func goPoolAllocIn(api C.int, size C.size_t, device C.int, stream C.uintptr_t, first, second C.uint64_t, bsize *C.uint64_t) C.uintptr_t {
	id := allocator.PoolID{First: uint64(first), Second: uint64(second)}
	ptr, pl := poolAllocFrom(fromPrivate, int(api), uint64(size), int(device), uintptr(stream), id)
	*bsize = C.uint64_t(pl.Size)
	return C.uintptr_t(ptr)
}

//export goPoolAllocSegment
func goPoolAllocSegment(api C.int, size C.size_t, device C.int, stream C.uintptr_t, bsize *C.uint64_t) C.uintptr_t {
	ptr, pl := poolAllocFrom(asSegment, int(api), uint64(size), int(device), uintptr(stream), allocator.PoolID{})
	*bsize = C.uint64_t(pl.Size)
	return C.uintptr_t(ptr)
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
		if err == nil && dropped != nil && !p.Routing(int(device), id) {
			*dropped = 1
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
	if err == nil {
		err = copyOut("snapshot", raw, buf, capacity, n)
	}
	if err != nil {
		return failSymm("symm_pool_snapshot", err)
	}
	return C.SYMM_OK
}
