package allocator

import (
	"errors"
	"fmt"
)

// What torch.cuda.MemPool asks of a private pool besides routing, with
// PyTorch's semantics (its CUDACachingAllocator's createOrIncrefPool,
// getPoolUseCount, setUseOnOOM, setNoSplit, emptyCache(mempool_id)):
//   - a pool may take its segments from another allocator than the backend
//     (a SegmentAllocator: ProcessGroupNCCL's ncclMemAlloc, PyTorch's
//     symmetric memory); they are cut and cached as the backend's are, and
//     go back through it;
//   - use_on_oom: a request of the default pool that would fail with
//     out-of-memory takes a free block of such a pool instead (AllocOnOOM);
//   - no_split: a block of the pool is handed out whole, never split.

// A SegmentAllocator gives a private pool its segments.
type SegmentAllocator interface {
	// Alloc returns size bytes of device dev; an error that IsOutOfMemory
	// when it has none.
	Alloc(dev int, size uint64) (uintptr, error)
	// Free gives back a segment Alloc returned.
	Free(dev int, ptr uintptr, size uint64) error
	// Close is called once, when the pool is forgotten (or was never made).
	Close()
}

// poolSource serves a private pool: fixed segments, from the pool's
// SegmentAllocator when it has one, cut unless the pool is no_split.
type poolSource struct {
	fixedSource
	pp *privatePool
}

func (f poolSource) cut(s *shard, b *block, r uint64) {
	if !f.pp.noSplit.Load() {
		f.fixedSource.cut(s, b, r)
	}
}

func (f poolSource) newMemory(s *shard, r uint64, k poolKind) (*block, error) {
	size := segmentSize(r, k, s.dev.pool.largeSegSize())
	if f.pp.segs == nil {
		return s.newSegment(size, k)
	}
	return s.newSegmentFrom(size, k, func() (uintptr, error) { return f.pp.segs.Alloc(s.dev.idx, size) })
}

func (f poolSource) giveBack(s *shard, seg *segment) (late, err error) {
	if f.pp.segs == nil {
		return f.fixedSource.giveBack(s, seg)
	}
	if err := f.pp.segs.Free(s.dev.idx, seg.ptr, seg.size); err != nil {
		s.dev.counts.numReleaseFailures.Add(1)
		return nil, fmt.Errorf("releasing a %d-byte segment at %#x of pool %v on device %d: %w", seg.size, seg.ptr, f.pp.id, s.dev.idx, err)
	}
	s.segmentEvent(ActSegmentFree, seg.ptr, seg.size)
	return nil, nil
}

