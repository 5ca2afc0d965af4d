package allocator

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Private pools: the memory of a CUDA graph capture, and segment-serving
// mode for a torch.cuda.MemPool. See doc.go ("Private pools").

// PoolID names a private pool, as PyTorch's MempoolId_t does. The zero value
// is the default pool, which cannot be named in the calls below.
type PoolID struct{ First, Second uint64 }

func (id PoolID) String() string { return fmt.Sprintf("(%d, %d)", id.First, id.Second) }

// ErrBusy marks a refused release of a private pool whose blocks are still
// allocated: nothing changes.
var ErrBusy = errors.New("pool busy")

// privatePool is one private pool of one device. Its fields are guarded by
// device.privMu; its shards' contents by their own mutexes.
//
// Invariants:
//   - uses counts BeginAllocateToPool calls not yet matched by ReleasePool
//     (PyTorch's use_count); a pool with uses == 0 is released: it takes no
//     new allocations, and EmptyCache returns its idle segments and forgets
//     it once it has none;
//   - its open routings are the entries of device.routes that name it (one
//     per BeginAllocateToPool not yet matched by EndAllocateToPool): the
//     device's one record of them (routes.go);
//   - its shards are on device.list (so frees, stats and snapshots find
//     them) and never in device.table (so default-pool allocations never
//     see them), and no other shard ever steals their segments.
type privatePool struct {
	id     PoolID
	uses   int
	direct bool // segments go back to the backend as soon as they are wholly free
	shards map[uintptr]*shard
	// What a torch.cuda.MemPool may ask (mempools.go): where its segments
	// come from (nil: the backend), set at creation; whether the default
	// pool may use it when out of memory (counted in device.onOOM); whether
	// its blocks are never split (read by its shards' source, so atomic).
	segs    SegmentAllocator
	onOOM   bool
	noSplit atomic.Bool
}

func (pp *privatePool) released() bool { return !pp.direct && pp.uses == 0 }

// BeginAllocateToPool starts routing allocations of device dev into private
// pool id, creating it or taking one more use of it (PyTorch's
// beginAllocateToPool: each graph capture calls it once, and a second graph
// sharing the pool calls it again). r picks the allocations the routing
// takes (RouteOf); nil: none, the caller names the pool itself (AllocIn).
// The pool owns r from then on, even on error, and closes it when the
// routing ends. While any pool of the device is routing, the pool records
// and queries no event, steals no segment across streams and processes no
// pending free, since any stream of the device may be capturing.
func (p *Pool) BeginAllocateToPool(dev int, id PoolID, r Route) error {
	d, err := p.privateDevice(dev, id)
	if err != nil {
		closeRoutes(r)
		return err
	}
	d.privMu.Lock()
	pp := d.privs[id]
	if pp == nil {
		pp = d.newPrivatePool(id)
	}
	pp.uses++
	d.openRoute(pp, r)
	d.privMu.Unlock()
	// The capture begins after this returns: operations that asked the
	// gate before it opened finish first (gate.go).
	d.capture.drain()
	return nil
}

// EndAllocateToPool stops the newest routing of pool id started by
// BeginAllocateToPool, and closes its Route. The pool keeps its memory:
// blocks freed later return to it, and only allocations routed to it again
// may reuse them.
func (p *Pool) EndAllocateToPool(dev int, id PoolID) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	d.privMu.Lock()
	pp, err := d.privatePool(id, "end of allocation to")
	var r Route
	if err == nil {
		var ok bool
		if r, ok = d.closeRoute(pp); !ok {
			err = fmt.Errorf("%w: end of allocation to pool %v on device %d: no allocation to it was begun", ErrInvalid, id, dev)
		}
	}
	d.privMu.Unlock()
	closeRoutes(r)
	return err
}

