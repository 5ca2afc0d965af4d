package allocator

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
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
// On the recorded traces (symm replay --expandable, with and without
// --unmap-free-pages=false) peak reserved over peak allocated goes from
// 1.0026, 1.0044 and 1.067 (GPT-2, ResNet-50, LLM inference) to 1.0008,
// 1.0013 and 1.0063 with 2 MiB chunks, and with the library's 20 MiB ones
// from 1.0034, 1.0026 and 1.070 to 1.0034, 1.0026 and 1.053.
//
// A block handed out over unmapped chunks gets them mapped first (mapFor);
// a failure there is an ordinary out of memory, and what was mapped before
// it stays mapped and booked (the block stays free).
// A free block was last used by work on the shard's stream only (a block
// with record_stream streams is pending until their events complete, never
// free), so its pages may go once the stream has passed its free: each
// free counts (shard.frees, block.freedAt), and a quiet event recorded
// after the latest one tells, when it completes, how far the stream got
// (passed). Mapping never waits for it, not even when it raises the peak of
// reserved bytes: pages not known to be passed stay mapped, and the pool
// maps new memory instead (PyTorch's malloc never waits for GPU progress,
// and a stream may be held by a kernel waiting for a peer this very thread
// is about to meet). Release waits, as for the tails, without s.mu.
// Config.UnmapFreePages switches it on; the library's default
// (ConfigFromEnv) is on, SYMM_POOL_UNMAP_FREE_PAGES=0 turns it off.
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
	if !on && w >= uint64(len(c.bits)) {
		return // never set
	}
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
	if seg.expSeg == nil {
		return 0
	}
	return uint64(seg.holes.n) * chunk
}

