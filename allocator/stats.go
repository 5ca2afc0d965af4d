package allocator

import (
	"sync/atomic"
)

// Statistics follow torch.cuda.memory_stats(): families × {all, small_pool,
// large_pool} × {current, peak, allocated, freed}, then scalars.
//
// Where they live. Each shard keeps its block counters in plain fields under
// its own lock (a few adds on the cached path, no atomics). A device sums its
// shards when read. Segments and reserved bytes change only on slow paths and
// are device-wide atomics, exact. Once a device has a second stream, the
// "all" block counters are also kept device-wide (hotStats), so the peaks
// users watch most — allocation, allocated_bytes, requested_bytes, active,
// active_bytes of "all" — stay exact. The remaining peaks (per pool,
// inactive_split) are then the sum of the shards' peaks: exact with one
// stream, an upper bound with several.
type statFamily int

const (
	stAllocation statFamily = iota
	stSegment
	stActive
	stInactiveSplit
	stAllocatedBytes
	stReservedBytes
	stActiveBytes
	stInactiveSplitBytes
	stRequestedBytes
	numFamilies
)

var familyNames = [numFamilies]string{
	"allocation", "segment", "active", "inactive_split", "allocated_bytes",
	"reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
}

// The statistics types, in PyTorch's order (typeNames): stAll, then a
// block's own pool's. Oversize blocks count as large_pool, as in PyTorch.
// The C++ front cache counts with the same numbers: export/shim_internal.h's
// SYMMSHIM_STAT_*, checked against these when libsymm is built.
const (
	stAll         = 0
	StatSmallPool = 1
	StatLargePool = 2
	numStatTypes  = 3
)

var typeNames = [numStatTypes]string{"all", "small_pool", "large_pool"}
var fieldNames = [4]string{"current", "peak", "allocated", "freed"}

// scalar statistics after the families.
var scalarNames = []string{
	"num_alloc_retries", "num_ooms", "num_sync_all_streams",
	"num_device_alloc", "num_device_free", "max_split_size",
	// libsymm's own: requests the front cache served with a block it held
	// (Front.Served), counted in the figures above too.
	"num_front_cache_hits",
	// libsymm's own: what mapping and unmapping chunks of expandable
	// segments costs (growth, Config.UnmapFreePages, release): driver
	// calls made, microseconds spent in them, and chunks mapped again from
	// spare ones instead of created (pages.go).
	"num_chunk_maps", "num_chunk_unmaps", "chunk_map_us", "chunk_unmap_us", "num_spare_chunks_reused",
	// libsymm's own: unmaps and releases of cached memory that failed
	// (release, the out-of-memory retry, free pages); each left the pool's
	// books equal to what the backend has mapped, and the pool went on.
	"num_release_failures",
}

var statNames = func() []string {
	var n []string
	for f := statFamily(0); f < numFamilies; f++ {
		for t := 0; t < numStatTypes; t++ {
			for _, fl := range fieldNames {
				n = append(n, familyNames[f]+"."+typeNames[t]+"."+fl)
			}
		}
	}
	for _, o := range []string{"oversize_allocations", "oversize_segments"} {
		for _, fl := range fieldNames {
			n = append(n, o+"."+fl)
		}
	}
	return append(n, scalarNames...)
}()

// StatNames lists the statistics Stats reports, in its order. The slice is
// shared: do not modify it.
func StatNames() []string { return statNames }

func statType(k poolKind) int {
	if k == smallPool {
		return StatSmallPool
	}
	return StatLargePool
}

// localStat is a counter kept under a shard's lock.
type localStat struct{ cur, peak, alloc, freed int64 }

func (s *localStat) add(n int64) {
	s.cur += n
	if n >= 0 {
		s.alloc += n
		if s.cur > s.peak {
			s.peak = s.cur
		}
	} else {
		s.freed -= n
	}
}

// blockCounters count one stat type's blocks in a shard. Only cumulative
// sums are kept; current values are differences, so the cached path does a
// few adds and compares. A block is allocated (alloc), then freed (free),
// then, once no record_stream event holds it, done: active = alloc − done.
type blockCounters struct {
	nAlloc, nFree, nDone int64 // blocks
	bAlloc, bFree, bDone int64 // block bytes
	rAlloc, rFree        int64 // requested bytes
	peakN, peakB, peakR  int64 // allocation, allocated_bytes, requested_bytes
	peakActN, peakActB   int64 // active, active_bytes
}

