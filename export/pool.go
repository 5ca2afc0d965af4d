package main

/*
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// The //export functions below are called only by the C++ shim (export/*.cpp),
// which owns the public symm_* names, the fork check and the size-0 shortcut.

// The api argument of goPoolAlloc, goPoolAllocIn and goPoolAllocSegment is
// the public function an allocation came through (allocAPIs names it).

// Where an allocation comes from (poolAllocFrom).
type allocSource int

const (
	fromPool    allocSource = iota // the caching pool
	fromPrivate                    // a private pool (CUDA graph capture)
	asSegment                      // a segment of its own (torch.cuda.MemPool)
	afterMiss                      // the caching pool, for a front-cache miss (allocator.AllocAround)
)

//export goPoolAlloc
func goPoolAlloc(api C.int, size C.size_t, device C.int, stream C.uintptr_t, bsize *C.uint64_t) C.uintptr_t {
	ptr, pl := poolAllocFrom(fromPool, int(api), uint64(size), int(device), uintptr(stream), allocator.PoolID{})
	*bsize = C.uint64_t(pl.Size)
	return C.uintptr_t(ptr)
}

// goPoolAllocAfter is goPoolAlloc for the front cache's misses: the n
// blocks at back, parked there, go back to the pool first, in this one call
// from C (export/front.cpp's alloc_miss says why). out->type is, on entry,
// the statistics type of the bins whose blocks of this device and stream
// are among them; were the request to read others, the cache gives back
// all it holds of the device. On return *out says where the block was
// placed (shim.h symmshim_placed).
//
//export goPoolAllocAfter
func goPoolAllocAfter(api C.int, back *C.symmshim_parked, n C.int, size C.size_t, device C.int, stream C.uintptr_t, out *C.symmshim_placed) C.uintptr_t {
	goPoolReturnParked(back, n)
	if p := lib.pool.Load(); p != nil && p.RequestType(uint64(size)) != int(out._type) {
		cFront{}.Return(int(device))
	}
	ptr, pl := poolAllocFrom(afterMiss, int(api), uint64(size), int(device), uintptr(stream), allocator.PoolID{})
	*out = C.symmshim_placed{bsize: C.uint64_t(pl.Size), _type: C.int32_t(pl.Type)}
	if pl.Whole {
		out.whole = 1
	}
	if pl.Epoch != nil {
		// Memory outside the Go heap (allocator/epoch.go): C may keep it.
		out.epoch = (*C.uint64_t)(unsafe.Pointer(pl.Epoch))
		out.mark = C.uint64_t(pl.Mark)
	}
	return C.uintptr_t(ptr)
}

// goPoolReturnParked frees the n blocks at back that the front cache parked
// (evicted, drained, or taken back before an allocation). They are the
// pool's own blocks, so a failure is a bug: printed, and kept out of the
// calling thread's last error, which belongs to the call it is making.
//
//export goPoolReturnParked
func goPoolReturnParked(back *C.symmshim_parked, n C.int) {
	if n <= 0 {
		return
	}
	defer deliverSegmentEvents()
	p, err := getPool()
	if err != nil {
		fmt.Fprintf(os.Stderr, "symm: returning %d cached blocks: %v\n", int(n), err)
		return
	}
	blocks := unsafe.Slice(back, int(n))
	for i := 0; i < len(blocks); {
		i = returnParked(p, blocks, i)
	}
}

// returnParked frees blocks[i:] into p and returns len(blocks), or the
// index after a block whose free panicked (printed, as errors are).
func returnParked(p *allocator.Pool, blocks []C.symmshim_parked, i int) (next int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "symm: returning a cached block: panic: %v\n", r)
			next = i + 1
		}
	}()
	for ; i < len(blocks); i++ {
		b := &blocks[i]
		if err := p.Free(int(b.dev), uintptr(b.stream), uintptr(b.ptr), uint64(b.req)); err != nil {
			fmt.Fprintf(os.Stderr, "symm: returning a cached block: %v\n", err)
		}
	}
	return i
}

//export goPoolFree
func goPoolFree(ptr C.uintptr_t, size C.size_t, device C.int, stream C.uintptr_t) {
	poolFree(uintptr(ptr), uint64(size), int(device), uintptr(stream))
}

// poolAlloc and poolFree are the hot path in Go types, so tests can measure
// them (cgo is not allowed in tests): one atomic load for the pool, then the
// pool's cached path; no heap allocation.
func poolAlloc(size uint64, device int, stream uintptr) (ptr uintptr, bsize uint64) {
	ptr, pl := poolAllocFrom(fromPool, 0, size, device, stream, allocator.PoolID{})
	return ptr, pl.Size
}

// poolAllocFrom serves every allocation entry: from the pool, a private
// pool id, or as a segment of its own; errors carry allocAPIs[api]. pl says
// where the pool placed a block of its own (allocator.Placement), which
// tells the front cache whether it may hand the block out again once freed.
func poolAllocFrom(src allocSource, api int, size uint64, device int, stream uintptr, id allocator.PoolID) (ptr uintptr, pl allocator.Placement) {
	fn := allocAPIs[api]
	defer func() {
		if recovered(fn, recover()) {
			ptr, pl = 0, allocator.Placement{}
		}
		deliverSegmentEvents()
	}()
	p, err := getPool()
	if err == nil {
		switch src {
		case fromPool:
			ptr, pl, err = p.Alloc(device, stream, size)
		case afterMiss:
			ptr, pl, err = p.AllocAround(device, stream, size, nil)
		case fromPrivate:
			if ptr, pl.Size, err = p.AllocIn(device, stream, size, id); err != nil {
				err = fmt.Errorf("in private pool %v: %w", id, err)
			}
		default:
			ptr, pl.Size, err = p.AllocSegment(device, stream, size)
		}
	}
	if err != nil {
		fail(fn, err)
		return 0, allocator.Placement{}
	}
	return ptr, pl
}

func poolFree(ptr uintptr, size uint64, device int, stream uintptr) {
	defer func() {
		recovered("symm_pool_free", recover())
		deliverSegmentEvents()
	}()
	p, err := getPool()
	if err != nil {
		fail("symm_pool_free", err)
		return
	}
	if err := p.Free(device, stream, ptr, size); err != nil {
		fail("symm_pool_free", err)
	}
}

// goPoolInit is symm_pool_init, or symm_torch_init when torch is 1 (the
// name its errors carry).
//
//export goPoolInit
func goPoolInit(deviceCount C.int, torch C.int) {
	fn := "symm_pool_init"
	if torch != 0 {
		fn = "symm_torch_init"
	}
	defer func() { recovered(fn, recover()) }()
	if _, err := getPool(); err != nil {
		fail(fn, err)
	}
}

//export goPoolEmptyCache
func goPoolEmptyCache() {
	defer func() {
		recovered("symm_pool_empty_cache", recover())
		deliverSegmentEvents()
	}()
	p := lib.pool.Load()
	if p == nil {
		return // nothing cached yet; do not load a driver just to empty nothing
	}
	if err := p.EmptyCache(); err != nil {
		fail("symm_pool_empty_cache", err)
	}
}

//export goPoolSetMemoryFraction
func goPoolSetMemoryFraction(fraction C.double, device C.int) {
	defer func() {
		recovered("symm_pool_set_memory_fraction", recover())
		deliverSegmentEvents()
	}()
	p, err := getPool()
	if err == nil {
		err = p.SetMemoryFraction(int(device), float64(fraction))
	}
	if err != nil {
		fail("symm_pool_set_memory_fraction", err)
	}
}

//export goPoolSetExpandable
func goPoolSetExpandable(enable C.int) (code C.int) {
	defer func() {
		if recovered("symm_pool_set_expandable", recover()) {
			code = C.SYMM_ERR_INTERNAL
		}
	}()
	if enable != 0 && enable != 1 {
		return fail("symm_pool_set_expandable", fmt.Errorf("%w: enable is %d: want 0 or 1", allocator.ErrInvalid, int(enable)))
	}
	lib.mu.Lock()
	p := lib.pool.Load()
	if p == nil {
		lib.expandable.Store(int32(enable) + 1)
	}
	lib.mu.Unlock()
	if p != nil {
		// Once the pool exists, the choice applies to the segments made
		// from now on, as PyTorch's expandable_segments setting does.
		if err := p.SetExpandable(enable == 1); err != nil {
			return fail("symm_pool_set_expandable", err)
		}
	}
	return C.SYMM_OK
}

//export goPoolSetLimit
func goPoolSetLimit(device C.int, bytes C.uint64_t) (code C.int) {
	defer func() {
		if recovered("symm_pool_set_limit", recover()) {
			code = C.SYMM_ERR_INTERNAL
		}
		deliverSegmentEvents()
	}()
	p, err := getPool()
	if err == nil {
		err = p.SetLimit(int(device), uint64(bytes))
	}
	if err != nil {
		return fail("symm_pool_set_limit", err)
	}
	return C.SYMM_OK
}

// goPoolRecordStream returns the block's start (0 on failure) so that the
// front cache can send the block's free to the pool.
//
//export goPoolRecordStream
func goPoolRecordStream(ptr, stream C.uintptr_t) (base C.uintptr_t) {
	defer func() {
		if recovered("symm_pool_record_stream", recover()) {
			base = 0
		}
	}()
	p, err := getPool()
	var b uintptr
	if err == nil {
		b, err = p.RecordStreamBlock(uintptr(ptr), uintptr(stream))
	}
	if err != nil {
		fail("symm_pool_record_stream", err)
		return 0
	}
	return C.uintptr_t(b)
}

// statNames are the statistic names as C strings, made once and never freed:
// symm_stat_t.name points at them.
var statNames = func() []*C.char {
	names := allocator.StatNames()
	out := make([]*C.char, len(names))
	for i, n := range names {
		out[i] = C.CString(n)
	}
	return out
}()

//export goPoolStats
func goPoolStats(device C.int, out *C.symm_stat_t, capacity C.int) (n C.int) {
	defer func() {
		if recovered("symm_pool_stats", recover()) {
			n = -1
		}
	}()
	p, err := getPool()
	if err != nil {
		fail("symm_pool_stats", err)
		return -1
	}
	vals, err := p.Stats(int(device))
	if err != nil {
		fail("symm_pool_stats", err)
		return -1
	}

	if capacity > 0 {
		dst := unsafe.Slice(out, int(capacity))
		for i := 0; i < len(vals) && i < len(dst); i++ {
			dst[i].name = statNames[i]
			dst[i].value = C.int64_t(vals[i])
		}
	}
	return C.int(len(vals))
}

//export goPoolResetPeak
func goPoolResetPeak(device C.int) (code C.int) {
	defer func() {
		if recovered("symm_pool_reset_peak", recover()) {
			code = C.SYMM_ERR_INTERNAL
		}
	}()
	p, err := getPool()
	if err == nil {
		err = p.ResetPeak(int(device))
	}
	if err != nil {
		return fail("symm_pool_reset_peak", err)
	}
	return C.SYMM_OK
}

//export goPoolDeviceCount
func goPoolDeviceCount() (n C.int) {
	defer func() {
		if recovered("symm_pool_device_count", recover()) {
			n = -1
		}
	}()
	p, err := getPool()
	if err != nil {
		fail("symm_pool_device_count", err)
		return -1
	}
	return C.int(p.DeviceCount())
}

//export goPoolBackend
func goPoolBackend() C.int { return C.int(lib.backend.Load()) }
