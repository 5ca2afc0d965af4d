package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
)

// CUDA graph capture, as the pool's graph_capture_record_stream_reuse needs
// it (allocator.CaptureGrapher): free markers, a stream's capture
// dependencies, a node's dependencies. Each uses the edge-data prototype
// (CUDA 12.3) where the driver has it, else CUDA 12.0's. Missing functions
// are a *MissingSymbolError; the pool then keeps the block deferred.

const captureActive = 1 // CU_STREAM_CAPTURE_STATUS_ACTIVE

var _ allocator.CaptureGrapher = (*Backend)(nil)

// pick returns the edge-data variant of a function if the driver has it,
// else the 12.0 one; edges says which.
func (d *driver) pick(edgesID, plainID fnID) (fn unsafe.Pointer, edges C.int, err error) {
	if p := d.fn[edgesID]; p != nil {
		return p, 1, nil
	}
	p, err := d.need(plainID)
	return p, 0, err
}

// MarkFree adds an empty node after stream's capture dependencies and makes
// it the stream's only dependency (allocator.CaptureGrapher). Stream 0, the
// legacy stream, never captures; it is not asked (asking it while another
// stream captures is an error, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
func (b *Backend) MarkFree(dev int, stream uintptr) (allocator.GraphNode, uint64, bool, error) {
	if stream == 0 {
		return 0, 0, false, nil
	}
	d := b.d
	info, ie, err := d.pick(fnStreamGetCaptureInfoEdges, fnStreamGetCaptureInfo)
	if err != nil {
		return 0, 0, false, err
	}
	upd, ue, err := d.pick(fnStreamUpdateCaptureDependenciesEdges, fnStreamUpdateCaptureDependencies)
	if err != nil {
		return 0, 0, false, err
	}
	add, s, err := d.enterFor(fnGraphAddEmptyNode, dev)
	if err != nil {
		return 0, 0, false, err
	}
	o := C.symm_capture_mark(info, ie, add, upd, ue, C.uintptr_t(stream))
	if r := Result(o.r); r != Success {
		name := [...]string{1: "cuStreamGetCaptureInfo", 2: "cuGraphAddEmptyNode", 3: "cuStreamUpdateCaptureDependencies"}[o.step]
		return 0, 0, false, s.leave(fmt.Errorf("%s(stream %#x) on device %d: %w", name, stream, dev, r))
	}
	if o.status != captureActive {
		return 0, 0, false, s.leave(nil)
	}
	return allocator.GraphNode(o.node), uint64(o.id), true, s.leave(nil)
}

// CaptureDeps appends stream's capture dependencies to deps
// (allocator.CaptureGrapher).
func (b *Backend) CaptureDeps(dev int, stream uintptr, deps []allocator.GraphNode) ([]allocator.GraphNode, uint64, bool, error) {
	if stream == 0 {
		return deps, 0, false, nil
	}
	d := b.d
	fn, edges, err := d.pick(fnStreamGetCaptureInfoEdges, fnStreamGetCaptureInfo)
	if err != nil {
		return deps, 0, false, err
	}
	s, err := d.enter(dev)
	if err != nil {
		return deps, 0, false, err
	}
	var id uint64
	deps, capturing, err := appendNodes(deps, func(buf []allocator.GraphNode) (int, bool, error) {
		o := C.symm_cuStreamGetCaptureInfo(fn, edges, C.uintptr_t(stream), nodePtr(buf), C.size_t(len(buf)))
		if r := Result(o.r); r != Success {
			return 0, false, fmt.Errorf("cuStreamGetCaptureInfo(stream %#x) on device %d: %w", stream, dev, r)
		}
		id = uint64(o.id)
		return int(o.n), o.status == captureActive, nil
	})
	if !capturing {
		id = 0
	}
	return deps, id, capturing, s.leave(err)
}

// NodeDeps appends the nodes node depends on to deps
// (allocator.CaptureGrapher).
func (b *Backend) NodeDeps(dev int, node allocator.GraphNode, deps []allocator.GraphNode) ([]allocator.GraphNode, error) {
	d := b.d
	fn, edges, err := d.pick(fnGraphNodeGetDependenciesEdges, fnGraphNodeGetDependencies)
	if err != nil {
		return deps, err
	}
	deps, _, err = appendNodes(deps, func(buf []allocator.GraphNode) (int, bool, error) {
		o := C.symm_cuGraphNodeGetDependencies(fn, edges, C.uintptr_t(node), nodePtr(buf), C.size_t(len(buf)))
		if r := Result(o.r); r != Success {
			return 0, false, fmt.Errorf("cuGraphNodeGetDependencies(node %#x) on device %d: %w", node, dev, r)
		}
		return int(o.n), true, nil
	})
	return deps, err
}

// appendNodes appends to deps the nodes query writes into buf (the room
// deps has left): query returns how many there are, or ok false when there
// is no list (a stream not capturing). When they did not fit, deps grows to
// hold them and query runs again. On error or !ok deps comes back as given.
func appendNodes(deps []allocator.GraphNode, query func(buf []allocator.GraphNode) (n int, ok bool, err error)) ([]allocator.GraphNode, bool, error) {
	base := len(deps)
	for {
		buf := deps[base:cap(deps)]
		n, ok, err := query(buf)
		if err != nil || !ok {
			return deps, false, err
		}
		if n <= len(buf) {
			return deps[:base+n], true, nil
		}
		deps = append(deps[:cap(deps)], make([]allocator.GraphNode, n-len(buf))...)[:base]
	}
}

// nodePtr is buf's first element as the driver's array, nil when empty.
func nodePtr(buf []allocator.GraphNode) *C.uintptr_t {
	if len(buf) == 0 {
		return nil
	}
	return (*C.uintptr_t)(unsafe.Pointer(&buf[0]))
}

// ---- for tests on a GPU ---------------------------------------------------

// beginCapture starts a relaxed-mode capture on stream.
func (d *driver) beginCapture(dev int, stream uintptr) error {
	fn, s, err := d.enterFor(fnStreamBeginCapture, dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuStreamBeginCapture(fn, C.uintptr_t(stream), 2)); r != Success {
		err = fmt.Errorf("cuStreamBeginCapture(stream %#x): %w", stream, r)
	}
	return s.leave(err)
}

// endCapture ends stream's capture and destroys the graph.
func (d *driver) endCapture(dev int, stream uintptr) error {
	end, err := d.need(fnStreamEndCapture)
	if err != nil {
		return err
	}
	destroy, err := d.need(fnGraphDestroy)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	o := C.symm_cuStreamEndCapture(end, C.uintptr_t(stream))
	if r := Result(o.r); r != Success {
		err = fmt.Errorf("cuStreamEndCapture(stream %#x): %w", stream, r)
	} else if r := Result(C.symm_cuGraphDestroy(destroy, C.uintptr_t(o.v))); r != Success {
		err = fmt.Errorf("cuGraphDestroy: %w", r)
	}
	return s.leave(err)
}

// streamWait makes stream wait for ev (cuStreamWaitEvent): during a capture,
// a fork or a join.
func (d *driver) streamWait(dev int, stream, ev uintptr) error {
	fn, s, err := d.enterFor(fnStreamWaitEvent, dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuStreamWaitEvent(fn, C.uintptr_t(stream), C.uintptr_t(ev))); r != Success {
		err = fmt.Errorf("cuStreamWaitEvent(stream %#x, event %#x): %w", stream, ev, r)
	}
	return s.leave(err)
}
