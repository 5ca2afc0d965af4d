package allocator

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
)

// What PyTorch's allocator interface (c10::cuda::CUDACachingAllocator::
// CUDAAllocator) asks of a pool besides alloc and free, for a C++ subclass of
// CUDAPluggableAllocator to answer from this pool:
//
//   - cacheInfo: the largest free cached block (CacheInfo), which cudnn's
//     benchmark mode uses to size its workspaces;
//   - checkPoolLiveAllocations and getCheckpointState: every block of a
//     private pool (PoolBlocks);
//   - setCheckpointPoolState: a private pool set back to a listing taken
//     earlier (RestoreBlocks), which torch.compile's CUDA-graph trees
//     (mode="reduce-overhead") call when a recording path diverges from the
//     one the pool's blocks reflect.
//
//   - shareIpcHandle: the segment behind a block (SegmentOf), which CUDA IPC
//     shares whole.
//
// None of it is on the cached path: each takes the locks it needs and walks
// segments.

// BlockStatus is where a listed block is in its life.
type BlockStatus int32

// The values are those of symm_block_info_t.state (include/symm.h).
const (
	StatusFree      BlockStatus = 0 // in a bin: PyTorch's "inactive"
	StatusAllocated BlockStatus = 1 // handed out and not freed
	StatusPending   BlockStatus = 2 // freed, waiting for record_stream events
)

// BlockInfo is one block of a pool's listing (PoolBlocks), and the unit of
// the state RestoreBlocks restores.
type BlockInfo struct {
	Addr      uintptr
	Size      uint64
	Requested uint64 // bytes asked for (allocated and pending blocks); 0 when free
	Stream    uintptr
	Segment   uintptr // address of the block's segment
	Status    BlockStatus
}

func (bi BlockInfo) end() uintptr { return bi.Addr + uintptr(bi.Size) }

// ---- cacheInfo --------------------------------------------------------------

// CacheInfo returns the size of the largest free block of device dev's
// default pool, across its streams; 0 when none is cached. Blocks a cache in
// front of the pool go back first (Front). Unlike
// PyTorch's cacheInfo, private pools' free blocks are left out (no
// allocation outside a pool can get them), and the device's free memory is
// not a floor (PyTorch starts from cudaMemGetInfo when asked with 0: a
// caller who wants that takes the larger of the two).
func (p *Pool) CacheInfo(dev int) (uint64, error) {
	d, err := p.device(dev)
	if err != nil {
		return 0, err
	}
	p.observe(dev)
	var largest uint64
	for _, s := range d.shardList() {
		if s.pool != nil {
			continue
		}
		s.mu.Lock()
		for k := range s.bins {
			largest = max(largest, s.bins[k].largest())
		}
		s.mu.Unlock()
	}
	return largest, nil
}

// largest returns the size of the largest block in bs, 0 if none. Bins
// partition sizes in increasing order, so the largest block is in the
// highest non-empty bin, which alone is walked.
func (bs *bins) largest() uint64 {
	for w := bitmapWords - 1; w >= 0; w-- {
		m := bs.bitmap[w]
		if m == 0 {
			continue
		}
		var n uint64
		for b := bs.heads[w*64+63-bits.LeadingZeros64(m)]; b != nil; b = b.fnext {
			n = max(n, b.size)
		}
		return n
	}
	return 0
}

// ---- listing ------------------------------------------------------------------