// runs calls fn for each maximal run [lo, hi) of chunks inside [from, to)
// (offsets in its segment, multiples of chunk) that are unmapped (mapped
// == false) or mapped (mapped == true).
func (x *expSeg) runs(from, to, chunk uint64, mapped bool, fn func(lo, hi uint64) error) error {
	lo := from
	for off := from; off <= to; off += chunk {
		in := off < to && !x.holes.has(off/chunk) == mapped
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
// of free block b (cutsHigh says from which end). On failure what was
// mapped stays mapped and counted (the block stays free: a free block may
// hold mapped and unmapped chunks alike), and the error says why. Called
// with s.mu held.
func (s *shard) mapFor(b *block, r uint64) error {
	seg := b.seg
	if !seg.hasHoles() {
		return nil
	}
	c := s.dev.expand.chunk
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
	s.makeRoom(span{seg, lo, hi}, want)
	// runs reads the holes ahead of the run it reports; bookMapped changes
	// only that run's, behind it.
	return seg.runs(lo, hi, c, false, func(a, z uint64) error {
		n, err := s.mapRun(seg.ptr+uintptr(a), z-a)
		s.bookMapped(seg, a, a+n)
		return err
	})
}

// bookMapped counts the chunks [lo, hi) of seg, unmapped until now, as
// mapped: out of seg.holes and into the reserved statistics (mapRun has
// counted them against the limit). Called with s.mu held.
func (s *shard) bookMapped(seg *segment, lo, hi uint64) {
	if hi <= lo {
		return
	}
	c := s.dev.expand.chunk
	for off := lo; off < hi; off += c {
		seg.holes.set(off/c, false)
	}
	s.dev.countSegment(seg.kind, int64(hi-lo), 0)
}

// dropRun unmaps the mapped chunks [lo, hi) of seg, which lie wholly inside
// one of its free blocks (below seg.size), and books what it unmapped:
// those chunks become holes of seg (pages.go's invariants) and leave the
// reserved statistics; their memory leaves the limit too, or with keep
// stays counted against it as spare chunks for the mapping the pool is
// about to make (s.kept). It returns the bytes unmapped: hi-lo, or on
// error a prefix (the backend unmaps chunk by chunk), so that after any
// failure the pool's books are what the backend has mapped. Called with
// s.mu held and the capture gate held.
func (s *shard) dropRun(seg *segment, lo, hi uint64, keep bool) (uint64, error) {
	d := s.dev
	t0 := time.Now()
	var n uint64
	var err error
	if keep {
		n, err = d.pool.keeper.KeepChunks(d.idx, seg.ptr+uintptr(lo), hi-lo, d.expand.chunk)
	} else {
		n, err = d.pool.exp.UnmapChunks(d.idx, seg.ptr+uintptr(lo), hi-lo, d.expand.chunk)
	}
	d.unmapped(t0)
	n = min(n, hi-lo) / d.expand.chunk * d.expand.chunk // a backend's word is checked, not trusted
	if err != nil {
		d.counts.numReleaseFailures.Add(1)
		err = fmt.Errorf("unmapping %d free bytes of the expandable segment at %#x on device %d (%d of them unmapped): %w",
			hi-lo, seg.ptr+uintptr(lo), d.idx, n, err)
	}
	if n == 0 {
		return 0, err
	}
	for off := lo; off < lo+n; off += d.expand.chunk {
		seg.holes.set(off/d.expand.chunk, true)
	}
	if keep {
		s.kept += n // still counted against the limit, as spare
	} else {
		d.unreserve(n)
	}
	d.uncountSegment(seg.kind, int64(n), 0)
	s.segmentEvent(ActSegmentUnmap, seg.ptr+uintptr(lo), n)
	return n, err
}

// dropMapped unmaps (dropRun) every mapped chunk of seg in [from, to),
// stopping at the first failure. Called with s.mu held and the gate held.
func (s *shard) dropMapped(seg *segment, from, to uint64) error {
	return seg.runs(from, to, s.dev.expand.chunk, true, func(lo, hi uint64) error {
		_, err := s.dropRun(seg, lo, hi, false)
		return err
	})
}

// unmapped counts one call that unmapped chunks, begun at t0
// (num_chunk_unmaps, chunk_unmap_us).
func (d *device) unmapped(t0 time.Time) {
	d.counts.chunkUnmapNs.Add(int64(time.Since(t0)))
	d.counts.numChunkUnmaps.Add(1)
}

// mapAfterFreeing maps n bytes at ptr (unmapped chunks of one of s's
// expandable segments) after unmapping as many bytes of free pages outside
// but, which that mapping takes first. It returns the bytes mapped from ptr:
// n, or on error a prefix, mapped and counted against the limit, which the
// caller books. Called with s.mu held.
func (s *shard) mapAfterFreeing(but span, ptr uintptr, n uint64) (uint64, error) {
	defer s.dropSpareAfterMapping()
	s.makeRoom(but, n)
	return s.mapRun(ptr, n)
}

// mapRun maps n bytes at ptr, unmapped chunks of one of s's expandable
// segments: with the chunks s keeps spare first, new ones for the rest.
// The bytes mapped are counted against the limit (spare ones are already),
// not in the statistics (the caller books them). It returns how many bytes
// from ptr it mapped: n, or on error a prefix (the spare chunks, when only
// the new ones could not be had), so that nothing needs undoing. Called
// with s.mu held.
func (s *shard) mapRun(ptr uintptr, n uint64) (mapped uint64, err error) {
	d := s.dev
	take := min(s.kept, n)
	if n > take {
		if err := d.reserve(n - take); err != nil {
			return 0, err
		}
	}
	// num_chunk_maps and chunk_map_us count the calls that mapped
	// something: a refused request leaves the statistics as they were,
	// but for its out-of-memory counts.
	t0 := time.Now()
	defer func() {
		if mapped > 0 {
			d.counts.chunkMapNs.Add(int64(time.Since(t0)))
			d.counts.numChunkMaps.Add(1)
		}
	}()
	if take > 0 {
		if err := d.pool.keeper.MapKept(d.idx, ptr, take, d.expand.chunk); err != nil {
			d.unreserve(n - take)
			return 0, fmt.Errorf("expandable segment: mapping %d bytes of spare chunks at %#x on device %d: %w", take, ptr, d.idx, err)
		}
		s.kept -= take
		d.counts.numSpareReused.Add(int64(take / d.expand.chunk))
		s.segmentEvent(ActSegmentMap, ptr, take)
	}
	if n > take {
		if err := d.pool.exp.MapChunks(d.idx, ptr+uintptr(take), n-take, d.expand.chunk); err != nil {
			d.unreserve(n - take)
			return take, fmt.Errorf("expandable segment: mapping %d more bytes at %#x on device %d: %w", n-take, ptr+uintptr(take), d.idx, err)
		}
		s.segmentEvent(ActSegmentMap, ptr+uintptr(take), n-take)
	}
	return n, nil
}

// dropSpare releases the spare chunks s kept that the mapping it made did
// not take, so that the spare is empty between operations. On failure they
// stay counted in s.kept (and against the limit): the next mapping uses
// them, and release tries again and reports it. Called with s.mu held and
// the capture gate held (kept chunks exist only under a hold: makeRoom).
func (s *shard) dropSpare() error {
	n := s.kept
	if n == 0 {
		return nil
	}
	d := s.dev
	if err := d.pool.keeper.ReleaseKept(d.idx, n); err != nil {
		d.counts.numReleaseFailures.Add(1)
		return fmt.Errorf("releasing %d bytes of spare chunks on device %d: %w", n, d.idx, err)
	}
	s.kept = 0
	d.unreserve(n)
	return nil
}

// dropSpareAfterMapping is dropSpare at the end of a mapping, whose
// outcome does not depend on it: chunks that cannot be released stay kept
// and counted (see dropSpare; num_release_failures counts it). No capture
// may begin while chunks are kept: the hold makeRoom took is left here.
func (s *shard) dropSpareAfterMapping() {
	if s.holding {
		_ = s.dropSpare()
		s.holding = false
		s.dev.capture.leave()
	}
}

// page is a run [lo, hi) of mapped chunks of seg (offsets) wholly inside
// one of its free blocks.
type page struct {
	seg    *segment
	lo, hi uint64
}

// freePages lists, up to limit bytes (rounded up to a chunk), the mapped
// chunks that lie wholly inside free blocks of s's expandable segments,
// freed at or before count safe of s.frees, outside but: the longest runs
// first, and of runs as long, the one freed longest ago first (then by
// address). Called with s.mu held.
//
// Why that order: a mapping takes as many bytes of free pages as it maps,
// and which ones decides how often the pool must map them again. A short
// hole between live blocks is soon handed out again and mapped back, at a
// driver call per run either way; a long run costs one call for many
// chunks and is the least likely to be wanted whole again soon. On the
// recorded traces (symm replay --expandable --unmap-free-pages) the peaks
// are the same as in address order, and the calls that map and unmap fall
// from 6,161 and 7,153 to 223 and 148 (LLM inference), 1,255 and 863 to
// 441 and 49 (GPT-2), 4,632 and 4,393 to 533 and 174 (FSDP).
func (s *shard) freePages(limit uint64, but span, safe uint64) (pages []page, total uint64) {
	c := s.dev.expand.chunk
	var runs []freeRun
	for seg := s.segs; seg != nil; seg = seg.snext {
		for b := seg.head; b != nil; b = b.next {
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
				runs = append(runs, freeRun{page{seg, a, z}, b.freedAt})
				return nil
			})
		}
	}
	slices.SortStableFunc(runs, func(x, y freeRun) int {
		if n := cmp.Compare(y.hi-y.lo, x.hi-x.lo); n != 0 {
			return n
		}
		return cmp.Compare(x.freedAt, y.freedAt)
	})
	for _, r := range runs {
		if total >= limit {
			break
		}
		if total+(r.hi-r.lo) > limit {
			r.hi = r.lo + roundUp(limit-total, c)
		}
		pages = append(pages, r.page)
		total += r.hi - r.lo
	}
	return pages, total
}

