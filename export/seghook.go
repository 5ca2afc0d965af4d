package main

/*
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"

	"github.com/libsymm/libsymm/allocator"
)

// Segment events for the hook of symm_pool_set_segment_hook (PyTorch's
// allocator trace trackers, through libsymm's extension).
//
// The pool queues its segment events under its shard locks
// (allocator/segevents.go); the exports that can cause them deliver them
// once the pool's call has returned (deliverSegmentEvents, deferred in
// poolAllocFrom (every allocation), poolFree, goPoolReturnParked,
// goPoolEmptyCache, goPoolSetMemoryFraction, goPoolSetLimit,
// goPoolRestoreBlocks and goPoolNewSegment), so the hook runs outside
// every pool lock. A release of a private pool gives its segments back at
// the next of these.
//
// Invariant: when deliverSegmentEvents returns, every event queued before
// it was called has been handed to the hook. A caller whose events another
// thread took waits for that thread's delivery (deliverMu): so the events
// an allocation or a free caused are delivered before it returns to C, and
// (one thread) before any later call of that thread can reuse the memory.
// Deliveries are serialized. A call into libsymm from the hook itself does
// not deliver (the C shim's thread flag, symmshim_in_segment_hook): the
// delivering loop picks its events up after the hook returns.
//
// Cost with no hook: one atomic load (hookOn) per export call that could
// cause an event; the cached path in C never gets here.

var seg struct {
	on        atomic.Bool   // a hook is registered
	delivered atomic.Uint64 // allocator.Pool.SegmentEventsQueued as far as delivered
	mu        sync.Mutex    // serializes deliveries; guards buf
	buf       []allocator.SegmentEvent
	cbuf      []C.symm_trace_entry_t
}

// goPoolWatchSegments starts (on 1) or stops the pool's queueing of segment
// events; snapshot.cpp has stored or cleared the hook.
//
//export goPoolWatchSegments
func goPoolWatchSegments(on C.int) (code C.int) {
	const fn = "symm_pool_set_segment_hook"
	defer guard(fn, &code)
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	seg.mu.Lock()
	defer seg.mu.Unlock()
	p.WatchSegments(on != 0)
	_, n, _ := p.TakeSegmentEvents(nil) // nothing from before the hook
	seg.delivered.Store(n)
	seg.on.Store(on != 0)
	return C.SYMM_OK
}

// deliverSegmentEvents hands the pool's queued segment events to the hook
// (see the invariant above).
func deliverSegmentEvents() {
	if !seg.on.Load() {
		return
	}
	p := lib.pool.Load()
	if p == nil || p.SegmentEventsQueued() == seg.delivered.Load() {
		return
	}
	if C.symmshim_in_segment_hook() != 0 {
		return // the delivery under way on this thread takes them
	}
	seg.mu.Lock()
	defer seg.mu.Unlock()
	for {
		evs, n, _ := p.TakeSegmentEvents(seg.buf[:0])
		seg.buf = evs
		if len(evs) > 0 && seg.on.Load() {
			callSegmentHook(evs)
		}
		seg.delivered.Store(n)
		if p.SegmentEventsQueued() == n {
			return
		}
	}
}

// callSegmentHook converts evs to C and calls the hook once; its buffer is
// Go memory without Go pointers, valid during the call only.
func callSegmentHook(evs []allocator.SegmentEvent) {
	out := seg.cbuf[:0]
	for _, e := range evs {
		out = append(out, C.symm_trace_entry_t{
			device: C.int32_t(e.Device), action: traceActions[e.Action], address: C.uint64_t(e.Addr),
			size: C.uint64_t(e.Size), stream: C.uintptr_t(e.Stream), time_us: C.int64_t(e.TimeUS),
			pool_id:       C.symm_pool_id_t{first: C.uint64_t(e.Pool.First), second: C.uint64_t(e.Pool.Second)},
			user_metadata: annotationCString(e.UserMetadata), compile_context: annotationCString(compileOrNA(e.CompileContext)),
		})
	}
	seg.cbuf = out
	C.symmshim_call_segment_hook(&out[0], C.int(len(out)))
}

// compileOrNA is a compile context as PyTorch reports it: "N/A" for none.
func compileOrNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}