func (c *blockCounters) alloc(sz, req int64) {
	c.nAlloc++
	c.bAlloc += sz
	c.rAlloc += req
	c.peakN = max(c.peakN, c.nAlloc-c.nFree)
	c.peakB = max(c.peakB, c.bAlloc-c.bFree)
	c.peakR = max(c.peakR, c.rAlloc-c.rFree)
	c.peakActN = max(c.peakActN, c.nAlloc-c.nDone)
	c.peakActB = max(c.peakActB, c.bAlloc-c.bDone)
}

func (c *blockCounters) free(sz, req int64) {
	c.nFree++
	c.bFree += sz
	c.rFree += req
}

func (c *blockCounters) done(sz int64) {
	c.nDone++
	c.bDone += sz
}

func (c *blockCounters) resetPeaks() {
	c.peakN, c.peakB, c.peakR = c.nAlloc-c.nFree, c.bAlloc-c.bFree, c.rAlloc-c.rFree
	c.peakActN, c.peakActB = c.nAlloc-c.nDone, c.bAlloc-c.bDone
}

// shardStats holds the block counters of one shard.
type shardStats struct {
	c              [numStatTypes]blockCounters
	inactive       [numStatTypes]localStat // inactive_split
	inactiveBytes  [numStatTypes]localStat // inactive_split_bytes
	oversizeAllocs localStat
	// base is c's cumulative sums at the last ResetAccumulated. The
	// "allocated" and "freed" statistics are reported as differences from
	// it, because the sums themselves also give the currents (alloc − free,
	// alloc − done) and the peaks: zeroing them would break those.
	base [numStatTypes]accumulated
}

// accumulated is a snapshot of the cumulative sums of blockCounters.
type accumulated struct {
	nAlloc, nFree, nDone int64
	bAlloc, bFree, bDone int64
	rAlloc, rFree        int64
}

func (ss *shardStats) alloc(k poolKind, sz, req int64) {
	ss.c[stAll].alloc(sz, req)
	ss.c[statType(k)].alloc(sz, req)
	if k == oversizePool {
		ss.oversizeAllocs.add(1)
	}
}

func (ss *shardStats) free(k poolKind, sz, req int64) {
	ss.c[stAll].free(sz, req)
	ss.c[statType(k)].free(sz, req)
	if k == oversizePool {
		ss.oversizeAllocs.add(-1)
	}
}

func (ss *shardStats) done(k poolKind, sz int64) {
	ss.c[stAll].done(sz)
	ss.c[statType(k)].done(sz)
}

func (ss *shardStats) inactiveSplit(k poolKind, n, sz int64) {
	for _, t := range [2]int{stAll, statType(k)} {
		ss.inactive[t].add(n)
		ss.inactiveBytes[t].add(sz)
	}
}

// atomicStat is a device-wide counter with an exact peak.
type atomicStat struct{ cur, peak, alloc, freed atomic.Int64 }

func (s *atomicStat) add(n int64) {
	c := s.cur.Add(n)
	if n >= 0 {
		s.alloc.Add(n)
		raisePeak(&s.peak, c)
	} else {
		s.freed.Add(-n)
	}
}

func (s *atomicStat) reset() { s.peak.Store(s.cur.Load()) }

// raisePeak makes p at least c. The load-compare is the common, cheap case.
func raisePeak(p *atomic.Int64, c int64) {
	for {
		old := p.Load()
		if c <= old || p.CompareAndSwap(old, c) {
			return
		}
	}
}

// hotStats are the device-wide "all" counters of blocks. While a device has
// one stream, its shard's own counters are exact and these stay unused, so
// the cached path has no atomic operation; from the second stream on (multi),
// every shard also updates these, so the device's peaks stay exact.
type hotStats struct {
	multi                                        atomic.Bool
	allocCount, allocBytes, reqBytes             atomic.Int64
	pendingCount, pendingBytes                   atomic.Int64
	allocCountPeak, allocBytesPeak, reqBytesPeak atomic.Int64
	activeCountPeak, activeBytesPeak             atomic.Int64
}

