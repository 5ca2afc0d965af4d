package allocator

import (
	"math/bits"
	"sync/atomic"
)

// blockState is where a block is in its life.
type blockState uint8

const (
	blockFree      blockState = iota // in a bin of its shard
	blockAllocated                   // handed out, in the shard's live table
	blockPending                     // freed, waiting for events of record_stream streams
)

// block is a contiguous piece of a segment. Invariants (checked by
// shard.check in tests):
//   - the blocks of a segment tile it exactly, in address order via prev/next;
//   - two free blocks are never neighbours (free merges them);
//   - a free block is in exactly one bin of its segment's shard, the bin of
//     its size; allocated blocks are in the live table; pending in s.pending.
type block struct {
	ptr  uintptr
	size uint64 // bytes, a multiple of 512
	req  uint64 // bytes the caller asked for (while allocated or pending)
	seg  *segment

	prev, next   *block // address neighbours inside seg
	fprev, fnext *block // bin list links (free), spare list (fnext)
	hnext        *block // live-table chain (allocated)

	state blockState
	// splitFree records that this free block was counted in inactive_split
	// when it entered its bin, so removal undoes exactly what insertion did.
	splitFree bool

	// extra holds streams given by record_stream other than the shard's own.
	// Inline so that record_stream of one or two streams does not allocate.
	extraInline [2]uintptr
	extraN      int
	extraMore   []uintptr
	// waiting counts the record_stream events a pending block waits for.
	waiting int
	// freedAt is the shard's count of frees (shard.frees) when this free
	// block's memory was last freed; 0: not used since it was mapped. With
	// UnmapFreePages, its pages may be unmapped once the stream has passed
	// that free (pages.go).
	freedAt uint64
	// born is the shard's count of blocks handed out from expandable
	// segments when this one last was (blocks reused by the front cache keep
	// theirs); see nearNewer. 0 in fixed segments.
	born uint64
}

func (b *block) addStream(st uintptr) {
	for i := 0; i < b.extraN && i < len(b.extraInline); i++ {
		if b.extraInline[i] == st {
			return
		}
	}
	for _, s := range b.extraMore {
		if s == st {
			return
		}
	}
	if b.extraN < len(b.extraInline) {
		b.extraInline[b.extraN] = st
	} else {
		b.extraMore = append(b.extraMore, st)
	}
	b.extraN++
}

func (b *block) streams(fn func(uintptr)) {
	for i := 0; i < b.extraN && i < len(b.extraInline); i++ {
		fn(b.extraInline[i])
	}
	for _, s := range b.extraMore {
		fn(s)
	}
}

// isWholeSegment reports whether b spans its entire segment.
func (b *block) isWholeSegment() bool { return b.prev == nil && b.next == nil }

// segment is one allocation from the backend. It belongs to exactly one shard
// at a time (seg.owner), which owns all its blocks.
type segment struct {
	ptr  uintptr
	size uint64
	kind poolKind
	// owner is the shard the segment belongs to, set by addSeg. Atomic
	// because a thief holds only the lock of the shard it believes owns the
	// segment (steal), while a move writes owner under the locks of the
	// shards it moves between, so the thief checks ownership here first.
	owner atomic.Pointer[shard]
	head  *block // lowest-address block
	tail  *block // highest-address block

	// *expSeg is what only an expandable segment has (expandable.go): its
	// reserved address space and its unmapped chunks. nil: a fixed segment;
	// seg.expSeg != nil is the one test of which a segment is.
	*expSeg

	// all segments of the shard, for walks (invariant checks).
	sprev, snext *segment
	// idle list of the shard: segments that are one free block.
	iprev, inext *segment
	idle         bool
	// idleAt is the device's gcClock when the segment last became idle
	// (set only while the garbage collector is on; gc.go).
	idleAt uint64

	// stealEvent is recorded on the owning shard's stream when another
	// stream wants this idle segment; once it completes, the segment may move.
	// Cleared whenever the segment is used again by its owner.
	stealEvent Event
	hasEvent   bool
}

// bins is the TLSF free-block index of one pool of one shard.
type bins struct {
	heads  [numBins]*block
	bitmap [bitmapWords]uint64
	// highTies: ties of the best fit go to the higher address (expandable
	// segments; see bestIn).
	highTies bool
}

