package allocator

import (
	"fmt"
	"math/bits"
)

// Free pages inside expandable segments (Config.UnmapFreePages).
//
// An expandable segment unmaps only its tail at release, as PyTorch's does;
// a free hole between live blocks keeps its physical chunks. With
// UnmapFreePages every chunk that lies wholly inside a free block may be
// unmapped (the free last block's too), and is:
//   - whenever the pool maps memory (a segment grows, or a block is handed
//     out over unmapped chunks): first as many bytes of free pages
//     elsewhere as it is about to map, so the memory held follows the live
//     blocks instead of each hole's high mark;
//   - at release (EmptyCache, the out-of-memory retry): all of them.
//
// On the recorded traces (symm replay --expandable --unmap-free-pages)
// peak reserved over peak allocated goes from 1.0026, 1.0044 and 1.067
// (GPT-2, ResNet-50, LLM inference) to 1.0008, 1.0013 and 1.0063.
//
// A block handed out over unmapped chunks gets them mapped first (mapFor);
// a failure there is an ordinary out of memory and changes nothing.
// A free block was last used by work on the shard's stream only (a block
// with record_stream streams is pending until their events complete, never
// free), so its pages may go once the stream has passed its free: each
// free counts (shard.frees, block.freedAt), and a quiet event recorded
// after the latest one tells, when it completes, how far the stream got
// (passed). Mapping never waits for it: pages not known to be passed stay
// mapped, and the pool maps new memory instead. Release waits, as for the
// tails. The library does not switch this on yet: the map and unmap calls
// it adds to a training step are still to be measured on a GPU.
//
// Invariants (CheckInvariants): an unmapped chunk of a segment lies below
// seg.size and wholly inside one free block; seg.holes counts them; the
// reserved statistics count seg.size minus the unmapped bytes.

// chunkSet marks the unmapped chunks of a segment, a bit per chunk offset.
type chunkSet struct {
	bits []uint64
	n    int // bits set
}

func (c *chunkSet) has(i uint64) bool {
	w := i / 64
	return w < uint64(len(c.bits)) && c.bits[w]&(1<<(i%64)) != 0
}

func (c *chunkSet) set(i uint64, on bool) {
	w := i / 64
	for uint64(len(c.bits)) <= w {
		c.bits = append(c.bits, 0)
	}
	was := c.bits[w]&(1<<(i%64)) != 0
	switch {
	case on && !was:
		c.bits[w] |= 1 << (i % 64)
		c.n++
	case !on && was:
		c.bits[w] &^= 1 << (i % 64)
		c.n--
	}
}

func (c *chunkSet) count() int {
	n := 0
	for _, w := range c.bits {
		n += bits.OnesCount64(w)
	}
	return n
}

// unmappedBytes is how much of [0, seg.size) is not mapped.
func (seg *segment) unmappedBytes(chunk uint64) uint64 {
	if seg.holes == nil {
		return 0
	}
	return uint64(seg.holes.n) * chunk
}

// runs calls fn for each maximal run [lo, hi) of chunks inside [from, to)
// (offsets in seg, multiples of chunk) that are unmapped (mapped == false)
// or mapped (mapped == true).
func (seg *segment) runs(from, to, chunk uint64, mapped bool, fn func(lo, hi uint64) error) error {
	lo := from
	for off := from; off <= to; off += chunk {
		in := off < to && (seg.holes == nil || !seg.holes.has(off/chunk)) == mapped
		if in {
			continue
		}
		if off > lo {
			if err := fn(lo, off); err != nil {
				return err
			}
		}
		lo = off + chunk
	}
	return nil
}

// mapFor maps the unmapped chunks under the r bytes that take will hand out
// of free block b (cutsHigh says from which end). On failure nothing
// changes. Called with s.mu held.
func (s *shard) mapFor(b *block, r uint64) error {
	seg := b.seg
	if seg.holes == nil || seg.holes.n == 0 {
		return nil
	}
	c := s.dev.chunk
	lo := uint64(b.ptr - seg.ptr)
	if cutsHigh(b, r) {
		lo += b.size - r
	}
	hi := roundUp(lo+r, c)
	lo = lo / c * c
	var want uint64
	_ = seg.runs(lo, hi, c, false, func(a, z uint64) error { want += z - a; return nil })
	if want == 0 {
		return nil
	}
	// Free pages elsewhere give back as much as this block takes (not
	// those under it).
	if _, err := s.unmapFreePagesBut(span{seg, lo, hi}, want, false); err != nil {
		return err
	}
	var done [][2]uint64
	err := seg.runs(lo, hi, c, false, func(a, z uint64) error {
		if err := s.dev.mapChunks(seg.ptr+uintptr(a), z-a, s.stream); err != nil {
			return err
		}
		done = append(done, [2]uint64{a, z})
		return nil
	})
	if err != nil {
		for _, d := range done { // undo: nothing changes on failure
			if uerr := s.unmapRun(seg, d[0], d[1]); uerr != nil {
				return fmt.Errorf("%w (undoing the mapping also failed: %v)", err, uerr)
			}
			s.dev.unreserve(d[1]-d[0], false) // mapChunks counted it against the limit
		}
		return err
	}
	for _, d := range done {
		for off := d[0]; off < d[1]; off += c {
			seg.holes.set(off/c, false)
		}
		s.dev.countSegment(seg.kind, int64(d[1]-d[0]), 0)
	}
	return nil
}

