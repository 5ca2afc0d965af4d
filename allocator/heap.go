package allocator

import (
	"errors"
	"fmt"
	"slices"
)

// Segments (Go's mheap): the slow path of an allocation, the device's
// reserve, limit and reserved statistics, out of memory, release. Where a
// shard's segments come from and how they go back is its source's
// (source.go).

// allocSlow finds memory when no cached block of this stream fits: an idle
// segment of another stream whose work has completed, else a new segment,
// else (out of memory or over the limit) release every cached segment of
// the device and try once more; the blocks of parked that a front cache
// still holds go back before any of these (AllocAround). Called and
// returns with s.mu held.
func (s *shard) allocSlow(n, r uint64, k poolKind, parked []Parked) (*block, error) {
	if b := s.reclaimParked(r, k, parked); b != nil {
		return b, nil
	}
	if b := s.steal(r, k); b != nil {
		return b, nil
	}
	if b, err := s.collectGarbage(r, k); b != nil || err != nil {
		return b, err
	}
	if b := s.awaitFreePages(r, k); b != nil {
		return b, nil
	}
	b, err := s.src.newMemory(s, r, k)
	if err == nil || !IsOutOfMemory(err) {
		return b, err
	}
	d := s.dev
	d.counts.numAllocRetries.Add(1)
	s.mu.Unlock()
	d.pool.observe(d.idx) // the front cache's blocks too, whatever Holds says
	relErr := d.releaseCached()
	s.mu.Lock()
	if s.src.caches() {
		if b := s.findFree(r, k); b != nil {
			return b, nil
		}
	}
	if b := s.steal(r, k); b != nil {
		return b, nil
	}
	if b, err = s.src.newMemory(s, r, k); err == nil {
		// A release that failed on the way is counted
		// (num_release_failures) and left the books right; the request
		// was served all the same.
		return b, nil
	}
	if !IsOutOfMemory(err) {
		if relErr != nil {
			err = fmt.Errorf("%w (releasing the cache before it also failed: %v)", err, relErr)
		}
		return nil, err
	}
	d.counts.numOOMs.Add(1)
	return nil, d.oomError(s, n, r, k, err, relErr)
}

// reclaimParked takes back the blocks a cache in front of the pool holds
// for this device, when it holds any (parked: those AllocAround was given,
// and the cache's others, Front), and looks for a fit again: the pool
// steals, collects and grows only when even they would not do.
// Default-pool shards only (private pools never see those blocks). Called
// and returns with s.mu held.
func (s *shard) reclaimParked(r uint64, k poolKind, parked []Parked) *block {
	if s.pool != nil || !s.dev.holdsParked(parked) {
		return nil
	}
	s.mu.Unlock()
	back := s.dev.reclaimAll(parked)
	s.mu.Lock()
	if !back {
		return nil
	}
	return s.findFree(r, k)
}

// oomError describes a refused request; called with held's lock held.
func (d *device) oomError(held *shard, n, r uint64, k poolKind, cause, relErr error) error {
	free, total, merr := d.pool.backend.MemInfo(d.idx)
	dev := "unknown"
	if merr == nil {
		dev = fmt.Sprintf("%d of %d bytes free", free, total)
	}
	d.hist.record(ActOOM, uintptr(free), n, held.stream)
	lim := "none"
	if l := d.budget.limit.Load(); l > 0 {
		lim = fmt.Sprintf("%d bytes", l)
	}
	// What the request needed: a fixed segment's size, or in an expandable
	// segment the rounded block (its growth maps at most that).
	need := fmt.Sprintf("a %d-byte segment of the %s", segmentSize(r, k, d.pool.largeSegSize()), k)
	if held.src.grows() {
		need = fmt.Sprintf("a %d-byte block of the %s's expandable segment", r, k)
	}
	msg := fmt.Sprintf("%s: out of memory: requested %d bytes (%s) on device %d: "+
		"pool reserved %d bytes, allocated %d bytes; limit %s; device %s; cause: %v",
		d.pool.backend.Name(), n, need, d.idx,
		d.reserved[stAll].cur.Load(), d.allocatedBytes(held), lim, dev, cause)
	if relErr != nil {
		msg += fmt.Sprintf(" (releasing the cache also failed: %v)", relErr)
	}
	return &oomErr{msg: msg}
}

