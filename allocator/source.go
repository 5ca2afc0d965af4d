package allocator

// Segment sources: where a shard's memory comes from and where it goes back.
//
// Each shard has one, chosen when the shard is made and never changed
// (sourceFor), from what the shard serves (a default-pool shard serves one
// kind of segment; a stream has a shard of each kind it used: shards.go):
//
//	default pool, fixed segments      fixedSource       source_fixed.go
//	default pool, expandable segments expandableSource  source_expandable.go
//	a private pool (graph, MemPool)   poolSource        mempools.go
//	MemPool segments (AllocSegment)   directSource      source_direct.go
//
// The shard's own code (bins, split and merge, live blocks, pending frees,
// statistics) is the same for all of them; every rule that differs between
// them is a method below, so no other code asks which kind of segment it
// holds. A source holds no state of its own: what it keeps lives in the
// shard (grow, births, frees) and its segments (expSeg: vsize, holes),
// under the shard's mutex.
type segmentSource interface {
	// class is the size r a request of n bytes is rounded to and the pool
	// k it is served from (sizeclass.go).
	class(n uint64) (r uint64, k poolKind)
	// caches reports whether free blocks serve later requests. false: each
	// request is a new segment of its own, given back as soon as it is
	// free again (PyTorch's caching allocator above caches it already).
	caches() bool
	// grows reports whether segments grow in place: then a block that is a
	// whole segment may stop being one, and an idle segment stays with its
	// stream (no steal) and out of the garbage collector's reach.
	grows() bool
	// cut hands out the r bytes of free block b, already out of its bins
	// (r ≤ b.size): what the source's rule leaves over becomes a free block
	// of its own. Called with s.mu held.
	cut(s *shard, b *block, r uint64)
	// newMemory returns a free block that holds r bytes of pool k from
	// memory s does not have yet, counted in the statistics (countSegment).
	// Called with s.mu held.
	newMemory(s *shard, r uint64, k poolKind) (*block, error)
	// giveBack returns the memory of idle segment seg to the backend and
	// uncounts what it unmapped piecewise; releaseSegment does the rest. On
	// err nothing more of it went and the segment stays, idle, its books
	// what the backend holds; late is a failure after the memory went (the
	// segment goes all the same). Called with s.mu held and the capture
	// gate held.
	giveBack(s *shard, seg *segment) (late, err error)
	// release gives back what s holds unused, once its pending frees were
	// waited for (releaseCached). Called with the capture gate held, s.mu
	// not held: a source that must wait for s's stream waits without it.
	release(s *shard) error
}

// rounded is the size a request of n bytes is rounded to in the default
// and private pools: by roundup_power2_divisions when an interval has
// them (one flag test on the cached path when none does), else to 512
// bytes (sizeclass.go).
func (p *Pool) rounded(n uint64) uint64 {
	if div := p.tun.roundup.Load(); div != nil {
		return roundDivisions(n, div)
	}
	return roundSize(n)
}

// sourceFor is the segment source of a new shard of device d serving pool
// pp (nil: the default pool, with expandable segments when expandable).
func (d *device) sourceFor(pp *privatePool, expandable bool) segmentSource {
	p := d.pool
	switch {
	case pp != nil && pp.direct:
		return directSource{fixedSource{p}}
	case pp == nil && expandable:
		return expandableSource{p}
	case pp != nil:
		return poolSource{fixedSource{p}, pp}
	default:
		return fixedSource{p}
	}
}
