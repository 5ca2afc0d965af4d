package allocator

import (
	"runtime"
	"sync/atomic"
	"time"
)

// gate is a device's one answer to "may a CUDA graph capture be under way
// on any of its streams?", and so to what the pool may do now.
//
// A capture routes the allocations it makes to a private pool between
// BeginAllocateToPool and EndAllocateToPool. The pool cannot see which
// stream captures (a capture may run on a stream the pool never saw), so
// while any routing is open it assumes every stream of the device may be
// capturing, as PyTorch's allocator does while a capture is under way:
//   - no event may be recorded on a stream, queried or waited for (that
//     would invalidate the capture): record_stream frees stay pending,
//     nothing is stolen across streams, pending frees are not processed;
//   - no device memory may be unmapped or given back (cuMemFree, cuMemUnmap,
//     cuMemRelease and the waits before an unmap are forbidden during a
//     global-mode capture): the out-of-memory retry, EmptyCache, the garbage
//     collector and free pages release nothing.
//
// The answer must hold for the whole operation that acts on it, not just at
// the moment it is asked: a capture that begins between "no capture" and
// the cuEventQuery that follows is invalidated all the same. PyTorch gets
// this from one mutex shared by malloc and beginAllocateToPool; the pool
// has no such lock on its cached path, so the gate is a two-counter
// handshake instead:
//
//	hold:  inside++, then read open   (act only if open was 0; leave: inside--)
//	begin: open++,   then wait until inside is 0
//
// Both sides write their own counter before reading the other's (sequentially
// consistent atomics), so either the holder sees the routing and backs off,
// or begin sees the holder and waits for it to leave: no act of a holder
// overlaps a capture that begins after BeginAllocateToPool returns.
// Holders never wait for begin (hold does not block), and begin waits with
// no lock held, so the only thing that ever waits is the thread that starts
// a capture, for operations already under way: what PyTorch's mutex does.
//
// Invariant: open is the number of the device's open routings
// (len(device.routes), routes.go), and total (Pool.routes, shared by the
// pool's devices) the sum of open over them; both change only here, with
// device.privMu held. A holder must not wait for anything
// begin's caller holds while draining: begin drains after privMu is
// unlocked, so holders may take privMu and any shard lock.
type gate struct {
	open   atomic.Int32
	inside atomic.Int32
	total  *atomic.Uint64 // Pool.routes; nil in a gate of its own (tests)
}

// begin opens one routing; called with privMu held. The caller must drain
// once privMu is unlocked, before the routing's capture may begin.
func (g *gate) begin() {
	g.open.Add(1)
	if g.total != nil {
		g.total.Add(1)
	}
}

// drain waits until no operation holds the gate. Called after begin, with
// no lock held: holders are slow-path operations (an event query, a stream
// waited for before an unmap, a segment given back), so it spins briefly,
// then sleeps.
func (g *gate) drain() {
	for i := 0; g.inside.Load() != 0; i++ {
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// end closes n routings; called with privMu held.
func (g *gate) end(n int32) {
	if g.total != nil {
		g.total.Add(^uint64(n - 1)) // minus n; before open drops, so total never reads below the sum
	}
	g.open.Add(-n)
}

// hold reports whether no capture may be under way, and if so keeps that
// true until leave: events may be recorded, queried and waited for, and
// memory unmapped and given back, meanwhile. It never blocks. Every true
// must be matched by one leave; holds nest.
func (g *gate) hold() bool {
	g.inside.Add(1)
	if g.open.Load() != 0 {
		g.inside.Add(-1)
		return false
	}
	return true
}

// leave ends a hold that hold granted.
func (g *gate) leave() { g.inside.Add(-1) }

// routing reports whether a routing is open now: a snapshot, for callers
// that only skip work while it is (and so need no hold).
func (g *gate) routing() bool { return g.open.Load() != 0 }
