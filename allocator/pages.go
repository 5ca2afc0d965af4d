package allocator

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
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
// tails. SYMM_POOL_UNMAP_FREE_PAGES=1 switches it on (off by default).
//
// With a backend that keeps chunks (ChunkKeeper), pages unmapped to make
// room for a mapping are kept as spare chunks and that mapping takes them
// first (mapRun), so moving memory costs an unmap and a map, no release and
// create; what the mapping did not take is released before the operation
// returns (dropSpare): the spare is empty between operations.
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

// mappedBytes is how much of [0, seg.size) is mapped: what the segment
// holds of the device's memory.
func (seg *segment) mappedBytes(chunk uint64) uint64 { return seg.size - seg.unmappedBytes(chunk) }

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
	defer s.dropSpareAfterMapping()
	if _, err := s.unmapFreePagesBut(span{seg, lo, hi}, want, false); err != nil {
		return err
	}
	var done [][2]uint64
	err := seg.runs(lo, hi, c, false, func(a, z uint64) error {
		if err := s.mapRun(seg.ptr+uintptr(a), z-a); err != nil {
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
			s.dev.unreserve(d[1]-d[0], false) // mapRun counted it against the limit
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
	if err := d.unmapChunks(seg.ptr+uintptr(lo), hi-lo); err != nil {
		return fmt.Errorf("unmapping %d free bytes of the expandable segment at %#x on device %d: %w", hi-lo, seg.ptr, d.idx, err)
	}
	d.hist.record(ActSegmentUnmap, seg.ptr+uintptr(lo), hi-lo, s.stream)
	return nil
}

// keepRun unmaps the mapped chunks [lo, hi) of seg into s's spare
// (Pool.keeper), uncounted, and returns how many bytes from lo it kept: all
// of them, or on error a prefix. Called with s.mu held.
func (s *shard) keepRun(seg *segment, lo, hi uint64) (uint64, error) {
	d := s.dev
	t0 := time.Now()
	kept, err := d.pool.keeper.KeepChunks(d.idx, seg.ptr+uintptr(lo), hi-lo)
	d.unmapped(t0)
	if kept > 0 {
		d.hist.record(ActSegmentUnmap, seg.ptr+uintptr(lo), kept, s.stream)
	}
	if err != nil {
		err = fmt.Errorf("unmapping %d free bytes inside the expandable segment at %#x on device %d into spare chunks: %w", hi-lo, seg.ptr, d.idx, err)
	}
	return kept, err
}

// raisesPeak reports whether mapping n more bytes would raise the device's
// peak of reserved bytes.
func (d *device) raisesPeak(n uint64) bool {
	r := &d.reserved[stAll]
	return r.cur.Load()+int64(n) > r.peak.Load()
}

// unmapChunks unmaps n bytes at ptr of an expandable segment, timed and
// counted (unmapped).
func (d *device) unmapChunks(ptr uintptr, n uint64) error {
	t0 := time.Now()
	err := d.pool.exp.UnmapChunks(d.idx, ptr, n)
	d.unmapped(t0)
	return err
}

// unmapped counts one call that unmapped chunks, begun at t0
// (num_chunk_unmaps, chunk_unmap_us).
func (d *device) unmapped(t0 time.Time) {
	d.chunkUnmapNs.Add(int64(time.Since(t0)))
	d.numChunkUnmaps.Add(1)
}

// mapAfterFreeing maps n bytes at ptr (unmapped chunks of one of s's
// expandable segments) after unmapping as many bytes of free pages outside
// but, which that mapping takes first. Called with s.mu held.
func (s *shard) mapAfterFreeing(but span, ptr uintptr, n uint64) error {
	defer s.dropSpareAfterMapping()
	if _, err := s.unmapFreePagesBut(but, n, false); err != nil {
		return err
	}
	return s.mapRun(ptr, n)
}

// mapRun maps n bytes at ptr, unmapped chunks of one of s's expandable
// segments: with the chunks s keeps spare first, new ones for the rest.
// The new bytes are counted against the limit (spare ones are already),
// not in the statistics (countSegment does that). On failure nothing is
// mapped or counted and the spare is as it was. Called with s.mu held.
func (s *shard) mapRun(ptr uintptr, n uint64) error {
	d := s.dev
	take := min(s.kept, n)
	if n > take {
		if err := d.reserve(n - take); err != nil {
			return err
		}
	}
	t0 := time.Now()
	defer func() { d.chunkMapNs.Add(int64(time.Since(t0))) }()
	d.numChunkMaps.Add(1)
	if take > 0 {
		if err := d.pool.keeper.MapKept(d.idx, ptr, take); err != nil {
			d.unreserve(n-take, false)
			return fmt.Errorf("expandable segment: mapping %d bytes of spare chunks at %#x on device %d: %w", take, ptr, d.idx, err)
		}
	}
	if n > take {
		if err := d.pool.exp.MapChunks(d.idx, ptr+uintptr(take), n-take); err != nil {
			d.unreserve(n-take, false)
			err = fmt.Errorf("expandable segment: mapping %d more bytes at %#x on device %d: %w", n-take, ptr+uintptr(take), d.idx, err)
			if take > 0 {
				err = errors.Join(err, s.unmapSpareAgain(ptr, take))
			}
			return err
		}
	}
	s.kept -= take
	d.numSpareReused.Add(int64(take / d.chunk))
	d.hist.record(ActSegmentMap, ptr, n, s.stream)
	return nil
}

// unmapSpareAgain undoes MapKept of n bytes at ptr: the chunks go back to
// the spare, or, those that cannot, are unmapped and released. Called with
// s.mu held.
func (s *shard) unmapSpareAgain(ptr uintptr, n uint64) error {
	d := s.dev
	kept, err := d.pool.keeper.KeepChunks(d.idx, ptr, n)
	if err == nil {
		return nil
	}
	// The chunks after the kept prefix are still mapped: they leave the
	// spare, released.
	err = fmt.Errorf("undoing a mapping of spare chunks: %w", err)
	rest := n - kept
	s.kept -= rest
	if uerr := d.pool.exp.UnmapChunks(d.idx, ptr+uintptr(kept), rest); uerr != nil {
		return fmt.Errorf("%w; unmapping them also failed, %d bytes stay mapped unused: %v", err, rest, uerr)
	}
	d.unreserve(rest, false)
	return err
}

// dropSpare releases the spare chunks s kept that the mapping it made did
// not take, so that the spare is empty between operations. On failure they
// stay counted in s.kept (and against the limit): the next mapping uses
// them, and release tries again and reports it. Called with s.mu held.
func (s *shard) dropSpare() error {
	n := s.kept
	if n == 0 {
		return nil
	}
	d := s.dev
	if err := d.pool.keeper.ReleaseKept(d.idx, n); err != nil {
		return fmt.Errorf("releasing %d bytes of spare chunks on device %d: %w", n, d.idx, err)
	}
	s.kept = 0
	d.unreserve(n, false)
	return nil
}

// dropSpareAfterMapping is dropSpare at the end of a mapping, whose
// outcome does not depend on it: chunks that cannot be released stay kept
// and counted (see dropSpare).
func (s *shard) dropSpareAfterMapping() { _ = s.dropSpare() }

// page is a run [lo, hi) of mapped chunks of seg (offsets) wholly inside
// one of its free blocks.
type page struct {
	seg    *segment
	lo, hi uint64
}

// freePages lists, up to limit bytes (rounded up to a chunk), the mapped
// chunks that lie wholly inside free blocks of s's expandable segments
// other than a segment's last block (release trims that one), freed at or
// before count safe of s.frees. Called with s.mu held.
func (s *shard) freePages(limit uint64, but span, safe uint64) (pages []page, total uint64) {
	c := s.dev.chunk
	for seg := s.segs; seg != nil && total < limit; seg = seg.snext {
		if seg.vsize == 0 {
			continue
		}
		for b := seg.head; b != nil && total < limit; b = b.next {
			if b.state != blockFree || b.freedAt > safe { // the stream may still use it
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

// unmapFreePagesBut is unmapFreePages leaving the chunks of but alone. With
// wait false (a mapping of limit bytes is about to be made) only pages
// freed before the stream's last completed quiet event go (passed), unless
// the mapping would raise the device's peak of reserved bytes and waiting
// for the stream would free pages that are not known to be passed yet:
// then it waits, as release does. A peak is set once, during the first
// steps of a training loop, so this wait is rare, while a hole freed
// moments ago is exactly what a mapping at the peak needs (on a GPU the
// stream is usually still running the work that freed it).
func (s *shard) unmapFreePagesBut(but span, limit uint64, wait bool) (uint64, error) {
	d := s.dev
	if !d.pool.cfg.UnmapFreePages || s.pool != nil || !d.capture.mayRelease() || !d.capture.mayRecord() {
		return 0, nil
	}
	mapping := !wait
	if mapping {
		s.passed()
		if s.safe < s.frees && d.raisesPeak(limit) {
			_, passed := s.freePages(limit, but, s.safe)
			_, all := s.freePages(limit, but, s.frees)
			wait = all > passed
		}
	}
	if wait && s.safe < s.frees {
		tag := s.frees
		if err := s.waitForStream(false); err != nil {
			return 0, err
		}
		s.safe = tag
		if mapping {
			d.numPeakWaits.Add(1)
		}
	}
	pages, total := s.freePages(limit, but, s.safe)
	if total == 0 {
		return 0, nil
	}
	c := d.chunk
	// Pages unmapped to make room for a mapping are kept for it (spare
	// chunks), those unmapped at release are released.
	keep := mapping && d.pool.keeper != nil
	var done uint64
	for _, pg := range pages {
		n, err := pg.hi-pg.lo, error(nil)
		if keep {
			n, err = s.keepRun(pg.seg, pg.lo, pg.hi)
		} else if err = s.unmapRun(pg.seg, pg.lo, pg.hi); err != nil {
			n = 0
		}
		if n > 0 {
			if pg.seg.holes == nil {
				pg.seg.holes = &chunkSet{}
			}
			for off := pg.lo; off < pg.lo+n; off += c {
				pg.seg.holes.set(off/c, true)
			}
			if keep { // still counted against the limit, as spare
				s.kept += n
				d.reserved[stAll].add(-int64(n))
			} else {
				d.unreserve(n, true)
			}
			d.reserved[statType(pg.seg.kind)].add(-int64(n))
			d.numDeviceFree.Add(1)
			done += n
		}
		if err != nil {
			return done, err
		}
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