type oomErr struct{ msg string }

func (e *oomErr) Error() string        { return e.msg }
func (e *oomErr) Is(target error) bool { return target == ErrOutOfMemory }

// errLimit is the cause when the cap, not the device, refuses a segment.
type limitErr struct{ want, reserved, limit uint64 }

func (e *limitErr) Error() string {
	return fmt.Sprintf("pool limit: %d reserved + %d requested > limit %d bytes", e.reserved, e.want, e.limit)
}
func (e *limitErr) OutOfMemory() bool { return true }

// allocatedBytes is allocated_bytes.all.current. held is a shard whose lock
// the caller already holds (or nil).
//
// Lock order: it may take other shards' locks while holding held's, which
// is safe only because it does so while the device is not multi, and a
// device that is not multi has one shard: appendShard switches the device
// to multi (goMulti) before it publishes a second shard, so two callers can
// never each hold one shard's lock and wait for the other's. Once multi,
// the device-wide counters answer and no lock is taken.
func (d *device) allocatedBytes(held *shard) int64 {
	if d.hot.multi.Load() {
		return d.hot.allocBytes.Load()
	}
	var n int64
	for _, s := range d.shardList() {
		if s != held {
			s.mu.Lock()
		}
		n += s.stats.c[stAll].bAlloc - s.stats.c[stAll].bFree
		if s != held {
			s.mu.Unlock()
		}
	}
	return n
}

// reserve counts size against the device's reserved bytes, refusing it if
// the limit would be passed.
func (d *device) reserve(size uint64) error {
	d.budget.reserveMu.Lock()
	defer d.budget.reserveMu.Unlock()
	if l := d.budget.limit.Load(); l > 0 && d.budget.committed+size > l {
		return &limitErr{want: size, reserved: d.budget.committed, limit: l}
	}
	d.budget.committed += size
	return nil
}

// unreserve gives back size bytes counted against the limit by reserve: of
// a segment the backend refused, of memory released, or of spare chunks
// released. The reserved statistics are uncountSegment's.
func (d *device) unreserve(size uint64) {
	d.budget.reserveMu.Lock()
	d.budget.committed -= size
	d.budget.reserveMu.Unlock()
}

// countSegment adds bytes of kind k that one backend call gave (a segment,
// or chunks mapped into one) and segments new segments to the device's
// reserved statistics; d.reserve has already counted the bytes against the
// limit. It and uncountSegment are the only writers of reserved_bytes and
// segment, and of num_device_alloc and num_device_free.
func (d *device) countSegment(k poolKind, bytes int64, segments int64) {
	t := statType(k)
	d.reserved[stAll].add(bytes)
	d.reserved[t].add(bytes)
	d.counts.numDeviceAlloc.Add(1)
	if segments != 0 {
		d.segments[stAll].add(segments)
		d.segments[t].add(segments)
		if k == oversizePool {
			d.oversizeSegs.add(segments)
		}
	}
}

// uncountSegment takes out of the reserved statistics what countSegment
// put in: bytes of kind k that one backend call took back (a segment freed,
// chunks unmapped; 0 when none did: an expandable segment's range goes
// after its chunks were uncounted one unmap at a time) and segments
// segments gone. The limit's side is unreserve's (chunks kept spare stay
// counted against the limit).
func (d *device) uncountSegment(k poolKind, bytes int64, segments int64) {
	t := statType(k)
	if bytes != 0 {
		d.reserved[stAll].add(-bytes)
		d.reserved[t].add(-bytes)
		d.counts.numDeviceFree.Add(1)
	}
	if segments != 0 {
		d.segments[stAll].add(-segments)
		d.segments[t].add(-segments)
		if k == oversizePool {
			d.oversizeSegs.add(-segments)
		}
	}
}

