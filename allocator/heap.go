package allocator

import (
	"errors"
	"fmt"
)

// Segments (Go's mheap): the slow path of an allocation, segments from the
// backend and back, the device's reserve and limit, out of memory, release.

// allocSlow finds memory when no cached block of this stream fits: an idle
// segment of another stream whose work has completed, else a new segment,
// else (out of memory or over the limit) release every cached segment of
// the device and try once more. Called and returns with s.mu held.
func (s *shard) allocSlow(n, r uint64, k poolKind) (*block, error) {
	if b := s.steal(r, k); b != nil {
		return b, nil
	}
	if b := s.reclaimParked(r, k); b != nil {
		return b, nil
	}
	if b, err := s.collectGarbage(r, k); b != nil || err != nil {
		return b, err
	}
	b, err := s.newMemory(r, k)
	if err == nil || !IsOutOfMemory(err) {
		return b, err
	}
	d := s.dev
	d.numAllocRetries.Add(1)
	s.mu.Unlock()
	if rc := d.pool.cfg.Reclaim; rc != nil {
		rc(d.idx)
	}
	relErr := d.releaseCached()
	s.mu.Lock()
	if !s.direct {
		if b := s.findFree(r, k); b != nil {
			return b, nil
		}
	}
	if b := s.steal(r, k); b != nil {
		return b, nil
	}
	if b, err = s.newMemory(r, k); err == nil {
		return b, nil
	}
	if !IsOutOfMemory(err) {
		return nil, err
	}
	d.numOOMs.Add(1)
	return nil, d.oomError(s, n, r, k, err, relErr)
}