// unmapRun unmaps the mapped chunks [lo, hi) of seg, uncounted: the caller
// accounts for them. Called with s.mu held.
func (s *shard) unmapRun(seg *segment, lo, hi uint64) error {
	d := s.dev
	if err := d.pool.exp.UnmapChunks(d.idx, seg.ptr+uintptr(lo), hi-lo); err != nil {
		return fmt.Errorf("unmapping %d free bytes inside the expandable segment at %#x on device %d: %w", hi-lo, seg.ptr, d.idx, err)
	}
	d.hist.record(ActSegmentUnmap, seg.ptr+uintptr(lo), hi-lo, s.stream)
	return nil
}

// page is a run [lo, hi) of mapped chunks of seg (offsets) wholly inside
// one of its free blocks.
type page struct {
	seg    *segment
	lo, hi uint64
}

// freePages lists, up to limit bytes (rounded up to a chunk), the mapped
// chunks that lie wholly inside free blocks of s's expandable segments
// other than a segment's last block (release trims that one). Called with
// s.mu held.
func (s *shard) freePages(limit uint64, but span) (pages []page, total uint64) {
	c := s.dev.chunk
	for seg := s.segs; seg != nil && total < limit; seg = seg.snext {
		if seg.vsize == 0 {
			continue
		}
		for b := seg.head; b != nil && total < limit; b = b.next {
			if b.state != blockFree || b.freedAt > s.safe { // the stream may still use it
				continue
			}
			lo := roundUp(uint64(b.ptr-seg.ptr), c)
			hi := (uint64(b.ptr-seg.ptr) + b.size) / c * c
			if hi <= lo {
				continue
			}
			_ = seg.runs(lo, hi, c, true, func(a, z uint64) error {
				if seg == but.seg { // leave out what is about to be handed out
					if a < but.lo && z > but.lo {
						z = but.lo
					} else if a >= but.lo && a < but.hi {
						a = min(z, but.hi)
					}
					if z <= a {
						return nil
					}
				}
				if total >= limit {
					return nil
				}
				if total+(z-a) > limit {
					z = a + roundUp(limit-total, c)
				}
				pages = append(pages, page{seg, a, z})
				total += z - a
				return nil
			})
		}
	}
	return pages, total
}

// unmapFreePages unmaps up to limit bytes of free pages (freePages) once the
// work queued on s's stream has completed (waiting for it: release), and
// returns how many bytes it unmapped. While a graph capture may be under
// way it does nothing (no event may be recorded, no memory given back).
// Called with s.mu held; the wait keeps it (this stream's allocations
// wait, as for a pending free).
func (s *shard) unmapFreePages(limit uint64) (uint64, error) {
	return s.unmapFreePagesBut(span{}, limit, true)
}

// span is a range [lo, hi) of chunk offsets of seg; the zero span is empty.
type span struct {
	seg    *segment
	lo, hi uint64
}

// unmapFreePagesBut is unmapFreePages leaving the chunks of but alone; with
// wait false it never waits: only pages freed before the stream's last
// completed quiet event go (passed).
func (s *shard) unmapFreePagesBut(but span, limit uint64, wait bool) (uint64, error) {
	d := s.dev
	if !d.pool.cfg.UnmapFreePages || s.pool != nil || !d.capture.mayRelease() || !d.capture.mayRecord() {
		return 0, nil
	}
	if wait && s.safe < s.frees {
		tag := s.frees
		if err := s.waitForStream(false); err != nil {
			return 0, err
		}
		s.safe = tag
	} else {
		s.passed()
	}
	pages, total := s.freePages(limit, but)
	if total == 0 {
		return 0, nil
	}
	c := d.chunk
	var done uint64
	for _, pg := range pages {
		if err := s.unmapRun(pg.seg, pg.lo, pg.hi); err != nil {
			return done, err
		}
		if pg.seg.holes == nil {
			pg.seg.holes = &chunkSet{}
		}
		for off := pg.lo; off < pg.hi; off += c {
			pg.seg.holes.set(off/c, true)
		}
		n := pg.hi - pg.lo
		d.unreserve(n, true)
		d.reserved[statType(pg.seg.kind)].add(-int64(n))
		d.numDeviceFree.Add(1)
		done += n
	}
	return done, nil
}

// passed advances s.safe to the frees the stream has passed, without
// waiting: a quiet event is recorded after the latest free when none is
// outstanding, and asked (not waited for) whether it completed. An event
// that cannot be recorded or asked leaves s.safe as it is: pages then stay
// mapped, and the pool maps new memory instead. Called with s.mu held.
func (s *shard) passed() {
	d := s.dev
	if !s.quietSet {
		if s.safe == s.frees {
			return
		}
		ev, err := s.recordOnStream()
		if err != nil {
			return
		}
		s.quiet, s.quietTag, s.quietSet = ev, s.frees, true
	}
	done, err := d.pool.backend.Query(d.idx, s.quiet)
	if err != nil || done {
		d.putEvent(s.quiet)
		s.quietSet = false
	}
	if err == nil && done {
		s.safe = s.quietTag
	}
}
