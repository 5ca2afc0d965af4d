// Package allocator is libsymm's caching pool: pure Go over a Backend
// (cuda, host, or a test fake). It is what symm_pool_alloc/symm_pool_free
// reach, and what PyTorch's CUDAPluggableAllocator calls for every tensor.
//
// # Levels
//
// A Pool has one device per GPU. A device has one shard per stream that has
// allocated on it from the default pool (found through a lock-free table,
// shards.go), and one per stream of each private pool (private.go). A shard
// owns its segments (memory from the backend) and the blocks they are cut
// into, in three pools (small, large, oversize; see sizeclass.go for the
// size rules and their worst-case waste), and serves requests from them
// (cache.go). The cached path — a free block of the right stream fits —
// takes only that shard's mutex, finds the shard without any lock, and
// makes no heap allocation. A free by pointer alone (AnyDevice) and the
// lookups of pointers inside blocks find the block's segment in the pool's
// lock-free address map (segmap.go), then lock only the shard that owns it.
//
// Each shard's segments come from one segment source, chosen when the
// shard is made (source.go): fixed segments, one backend allocation each
// (source_fixed.go: the default pool, and every private pool); expandable
// segments, an address range that grows by mapped chunks
// (source_expandable.go, the segments themselves in expandable.go, with
// Config.Expandable: the default pool); or a segment per request,
// given back once freed (source_direct.go: AllocSegment). The source
// decides how requests are rounded and split, where new memory comes from
// and how it goes back; the shard's code is the same for all three.
//
// An expandable segment maps physical chunks of two sizes: a big one
// (Config.ExpandableChunk, 20 MiB) wherever a mapping covers a whole slot of
// it, and chunks of the driver's granularity (2 MiB) elsewhere, because the
// driver's cost is per chunk while the memory a free page gives back, and
// what a small process holds, is per chunk too. expandable.go has the
// choice, its alternatives and their figures; the free pages inside
// segments, unmapped where memory is mapped next, are pages.go's.
//
// When a shard has no fitting free block (heap.go), it first takes back
// the blocks a cache in front of the pool holds parked, if any (front.go:
// a parked block never makes the pool steal, collect or grow, and a
// request that could raise a peak is served only once they are back), and
// looks again; then it takes the smallest idle fixed segment of another
// stream that fits and is no larger than the segment it would otherwise
// allocate, once that stream's work on it has completed (steal.go), then
// (past the garbage collection line, gc.go) collects idle segments, then
// takes new memory from its source, then, out of memory, releases the
// device's cached segments and tries once more. The device counts every segment against
// its limit and in the reserved statistics in one place (countSegment,
// uncountSegment).
//
// # Stream contract
//
// A block is allocated for a stream S (the stream given to Alloc).
//
//   - Freed on S, it is reused for S at once: work S queues later runs after
//     the work S queued before the free.
//   - It is reused for another stream T only once the work queued on S before
//     the free has completed: a whole idle segment moves from S to T only
//     after an event recorded on S, after the free, reports completion.
//     The pool never blocks the caller for this (except EmptyCache and the
//     out-of-memory retry, which wait, holding no lock another thread's
//     allocation needs: only a capture that begins meanwhile waits for them,
//     gate.go). Mapping memory never waits for a stream.
//   - RecordStream(ptr, U) adds a stream U that must also pass: at free time
//     an event is recorded on each such U, and the block returns to the
//     cache only when all of them have completed.
//
// Segments go back to the backend only when wholly free (EmptyCache, or the
// out-of-memory retry); the CUDA backend's cuMemFree orders the release after
// all work queued on the device.
//
// # Private pools
//
// A private pool (PoolID, PyTorch's MempoolId_t) holds the memory of CUDA
// graph captures. BeginAllocateToPool opens a route and takes a use,
// EndAllocateToPool closes the route, ReleasePool drops the use; the caller
// (export/'s shim, with PyTorch's capture filters) decides which allocations
// go to AllocIn. Invariants: a private pool's segments serve only its own
// allocations; its blocks freed are reused only by allocations routed to it
// again; it goes back to the backend only once released (no use left), at
// EmptyCache or the out-of-memory retry, segment by segment as its blocks are
// freed. While any route is open on a device (a capture may be under way on
// any of its streams) the device records and queries no event: no segment
// moves across streams, pending record_stream frees wait, and event recording
// for new ones is deferred until no route is open, as PyTorch's allocator
// defers it while captures are under way. With graph_capture_record_stream_reuse
// (Config.CaptureReuse) and a backend that sees capture graphs
// (CaptureGrapher), such a block serves its stream again during the capture
// once the graph orders all its uses first (capture_reuse.go).
//
// AllocSegment serves torch.cuda.MemPool: each request is a segment of its
// own, exactly the size asked, returned to the backend when freed.
//
// # History
//
// RecordHistory keeps a ring of alloc/free/segment/oom events per device;
// Snapshot describes every segment and block in the shape of PyTorch's
// torch.cuda.memory._snapshot().
//
// # PyTorch's allocator settings
//
// ConfigFromEnv reads PYTORCH_CUDA_ALLOC_CONF (else PYTORCH_ALLOC_CONF) as
// torch 2.11 does (torchconf.go lists what each key does here), then the
// SYMM_POOL_ variables, which win for their fields. Two settings act in the
// pool itself: roundup_power2_divisions rounds requests before the size rules
// (sizeclass.go), at the cost of one flag test on the cached path when it is
// not set; garbage_collection_threshold frees the longest-idle cached large
// segments before a new segment is taken once reserved bytes pass that share
// of the device's cap (gc.go), on the slow path only. Both act on the default
// and private pools; MemPool segments (AllocSegment) are left to PyTorch's
// allocator above, which applies the same settings itself.
//
// # Failure
//
// Errors are values: ErrInvalid (bad device, size, fraction), ErrUnknownPointer
// (free of a pointer the pool does not hold: nothing changes) and
// ErrOutOfMemory (after releasing the device's cached segments and retrying
// once; the message names the request, the device, reserved and allocated
// bytes, and the limit).
//
// # Files
//
// The public API and the pool's types: pool.go; per-(device, stream) shards:
// shards.go; the cached path: cache.go; segments, limits, reserved statistics,
// out of memory and release: heap.go; size classes and TLSF bins: sizeclass.go
// (SIZECLASSES.md, generated and checked by a test); blocks and the address
// map: block.go, segmap.go.
//
// Segment sources, one per shard, chosen when it is made: source.go; fixed
// segments: source_fixed.go; expandable ones: source_expandable.go (its rules,
// and its release, which waits for the stream before it unmaps); one per
// MemPool request: source_direct.go. Expandable segments over the backend's
// Expander: expandable.go (what only they hold, expSeg, one pointer in a
// segment and nil in a fixed one; the placement rule, growth and shrinking),
// the free pages inside them: pages.go; their physical chunks of two sizes,
// mapped and unmapped: chunks.go; how far a stream has got, for the free
// pages, and the wait at the peak: progress.go.
//
// Across streams: idle segments stolen (steal.go), record_stream events
// (events.go), the capture gate, whether a graph capture may be under way
// (gate.go), blocks reused inside a capture (capture_reuse.go). For the front
// cache: its contract (front.go) and each shard's count of changes to what its
// best fit sees, kept outside the Go heap (epoch.go).
//
// Private pools for CUDA graphs and segment-serving for MemPools: private.go;
// their open routings, the one record of them: routes.go; what a
// torch.cuda.MemPool asks of one (use count, use_on_oom, no_split, another
// allocator's segments, its cache emptied alone): mempools.go; pool listings
// and checkpoints: checkpoint.go.
//
// Statistics: stats.go; the pool's configuration and sizes as written
// (ParseSize): config.go; PyTorch's allocator settings: torchconf.go, their
// changes at run time: torchsettings.go, and the settings a program may change
// while it runs: tunables.go; garbage collection: gc.go; history and snapshots
// in PyTorch's format: history.go, with the annotations of its entries:
// annotations.go; segment events queued for a watcher (PyTorch's trace
// trackers): segevents.go; CheckInvariants: check.go; Virtual, a backend of
// address ranges with no memory, for trace replay: virtual.go; the Backend
// interface: backend.go.
package allocator