// reclaimParked takes back the blocks a cache in front of the pool holds
// for this device, when it holds any, and looks for a fit again: the pool
// grows only when even they would not do. Default-pool shards only (private
// pools never see those blocks). Called and returns with s.mu held.
func (s *shard) reclaimParked(r uint64, k poolKind) *block {
	cfg := &s.dev.pool.cfg
	if s.pool != nil || cfg.Reclaim == nil || cfg.Parked == nil || !cfg.Parked(s.dev.idx) {
		return nil
	}
	s.mu.Unlock()
	cfg.Reclaim(s.dev.idx)
	s.mu.Lock()
	if b := s.findFree(r, k); b != nil {
		return b
	}
	return s.steal(r, k)
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
	if l := d.limit.Load(); l > 0 {
		lim = fmt.Sprintf("%d bytes", l)
	}
	msg := fmt.Sprintf("%s: out of memory: requested %d bytes (a %d-byte segment of the %s) on device %d: "+
		"pool reserved %d bytes, allocated %d bytes; limit %s; device %s; cause: %v",
		d.pool.backend.Name(), n, segmentSize(r, k), k, d.idx,
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

// newSegment asks the backend for a segment that fits r and returns its
// (free, whole) block. Called with s.mu held.
func (s *shard) newSegment(r uint64, k poolKind) (*block, error) {
	d := s.dev
	size := segmentSize(r, k)
	if s.direct {
		size = r // PyTorch's caching allocator above already chose the segment's size
	}
	if err := d.reserve(size); err != nil {
		return nil, err
	}
	ptr, err := d.pool.backend.Alloc(d.idx, size)
	if err != nil {
		d.unreserve(size, false)
		return nil, err
	}
	d.countSegment(k, int64(size), 1)
	seg := &segment{ptr: ptr, size: size, kind: k}
	d.hist.record(ActSegmentAlloc, ptr, size, s.stream)
	s.addSeg(seg)
	b := s.newBlock()
	*b = block{ptr: ptr, size: size, seg: seg}
	seg.head, seg.tail = b, b
	s.insertFree(b)
	s.addIdle(seg)
	return b, nil
}

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
	d.reserveMu.Lock()
	defer d.reserveMu.Unlock()
	if l := d.limit.Load(); l > 0 && d.committed+size > l {
		return &limitErr{want: size, reserved: d.committed, limit: l}
	}
	d.committed += size
	return nil
}

// unreserve gives back a reservation: of a segment the backend refused
// (counted=false) or of one released (counted=true, in the statistics too).
func (d *device) unreserve(size uint64, counted bool) {
	d.reserveMu.Lock()
	d.committed -= size
	d.reserveMu.Unlock()
	if counted {
		d.reserved[stAll].add(-int64(size))
	}
}

// releaseSegment returns idle segment seg of s to the backend. An
// expandable one must be quiet: no work of its stream may still use it
// (releaseExpandable waits for that).
func (s *shard) releaseSegment(seg *segment) error {
	d := s.dev
	var rangeErr error
	mapped := seg.mappedBytes(d.chunk)
	if seg.vsize != 0 {
		err := seg.runs(0, seg.size, d.chunk, true, func(lo, hi uint64) error {
			return d.unmapChunks(seg.ptr+uintptr(lo), hi-lo)
		})
		if err != nil {
			return fmt.Errorf("unmapping a %d-byte expandable segment at %#x on device %d: %w", seg.size, seg.ptr, d.idx, err)
		}
		// The memory is gone with the unmap; a range that cannot be given
		// back leaks address space only, so the segment goes all the same.
		rangeErr = d.pool.exp.FreeRange(d.idx, seg.ptr, seg.vsize)
		d.hist.record(ActSegmentUnmap, seg.ptr, seg.size, s.stream)
		for k := range s.grow {
			if s.grow[k] == seg {
				s.grow[k] = nil
			}
		}
	} else {
		if err := d.pool.backend.Free(d.idx, seg.ptr, seg.size); err != nil {
			return fmt.Errorf("releasing a %d-byte segment at %#x on device %d: %w", seg.size, seg.ptr, d.idx, err)
		}
		d.hist.record(ActSegmentFree, seg.ptr, seg.size, s.stream)
	}
	s.removeIdle(seg)
	s.removeFree(seg.head)
	s.removeSeg(seg)
	s.recycle(seg.head)
	seg.head, seg.tail = nil, nil
	t := statType(seg.kind)
	d.unreserve(mapped, true)
	d.reserved[t].add(-int64(mapped))
	d.segments[stAll].add(-1)
	d.segments[t].add(-1)
	if seg.kind == oversizePool {
		d.oversizeSegs.add(-1)
	}
	d.numDeviceFree.Add(1)
	if rangeErr != nil {
		return fmt.Errorf("giving back the address range of an expandable segment at %#x on device %d: %w", seg.ptr, d.idx, rangeErr)
	}
	return nil
}

// releaseCached waits for every pending block of the device and returns
// every idle segment to the backend; while any private pool of the device is
// routing (a capture may be under way) it does nothing.
func (d *device) releaseCached() error {
	var errs []error
	// privMu keeps every private pool's released state put meanwhile.
	d.privMu.Lock()
	defer d.privMu.Unlock()
	if !d.capture.mayRelease() {
		// A capture may be under way on any stream of the device: the
		// driver forbids freeing (cuMemFree) and the synchronize before an
		// unmap during a global-mode capture, and waiting for pending blocks
		// would record and query events. PyTorch releases nothing while a
		// capture is under way either; the first release after the routings
		// end does it.
		return nil
	}
	for _, s := range d.shardList() {
		if s.pool != nil && !s.direct && !s.pool.released() {
			continue // a live graph's memory stays with its pool
		}
		s.mu.Lock()
		if len(s.pending) > 0 {
			if err := s.processPending(true); err != nil {
				errs = append(errs, err)
			}
		}
		for seg := s.idle; seg != nil; {
			next := seg.inext
			if seg.vsize == 0 { // expandable ones go below, after their stream
				if err := s.releaseSegment(seg); err != nil {
					errs = append(errs, err)
				}
			}
			seg = next
		}
		s.mu.Unlock()
		if s.expandable {
			if err := s.releaseExpandable(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	d.forgetReleased()
	d.numSyncAll.Add(1)
	return errors.Join(errs...)
}
