package main

/*
#include <string.h>
#include "../include/symm.h"
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// Snapshots as C listings (symm_pool_snapshot_list), the pool's settings,
// and segment events for a hook (symm_pool_set_segment_hook). Called only
// by snapshot.cpp, which owns the public names, the fork check and the
// NULL checks.

// traceActions maps the allocator's actions onto SYMM_TRACE_*.
var traceActions = [...]C.int32_t{
	allocator.ActAlloc:         C.SYMM_TRACE_ALLOC,
	allocator.ActFreeRequested: C.SYMM_TRACE_FREE_REQUESTED,
	allocator.ActFreeCompleted: C.SYMM_TRACE_FREE_COMPLETED,
	allocator.ActSegmentAlloc:  C.SYMM_TRACE_SEGMENT_ALLOC,
	allocator.ActSegmentFree:   C.SYMM_TRACE_SEGMENT_FREE,
	allocator.ActOOM:           C.SYMM_TRACE_OOM,
	allocator.ActSnapshot:      C.SYMM_TRACE_SNAPSHOT,
	allocator.ActSegmentMap:    C.SYMM_TRACE_SEGMENT_MAP,
	allocator.ActSegmentUnmap:  C.SYMM_TRACE_SEGMENT_UNMAP,
}

var blockStates = map[string]C.int32_t{
	"inactive": C.SYMM_BLOCK_FREE, "active_allocated": C.SYMM_BLOCK_ALLOCATED, "active_pending_free": C.SYMM_BLOCK_PENDING,
}

// goPoolSnapshotList is symm_pool_snapshot_list: *nsegs, *nblocks and
// *ntraces (ntraces NULL: no traces) hold the capacities, checked by
// snapshot.cpp, and receive the counts.
//
//export goPoolSnapshotList
func goPoolSnapshotList(segs *C.symm_segment_info_t, nsegs *C.int, blocks *C.symm_block_info_t, nblocks *C.int,
	traces *C.symm_trace_entry_t, ntraces *C.int) (code C.int) {
	const fn = "symm_pool_snapshot_list"
	defer guard(fn, &code)
	capSegs, capBlocks, capTraces := int(*nsegs), int(*nblocks), 0
	if ntraces != nil {
		capTraces = int(*ntraces)
	}
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	query := capSegs == 0 && capBlocks == 0 && capTraces == 0
	var snap *allocator.Snapshot
	if query {
		snap = p.PeekSnapshot()
	} else {
		snap = p.Snapshot() // records its "snapshot" events after taking the traces: not listed
	}
	ns, nb, nt := len(snap.Segments), 0, 0
	for _, s := range snap.Segments {
		nb += len(s.Blocks)
	}
	if ntraces != nil {
		for _, t := range snap.DeviceTraces {
			nt += len(t)
		}
	}
	*nsegs, *nblocks = C.int(ns), C.int(nb)
	if ntraces != nil {
		*ntraces = C.int(nt)
	}
	if query {
		return C.SYMM_OK
	}
	if ns > capSegs || nb > capBlocks || nt > capTraces {
		return fail(fn, fmt.Errorf("%w: the arrays hold %d segments, %d blocks and %d trace entries; the snapshot has %d, %d and %d (the counts are written: call again with room to spare)",
			allocator.ErrInvalid, capSegs, capBlocks, capTraces, ns, nb, nt))
	}
	listSegments(snap, unsafe.Slice(segs, capSegs), unsafe.Slice(blocks, capBlocks))
	if ntraces != nil {
		listTraces(snap, unsafe.Slice(traces, capTraces))
	}
	return C.SYMM_OK
}

// listSegments writes snap's segments and their blocks (they fit).
func listSegments(snap *allocator.Snapshot, segs []C.symm_segment_info_t, blocks []C.symm_block_info_t) {
	j := 0
	for i, s := range snap.Segments {
		segs[i] = C.symm_segment_info_t{
			address: C.uint64_t(s.Address), total_size: C.uint64_t(s.TotalSize),
			allocated_size: C.uint64_t(s.AllocatedSize), active_size: C.uint64_t(s.ActiveSize),
			requested_size: C.uint64_t(s.RequestedSize), stream: C.uintptr_t(s.Stream),
			pool_id: C.symm_pool_id_t{first: C.uint64_t(s.PoolID[0]), second: C.uint64_t(s.PoolID[1])},
			device:  C.int32_t(s.Device), nblocks: C.int32_t(len(s.Blocks)),
		}
		if s.SegmentType == "large" {
			segs[i].is_large = 1
		}
		if s.IsExpandable {
			segs[i].is_expandable = 1
		}
		for _, b := range s.Blocks {
			blocks[j] = C.symm_block_info_t{
				address: C.uint64_t(b.Address), size: C.uint64_t(b.Size), requested_size: C.uint64_t(b.RequestedSize),
				stream: C.uintptr_t(s.Stream), segment_address: C.uint64_t(s.Address), state: blockStates[b.State],
			}
			j++
		}
	}
}

// listTraces writes every device's history of snap (it fits).
func listTraces(snap *allocator.Snapshot, out []C.symm_trace_entry_t) {
	j := 0
	for dev, trace := range snap.DeviceTraces {
		for _, t := range trace {
			e := C.symm_trace_entry_t{device: C.int32_t(dev), size: C.uint64_t(t.Size), stream: C.uintptr_t(t.Stream),
				time_us: C.int64_t(t.TimeUS), action: actionCodes[t.Action],
				user_metadata: annotationCString(t.UserMetadata), compile_context: annotationCString(t.CompileContext)}
			if t.Addr != nil {
				e.address = C.uint64_t(*t.Addr)
			} else if t.DeviceFree != nil {
				e.address = C.uint64_t(*t.DeviceFree)
			}
			out[j] = e
			j++
		}
	}
}

// actionCodes maps a trace action's name onto SYMM_TRACE_*.
var actionCodes = func() map[string]C.int32_t {
	m := make(map[string]C.int32_t, len(traceActions))
	for a, c := range traceActions {
		m[allocator.TraceAction(a).String()] = c
	}
	return m
}()

// goPoolSetAnnotation is symm_pool_set_annotation; snapshot.cpp checked
// the pointers.
//
//export goPoolSetAnnotation
func goPoolSetAnnotation(userMetadata, compileContext *C.char) (code C.int) {
	const fn = "symm_pool_set_annotation"
	defer guard(fn, &code)
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	// Measured before the copy: a text over the bound is refused without
	// copying megabytes into Go.
	nm, nc := C.strnlen(userMetadata, allocator.MaxAnnotationLen+1), C.strnlen(compileContext, allocator.MaxAnnotationLen+1)
	if nm > allocator.MaxAnnotationLen || nc > allocator.MaxAnnotationLen {
		return fail(fn, fmt.Errorf("%w: an annotation text is over %d bytes", allocator.ErrInvalid, allocator.MaxAnnotationLen))
	}
	if err := p.SetAnnotation(C.GoStringN(userMetadata, C.int(nm)), C.GoStringN(compileContext, C.int(nc))); err != nil {
		return fail(fn, err)
	}
	return C.SYMM_OK
}

// annotations holds the C copies of the annotation texts that listings
// and segment events have handed out: one per distinct text, never freed
// (symm_trace_entry_t promises them for the life of the process). Texts
// are few in practice (a program's metadata values and compiled regions);
// "" and "N/A" are static.
var annotations struct {
	mu sync.Mutex
	c  map[string]*C.char
}

var (
	cEmpty = C.CString("")
	cNA    = C.CString("N/A")
)

func annotationCString(s string) *C.char {
	switch s {
	case "":
		return cEmpty
	case "N/A":
		return cNA
	}
	annotations.mu.Lock()
	defer annotations.mu.Unlock()
	c, ok := annotations.c[s]
	if !ok {
		if annotations.c == nil {
			annotations.c = make(map[string]*C.char)
		}
		c = C.CString(s)
		annotations.c[s] = c
	}
	return c
}

// allocConf holds the pool's settings text as a C string, made again
// when the text changes (symm_pool_set_allocator_settings) and never freed:
// symm_pool_settings promises it for the life of the process, and the
// settings change a handful of times at most.
var allocConf struct {
	mu sync.Mutex
	s  string
	c  *C.char
}

func allocConfCString(s string) *C.char {
	allocConf.mu.Lock()
	defer allocConf.mu.Unlock()
	if allocConf.c == nil || allocConf.s != s {
		allocConf.s, allocConf.c = s, C.CString(s)
	}
	return allocConf.c
}

//export goPoolSettings
func goPoolSettings(out *C.symm_pool_settings_t) (code C.int) {
	const fn = "symm_pool_settings"
	defer guard(fn, &code)
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	st := p.Settings()
	*out = C.symm_pool_settings_t{max_split_size: C.uint64_t(st.MaxSplit),
		garbage_collection_threshold: C.double(st.GCThreshold), alloc_conf: allocConfCString(st.AllocConf)}
	if st.Expandable {
		out.expandable_segments = 1
	}
	return C.SYMM_OK
}