// PoolBlocks lists every block of every segment of pool id on device dev,
// free ones too, sorted by address; id (0, 0) is the device's default pool
// (every stream's; expandable segments show their mapped part). Blocks a
// cache in front of the pool holds go back first (Front).
// ErrInvalid for a bad device or an unknown pool.
func (p *Pool) PoolBlocks(dev int, id PoolID) ([]BlockInfo, error) {
	d, err := p.device(dev)
	if err != nil {
		return nil, err
	}
	if id == (PoolID{}) {
		p.observe(dev) // only the default pool's blocks are ever parked
	}
	// privMu keeps the pool and its shard set put (lock order: privMu, then
	// each shard in turn).
	d.privMu.Lock()
	defer d.privMu.Unlock()
	var shards []*shard
	if id == (PoolID{}) {
		for _, s := range d.shardList() {
			if s.pool == nil {
				shards = append(shards, s)
			}
		}
	} else {
		pp, err := d.privatePool(id, "listing of")
		if err != nil {
			return nil, err
		}
		shards = pp.sortedShards()
	}
	out := []BlockInfo{}
	for _, s := range shards {
		s.mu.Lock()
		for seg := s.segs; seg != nil; seg = seg.snext {
			for b := seg.head; b != nil; b = b.next {
				out = append(out, s.blockInfo(b))
			}
		}
		s.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, nil
}

// blockInfo describes b, a block of s; called with s.mu held.
func (s *shard) blockInfo(b *block) BlockInfo {
	bi := BlockInfo{Addr: b.ptr, Size: b.size, Stream: s.stream, Segment: b.seg.ptr}
	switch b.state {
	case blockAllocated:
		bi.Status, bi.Requested = StatusAllocated, b.req
	case blockPending:
		bi.Status, bi.Requested = StatusPending, b.req
	}
	return bi
}

// sortedShards returns the pool's shards ordered by stream: the order in
// which RestoreBlocks locks them all. Called with privMu held.
func (pp *privatePool) sortedShards() []*shard {
	out := make([]*shard, 0, len(pp.shards))
	for _, s := range pp.shards {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *shard) int {
		switch {
		case a.stream < b.stream:
			return -1
		case a.stream > b.stream:
			return 1
		}
		return 0
	})
	return out
}

// ---- checkpoint restore -------------------------------------------------------

// Restored is what RestoreBlocks changed: the addresses of the blocks it
// freed and of those it allocated, each in increasing order. A block
// allocated both before and after with the same address and size but
// another requested size is in both.
type Restored struct {
	Freed, Allocated []uintptr
}

// RestoreCapacityError is RestoreBlocksCapped's refusal when the result would
// not fit the caller's arrays: nothing changed, and Freed and Allocated are
// the counts needed. It is an ErrInvalid.
type RestoreCapacityError struct {
	Freed, Allocated       int // what the restore would free and allocate
	MaxFreed, MaxAllocated int // what the caller can take
}

func (e *RestoreCapacityError) Error() string {
	return fmt.Sprintf("%v: the restore would free %d blocks and allocate %d, but the arrays hold %d and %d; nothing changed",
		ErrInvalid, e.Freed, e.Allocated, e.MaxFreed, e.MaxAllocated)
}

func (e *RestoreCapacityError) Is(target error) bool { return target == ErrInvalid }

// RestoreBlocks sets private pool id of device dev back to want, a listing
// PoolBlocks returned earlier for that pool (PyTorch's setCheckpointPoolState).
// Afterwards the blocks allocated in the pool are exactly those allocated in
// want, at their addresses, with their sizes and requested sizes; every
// other byte of the pool's segments is free (want's pending blocks are
// restored as free: the caller had freed them). So:
//
//   - a block allocated now and not (identically) in want is freed, as Free
//     would (its record_stream streams, if any, still hold it: it turns
//     pending);
//   - a block allocated in want and not now is allocated at its address,
//     splitting and merging free space as needed;
//   - segments the pool took after the listing keep no allocated block;
//   - a block allocated in both, same address, size and requested size, is
//     left alone (not reported), whatever its streams.
//
// PyTorch's CheckpointDelta reports every block allocated before the call as
// freed and every block allocated in the checkpoint as allocated; a caller
// that needs those lists has them from PoolBlocks before the call and from
// want.
//
// Everything is validated before anything changes; on error nothing
// changed. ErrInvalid: a bad device, the default pool (id (0, 0): it is
// every stream's and the front cache's; checkpoints are for private pools),
// an unknown or released pool, or a want that is not a listing of the pool's
// present segments: a segment that is not the pool's (released, or never
// its), blocks that do not tile their segment exactly (a gap, an overlap, a
// block crossing its segment's end), an address or size that is zero, not a
// multiple of 512 or wraps, a status other than 0, 1, 2, an allocated block
// whose requested size is 0 or over its size, a stream other than the
// segment's. ErrBusy: a block pending on record_stream events lies where want
// allocates, and the events cannot be waited for now (a capture may be under
// way on the device: some private pool is routing) or an allocated block
// that must make room has record_stream streams. With no capture under way,
// pending blocks in the way are waited for first (as EmptyCache does).
//
// Stream contract: a block allocated here is allocated for its segment's
// stream (a private pool's segments never change streams), as at the
// checkpoint; PyTorch makes the same assumption.
func (p *Pool) RestoreBlocks(dev int, id PoolID, want []BlockInfo) (Restored, error) {
	return p.RestoreBlocksCapped(dev, id, want, -1, -1)
}