func (h *hotStats) alloc(size, req int64) {
	c := h.allocCount.Add(1)
	b := h.allocBytes.Add(size)
	r := h.reqBytes.Add(req)
	raisePeak(&h.allocCountPeak, c)
	raisePeak(&h.allocBytesPeak, b)
	raisePeak(&h.reqBytesPeak, r)
	raisePeak(&h.activeCountPeak, c+h.pendingCount.Load())
	raisePeak(&h.activeBytesPeak, b+h.pendingBytes.Load())
}

// free takes a block out of the allocated counts; pending blocks stay active.
func (h *hotStats) free(size, req int64, pending bool) {
	if pending {
		h.pendingCount.Add(1)
		h.pendingBytes.Add(size)
	}
	h.allocCount.Add(-1)
	h.allocBytes.Add(-size)
	h.reqBytes.Add(-req)
}

func (h *hotStats) done(size int64) {
	h.pendingCount.Add(-1)
	h.pendingBytes.Add(-size)
}

func (h *hotStats) reset() {
	h.allocCountPeak.Store(h.allocCount.Load())
	h.allocBytesPeak.Store(h.allocBytes.Load())
	h.reqBytesPeak.Store(h.reqBytes.Load())
	h.activeCountPeak.Store(h.allocCount.Load() + h.pendingCount.Load())
	h.activeBytesPeak.Store(h.allocBytes.Load() + h.pendingBytes.Load())
}

// goMulti switches device d to device-wide counters when its second shard
// appears, seeding them from the first shard. Called with d.mu held, before
// the new shard is published; the first shard's lock orders the switch with
// its own updates.
func (d *device) goMulti(first *shard) {
	first.mu.Lock()
	c := &first.stats.c[stAll]
	h := &d.hot
	h.allocCount.Store(c.nAlloc - c.nFree)
	h.allocBytes.Store(c.bAlloc - c.bFree)
	h.reqBytes.Store(c.rAlloc - c.rFree)
	h.pendingCount.Store(c.nFree - c.nDone)
	h.pendingBytes.Store(c.bFree - c.bDone)
	h.allocCountPeak.Store(c.peakN)
	h.allocBytesPeak.Store(c.peakB)
	h.reqBytesPeak.Store(c.peakR)
	h.activeCountPeak.Store(c.peakActN)
	h.activeBytesPeak.Store(c.peakActB)
	h.multi.Store(true)
	first.mu.Unlock()
}

