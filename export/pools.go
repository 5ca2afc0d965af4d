package main

/*
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// What PyTorch's allocator interface asks besides alloc and free: cacheInfo,
// resetAccumulatedStats, the blocks of a pool, checkpoint restore, segments
// for torch.cuda.MemPool, and the segment behind a block for CUDA IPC. Called only by pools.cpp, which owns the
// public names, the fork check and the NULL checks.

//export goPoolCacheInfo
func goPoolCacheInfo(device C.int, largest *C.size_t) (code C.int) {
	const fn = "symm_pool_cache_info"
	defer guard(fn, &code)
	p, err := getPool()
	var n uint64
	if err == nil {
		n, err = p.CacheInfo(int(device))
	}
	if err != nil {
		return fail(fn, err)
	}
	*largest = C.size_t(n)
	return C.SYMM_OK
}

//export goPoolResetAccumulated
func goPoolResetAccumulated(device C.int) (code C.int) {
	const fn = "symm_pool_reset_accumulated"
	defer guard(fn, &code)
	p, err := getPool()
	if err == nil {
		err = p.ResetAccumulated(int(device))
	}
	if err != nil {
		return fail(fn, err)
	}
	return C.SYMM_OK
}

// goPoolBlocks writes up to capacity blocks of the pool into out and returns
// how many the pool has, or -1.
//
//export goPoolBlocks
func goPoolBlocks(device C.int, first, second C.uint64_t, out *C.symm_block_info_t, capacity C.int) (n C.int) {
	const fn = "symm_pool_blocks"
	defer func() {
		if recovered(fn, recover()) {
			n = -1
		}
	}()
	p, err := getPool()
	var bl []allocator.BlockInfo
	if err == nil {
		bl, err = p.PoolBlocks(int(device), allocator.PoolID{First: uint64(first), Second: uint64(second)})
	}
	if err != nil {
		fail(fn, err)
		return -1
	}
	if capacity > 0 {
		dst := unsafe.Slice(out, int(capacity))
		for i := 0; i < len(bl) && i < len(dst); i++ {
			dst[i] = blockInfoC(bl[i])
		}
	}
	return C.int(len(bl))
}

func blockInfoC(b allocator.BlockInfo) C.symm_block_info_t {
	return C.symm_block_info_t{
		address:         C.uint64_t(b.Addr),
		size:            C.uint64_t(b.Size),
		requested_size:  C.uint64_t(b.Requested),
		stream:          C.uintptr_t(b.Stream),
		segment_address: C.uint64_t(b.Segment),
		state:           C.int32_t(b.Status),
	}
}

// goPoolRestoreBlocks restores pool (first, second) to the n blocks at want.
// *nfreed and *nallocated hold the capacities of freed and allocated (checked
// by pools.cpp) and receive the counts: those written on success, those
// needed when the arrays are too small, 0 on any other error.
//
//export goPoolRestoreBlocks
func goPoolRestoreBlocks(device C.int, first, second C.uint64_t, want *C.symm_block_info_t, n C.int,
	freed *C.uint64_t, nfreed *C.int, allocated *C.uint64_t, nallocated *C.int) (code C.int) {
	const fn = "symm_pool_restore_blocks"
	capFreed, capAllocated := int(*nfreed), int(*nallocated)
	*nfreed, *nallocated = 0, 0
	defer deliverSegmentEvents()
	defer guard(fn, &code)
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	in := unsafe.Slice(want, int(n))
	bl := make([]allocator.BlockInfo, len(in))
	for i, w := range in {
		if w.reserved != 0 {
			return fail(fn, fmt.Errorf("%w: want[%d].reserved is %d: must be 0; nothing changed", allocator.ErrInvalid, i, int32(w.reserved)))
		}
		bl[i] = allocator.BlockInfo{
			Addr: uintptr(w.address), Size: uint64(w.size), Requested: uint64(w.requested_size),
			Stream: uintptr(w.stream), Segment: uintptr(w.segment_address), Status: allocator.BlockStatus(w.state),
		}
	}
	id := allocator.PoolID{First: uint64(first), Second: uint64(second)}
	res, err := p.RestoreBlocksCapped(int(device), id, bl, capFreed, capAllocated)
	if err != nil {
		var ce *allocator.RestoreCapacityError
		if errors.As(err, &ce) {
			*nfreed, *nallocated = C.int(ce.Freed), C.int(ce.Allocated)
		}
		return fail(fn, err)
	}
	*nfreed = copyAddrs(freed, capFreed, res.Freed)
	*nallocated = copyAddrs(allocated, capAllocated, res.Allocated)
	return C.SYMM_OK
}

// copyAddrs writes addrs into the array of capacity entries at dst (they fit:
// RestoreBlocksCapped checked) and returns how many.
func copyAddrs(dst *C.uint64_t, capacity int, addrs []uintptr) C.int {
	out := unsafe.Slice(dst, capacity)
	for i, a := range addrs {
		out[i] = C.uint64_t(a)
	}
	return C.int(len(addrs))
}

// goPoolNewSegment is symm_pool_alloc_segment: a segment of its own, as
// symm_pool_alloc serves a torch.cuda.MemPool, whatever the caller.
//
//export goPoolNewSegment
func goPoolNewSegment(size C.size_t, device C.int, stream C.uintptr_t) (ptr C.uintptr_t) {
	const fn = "symm_pool_alloc_segment"
	defer func() {
		if recovered(fn, recover()) {
			ptr = 0
		}
		deliverSegmentEvents()
	}()
	p, err := getPool()
	var v uintptr
	if err == nil {
		v, _, err = p.AllocSegment(int(device), uintptr(stream), uint64(size))
	}
	if err != nil {
		fail(fn, err)
		return 0
	}
	return C.uintptr_t(v)
}

//export goPoolBlockOf
func goPoolBlockOf(ptr C.uintptr_t, addr, requested *C.uint64_t) (code C.int) {
	const fn = "symm_pool_block_of"
	defer guard(fn, &code)
	p, err := getPool()
	var a uintptr
	var n uint64
	if err == nil {
		a, n, err = p.BlockOf(uintptr(ptr))
	}
	if err != nil {
		return fail(fn, err)
	}
	*addr, *requested = C.uint64_t(a), C.uint64_t(n)
	return C.SYMM_OK
}

//export goPoolSegmentChunk
func goPoolSegmentChunk(ptr C.uintptr_t, chunk *C.uint64_t) (code C.int) {
	const fn = "symm_pool_segment_chunk"
	defer guard(fn, &code)
	p, err := getPool()
	var c uint64
	if err == nil {
		c, err = p.SegmentChunk(uintptr(ptr))
	}
	if err != nil {
		return fail(fn, err)
	}
	*chunk = C.uint64_t(c)
	return C.SYMM_OK
}

//export goPoolChunkAt
func goPoolChunkAt(ptr, at C.uintptr_t, base, size *C.uint64_t) (code C.int) {
	const fn = "symm_pool_chunk_at"
	defer guard(fn, &code)
	p, err := getPool()
	var b uintptr
	var n uint64
	if err == nil {
		b, n, err = p.ChunkAt(uintptr(ptr), uintptr(at))
	}
	if err != nil {
		return fail(fn, err)
	}
	*base, *size = C.uint64_t(b), C.uint64_t(n)
	return C.SYMM_OK
}

//export goPoolSegmentOf
func goPoolSegmentOf(ptr C.uintptr_t, base, size *C.uint64_t, expandable *C.int) (code C.int) {
	const fn = "symm_pool_segment_of"
	defer guard(fn, &code)
	p, err := getPool()
	var b uintptr
	var n uint64
	var exp bool
	if err == nil {
		b, n, exp, err = p.SegmentOf(uintptr(ptr))
	}
	if err != nil {
		return fail(fn, err)
	}
	*base, *size, *expandable = C.uint64_t(b), C.uint64_t(n), 0
	if exp {
		*expandable = 1
	}
	return C.SYMM_OK
}
