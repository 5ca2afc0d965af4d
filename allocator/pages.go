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
// UnmapFreePages every physical chunk that lies wholly inside a free block
// may be unmapped (the free last block's too), and is:
//   - whenever the pool maps memory (a segment grows, or a block is handed
//     out over unmapped chunks): first as many bytes of free pages as it
//     is about to map, its own stream's first, then those of the device's
//     other streams' expandable segments (each known passed by its own
//     stream), so the memory held follows the live blocks instead of each
//     hole's high mark, and memory one stream freed serves another's
//     growth as an idle fixed segment moves between streams (steal.go);
//   - at release (EmptyCache, the out-of-memory retry): all of them.
//
// On the recorded traces (symm replay --expandable, with and without
// --unmap-free-pages=false) peak reserved over peak allocated goes from
// 1.0026, 1.0044, 1.067 and 1.031 (GPT-2, ResNet-50, LLM inference, FSDP
// with two streams) to 1.0023, 1.0020, 1.0164 and 1.0030 with the
// library's chunks (expandable.go); FSDP was 1.0302 before other streams'
// pages counted.
//
// A block handed out over unmapped chunks gets them mapped first (mapFor);
// a failure there is an ordinary out of memory, and nothing of that
// mapping stays mapped (mapPieces undoes its pieces; the block stays
// free).
// A free block was last used by work on the shard's stream only (a block
// with record_stream streams is pending until their events complete, never
// free), so its pages may go once the stream has passed its free: each
// free counts (shard.frees, block.freedAt), and a quiet event recorded
// after the latest one tells, when it completes, how far the stream got
// (passed). A mapping asks, never waits, but for one case: a growth that
// would raise the device's peak of reserved bytes while unpassed free pages
// of its own stream would cover half of it waits for the stream without
// s.mu, at most Config.FreePagesWait (awaitFreePages: a host running ahead
// of its GPU otherwise never sees a page passed when it maps, and on an
// H100 LLM inference kept 1.053 reserved per allocated byte where replay,
// whose events complete at once, said 1.016). Otherwise pages not known to
// be passed stay mapped, and the pool maps new memory instead (a stream
// may be held by a kernel waiting for a peer this very thread is about to
// meet; the bound caps what that costs). Release waits, as for the tails,
// without s.mu.
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
		for off := pg.hi - pg.c; off+pg.c > pg.lo; off -= pg.c {
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
			if off < pg.c { // off - pg.c would wrap
				break
			}
		}
	}
	return lo
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
	_ = seg.holeRuns(lo, hi, c, func(a, z uint64) error { want += z - a; return nil })
	if want == 0 {
		return nil
	}
	// Free pages elsewhere give back as much as this block takes (not
	// those under it).
	defer s.dropSpareAfterMapping()
	s.makeRoom(span{seg, lo, hi}, want)
	// holeRuns reads the holes ahead of the run it reports; bookMapped
	// changes only that run's, behind it.
	return seg.holeRuns(lo, hi, c, func(a, z uint64) error {
		_, err := s.mapPieces(seg, a, z, func(x, y uint64) { s.bookMapped(seg, x, y) })
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

// mapAfterFreeing maps the n bytes at offset off of seg (unmapped chunks
// beyond its mapped end: a segment growing, or one being made) after
// unmapping as many bytes of free pages outside but, which that mapping
// takes first. It returns the bytes mapped from off: n, or on error a
// prefix, mapped and counted against the limit, which the caller books.
// Called with s.mu held.
func (s *shard) mapAfterFreeing(but span, seg *segment, off, n uint64) (uint64, error) {
	defer s.dropSpareAfterMapping()
	s.makeRoom(but, n)
	return s.mapPieces(seg, off, off+n, func(lo, hi uint64) {})
}

// mapRun maps n bytes at ptr, unmapped chunks of one of s's expandable
// segments, as physical chunks of c bytes: with the chunks of that size s
// keeps spare first, new ones for the rest. The bytes mapped are counted
// against the limit (spare ones are already), not in the statistics (the
// caller books them). It returns how many bytes from ptr it mapped: n, or
// on error a prefix (the spare chunks, when only the new ones could not be
// had), so that nothing needs undoing. Called with s.mu held.
func (s *shard) mapRun(ptr uintptr, n, c uint64) (mapped uint64, err error) {
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

// page is a run [lo, hi) of mapped physical chunks of c bytes of seg
// (offsets) wholly inside one of its free blocks.
type page struct {
	seg       *segment
	lo, hi, c uint64
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
	g := s.dev.expand
	c := g.chunk
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
			add := func(a, z, c uint64) error {
				runs = append(runs, freeRun{page{seg, a, z, c}, b.freedAt})
				return nil
			}
			if seg != but.seg || hi <= but.lo || lo >= but.hi {
				_ = g.mappedRuns(seg, lo, hi, add)
				continue
			}
			// Leave out what is about to be handed out.
			_ = g.mappedRuns(seg, lo, min(hi, but.lo), add)
			_ = g.mappedRuns(seg, max(lo, but.hi), hi, add)
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
			r.hi = r.lo + roundUp(limit-total, r.c)
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

// span is a range [lo, hi) of offsets of seg (multiples of the
// granularity); the zero span is empty.
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
	keep := d.pool.keeper != nil
	got, ok := s.dropPassedPages(but, limit, keep)
	if !ok || got >= limit {
		return
	}
	// The rest from the other streams' expandable segments: memory one
	// stream freed then serves another's growth, as a fixed segment moves
	// between streams once idle (steal.go). A shard whose lock is taken
	// is skipped, so that no two shards wait for each other (the lock
	// order of stealCandidate).
	for _, o := range d.shardList() {
		if got >= limit {
			return
		}
		if o == s || o.pool != nil || !o.src.grows() || !o.mu.TryLock() {
			continue
		}
		n, ok := o.dropPassedPages(span{}, limit-got, keep)
		// What o kept is s's to map: the spare is the device's.
		for k := range o.kept {
			s.kept[k] += o.kept[k]
			o.kept[k] = 0
		}
		o.mu.Unlock()
		got += n
		if !ok {
			return
		}
	}
}

// dropPassedPages unmaps up to limit bytes (rounded up to a chunk) of s's
// free pages outside but that s's stream is known to have passed (passed:
// asked, never waited for), as spare chunks with keep. It returns the bytes
// unmapped, and false after a failure (counted; what was unmapped is
// booked). Called with s.mu held and the capture gate held.
func (s *shard) dropPassedPages(but span, limit uint64, keep bool) (uint64, bool) {
	s.passed()
	pages, _ := s.freePages(limit, but, s.safe)
	var got uint64
	for _, pg := range pages {
		n, err := s.dropRun(pg.seg, pg.lo, pg.hi, pg.c, keep)
		got += n
		if err != nil {
			return got, false
		}
	}
	return got, true
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
		if _, err := s.dropRun(pg.seg, pg.lo, pg.hi, pg.c, false); err != nil {
			return err
		}
	}
	return nil
}

// passed advances s.safe to the frees the stream has passed, without
// waiting: a quiet event is recorded after the latest free when none is
// outstanding, and asked (not waited for) whether it completed. Once one
// has, the next is recorded at once when frees came after it, so that the
// next mapping asks about the stream's progress up to this one rather than
// up to the one before (a mapping that found its event done would
// otherwise record the next only at the following mapping, and the pages
// freed in between would wait two mappings). An event that cannot be
// recorded or asked leaves s.safe as it is: pages then stay mapped, and the
// pool maps new memory instead. Called with s.mu held.
func (s *shard) passed() {
	d := s.dev
	if !s.quietSet && !s.recordQuiet() {
		return
	}
	done, err := d.pool.backend.Query(d.idx, s.quiet)
	if err != nil || done {
		d.putEvent(s.quiet)
		s.quietSet = false
	}
	if err == nil && done {
		s.safe = max(s.safe, s.quietTag) // a release may have waited further
		s.recordQuiet()
	}
}

// recordQuiet records the quiet event after the latest free, when frees
// came after what s.safe covers; it reports whether one is outstanding.
// Called with s.mu held and none outstanding.
func (s *shard) recordQuiet() bool {
	if s.safe == s.frees {
		return false
	}
	ev, err := s.recordOnStream()
	if err != nil {
		return false
	}
	s.quiet, s.quietTag, s.quietSet = ev, s.frees, true
	return true
}

// DefaultFreePagesWait is the library's Config.FreePagesWait: long enough
// for a GPU to drain what a CPU ahead of it has queued in the usual case
// (a stream the host outruns by thousands of small kernels), short enough
// that a stream held by a kernel waiting for a peer this very thread is
// about to meet costs a tenth of a second once per such mapping, after
// which the pool maps new memory as it would have.
const DefaultFreePagesWait = 100 * time.Millisecond

// awaitFreePages lets a growth wait for the free pages its own stream has
// not passed yet, where bytes matter: when mapping r bytes of new memory
// would raise the device's peak of reserved bytes while free pages of s
// that the stream has not been seen to pass would give back at least half
// of them. A host that runs ahead of its GPU (a decode loop that never
// synchronizes) otherwise finds every page it freed still unpassed
// whenever it maps, and its peak is each hole's high mark, as if no page
// were ever unmapped. It records an event on the stream after the latest
// free and waits for it without s.mu, at most Config.FreePagesWait (the
// stream may be held by a kernel waiting for a peer that this thread is
// about to meet), once per count of frees; then it looks for a fit again,
// and the mapping that follows (makeRoom) unmaps what the stream passed.
// Returns a block that fits now, or nil to go on. Called and returns with
// s.mu held.
func (s *shard) awaitFreePages(r uint64, k poolKind) *block {
	d := s.dev
	wait := d.pool.cfg.FreePagesWait
	if wait <= 0 || !d.pool.cfg.UnmapFreePages || !s.src.grows() || s.safe == s.frees || s.waitedTag == s.frees {
		return nil
	}
	res := &d.reserved[stAll]
	if res.cur.Load()+int64(r) <= res.peak.Load() {
		return nil // below the peak: new memory costs no peak bytes
	}
	_, known := s.freePages(r, span{}, s.safe)
	_, all := s.freePages(r, span{}, s.frees)
	if all-known < r/2 {
		return nil
	}
	if !d.capture.hold() {
		return nil // a capture may be under way: no event is recorded
	}
	defer d.capture.leave()
	ev, err := s.recordOnStream()
	if err != nil {
		return nil
	}
	tag := s.frees
	s.waitedTag = tag
	s.mu.Unlock()
	done := d.pollEvent(ev, wait)
	s.mu.Lock()
	if !done {
		return nil
	}
	s.safe = max(s.safe, tag)
	return s.findFree(r, k)
}

// pollEvent reports whether ev completed within limit, asking without
// blocking in the driver (a blocked Sync could not be given up), and
// recycles it. Called without any shard's lock.
func (d *device) pollEvent(ev Event, limit time.Duration) bool {
	t0 := time.Now()
	nap := 20 * time.Microsecond
	for {
		done, err := d.pool.backend.Query(d.idx, ev)
		if err != nil || done || time.Since(t0) >= limit {
			d.putEvent(ev)
			return err == nil && done
		}
		time.Sleep(nap)
		nap = min(2*nap, time.Millisecond)
	}
}
