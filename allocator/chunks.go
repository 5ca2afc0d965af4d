package allocator

import (
	"fmt"
	"math/bits"
	"time"
)

// The physical chunks of expandable segments: their books (which chunks of
// the granularity are unmapped, which form big chunks: expandable.go's two
// sizes), the runs of one size they form, and mapping and unmapping them,
// with the spare chunks a ChunkKeeper keeps in between. Which free pages go
// and when is pages.go's.

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

// holeRuns calls fn for each maximal run [lo, hi) of unmapped chunks (of
// the granularity c) inside [from, to) (offsets in its segment, multiples
// of c).
func (x *expSeg) holeRuns(from, to, c uint64, fn func(lo, hi uint64) error) error {
	lo := from
	for off := from; off <= to; off += c {
		if off < to && x.holes.has(off/c) {
			continue
		}
		if off > lo {
			if err := fn(lo, off); err != nil {
				return err
			}
		}
		lo = off + c
	}
	return nil
}

// mappedRuns calls fn for each maximal run [lo, hi) of mapped physical
// chunks of one size c inside [from, to) (offsets in seg, multiples of the
// granularity): big chunks (c = g.big) and chunks of the granularity
// (c = g.chunk), in address order. A big chunk that reaches outside
// [from, to) is left out: it unmaps only whole.
func (g expandGeometry) mappedRuns(seg *segment, from, to uint64, fn func(lo, hi, c uint64) error) error {
	var lo, c uint64 // the run being gathered: [lo, off) of chunks of c; c == 0 for none
	off := from
	flush := func() error {
		if c == 0 || off <= lo {
			c = 0
			return nil
		}
		err := fn(lo, off, c)
		c = 0
		return err
	}
	for off < to {
		var next, want uint64 // the end of this chunk; its size when it joins a run
		i := off / g.chunk
		switch {
		case seg.bigStarts.has(i):
			next = off + g.big
			if next <= to {
				want = g.big
			}
		case seg.bigs.has(i): // inside a big chunk begun before from
			next = off + g.chunk
		case seg.holes.has(i):
			next = off + g.chunk
		default:
			next, want = off+g.chunk, g.chunk
		}
		if want != c {
			if err := flush(); err != nil {
				return err
			}
			lo, c = off, want
		}
		off = next
	}
	off = min(off, to)
	return flush()
}

// pieces cuts a run [lo, hi) of unmapped chunks (offsets, multiples of the
// granularity) into the parts that are mapped with one chunk size each:
// every slot of a big chunk (at multiples of g.big from the segment's
// base) wholly inside it as big chunks, the rest as chunks of the
// granularity, in address order; fn stops at its first error.
func (g expandGeometry) pieces(lo, hi uint64, fn func(lo, hi, c uint64) error) error {
	first, last := roundUp(lo, g.big), hi/g.big*g.big
	if g.big == g.chunk || first >= last {
		return fn(lo, hi, g.chunk)
	}
	if lo < first {
		if err := fn(lo, first, g.chunk); err != nil {
			return err
		}
	}
	if err := fn(first, last, g.big); err != nil {
		return err
	}
	if last < hi {
		return fn(last, hi, g.chunk)
	}
	return nil
}

// markBigs marks [lo, hi) of seg (whole big chunks, from lo) as big chunks,
// or unmarks them.
func (g expandGeometry) markBigs(seg *segment, lo, hi uint64, on bool) {
	for off := lo; off < hi; off += g.chunk {
		seg.bigs.set(off/g.chunk, on)
		seg.bigStarts.set(off/g.chunk, on && (off-lo)%g.big == 0)
	}
}

// mapPieces maps the unmapped chunks [lo, hi) of seg (pieces: big chunks
// where a whole slot lies inside, the granularity elsewhere), marking the
// big ones in seg.bigs, and calls booked with what it mapped. It is all or
// nothing, as one MapChunks call is: when a piece cannot be mapped, those
// mapped before it are unmapped again (never used: no stream to wait for),
// so that a refused request leaves the pool and its statistics as they
// were, but for its out-of-memory counts. It returns the bytes mapped from
// lo: hi-lo, 0 on error, or when even that undoing fails a prefix, mapped
// and counted against the limit, which booked has seen. num_chunk_maps and
// chunk_map_us count the calls that mapped something. Called with s.mu
// held.
func (s *shard) mapPieces(seg *segment, lo, hi uint64, booked func(lo, hi uint64)) (uint64, error) {
	d := s.dev
	g := d.expand
	t0 := time.Now()
	var done []page // the pieces mapped, in address order
	err := g.pieces(lo, hi, func(a, z, c uint64) error {
		n, err := s.mapRun(seg.ptr+uintptr(a), z-a, c)
		if n > 0 {
			done = append(done, page{seg, a, a + n, c})
			if c != g.chunk {
				g.markBigs(seg, a, a+n, true)
			}
		}
		return err
	})
	end := lo
	if len(done) > 0 {
		end = done[len(done)-1].hi
	}
	if err != nil {
		end = s.unmapNew(done, lo)
	}
	if end > lo {
		booked(lo, end)
		d.counts.chunkMapNs.Add(int64(time.Since(t0)))
		d.counts.numChunkMaps.Add(1)
	}
	return end - lo, err
}