func (bs *bins) insert(b *block) {
	i := binIndex(b.size)
	b.fprev = nil
	b.fnext = bs.heads[i]
	if b.fnext != nil {
		b.fnext.fprev = b
	}
	bs.heads[i] = b
	bs.bitmap[i/64] |= 1 << (i % 64)
}

func (bs *bins) remove(b *block) {
	i := binIndex(b.size)
	if b.fprev != nil {
		b.fprev.fnext = b.fnext
	} else {
		bs.heads[i] = b.fnext
	}
	if b.fnext != nil {
		b.fnext.fprev = b.fprev
	}
	b.fprev, b.fnext = nil, nil
	if bs.heads[i] == nil {
		bs.bitmap[i/64] &^= 1 << (i % 64)
	}
}

// bestIn returns the smallest block of bin i that holds r bytes, looking at
// no more than bestFitScan blocks; ties go to the lower address, as in
// PyTorch, which keeps segments' tails free for larger requests, or with
// highTies to the higher one: in the one segment per stream of expandable
// segments that kept the GPT-2 trace's early holes apart from its logits
// (peak reserved/allocated 1.0026 against 1.0031; ResNet-50 1.0044 against
// 1.0029, LLM inference 1.0670 against 1.0560: allocator/expandable.go). In an exact
// bin every block has one size, so the head (the most recently freed, still
// warm in caches) is taken.
func (bs *bins) bestIn(i int, r uint64) *block {
	if i < exactBins {
		if b := bs.heads[i]; b != nil && b.size >= r {
			return b
		}
		return nil
	}
	var best *block
	n := 0
	for b := bs.heads[i]; b != nil && n < bestFitScan; b = b.fnext {
		n++
		if b.size >= r && (best == nil || b.size < best.size || (b.size == best.size && (b.ptr < best.ptr) != bs.highTies)) {
			best = b
		}
	}
	return best
}

// nextNonEmpty returns the first non-empty bin > i, or -1.
func (bs *bins) nextNonEmpty(i int) int {
	i++
	if i >= numBins {
		return -1
	}
	w := i / 64
	m := bs.bitmap[w] &^ (1<<(i%64) - 1)
	for {
		if m != 0 {
			return w*64 + bits.TrailingZeros64(m)
		}
		w++
		if w >= bitmapWords {
			return -1
		}
		m = bs.bitmap[w]
	}
}

// find returns a free block of at least r bytes, the best fit it can see.
func (bs *bins) find(r uint64) *block {
	i := binIndex(r)
	if b := bs.bestIn(i, r); b != nil {
		return b
	}
	j := bs.nextNonEmpty(i)
	if j < 0 {
		return nil
	}
	return bs.bestIn(j, r)
}

// liveTable maps the pointer of every allocated block of a shard to its
// block: a chained hash through block.hnext, so lookups and updates make no
// heap allocation (Go maps may allocate when they rehash).
type liveTable struct {
	buckets []*block
	n       int
}

func (t *liveTable) slot(ptr uintptr) int {
	// Blocks are 512-aligned; Fibonacci hashing spreads the remaining bits.
	h := uint64(ptr>>9) * 0x9E3779B97F4A7C15
	return int(h >> (64 - bits.Len(uint(len(t.buckets)-1))))
}

func (t *liveTable) get(ptr uintptr) *block {
	if t.n == 0 {
		return nil
	}
	for b := t.buckets[t.slot(ptr)]; b != nil; b = b.hnext {
		if b.ptr == ptr {
			return b
		}
	}
	return nil
}

func (t *liveTable) put(b *block) {
	if t.n >= len(t.buckets) {
		t.grow()
	}
	i := t.slot(b.ptr)
	b.hnext = t.buckets[i]
	t.buckets[i] = b
	t.n++
}

func (t *liveTable) del(b *block) {
	i := t.slot(b.ptr)
	for pp := &t.buckets[i]; *pp != nil; pp = &(*pp).hnext {
		if *pp == b {
			*pp = b.hnext
			b.hnext = nil
			t.n--
			return
		}
	}
}

func (t *liveTable) grow() {
	n := 2 * len(t.buckets)
	if n < 64 {
		n = 64
	}
	old := t.buckets
	t.buckets = make([]*block, n)
	for _, b := range old {
		for b != nil {
			next := b.hnext
			i := t.slot(b.ptr)
			b.hnext = t.buckets[i]
			t.buckets[i] = b
			b = next
		}
	}
}