// RestoreBlocksCapped is RestoreBlocks for a caller whose result arrays are
// fixed (the C API): when the restore would free more than maxFreed blocks or
// allocate more than maxAllocated (negative: no bound), nothing changes and
// the error is a *RestoreCapacityError with the counts needed.
func (p *Pool) RestoreBlocksCapped(dev int, id PoolID, want []BlockInfo, maxFreed, maxAllocated int) (Restored, error) {
	d, err := p.device(dev)
	if err != nil {
		return Restored{}, err
	}
	if id == (PoolID{}) {
		return Restored{}, fmt.Errorf("%w: restore of pool (0, 0) on device %d: the default pool is shared by every stream and cannot be set back to a checkpoint; only private pools can", ErrInvalid, dev)
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	pp, err := d.privatePool(id, "restore of")
	if err != nil {
		return Restored{}, err
	}
	if pp.released() {
		return Restored{}, fmt.Errorf("%w: restore of pool %v on device %d: the pool was released", ErrInvalid, id, dev)
	}
	// Every shard of the pool stays locked until the restore is done, so
	// that what was validated is what changes. Lock order: privMu, then the
	// pool's shards by stream; nothing else holds one shard's lock while
	// waiting for another's (steal only tries, and skips private pools).
	shards := pp.sortedShards()
	for _, s := range shards {
		s.mu.Lock()
	}
	defer func() {
		for _, s := range shards {
			s.mu.Unlock()
		}
	}()
	rp, err := planRestore(d, id, shards, want)
	if err != nil {
		return Restored{}, err
	}
	if rp.busy != nil && d.capture.hold() {
		defer d.capture.leave()
		// No capture can be under way: pending blocks may be waited for,
		// as EmptyCache would. They are freed already, so this changes no
		// state the caller can tell apart; then plan again.
		var syncErr error
		for _, s := range shards {
			if len(s.pending) > 0 {
				if err := s.processPending(true); err != nil && syncErr == nil {
					syncErr = err
				}
			}
		}
		if rp, err = planRestore(d, id, shards, want); err != nil {
			return Restored{}, err
		}
		if rp.busy != nil && syncErr != nil {
			rp.busy = fmt.Errorf("%w (waiting for its events failed: %v)", rp.busy, syncErr)
		}
	}
	if rp.busy != nil {
		return Restored{}, rp.busy
	}
	if (maxFreed >= 0 && len(rp.free) > maxFreed) || (maxAllocated >= 0 && len(rp.alloc) > maxAllocated) {
		return Restored{}, &RestoreCapacityError{Freed: len(rp.free), Allocated: len(rp.alloc), MaxFreed: maxFreed, MaxAllocated: maxAllocated}
	}
	return rp.apply(), nil
}

// restorePlan is what a validated restore will do.
type restorePlan struct {
	free  []*block      // allocated blocks to free, by address
	alloc []restoreWant // blocks to allocate, grouped by segment, by address
	busy  error         // ErrBusy: a pending or stream-held block is in the way
}

type restoreWant struct {
	seg  *segment
	addr uintptr
	size uint64
	req  uint64
}

// planRestore validates want against the pool's segments (in shards, all
// locked) and works out what restoring it frees and allocates, changing
// nothing. It returns the first way want is not a listing of the pool as an
// ErrInvalid error; a block in the way that cannot be reused now is
// reported in the plan's busy, so that the caller may wait for it.
func planRestore(d *device, id PoolID, shards []*shard, want []BlockInfo) (*restorePlan, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: restore of pool %v on device %d: %s; nothing changed", ErrInvalid, id, d.idx, fmt.Sprintf(format, args...))
	}
	segs := map[uintptr]*segment{}
	for _, s := range shards {
		for seg := s.segs; seg != nil; seg = seg.snext {
			segs[seg.ptr] = seg
		}
	}
	// Each entry on its own first, then the tiling of each segment.
	order := make([]int, len(want))
	for i, w := range want {
		order[i] = i
		switch {
		case w.Status != StatusFree && w.Status != StatusAllocated && w.Status != StatusPending:
			return nil, bad("block %d (%#x): state %d: want 0 (free), 1 (allocated) or 2 (pending)", i, w.Addr, w.Status)
		case w.Size == 0 || w.Size%minBlock != 0 || w.Addr%minBlock != 0:
			return nil, bad("block %d: address %#x or size %d is zero or not a multiple of %d", i, w.Addr, w.Size, minBlock)
		case w.Size > maxRequest || w.end() < w.Addr:
			return nil, bad("block %d: [%#x, +%d) is not an address range", i, w.Addr, w.Size)
		case w.Status == StatusAllocated && (w.Requested == 0 || w.Requested > w.Size):
			return nil, bad("block %d (%#x): allocated with requested size %d: want 1 to its size %d", i, w.Addr, w.Requested, w.Size)
		}
		seg := segs[w.Segment]
		switch {
		case seg == nil:
			return nil, bad("block %d (%#x): segment %#x is not one of the pool's (released since, or another pool's)", i, w.Addr, w.Segment)
		case w.Addr < seg.ptr || w.end() > seg.ptr+uintptr(seg.size):
			return nil, bad("block %d [%#x, +%d) crosses the boundary of its segment [%#x, +%d)", i, w.Addr, w.Size, seg.ptr, seg.size)
		case w.Stream != seg.owner.Load().stream:
			return nil, bad("block %d (%#x): stream %#x, but its segment is stream %#x's", i, w.Addr, w.Stream, seg.owner.Load().stream)
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return want[order[a]].Addr < want[order[b]].Addr })
	// Targets: the allocated blocks of want, by segment, by address.
	targets := map[*segment][]restoreWant{}
	listed := map[*segment]bool{}
	for k := 0; k < len(order); {
		seg := segs[want[order[k]].Segment]
		if listed[seg] {
			return nil, bad("segment %#x: its blocks are not contiguous in address order (listed twice?)", seg.ptr)
		}
		listed[seg] = true
		at := seg.ptr
		for ; k < len(order) && want[order[k]].Segment == seg.ptr; k++ {
			w := want[order[k]]
			if w.Addr != at {
				what := "a gap"
				if w.Addr < at {
					what = "an overlap"
				}
				return nil, bad("segment %#x: %s at %#x (block %d starts at %#x)", seg.ptr, what, at, order[k], w.Addr)
			}
			if w.Status == StatusAllocated {
				targets[seg] = append(targets[seg], restoreWant{seg: seg, addr: w.Addr, size: w.Size, req: w.Requested})
			}
			at = w.end()
		}
		if at != seg.ptr+uintptr(seg.size) {
			return nil, bad("segment %#x of %d bytes: its blocks end at offset %d", seg.ptr, seg.size, at-seg.ptr)
		}
	}
	// What changes: walk each segment's blocks beside its targets.
	rp := &restorePlan{}
	for _, s := range shards {
		for seg := s.segs; seg != nil; seg = seg.snext {
			rp.planSegment(d, id, seg, targets[seg])
		}
	}
	slices.SortFunc(rp.free, func(a, b *block) int { return cmpAddr(a.ptr, b.ptr) })
	slices.SortFunc(rp.alloc, func(a, b restoreWant) int { return cmpAddr(a.addr, b.addr) })
	return rp, nil
}