// unmapNew unmaps the chunks of done (pieces mapped from lo by a mapping
// that failed further on, never handed out), the highest first, one chunk
// per call, releasing their memory and their place against the limit. It
// returns where what stays mapped ends: lo, or after a chunk that would not
// unmap (counted in num_release_failures), that chunk's end, so what stays
// is a prefix. Called with s.mu held.
func (s *shard) unmapNew(done []page, lo uint64) uint64 {
	d := s.dev
	for i := len(done) - 1; i >= 0; i-- {
		pg := done[i]
		for k := (pg.hi - pg.lo) / pg.c; k > 0; k-- {
			off := pg.lo + (k-1)*pg.c
			ptr := pg.seg.ptr + uintptr(off)
			if n, err := d.pool.exp.UnmapChunks(d.idx, ptr, pg.c, pg.c); err != nil || n != pg.c {
				d.counts.numReleaseFailures.Add(1)
				return off + pg.c
			}
			d.unreserve(pg.c)
			if pg.c != d.expand.chunk {
				d.expand.markBigs(pg.seg, off, off+pg.c, false)
			}
			s.segmentEvent(ActSegmentUnmap, ptr, pg.c)
		}
	}
	return lo
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

// dropRun unmaps the mapped chunks [lo, hi) of seg, physical chunks of c
// bytes each (mappedRuns), which lie wholly inside one of its free blocks
// (below seg.size), and books what it unmapped: those chunks become holes
// of seg (pages.go's invariants), big ones leave seg.bigs, and they leave
// the reserved statistics; their memory leaves the limit too, or with keep
// stays counted against it as spare chunks for the mapping the pool is
// about to make (s.kept). It returns the bytes unmapped: hi-lo, or on
// error a prefix (the backend unmaps chunk by chunk), so that after any
// failure the pool's books are what the backend has mapped. Called with
// s.mu held and the capture gate held.
func (s *shard) dropRun(seg *segment, lo, hi, c uint64, keep bool) (uint64, error) {
	d := s.dev
	t0 := time.Now()
	var n uint64
	var err error
	if keep {
		n, err = d.pool.keeper.KeepChunks(d.idx, seg.ptr+uintptr(lo), hi-lo, c)
	} else {
		n, err = d.pool.exp.UnmapChunks(d.idx, seg.ptr+uintptr(lo), hi-lo, c)
	}
	d.unmapped(t0)
	n = min(n, hi-lo) / c * c // a backend's word is checked, not trusted
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
	if c != d.expand.chunk {
		d.expand.markBigs(seg, lo, lo+n, false)
	}
	if keep {
		s.kept[d.expand.sizeIndex(c)] += n // still counted against the limit, as spare
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
	return s.dev.expand.mappedRuns(seg, from, to, func(lo, hi, c uint64) error {
		_, err := s.dropRun(seg, lo, hi, c, false)
		return err
	})
}

// unmapped counts one call that unmapped chunks, begun at t0
// (num_chunk_unmaps, chunk_unmap_us).
func (d *device) unmapped(t0 time.Time) {
	d.counts.chunkUnmapNs.Add(int64(time.Since(t0)))
	d.counts.numChunkUnmaps.Add(1)
}

// mapRun maps n bytes at ptr, unmapped chunks of one of s's expandable
// segments, as physical chunks of c bytes: with the chunks of that size s
// keeps spare first, new ones for the rest. The bytes mapped are counted
// against the limit (spare ones are already), not in the statistics (the
// caller books them). It returns how many bytes from ptr it mapped: n, or
// on error a prefix (the spare chunks, when only the new ones could not be
// had), so that nothing needs undoing. Called with s.mu held.
func (s *shard) mapRun(ptr uintptr, n, c uint64) (uint64, error) {
	d := s.dev
	k := d.expand.sizeIndex(c)
	take := min(s.kept[k], n)
	if n > take {
		if err := d.reserve(n - take); err != nil {
			return 0, err
		}
	}
	if take > 0 {
		if err := d.pool.keeper.MapKept(d.idx, ptr, take, c); err != nil {
			d.unreserve(n - take)
			return 0, fmt.Errorf("expandable segment: mapping %d bytes of spare chunks at %#x on device %d: %w", take, ptr, d.idx, err)
		}
		s.kept[k] -= take
		d.counts.numSpareReused.Add(int64(take / c))
		s.segmentEvent(ActSegmentMap, ptr, take)
	}
	if n > take {
		if err := d.pool.exp.MapChunks(d.idx, ptr+uintptr(take), n-take, c); err != nil {
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
	d := s.dev
	for k, n := range s.kept {
		if n == 0 {
			continue
		}
		c := d.expand.size(k)
		if err := d.pool.keeper.ReleaseKept(d.idx, n, c); err != nil {
			d.counts.numReleaseFailures.Add(1)
			return fmt.Errorf("releasing %d bytes of spare %d-byte chunks on device %d: %w", n, c, d.idx, err)
		}
		s.kept[k] = 0
		d.unreserve(n)
	}
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
