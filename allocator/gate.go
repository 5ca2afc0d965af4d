package allocator

import "sync/atomic"

// gate is a device's one answer to "may a CUDA graph capture be under way
// on any of its streams?", and so to what the pool may do now.
//
// A capture routes the allocations it makes to a private pool between
// BeginAllocateToPool and EndAllocateToPool. The pool cannot see which
// stream captures (a capture may run on a stream the pool never saw), so
// while any routing is open it assumes every stream of the device may be
// capturing, as PyTorch's allocator does while a capture is under way:
//   - no event may be recorded on a stream or queried (that would invalidate
//     the capture): record_stream frees stay pending, nothing is stolen
//     across streams, pending frees are not processed;
//   - no device memory may be given back (cuMemFree and the waits before an
//     unmap are forbidden during a global-mode capture): the out-of-memory
//     retry, EmptyCache and the garbage collector release nothing.
//
// Invariant: open is the sum of privatePool.active over the device. It
// changes only with device.privMu held, so a caller that holds privMu and
// finds the gate closed (mayRelease) keeps that answer until it unlocks;
// callers without privMu (the cached path) read a snapshot, which is safe
// because each of them only skips work while the gate is open.
type gate struct {
	open atomic.Int32
}

// begin and end open and close one routing; called with privMu held.
func (g *gate) begin()      { g.open.Add(1) }
func (g *gate) end(n int32) { g.open.Add(-n) }

// mayRecord reports whether events may be recorded and queried now.
func (g *gate) mayRecord() bool { return g.open.Load() == 0 }

// mayRelease reports whether device memory may be given back now; the
// answer holds while the caller holds privMu.
func (g *gate) mayRelease() bool { return g.open.Load() == 0 }