func cmpAddr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// planSegment adds seg's changes to the plan: ts are its target allocated
// blocks, by address, not overlapping.
func (rp *restorePlan) planSegment(d *device, id PoolID, seg *segment, ts []restoreWant) {
	kept := make([]bool, len(ts))
	j := 0 // first target that ends after the current block starts
	for b := seg.head; b != nil; b = b.next {
		end := b.ptr + uintptr(b.size)
		for j < len(ts) && ts[j].addr+uintptr(ts[j].size) <= b.ptr {
			j++
		}
		// ts[j:k] overlap b.
		k := j
		for k < len(ts) && ts[k].addr < end {
			k++
		}
		switch b.state {
		case blockAllocated:
			if k == j+1 && ts[j].addr == b.ptr && ts[j].size == b.size && ts[j].req == b.req {
				kept[j] = true
				continue
			}
			rp.free = append(rp.free, b)
			if k > j && b.extraN > 0 && rp.busy == nil {
				rp.busy = fmt.Errorf("%w: restore of pool %v on device %d: allocated block %#x (%d bytes) must make room for block %#x, but record_stream streams still hold it; nothing changed",
					ErrBusy, id, d.idx, b.ptr, b.size, ts[j].addr)
			}
		case blockPending:
			if k > j && rp.busy == nil {
				rp.busy = fmt.Errorf("%w: restore of pool %v on device %d: block %#x (%d bytes), freed and waiting for record_stream events, lies where block %#x must be allocated; nothing changed",
					ErrBusy, id, d.idx, b.ptr, b.size, ts[j].addr)
			}
		}
	}
	for i, t := range ts {
		if !kept[i] {
			rp.alloc = append(rp.alloc, t)
		}
	}
}