// freeRun is a page that freePages may choose, with its block's freedAt.
type freeRun struct {
	page
	freedAt uint64
}

// span is a range [lo, hi) of chunk offsets of seg; the zero span is empty.
type span struct {
	seg    *segment
	lo, hi uint64
}

// makeRoom unmaps up to limit bytes of free pages outside but that the
// stream is known to have passed (passed: a quiet event asked, never waited
// for), keeping them as spare chunks for the mapping of limit bytes the
// caller is about to make, which takes them first. It is an optional step:
// it never waits for the stream (PyTorch's malloc never waits for GPU
// progress, and a stream may be held by a kernel waiting for a peer that
// this very thread is about to meet), and a failure only leaves pages
// mapped (counted in num_release_failures) while the mapping goes on with
// new memory. While a graph capture may be under way it does nothing. It
// takes the capture gate when it acts, for as long as chunks are kept:
// dropSpareAfterMapping, which the caller defers, leaves it. Called with
// s.mu held.
func (s *shard) makeRoom(but span, limit uint64) {
	d := s.dev
	if !d.pool.cfg.UnmapFreePages || s.holding || !d.capture.hold() {
		return
	}
	s.holding = true
	s.passed()
	pages, _ := s.freePages(limit, but, s.safe)
	keep := d.pool.keeper != nil
	for _, pg := range pages {
		if _, err := s.dropRun(pg.seg, pg.lo, pg.hi, keep); err != nil {
			return // counted; what was unmapped is booked
		}
	}
}

// unmapFreePages unmaps every free page (freePages) the stream has passed
// by count safe of s.frees, releasing the memory; release calls it after
// waiting for the stream without s.mu (releaseExpandable). Called with
// s.mu held and the capture gate held.
func (s *shard) unmapFreePages(safe uint64) error {
	if !s.dev.pool.cfg.UnmapFreePages {
		return nil
	}
	pages, _ := s.freePages(^uint64(0), span{}, safe)
	for _, pg := range pages {
		if _, err := s.dropRun(pg.seg, pg.lo, pg.hi, false); err != nil {
			return err
		}
	}
	return nil
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
		s.safe = max(s.safe, s.quietTag) // a release may have waited further
	}
}
