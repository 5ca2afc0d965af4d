package allocator

// directSource serves torch.cuda.MemPool (AllocSegment): each request is a
// fixed segment of exactly its rounded size, taken from the backend for it
// and given back as soon as it is freed (Pool.freeSlow), since PyTorch's
// caching allocator above already caches it; a second cache below would
// keep memory nobody can reach. Requests are not rounded to
// roundup_power2_divisions (PyTorch above did that) and never look at free
// blocks (a segment whose release failed stays idle until releaseCached
// tries again, serving no one meanwhile).
type directSource struct{ fixedSource }

func (f directSource) class(n uint64) (uint64, poolKind) {
	r := roundSize(n)
	return r, kindFor(r, f.p.maxSplit())
}

func (directSource) caches() bool { return false }

// newMemory takes a segment of r bytes: PyTorch's caching allocator above
// already chose the segment's size.
func (directSource) newMemory(s *shard, r uint64, k poolKind) (*block, error) {
	return s.newSegment(r, k)
}