// ReleasePool drops one use of pool id (PyTorch's releasePool, called when a
// graph is destroyed). When the last use goes, the pool is released: its
// idle segments go back to the backend at the next EmptyCache or
// out-of-memory retry, and so do the segments of its blocks still allocated
// once they are freed; routings still open (a capture that never ended)
// end with it, or the device would stay in capture-safe mode for good.
// With strict, a pool whose blocks are still allocated is not touched and
// ErrBusy says how many; without it (PyTorch's semantics: a graph may die
// before its output tensors) the release goes ahead and the live blocks
// stay valid.
func (p *Pool) ReleasePool(dev int, id PoolID, strict bool) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	d.privMu.Lock()
	closed, err := d.releasePool(id, strict)
	d.privMu.Unlock()
	closeRoutes(closed...)
	return err
}

// releasePool is ReleasePool with privMu held; it returns the routes it
// ended, for the caller to close once privMu is unlocked.
func (d *device) releasePool(id PoolID, strict bool) ([]Route, error) {
	pp, err := d.privatePool(id, "release of")
	if err != nil {
		return nil, err
	}
	if pp.uses == 0 {
		return nil, fmt.Errorf("%w: release of pool %v on device %d: already released", ErrInvalid, id, d.idx)
	}
	if strict && pp.uses == 1 {
		if n, bytes := pp.liveBlocks(); n > 0 {
			return nil, fmt.Errorf("%w: release of pool %v on device %d: %d blocks (%d bytes) of it are still allocated; free them first; nothing released",
				ErrBusy, id, d.idx, n, bytes)
		}
	}
	pp.uses--
	var closed []Route
	if pp.uses == 0 {
		for r, ok := d.closeRoute(pp); ok; r, ok = d.closeRoute(pp) {
			closed = append(closed, r)
		}
	}
	return closed, nil
}

// privateDevice returns device dev for a call naming private pool id, or
// why it cannot be named (a bad device, the default pool's id).
func (p *Pool) privateDevice(dev int, id PoolID) (*device, error) {
	d, err := p.device(dev)
	if err == nil && id == (PoolID{}) {
		err = fmt.Errorf("%w: pool id (0, 0) is the default pool; a private pool needs a non-zero id", ErrInvalid)
	}
	return d, err
}

// privatePool returns pool id of the device, or an error naming what was
// asked of it ("release of"). Called with privMu held.
func (d *device) privatePool(id PoolID, what string) (*privatePool, error) {
	if pp := d.privs[id]; pp != nil {
		return pp, nil
	}
	return nil, fmt.Errorf("%w: %s pool %v on device %d: no such pool", ErrInvalid, what, id, d.idx)
}

