package allocator

// Front is a cache in front of the pool: a level of its own above the
// shards, as the Go runtime's per-P mcache sits above its central lists.
// export/'s front cache (export/front.cpp, in C so that a cached alloc and
// free never enter Go) is the one libsymm uses when SYMM_POOL_FRONT_CACHE=1
// turns it on; by default it is off and Config.Front is nil. Where it
// serves few requests it steps aside for a while, its blocks back in the
// pool, and the pool serves every call as with no front cache.
//
// The contract between the two levels:
//
//   - The front cache hands out only blocks the pool placed, and keeps
//     blocks its callers freed ("parked") until it reuses or returns them.
//     To the pool a parked block is allocated: the pool alone owns every
//     block's state, and judges every free it receives (an unknown pointer,
//     a double free, a size or device that does not match). A front cache
//     that sees a free of a block it holds parked returns that block first
//     and hands the free on, so that the pool answers it.
//   - Whatever reads the pool as its callers see it (statistics, listings,
//     snapshots, record_stream) or releases its cache calls Pool.observe
//     first, which has the front cache return its blocks: the pool then
//     counts them free.
//   - A miss (AllocAround) gives back first the parked blocks of the bins
//     the request reads (its device, stream and pool); the others stay
//     parked. Before the pool steals, collects or takes new memory, and
//     when the request could raise a peak, it takes back every parked block
//     of the device and looks for a fit again (heap.go): a parked block
//     never makes the pool grow, and every peak is the pool's own. Before
//     the out-of-memory retry it takes them back whatever Holds says.
//
// Methods are called with no pool lock held, from any goroutine; Return
// calls Pool.Free for each block.
type Front interface {
	// Holds reports whether the cache holds blocks of device dev (-1: of
	// any device). A hint read without locks, except that the calling
	// thread's own frees are always seen.
	Holds(dev int) bool
	// Return hands every block of dev (-1: every device) that the cache
	// holds when it begins back to the pool, through Pool.Free.
	Return(dev int)
	// Served reports what the cache served itself on dev since the process
	// began: requests it answered with a block it held, each also a free
	// the pool never saw. Stats counts them in the cumulative allocated and
	// freed figures, as PyTorch counts every malloc and free.
	Served(dev int) FrontCounts
}

// FrontCounts is, per statistics type (1 small_pool, 2 large_pool; 0
// unused), how many requests a cache in front of the pool served, their
// blocks' bytes and their requested bytes.
type FrontCounts [numStatTypes]struct{ N, Bytes, Req int64 }

// observe has the front cache, if any, return its blocks of dev (-1: every
// device), so that what the caller reads or releases next is the pool as
// its callers see it: a parked block was freed by its caller. The one
// place that answers "drain the front cache before reading"; dev must be
// valid (or -1).
func (p *Pool) observe(dev int) {
	if f := p.cfg.Front; f != nil {
		f.Return(dev)
	}
}

// reclaim has the front cache return its blocks of dev if it holds any,
// and reports whether it did (heap.go: before the pool grows).
func (p *Pool) reclaim(dev int) bool {
	f := p.cfg.Front
	if f == nil || !f.Holds(dev) {
		return false
	}
	f.Return(dev)
	return true
}

// Parked is a block a front cache holds parked, as it shows it to
// AllocAround: allocated as far as the pool can see, freed by its caller.
type Parked struct {
	Ptr    uintptr
	Req    uint64  // the size it was allocated with
	Stream uintptr // the stream it was allocated for
	Type   int     // its statistics type (Placement.Type)
	// Back is set by AllocAround when it freed the block into the pool: the
	// cache no longer holds it. Blocks left false stay parked.
	Back bool
}