// apply carries out a plan with no busy block: frees first, so that the
// space of every target is one free block, then the allocations. It cannot
// fail. Called with every shard of the pool locked.
func (rp *restorePlan) apply() Restored {
	out := Restored{Freed: make([]uintptr, 0, len(rp.free)), Allocated: make([]uintptr, 0, len(rp.alloc))}
	for _, b := range rp.free {
		// Only free blocks are merged away (and recycled) by a free, so the
		// blocks still to free stay valid through the loop.
		out.Freed = append(out.Freed, b.ptr)
		b.seg.owner.Load().free(b)
	}
	// rp.alloc is in address order, so each segment's targets are met by one
	// forward walk of its blocks.
	var cur *block
	for _, t := range rp.alloc {
		if cur == nil || cur.seg != t.seg {
			cur = t.seg.head
		}
		for cur.ptr+uintptr(cur.size) <= t.addr {
			cur = cur.next
		}
		b := t.seg.owner.Load().carve(cur, t.addr, t.size, t.req)
		out.Allocated = append(out.Allocated, b.ptr)
		cur = b
	}
	return out
}

// carve allocates [addr, addr+size) out of free block b, which holds it:
// the bytes of b before and after it stay free blocks of their own. The
// block's shape is the checkpoint's, whatever the split rules say now (as
// PyTorch restores it). Statistics and history count it as an allocation of
// req bytes. Called with s.mu held.
func (s *shard) carve(b *block, addr uintptr, size, req uint64) *block {
	seg := b.seg
	if b.state != blockFree || addr < b.ptr || addr+uintptr(size) > b.ptr+uintptr(b.size) {
		// planRestore rules this out: a broken invariant, not bad input.
		panic(fmt.Sprintf("allocator: restore: block [%#x,+%d) (state %d) does not hold [%#x,+%d)", b.ptr, b.size, b.state, addr, size))
	}
	s.removeFree(b)
	if seg.idle {
		s.removeIdle(seg)
	}
	if lead := uint64(addr - b.ptr); lead > 0 {
		s.splitHigh(b, b.size-lead) // [b.ptr, addr) stays free
	}
	if b.size > size {
		s.splitTail(b, size)
	}
	s.markAllocated(b, req)
	s.dev.hist.record(ActAlloc, b.ptr, b.req, s.stream)
	return b
}

