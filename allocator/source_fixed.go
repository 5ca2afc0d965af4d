package allocator

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// fixedSource serves fixed segments: each one a single backend allocation
// (cuMemAlloc) of segmentSize bytes, cut into blocks, never resized, given
// back whole once wholly free. The default pool uses it unless
// Config.Expandable is set, and every private pool does.
type fixedSource struct{ p *Pool }

func (f fixedSource) class(n uint64) (uint64, poolKind) {
	r := f.p.rounded(n)
	return r, kindFor(r, f.p.maxSplit())
}

func (fixedSource) caches() bool { return true }
func (fixedSource) grows() bool  { return false }

// cut splits the rest off at the high end when the size rules say it is
// worth keeping apart (shouldSplit); the block keeps the low end, as in
// PyTorch.
func (fixedSource) cut(s *shard, b *block, r uint64) {
	if shouldSplit(b.size, r, b.seg.kind) {
		s.splitTail(b, r)
	}
}

func (fixedSource) newMemory(s *shard, r uint64, k poolKind) (*block, error) {
	return s.newSegment(segmentSize(r, k, s.dev.pool.largeSegSize()), k)
}

func (fixedSource) giveBack(s *shard, seg *segment) (late, err error) {
	d := s.dev
	if err := d.pool.backend.Free(d.idx, seg.ptr, seg.size); err != nil {
		d.counts.numReleaseFailures.Add(1)
		return nil, fmt.Errorf("releasing a %d-byte segment at %#x on device %d: %w", seg.size, seg.ptr, d.idx, err)
	}
	s.segmentEvent(ActSegmentFree, seg.ptr, seg.size)
	return nil, nil
}

// release gives back every idle segment of s: the backend's free orders
// itself after the work queued on the device (Backend.Free), so nothing
// is waited for here. The order is PyTorch's release_cached_blocks', so
// that the segment_free events (and its trace trackers) come in the same
// sequence: large segments before small ones, each by size then address
// (BlockComparatorSize within one stream).
func (fixedSource) release(s *shard) error {
	var errs []error
	s.mu.Lock()
	var idle []*segment
	for seg := s.idle; seg != nil; seg = seg.inext {
		idle = append(idle, seg)
	}
	slices.SortFunc(idle, func(a, b *segment) int {
		if (a.kind == smallPool) != (b.kind == smallPool) {
			if a.kind == smallPool {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.ptr, b.ptr))
	})
	for _, seg := range idle {
		errs = append(errs, s.releaseSegment(seg))
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// newSegment asks the backend for a fixed segment of size bytes of pool k
// and returns its (free, whole) block. Called with s.mu held.
func (s *shard) newSegment(size uint64, k poolKind) (*block, error) {
	return s.newSegmentFrom(size, k, func() (uintptr, error) { return s.dev.pool.backend.Alloc(s.dev.idx, size) })
}

// newSegmentFrom is newSegment with the memory from alloc (a private
// pool's SegmentAllocator, mempools.go).
func (s *shard) newSegmentFrom(size uint64, k poolKind, alloc func() (uintptr, error)) (*block, error) {
	d := s.dev
	if err := d.reserve(size); err != nil {
		return nil, err
	}
	ptr, err := alloc()
	if err != nil {
		d.unreserve(size)
		return nil, err
	}
	d.countSegment(k, int64(size), 1)
	seg := &segment{ptr: ptr, size: size, kind: k}
	s.segmentEvent(ActSegmentAlloc, ptr, size)
	d.pool.byAddr.add(seg)
	s.addSeg(seg)
	b := s.newBlock()
	*b = block{ptr: ptr, size: size, seg: seg}
	seg.head, seg.tail = b, b
	s.insertFree(b)
	s.addIdle(seg)
	return b, nil
}