// AllocAround is Alloc for a request that a front cache in front of the
// pool could not serve while it holds the blocks of parked (every block it
// holds of device dev, allocated as far as the pool can see). The rule
// that keeps what the pool places, and every peak it reaches, those of the
// pool alone with every parked block freed, while the cache keeps blocks
// that a later request of their size reuses:
//
//   - Before the pool places the request, the parked blocks of the
//     request's stream and pool (RequestType: small or large) go back (are
//     freed, Back set): those are the bins the best fit reads. A block of
//     another stream or pool lies in bins this request never reads, so it
//     cannot change where the request goes.
//   - All of them go back, and the cache's other blocks of the device too
//     (Front.Return), before the pool steals a segment of another stream,
//     collects idle segments or takes memory (a new segment, chunks mapped,
//     free pages mapped again), and whenever the request, counted with the
//     blocks still parked as allocated, could raise a peak of the shard's
//     or the device's block statistics (allocation, allocated, requested,
//     active): so every peak is reached with nothing parked, and is the
//     pool's own.
//
// export/front.cpp applies the first rule itself when it takes blocks out
// of its slots for a miss (and passes none here); internal/trace's model
// passes all of its own. Called with no pool lock held.
func (p *Pool) AllocAround(dev int, stream uintptr, size uint64, parked []Parked) (uintptr, Placement, error) {
	if size == 0 {
		return 0, Placement{}, nil
	}
	if dev < 0 || dev >= len(p.devs) || size > maxRequest {
		return 0, Placement{}, p.badRequest(dev, size)
	}
	s := p.devs[dev].shardFor(stream)
	if len(parked) > 0 {
		_, k := s.src.class(size)
		t := statType(k)
		for i := range parked {
			if pk := &parked[i]; !pk.Back && pk.Stream == stream && pk.Type == t {
				pk.Back = true
				_ = p.Free(dev, pk.Stream, pk.Ptr, pk.Req) // the cache's own block: no error
			}
		}
	} else if parked == nil {
		parked = noneParked[:] // not nil: alloc applies the peak rule (front cache's blocks, Front)
	}
	return s.alloc(size, parked)
}

// noneParked is AllocAround's parked when its caller shows none: an empty
// slice that is not nil.
var noneParked [0]Parked

// RequestType is the statistics type (1 small_pool, 2 large_pool) of the
// blocks that serve a request of size bytes from the default pool: the
// pool whose bins it reads.
func (p *Pool) RequestType(size uint64) int {
	if len(p.devs) == 0 {
		return statType(smallPool)
	}
	_, k := p.devs[0].sourceFor(nil, p.Expandable()).class(size)
	return statType(k)
}

// reclaimAll frees every block of parked not yet Back, setting its Back,
// and has the front cache return what else it holds of d (AllocAround's
// second rule); it reports whether anything went back. Called with no
// shard lock held.
func (d *device) reclaimAll(parked []Parked) bool {
	any := false
	if parked == nil && d.pool.cfg.Front == nil {
		return false // the pool alone: nothing to ask for
	}
	for i := range parked {
		pk := &parked[i]
		if pk.Back {
			continue
		}
		pk.Back, any = true, true
		// The cache's own blocks: an error would be a bug in the cache,
		// and the pool's books are unchanged by it.
		_ = d.pool.Free(d.idx, pk.Stream, pk.Ptr, pk.Req)
	}
	return d.pool.reclaim(d.idx) || any
}

// holdsParked reports whether some block of parked is still parked, or
// the front cache holds blocks of d (Front.Holds: a hint).
func (d *device) holdsParked(parked []Parked) bool {
	for i := range parked {
		if !parked[i].Back {
			return true
		}
	}
	f := d.pool.cfg.Front
	return f != nil && f.Holds(d.idx)
}

// belowPeaks reports whether a request of n bytes, rounded to r, of kind k,
// served now with whatever is parked still counted allocated, raises no
// peak of s's or its device's block statistics (AllocAround). The block
// may be larger than r where the rest is too small to split off (at most
// smallMax in the large pool, the oversize slack in the oversize pool).
// Called with s.mu held.
func (s *shard) belowPeaks(r, n uint64, k poolKind) bool {
	sz := r
	if !s.src.grows() {
		switch k {
		case largePool:
			sz += smallMax
		case oversizePool:
			sz += s.dev.pool.slack()
		}
	}
	b, q := int64(sz), int64(n)
	if !s.stats.c[stAll].below(b, q) || !s.stats.c[statType(k)].below(b, q) {
		return false
	}
	return !s.dev.hot.multi.Load() || s.dev.hot.below(b, q)
}

// below reports whether one more block of sz bytes for a request of req
// bytes leaves every peak of c where it is.
func (c *blockCounters) below(sz, req int64) bool {
	return c.nAlloc-c.nFree+1 <= c.peakN && c.bAlloc-c.bFree+sz <= c.peakB && c.rAlloc-c.rFree+req <= c.peakR &&
		c.nAlloc-c.nDone+1 <= c.peakActN && c.bAlloc-c.bDone+sz <= c.peakActB
}

// below is blockCounters.below for the device-wide counters.
func (h *hotStats) below(sz, req int64) bool {
	n, b := h.allocCount.Load(), h.allocBytes.Load()
	return n+1 <= h.allocCountPeak.Load() && b+sz <= h.allocBytesPeak.Load() && h.reqBytes.Load()+req <= h.reqBytesPeak.Load() &&
		n+h.pendingCount.Load()+1 <= h.activeCountPeak.Load() && b+h.pendingBytes.Load()+sz <= h.activeBytesPeak.Load()
}
