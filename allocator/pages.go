package allocator

import (
	"cmp"
	"slices"
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

// mapFor maps the unmapped chunks under the r bytes that take will hand out
// of free block b (cutsHigh says from which end). On failure the run that
// failed maps nothing (mapPieces) and the runs before it stay mapped and
// counted (the block stays free: a free block may hold mapped and unmapped
// chunks alike), and the error says why. Called with s.mu held.
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
