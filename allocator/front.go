package allocator

// Front is a cache in front of the pool: a level of its own above the
// shards, as the Go runtime's per-P mcache sits above its central lists.
// export/'s front cache (export/front.cpp, in C so that a cached alloc and
// free never enter Go) is the one libsymm uses.
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
//   - Before the pool takes new memory, it takes back the parked blocks of
//     the device, if any, and looks for a fit again (heap.go): a parked
//     block never makes the pool grow. Before the out-of-memory retry it
//     takes them back whatever Holds says.
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
