package allocator

import (
	"sync"
	"sync/atomic"
	"time"
)

// Segment events: the backend memory a pool takes and gives back, for a
// watcher outside the pool (PyTorch's allocator trace trackers, through
// which ProcessGroupNCCL registers each new segment with NCCL). The pool
// records them where it already records its history (a segment's
// allocation and free, an expandable segment's mapped and unmapped runs),
// under its shard locks, so it only queues them here; the caller that
// watches takes them (TakeSegmentEvents) once the operation that caused
// them has returned and the pool holds no lock, and hands them on.
//
// Cost: nothing on the cached path (no segment changes there); one atomic
// load per segment event when nobody watches.

// SegmentEvent is one segment event: Action is ActSegmentAlloc,
// ActSegmentFree, ActSegmentMap or ActSegmentUnmap; Addr and Size the
// segment (alloc, free) or the run of chunks (map, unmap); Stream the
// stream the segment serves; Pool its private pool ({0, 0}: the default
// pool, or a torch.cuda.MemPool segment of its own).
type SegmentEvent struct {
	TraceEntry
	Device int
	Pool   PoolID
	// The annotation current when it happened (SetAnnotation's texts; not
	// TraceEntry.Ann, which a compaction may renumber while it is queued).
	UserMetadata, CompileContext string
}

// maxQueuedSegmentEvents bounds the queue when a watcher stops taking:
// beyond it the oldest events are dropped (and counted).
const maxQueuedSegmentEvents = 1 << 16

// segmentWatch is a device's queue of segment events (in its history).
type segmentWatch struct {
	on      atomic.Bool
	queued  atomic.Uint64 // events queued since the pool began, dropped ones too; written under mu
	mu      sync.Mutex    // guards q and dropped; a leaf: taken under shard locks
	q       []SegmentEvent
	dropped uint64
}

// WatchSegments turns the queueing of segment events on or off; off drops
// what is queued.
func (p *Pool) WatchSegments(on bool) {
	for _, d := range p.devs {
		w := &d.hist.watch
		w.mu.Lock()
		w.on.Store(on)
		if !on {
			w.q = nil
		}
		w.mu.Unlock()
	}
}

// SegmentEventsQueued is how many segment events were queued since the
// pool began, over every device: a count that only grows, which
// TakeSegmentEvents returns as it was for what it took.
func (p *Pool) SegmentEventsQueued() uint64 {
	var n uint64
	for _, d := range p.devs {
		n += d.hist.watch.queued.Load()
	}
	return n
}

// TakeSegmentEvents appends the queued segment events to dst, device by
// device, each device's oldest first, and empties the queues. It returns
// them with seq, SegmentEventsQueued as far as the events taken (and
// dropped) go, and how many were dropped since the last take.
func (p *Pool) TakeSegmentEvents(dst []SegmentEvent) (evs []SegmentEvent, seq, dropped uint64) {
	for _, d := range p.devs {
		w := &d.hist.watch
		w.mu.Lock()
		dst = append(dst, w.q...)
		w.q = w.q[:0]
		dropped += w.dropped
		w.dropped = 0
		seq += w.queued.Load()
		w.mu.Unlock()
	}
	return dst, seq, dropped
}

// segmentEvent records a segment event of s in the device's history and,
// when watched, in the pool's queue. Called with s.mu held.
func (s *shard) segmentEvent(a TraceAction, ptr uintptr, size uint64) {
	d := s.dev
	d.hist.record(a, ptr, size, s.stream)
	w := &d.hist.watch
	if !w.on.Load() {
		return
	}
	ann := d.pool.annots.currentPair()
	e := SegmentEvent{TraceEntry: TraceEntry{Action: a, Addr: ptr, Size: size, Stream: s.stream, TimeUS: time.Now().UnixMicro()},
		Device: d.idx, UserMetadata: ann.meta, CompileContext: ann.compile}
	if s.pool != nil && !s.pool.direct {
		e.Pool = s.pool.id
	}
	w.mu.Lock()
	if w.on.Load() {
		if len(w.q) >= maxQueuedSegmentEvents {
			w.q = append(w.q[:0], w.q[1:]...)
			w.dropped++
		}
		w.q = append(w.q, e)
		w.queued.Add(1)
	}
	w.mu.Unlock()
}
