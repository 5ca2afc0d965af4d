package main

/*
#include "../include/symm.h"
#include "shim.h"

#ifdef __cplusplus
extern "C" {
#endif
// routes.cpp: a capture filter's call (1 takes, 0 not, -1 threw: the
// message in symmshim_filter_error, this thread's) and its deletion.
int symmshim_filter_call(uintptr_t filter, uintptr_t stream);
const char *symmshim_filter_error(void);
void symmshim_filter_free(uintptr_t filter);
// routes.cpp: where the shim reads the pool's count of open routings.
void symmshim_set_open_routes(const uint64_t *count);
#ifdef __cplusplus
}
#endif
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// publishRoutes tells the shim where the new pool p counts its open
// routings (memory outside the Go heap), before any routing can open.
func publishRoutes(p *allocator.Pool) {
	C.symmshim_set_open_routes((*C.uint64_t)(unsafe.Pointer(p.OpenRoutes())))
}

// Private pools (CUDA graphs), segment-serving mode (torch.cuda.MemPool) and
// memory history/snapshots. The pool keeps the open routings and their
// filters (allocator/routes.go); the C++ shim tests the pool's count of
// them before it asks (routes.cpp), and decides PyTorch's mode
// (torchmode.cpp); these exports only carry the calls to the pool.

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

// goPoolRoutedAlloc serves an allocation that an open routing takes: the
// shim asks it only while the pool's count of open routings (OpenRoutes) is
// above zero. *routed is 0 when no routing takes it (the shim then serves
// it as usual), 1 when one did (the result is then the allocation's,
// NULL with the thread's last error on failure).
//
//export goPoolRoutedAlloc
func goPoolRoutedAlloc(api C.int, size C.size_t, device C.int, stream C.uintptr_t, bsize *C.uint64_t, routed *C.int) C.uintptr_t {
	*routed = 0
	p := lib.pool.Load()
	if p == nil {
		return 0 // no pool, no routing
	}
	id, ok, err := p.RouteOf(int(device), uintptr(stream))
	if err != nil {
		*routed = 1
		fail(allocAPIs[api], err)
		return 0
	}
	if !ok {
		return 0
	}
	*routed = 1
	return goPoolAllocIn(api, size, device, stream, C.uint64_t(id.First), C.uint64_t(id.Second), bsize)
}

// cFilter is a capture filter of PyTorch's (a std::function that routes.cpp
// made and handed over), called through the shim, which catches what it
// throws. The pool owns it from BeginAllocateToPool on and closes it once.
type cFilter uintptr

func (f cFilter) Takes(stream uintptr) (bool, error) {
	switch C.symmshim_filter_call(C.uintptr_t(f), C.uintptr_t(stream)) {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("its capture filter threw: %s", C.GoString(C.symmshim_filter_error()))
}

func (f cFilter) Close() { C.symmshim_filter_free(C.uintptr_t(f)) }

// goPoolRoute begins (op routeBegin) a routing to a private pool, taking
// the allocations on stream, or those filter (a cFilter, when not 0) takes;
// ends one (routeEnd); or releases the pool (routeRelease, strict or not).
// The pool owns filter from then on, even when the call fails.
//
//export goPoolRoute
func goPoolRoute(fn *C.char, op C.int, device C.int, first, second C.uint64_t, strict C.int, stream, filter C.uintptr_t) (code C.int) {
	name := C.GoString(fn)
	var r allocator.Route = allocator.StreamRoute(stream)
	if filter != 0 {
		r = cFilter(filter)
	}
	defer func() {
		if r != nil { // not handed to the pool: a panic before the call
			r.Close()
		}
	}()
	defer guard(name, &code)
	p, err := getPool()
	if err != nil {
		return fail(name, err)
	}
	id := allocator.PoolID{First: uint64(first), Second: uint64(second)}
	switch op {
	case routeBegin:
		route := r
		r = nil
		err = p.BeginAllocateToPool(int(device), id, route)
	case routeEnd:
		err = p.EndAllocateToPool(int(device), id)
	default:
		err = p.ReleasePool(int(device), id, strict != 0)
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
	// A size query records no "snapshot" event: only the snapshot that is
	// handed out does (after taking its traces, as PyTorch's).
	var raw []byte
	if buf == nil || capacity == 0 {
		raw, err = json.Marshal(p.PeekSnapshot())
	} else {
		raw, err = p.SnapshotJSON()
	}
	if err == nil {
		err = copyOut("snapshot", raw, buf, capacity, n)
	}
	if err != nil {
		return fail("symm_pool_snapshot", err)
	}
	return C.SYMM_OK
}