// releaseSegment returns idle segment seg of s to the backend (its
// source's giveBack) and drops it from s and from the statistics. An
// expandable one must be quiet: no work of its stream may still use it
// (releaseExpandable waits for that). When the backend refuses, the segment
// stays, idle, its books what the backend holds, and a later release tries
// again. Called with s.mu held and the capture gate held.
func (s *shard) releaseSegment(seg *segment) error {
	d := s.dev
	// Out of the address map before the backend can hand the range out
	// again (segmap.go's invariant); back in if the segment stays.
	d.pool.byAddr.remove(seg)
	late, err := s.src.giveBack(s, seg)
	if err != nil {
		d.pool.byAddr.add(seg)
		return err
	}
	// What is still counted: a fixed segment's size; nothing of an
	// expandable one, whose chunks giveBack uncounted as it unmapped them.
	mapped := seg.mappedBytes(d.expand.chunk)
	s.removeIdle(seg)
	s.removeFree(seg.head)
	s.removeSeg(seg)
	s.recycle(seg.head)
	seg.head, seg.tail = nil, nil
	d.unreserve(mapped)
	d.uncountSegment(seg.kind, int64(mapped), 1)
	return late
}

// releaseCached waits for every pending block of the device and returns
// every idle segment to the backend; while any private pool of the device is
// routing (a capture may be under way) it does nothing.
//
// It holds the capture gate throughout (a capture that begins meanwhile
// waits for it in BeginAllocateToPool, as PyTorch's capture waits for its
// allocator's mutex), but no lock while it waits for a stream: privMu only
// to list the shards, each shard's lock only between its waits
// (waitPending, the source's release). So another thread's allocation never
// waits for this one's streams; that is the out-of-memory retry's rule too.
func (d *device) releaseCached() error {
	if !d.capture.hold() {
		// A capture may be under way on any stream of the device: the
		// driver forbids freeing (cuMemFree) and the synchronize before an
		// unmap during a global-mode capture, and waiting for pending blocks
		// would record and query events. PyTorch releases nothing while a
		// capture is under way either; the first release after the routings
		// end does it.
		return nil
	}
	defer d.capture.leave()
	// A live graph's memory stays with its pool. A pool found released
	// here may take a use again meanwhile (BeginAllocateToPool), but its
	// capture cannot begin before this returns, and only idle segments go.
	d.privMu.Lock()
	var shards []*shard
	for _, s := range d.shardList() {
		// A source that caches nothing keeps nothing back.
		if s.pool == nil || !s.src.caches() || s.pool.released() {
			shards = append(shards, s)
		}
	}
	d.privMu.Unlock()
	var errs []error
	for _, s := range shards {
		errs = append(errs, s.waitPending())
		errs = append(errs, s.src.release(s))
	}
	d.privMu.Lock()
	d.forgetReleased()
	d.privMu.Unlock()
	d.counts.numSyncAll.Add(1)
	return errors.Join(errs...)
}

// waitPending waits for the record_stream streams of s's pending frees,
// without s.mu (an event recorded on a stream now covers the events its
// pending frees recorded earlier), then releases the blocks whose events
// have completed. Called with the capture gate held, s.mu not held.
func (s *shard) waitPending() error {
	d := s.dev
	var errs []error
	for round := 0; round < 2; round++ { // a second round for events recorded late (processPending)
		s.mu.Lock()
		var streams []uintptr
		for _, pf := range s.pending {
			if !slices.Contains(streams, pf.stream) {
				streams = append(streams, pf.stream)
			}
		}
		s.mu.Unlock()
		if len(streams) == 0 {
			break
		}
		for _, st := range streams {
			ev, err := d.getEvent()
			if err == nil {
				if err = d.pool.backend.Record(d.idx, ev, st); err != nil {
					d.putEvent(ev)
				} else {
					err = d.waitEvent(ev)
				}
			}
			if err != nil {
				d.counts.numReleaseFailures.Add(1)
				errs = append(errs, fmt.Errorf("waiting for stream %#x's pending frees on device %d: %w", st, d.idx, err))
			}
		}
		s.mu.Lock()
		errs = append(errs, s.processPending(false))
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}