// ---- CUDA IPC ---------------------------------------------------------------

// BlockOf returns the allocated block at or containing ptr: its address and
// the size it was asked for (what PyTorch's CUDA IPC shares of it).
func (p *Pool) BlockOf(ptr uintptr) (addr uintptr, requested uint64, err error) {
	s, b := p.findContaining(ptr)
	if b == nil {
		return 0, 0, fmt.Errorf("%w: %#x is not in a block this pool has allocated", ErrUnknownPointer, ptr)
	}
	addr, requested = b.ptr, b.req
	s.mu.Unlock()
	return addr, requested, nil
}

// SegmentOf returns the segment that holds the allocated block at, or
// containing, ptr: its base address, its mapped size and whether it is an
// expandable segment. PyTorch's CUDA IPC (torch.multiprocessing) shares a
// whole segment, cuMemAlloc's unit, and sends the block's offset in it.
// A pointer in no allocated block of the pool is ErrUnknownPointer.
func (p *Pool) SegmentOf(ptr uintptr) (base uintptr, size uint64, expandable bool, err error) {
	s, b := p.findContaining(ptr)
	if b == nil {
		return 0, 0, false, fmt.Errorf("%w: %#x is not in a block this pool has allocated", ErrUnknownPointer, ptr)
	}
	seg := b.seg
	base, size, expandable = seg.ptr, seg.size, seg.expSeg != nil
	s.mu.Unlock()
	return base, size, expandable, nil
}

// SegmentChunk returns the size of the physical chunk of the expandable
// segment that holds ptr, which must be at or inside a block the pool has
// allocated: the granularity, or Config.ExpandableChunk rounded to it for a
// big chunk (ChunkAt says which and where); 0 for a fixed segment.
func (p *Pool) SegmentChunk(ptr uintptr) (uint64, error) {
	_, size, err := p.ChunkAt(ptr, ptr)
	return size, err
}

// ChunkAt returns the physical chunk [base, base+size) that holds address
// at, mapped in the expandable segment of the allocated block at or
// containing ptr: each chunk is one physical allocation, which a process
// mapping that memory must map whole. A fixed segment has no chunks: size
// 0. An at outside the segment's mapped chunks is ErrInvalid.
func (p *Pool) ChunkAt(ptr, at uintptr) (base uintptr, size uint64, err error) {
	s, b := p.findContaining(ptr)
	if b == nil {
		return 0, 0, fmt.Errorf("%w: %#x is not in a block this pool has allocated", ErrUnknownPointer, ptr)
	}
	defer s.mu.Unlock()
	seg := b.seg
	if seg.expSeg == nil {
		return 0, 0, nil
	}
	g := s.dev.expand
	if at < seg.ptr || at >= seg.ptr+uintptr(seg.size) || seg.holes.has(uint64(at-seg.ptr)/g.chunk) {
		return 0, 0, fmt.Errorf("%w: %#x is not in a mapped chunk of the expandable segment at %#x (%d bytes) that holds %#x", ErrInvalid, at, seg.ptr, seg.size, ptr)
	}
	i := uint64(at-seg.ptr) / g.chunk
	if !seg.bigs.has(i) {
		return seg.ptr + uintptr(i*g.chunk), g.chunk, nil
	}
	for !seg.bigStarts.has(i) {
		i--
	}
	return seg.ptr + uintptr(i*g.chunk), g.big, nil
}