// Stats returns device dev's statistics in the order of StatNames.
func (p *Pool) Stats(dev int) ([]int64, error) {
	d, err := p.device(dev)
	if err != nil {
		return nil, err
	}
	p.observe(dev)
	var sum [numFamilies][numStatTypes]localStat
	var over localStat
	addTo := func(a *localStat, cur, peak, alloc, freed int64) {
		a.cur += cur
		a.peak += peak
		a.alloc += alloc
		a.freed += freed
	}
	for _, s := range d.shardList() {
		s.mu.Lock()
		for t := range s.stats.c {
			c, z := &s.stats.c[t], &s.stats.base[t]
			addTo(&sum[stAllocation][t], c.nAlloc-c.nFree, c.peakN, c.nAlloc-z.nAlloc, c.nFree-z.nFree)
			addTo(&sum[stAllocatedBytes][t], c.bAlloc-c.bFree, c.peakB, c.bAlloc-z.bAlloc, c.bFree-z.bFree)
			addTo(&sum[stRequestedBytes][t], c.rAlloc-c.rFree, c.peakR, c.rAlloc-z.rAlloc, c.rFree-z.rFree)
			addTo(&sum[stActive][t], c.nAlloc-c.nDone, c.peakActN, c.nAlloc-z.nAlloc, c.nDone-z.nDone)
			addTo(&sum[stActiveBytes][t], c.bAlloc-c.bDone, c.peakActB, c.bAlloc-z.bAlloc, c.bDone-z.bDone)
			i, ib := s.stats.inactive[t], s.stats.inactiveBytes[t]
			addTo(&sum[stInactiveSplit][t], i.cur, i.peak, i.alloc, i.freed)
			addTo(&sum[stInactiveSplitBytes][t], ib.cur, ib.peak, ib.alloc, ib.freed)
		}
		o := s.stats.oversizeAllocs
		addTo(&over, o.cur, o.peak, o.alloc, o.freed)
		s.mu.Unlock()
	}
	// With several streams, the device-wide counters give exact "all" peaks.
	if h := &d.hot; h.multi.Load() {
		sum[stAllocation][stAll].peak = h.allocCountPeak.Load()
		sum[stAllocatedBytes][stAll].peak = h.allocBytesPeak.Load()
		sum[stRequestedBytes][stAll].peak = h.reqBytesPeak.Load()
		sum[stActive][stAll].peak = h.activeCountPeak.Load()
		sum[stActiveBytes][stAll].peak = h.activeBytesPeak.Load()
	}
	hits := d.addFrontServed(&sum)
	for t := 0; t < numStatTypes; t++ {
		for f, a := range [...]*atomicStat{stSegment: &d.segments[t], stReservedBytes: &d.reserved[t]} {
			if a != nil {
				sum[f][t] = localStat{a.cur.Load(), a.peak.Load(), a.alloc.Load(), a.freed.Load()}
			}
		}
	}
	out := make([]int64, 0, len(statNames))
	for f := range sum {
		for t := range sum[f] {
			s := sum[f][t]
			out = append(out, s.cur, s.peak, s.alloc, s.freed)
		}
	}
	out = append(out, over.cur, over.peak, over.alloc, over.freed)
	os := &d.oversizeSegs
	out = append(out, os.cur.Load(), os.peak.Load(), os.alloc.Load(), os.freed.Load())
	out = append(out, d.counts.numAllocRetries.Load(), d.counts.numOOMs.Load(), d.counts.numSyncAll.Load(),
		d.counts.numDeviceAlloc.Load(), d.counts.numDeviceFree.Load(), p.maxSplitStat(), hits,
		d.counts.numChunkMaps.Load(), d.counts.numChunkUnmaps.Load(), d.counts.chunkMapNs.Load()/1000, d.counts.chunkUnmapNs.Load()/1000,
		d.counts.numSpareReused.Load(), d.counts.numReleaseFailures.Load())
	return out, nil
}

// StatsMap is Stats keyed by name, for tests and tools.
func (p *Pool) StatsMap(dev int) (map[string]int64, error) {
	v, err := p.Stats(dev)
	if err != nil {
		return nil, err
	}
	m := make(map[string]int64, len(v))
	for i, n := range statNames {
		m[n] = v[i]
	}
	return m, nil
}

// ResetPeak sets every peak of device dev to the current value.
func (p *Pool) ResetPeak(dev int) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	p.observe(dev)
	for _, s := range d.shardList() {
		s.mu.Lock()
		for t := range s.stats.c {
			s.stats.c[t].resetPeaks()
			s.stats.inactive[t].peak = s.stats.inactive[t].cur
			s.stats.inactiveBytes[t].peak = s.stats.inactiveBytes[t].cur
		}
		s.stats.oversizeAllocs.peak = s.stats.oversizeAllocs.cur
		s.mu.Unlock()
	}
	d.hot.reset()
	for t := 0; t < numStatTypes; t++ {
		d.segments[t].reset()
		d.reserved[t].reset()
	}
	d.oversizeSegs.reset()
	return nil
}