// Routing reports whether allocations are being routed to pool id of device
// dev (begun and not yet ended, nor released).
func (p *Pool) Routing(dev int, id PoolID) bool {
	d, err := p.device(dev)
	if err != nil {
		return false
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	pp := d.privs[id]
	return pp != nil && d.routings(pp) > 0
}

// liveBlocks counts the allocated and pending blocks of the pool. Called with
// privMu held.
func (pp *privatePool) liveBlocks() (n, bytes int64) {
	for _, s := range pp.shards {
		s.mu.Lock()
		c := &s.stats.c[stAll]
		n += c.nAlloc - c.nDone
		bytes += c.bAlloc - c.bDone
		s.mu.Unlock()
	}
	return n, bytes
}

// AllocIn is Alloc from private pool id, which BeginAllocateToPool must have
// made active on device dev (RouteOf finds the pool of a routed allocation). The block is the pool's until freed, and its
// memory is never handed to an allocation outside the pool.
func (p *Pool) AllocIn(dev int, stream uintptr, size uint64, id PoolID) (uintptr, uint64, error) {
	if size == 0 {
		return 0, 0, nil
	}
	if err := p.badRequest(dev, size); err != nil {
		return 0, 0, err
	}
	d := p.devs[dev]
	d.privMu.Lock()
	pp := d.privs[id]
	if pp == nil || d.routings(pp) == 0 {
		d.privMu.Unlock()
		return 0, 0, fmt.Errorf("%w: allocation in pool %v on device %d: no allocation to that pool is under way", ErrInvalid, id, dev)
	}
	s := d.poolShard(pp, stream)
	d.privMu.Unlock()
	ptr, pl, err := s.alloc(size, nil)
	return ptr, pl.Size, err
}

// AllocSegment serves a request as a segment of its own, which goes back to
// the backend as soon as it is freed: what a torch.cuda.MemPool needs, since
// PyTorch's caching allocator above caches it already (a second cache below
// would keep memory nobody can reach). Statistics count it like any block.
func (p *Pool) AllocSegment(dev int, stream uintptr, size uint64) (uintptr, uint64, error) {
	if size == 0 {
		return 0, 0, nil
	}
	if err := p.badRequest(dev, size); err != nil {
		return 0, 0, err
	}
	d := p.devs[dev]
	d.privMu.Lock()
	if d.direct == nil {
		d.direct = &privatePool{direct: true, shards: map[uintptr]*shard{}}
	}
	s := d.poolShard(d.direct, stream)
	d.privMu.Unlock()
	ptr, pl, err := s.alloc(size, nil)
	return ptr, pl.Size, err
}

// poolShard returns pool pp's shard of stream, creating it. Called with
// privMu held.
func (d *device) poolShard(pp *privatePool, stream uintptr) *shard {
	if s := pp.shards[stream]; s != nil {
		return s
	}
	s := &shard{dev: d, stream: stream, pool: pp, src: d.sourceFor(pp, false)}
	pp.shards[stream] = s
	d.mu.Lock()
	d.appendShard(s)
	d.mu.Unlock()
	return s
}

// appendShard publishes s on the device's shard list, switching the device
// to device-wide counters at its second shard. Called with d.mu held.
func (d *device) appendShard(s *shard) {
	old := *d.list.Load()
	if len(old) == 1 {
		d.goMulti(old[0])
	}
	nl := make([]*shard, len(old), len(old)+1)
	copy(nl, old)
	nl = append(nl, s)
	d.list.Store(&nl)
}

// forgetReleased drops released private pools that hold no segment any
// more, and their shards. Called with privMu held and no shard lock.
func (d *device) forgetReleased() {
	for id, pp := range d.privs {
		if !pp.released() {
			continue
		}
		empty := true
		for _, s := range pp.shards {
			s.mu.Lock()
			empty = empty && s.segs == nil && len(s.pending) == 0
			s.mu.Unlock()
		}
		if !empty {
			continue
		}
		delete(d.privs, id)
		if pp.onOOM {
			d.onOOM.Add(-1)
		}
		closeSegs(pp.segs) // no segment of it is left
		d.mu.Lock()
		old := *d.list.Load()
		nl := make([]*shard, 0, len(old))
		for _, s := range old {
			if s.pool != pp {
				nl = append(nl, s)
			}
		}
		d.list.Store(&nl)
		d.mu.Unlock()
	}
}

// PoolInfo describes a private pool for tests and snapshots.
type PoolInfo struct {
	ID       PoolID
	Uses     int
	Active   int
	Segments int
	Reserved uint64
}

// Pools lists device dev's private pools (not the default pool, nor the
// segment-serving one).
func (p *Pool) Pools(dev int) ([]PoolInfo, error) {
	d, err := p.device(dev)
	if err != nil {
		return nil, err
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	out := make([]PoolInfo, 0, len(d.privs))
	for _, pp := range d.privs {
		pi := PoolInfo{ID: pp.id, Uses: pp.uses, Active: d.routings(pp)}
		for _, s := range pp.shards {
			s.mu.Lock()
			for seg := s.segs; seg != nil; seg = seg.snext {
				pi.Segments++
				pi.Reserved += seg.size
			}
			s.mu.Unlock()
		}
		out = append(out, pi)
	}
	return out, nil
}
