package allocator

import (
	"sync"
	"sync/atomic"
)

// segMap finds the segment that holds an address without taking any lock:
// what a free by pointer alone (Free with AnyDevice: PyTorch's raw_delete
// and a tensor's deleter, which know only the pointer) and the lookups of
// interior pointers (BlockOf, SegmentOf, RecordStream) need, so that they
// lock only the shard that owns the block instead of every shard of every
// device in turn.
//
// It is an immutable array of the pool's segments sorted by address,
// published through an atomic pointer and replaced by a copy when a
// segment is made or given back (shards.go's table grows the same way).
// Invariants:
//   - The ranges are disjoint: a segment's range is its reserved address
//     space (a fixed segment's size, an expandable segment's whole reserved
//     range, which never moves while it is mapped), and a segment leaves
//     the map before its memory goes back to the backend (releaseSegment),
//     so a later segment at the same address cannot meet it here.
//   - A segment enters the map before any block of it is handed out
//     (addSeg, under its shard's lock, before the allocation returns). A
//     caller frees a pointer only after its allocation returned, so the
//     array it loads holds the block's segment.
//   - The map says which segment; seg.owner says which shard, checked again
//     under that shard's lock (a segment moves between shards only while
//     idle: steal.go; a segment with a live block never moves).
//
// The copy costs O(segments) per segment made or given back, on the slow
// path only, next to a driver allocation or free that costs far more; the
// lookup is a binary search that allocates nothing.
type segMap struct {
	mu  sync.Mutex // serializes writers; a leaf, taken under a shard's lock
	cur atomic.Pointer[[]segRange]
}

// segRange is one segment's address range [lo, hi).
type segRange struct {
	lo, hi uintptr
	seg    *segment
}

// span is the address range seg takes: for an expandable segment the
// whole reserved range, whatever is mapped of it now. CheckInvariants
// checks with it that no two segments overlap.
func (seg *segment) span() (lo, hi uintptr) {
	return seg.ptr, seg.ptr + uintptr(max(seg.size, seg.reservedRange()))
}

// find returns the segment whose range holds ptr, or nil.
func (m *segMap) find(ptr uintptr) *segment {
	rs := m.cur.Load()
	if rs == nil {
		return nil
	}
	r := *rs
	// The first range whose end is above ptr; it holds ptr if it starts
	// at or below it.
	lo, hi := 0, len(r)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r[mid].hi <= ptr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(r) && r[lo].lo <= ptr {
		return r[lo].seg
	}
	return nil
}

// add publishes seg's range.
func (m *segMap) add(seg *segment) {
	lo, hi := seg.span()
	m.mu.Lock()
	defer m.mu.Unlock()
	var old []segRange
	if rs := m.cur.Load(); rs != nil {
		old = *rs
	}
	i := 0
	for i < len(old) && old[i].lo < lo {
		i++
	}
	nr := make([]segRange, 0, len(old)+1)
	nr = append(nr, old[:i]...)
	nr = append(nr, segRange{lo: lo, hi: hi, seg: seg})
	nr = append(nr, old[i:]...)
	m.cur.Store(&nr)
}

// remove takes seg's range out; a segment not in the map is ignored.
func (m *segMap) remove(seg *segment) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rs := m.cur.Load()
	if rs == nil {
		return
	}
	old := *rs
	for i := range old {
		if old[i].seg == seg {
			nr := make([]segRange, 0, len(old)-1)
			nr = append(nr, old[:i]...)
			nr = append(nr, old[i+1:]...)
			m.cur.Store(&nr)
			return
		}
	}
}

// len is the number of segments in the map (tests, invariant checks).
func (m *segMap) len() int {
	if rs := m.cur.Load(); rs != nil {
		return len(*rs)
	}
	return 0
}

// lockedSegment returns the segment holding ptr and its owner shard,
// locked; or nil, nil when ptr is in no segment of the pool. It retries
// when the segment moved to another shard between the lookup and the lock.
func (p *Pool) lockedSegment(ptr uintptr) (*shard, *segment) {
	for {
		seg := p.byAddr.find(ptr)
		if seg == nil {
			return nil, nil
		}
		s := seg.owner.Load()
		s.mu.Lock()
		// owner is written under the locks of the shards a segment moves
		// between: with s.mu held, it stays s.
		if seg.owner.Load() == s {
			return s, seg
		}
		s.mu.Unlock()
	}
}