// ResetAccumulated zeroes every "allocated" and "freed" statistic of device
// dev and the counters num_alloc_retries, num_ooms, num_sync_all_streams,
// num_device_alloc and num_device_free (PyTorch's resetAccumulatedStats),
// and libsymm's chunk counters;
// current and peak values are unchanged. Block counters keep their sums and
// move a baseline (shardStats.base); the others are zeroed in place.
func (p *Pool) ResetAccumulated(dev int) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	p.observe(dev) // frees parked before the reset count before it
	for _, s := range d.shardList() {
		s.mu.Lock()
		ss := &s.stats
		for t := range ss.c {
			c := &ss.c[t]
			ss.base[t] = accumulated{c.nAlloc, c.nFree, c.nDone, c.bAlloc, c.bFree, c.bDone, c.rAlloc, c.rFree}
			ss.inactive[t].alloc, ss.inactive[t].freed = 0, 0
			ss.inactiveBytes[t].alloc, ss.inactiveBytes[t].freed = 0, 0
		}
		ss.oversizeAllocs.alloc, ss.oversizeAllocs.freed = 0, 0
		s.mu.Unlock()
	}
	for t := 0; t < numStatTypes; t++ {
		d.segments[t].resetAccumulated()
		d.reserved[t].resetAccumulated()
	}
	if f := p.cfg.Front; f != nil {
		d.frontMu.Lock()
		d.frontBase = f.Served(d.idx)
		d.frontMu.Unlock()
	}
	d.oversizeSegs.resetAccumulated()
	for _, n := range []*atomic.Int64{&d.counts.numAllocRetries, &d.counts.numOOMs, &d.counts.numSyncAll, &d.counts.numDeviceAlloc, &d.counts.numDeviceFree,
		&d.counts.numChunkMaps, &d.counts.numChunkUnmaps, &d.counts.chunkMapNs, &d.counts.chunkUnmapNs, &d.counts.numSpareReused, &d.counts.numReleaseFailures} {
		n.Store(0)
	}
	return nil
}

// resetAccumulated zeroes the allocated and freed totals; an add racing with
// it may leave its amount in one of them, as a reset an instant later would.
func (s *atomicStat) resetAccumulated() {
	s.alloc.Store(0)
	s.freed.Store(0)
}

// addFrontServed adds to sum's cumulative allocated and freed figures what a
// cache in front of the pool served itself since the last reset
// (Front.Served): each such request is an allocation and a free the
// pool never saw, of the same block. Current values and peaks do not move:
// to the pool the block stayed allocated all along.
func (d *device) addFrontServed(sum *[numFamilies][numStatTypes]localStat) (hits int64) {
	f := d.pool.cfg.Front
	if f == nil {
		return 0
	}
	now := f.Served(d.idx)
	d.frontMu.Lock()
	base := d.frontBase
	d.frontMu.Unlock()
	for t := 1; t < numStatTypes; t++ {
		n, b, r := now[t].N-base[t].N, now[t].Bytes-base[t].Bytes, now[t].Req-base[t].Req
		hits += n
		for _, fv := range [...]struct {
			f statFamily
			v int64
		}{{stAllocation, n}, {stAllocatedBytes, b}, {stRequestedBytes, r}, {stActive, n}, {stActiveBytes, b}} {
			for _, tt := range [...]int{t, stAll} {
				sum[fv.f][tt].alloc += fv.v
				sum[fv.f][tt].freed += fv.v
			}
		}
	}
	return hits
}

// StreamUsage is what one stream's part of a pool holds on a device.
type StreamUsage struct {
	Stream uintptr
	// Private: the shard serves a graph private pool or a MemPool, not the
	// default pool.
	Private bool
	// Allocated is the bytes of blocks handed out and not freed
	// (allocated_bytes); Reserved the memory of its segments (mapped chunks
	// only, for expandable ones); Segments how many.
	Allocated, Reserved int64
	Segments            int
}

// StreamUsage reports, per stream and pool, what the pool holds on device
// dev, in no particular order. It takes each shard's lock in turn, briefly:
// for monitors (symm top), not for the cached path.
func (p *Pool) StreamUsage(dev int) ([]StreamUsage, error) {
	d, err := p.device(dev)
	if err != nil {
		return nil, err
	}
	p.observe(dev)
	var out []StreamUsage
	for _, s := range d.shardList() {
		s.mu.Lock()
		c := &s.stats.c[stAll]
		u := StreamUsage{Stream: s.stream, Private: s.pool != nil, Allocated: c.bAlloc - c.bFree}
		for seg := s.segs; seg != nil; seg = seg.snext {
			u.Reserved += int64(seg.mappedBytes(d.expand.chunk))
			u.Segments++
		}
		s.mu.Unlock()
		out = append(out, u)
	}
	return out, nil
}

// maxSplitStat is the max_split_size statistic as PyTorch reports it: the
// value when the pool was made (PyTorch's device allocators read it once,
// in their constructor, and a run-time change leaves the statistic as it
// was), -1 for none (its SIZE_MAX as int64).
func (p *Pool) maxSplitStat() int64 {
	if p.cfg.MaxSplit == 0 {
		return -1
	}
	return int64(p.cfg.MaxSplit)
}