// CreateOrIncrefPool makes private pool id of device dev with one use, or
// takes one more use of it (PyTorch's createOrIncrefPool: MemPool's
// constructor). segs, when not nil, gives the new pool its segments; the
// pool owns it from the call on, even on error (a pool that exists already
// refuses one, as PyTorch does).
func (p *Pool) CreateOrIncrefPool(dev int, id PoolID, segs SegmentAllocator) error {
	d, err := p.privateDevice(dev, id)
	if err != nil {
		closeSegs(segs)
		return err
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	if pp := d.privs[id]; pp != nil {
		if segs != nil {
			closeSegs(segs)
			return fmt.Errorf("%w: pool %v on device %d exists: only a new pool takes a segment allocator", ErrInvalid, id, dev)
		}
		pp.uses++
		return nil
	}
	d.newPrivatePool(id).segs = segs
	d.privs[id].uses = 1
	return nil
}

// newPrivatePool makes pool id, with no use. Called with privMu held.
func (d *device) newPrivatePool(id PoolID) *privatePool {
	if d.privs == nil {
		d.privs = map[PoolID]*privatePool{}
	}
	pp := &privatePool{id: id, shards: map[uintptr]*shard{}}
	d.privs[id] = pp
	return pp
}

func closeSegs(segs SegmentAllocator) {
	if segs != nil {
		segs.Close()
	}
}

// UseCount is pool id's uses (PyTorch's getPoolUseCount): its creation,
// each open routing, each graph sharing it, less the releases.
func (p *Pool) UseCount(dev int, id PoolID) (int, error) {
	return withPool(p, dev, id, "use count of", func(_ *device, pp *privatePool) (int, error) { return pp.uses, nil })
}

// SetUseOnOOM says whether the default pool of device dev may take free
// blocks of pool id when it is out of memory (AllocOnOOM).
func (p *Pool) SetUseOnOOM(dev int, id PoolID, on bool) error {
	_, err := withPool(p, dev, id, "use_on_oom of", func(d *device, pp *privatePool) (int, error) {
		if pp.onOOM != on {
			pp.onOOM = on
			if on {
				d.onOOM.Add(1)
			} else {
				d.onOOM.Add(-1)
			}
		}
		return 0, nil
	})
	return err
}

// SetNoSplit makes pool id hand out its blocks whole from now on.
func (p *Pool) SetNoSplit(dev int, id PoolID) error {
	_, err := withPool(p, dev, id, "no_split of", func(_ *device, pp *privatePool) (int, error) {
		pp.noSplit.Store(true)
		return 0, nil
	})
	return err
}

// withPool calls fn with pool id of device dev, under privMu.
func withPool(p *Pool, dev int, id PoolID, what string, fn func(*device, *privatePool) (int, error)) (int, error) {
	d, err := p.device(dev)
	if err != nil {
		return 0, err
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	pp, err := d.privatePool(id, what)
	if err != nil {
		return 0, err
	}
	return fn(d, pp)
}

// AllocOnOOM serves a default-pool request of device dev that failed with
// out-of-memory from a free block of a use_on_oom pool, as PyTorch's malloc
// does before it raises: the pool's shard of the same stream, cached
// blocks only. ok is false when none fits.
func (p *Pool) AllocOnOOM(dev int, stream uintptr, size uint64) (ptr uintptr, bsize uint64, ok bool) {
	if dev < 0 || dev >= len(p.devs) || size == 0 || size > maxRequest {
		return 0, 0, false
	}
	d := p.devs[dev]
	if d.onOOM.Load() == 0 {
		return 0, 0, false
	}
	d.privMu.Lock()
	var shards []*shard
	for _, pp := range d.privs {
		if s := pp.shards[stream]; pp.onOOM && s != nil {
			shards = append(shards, s)
		}
	}
	d.privMu.Unlock()
	for _, s := range shards {
		if ptr, bsize, ok = s.allocCached(size); ok {
			return ptr, bsize, true
		}
	}
	return 0, 0, false
}

// allocCached serves n from s's free blocks, or reports false.
func (s *shard) allocCached(n uint64) (uintptr, uint64, bool) {
	r, k := s.src.class(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.findFree(r, k)
	if b == nil || b.seg.hasHoles() {
		return 0, 0, false
	}
	s.take(b, r, n)
	s.dev.hist.record(ActAlloc, b.ptr, b.req, s.stream)
	return b.ptr, b.size, true
}

// EmptyPool gives back the idle segments of pool id on every device where
// it is released (PyTorch's emptyCache(mempool_id), which MemPool's
// destructor calls after its release), and forgets it once it holds none.
// The default pool and other pools keep their caches. Nothing is given back
// on a device while a routing is open there.
func (p *Pool) EmptyPool(id PoolID) error {
	if id == (PoolID{}) {
		return p.EmptyCache()
	}
	var errs []error
	for _, d := range p.devs {
		if !d.capture.hold() {
			continue
		}
		d.privMu.Lock()
		var shards []*shard
		if pp := d.privs[id]; pp != nil && pp.released() {
			for _, s := range pp.shards {
				shards = append(shards, s)
			}
		}
		d.privMu.Unlock()
		for _, s := range shards {
			errs = append(errs, s.waitPending(), s.src.release(s))
		}
		d.privMu.Lock()
		d.forgetReleased()
		d.privMu.Unlock()
		d.capture.leave()
	}
	return errors.Join(errs...)
}
