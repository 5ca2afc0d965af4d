package allocator

import (
	"sync/atomic"
)

// Statistics follow torch.cuda.memory_stats(): families × {all, small_pool,
// large_pool} × {current, peak, allocated, freed}, then scalars.
//
// Where they live. Each shard keeps every counter in plain fields under its
// own lock (free on the cached path). A device sums its shards when read.
// The peaks that users watch most — allocation, allocated_bytes,
// requested_bytes, active and active_bytes of "all", and everything about
// segments and reserved bytes — are also kept device-wide in atomics, so they
// are exact however many streams allocate at once. The other peaks (per pool,
// inactive_split) are the sum of the shards' peaks: exact with one stream, an
// upper bound with several.
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

const (
	stAll = 0
	// stat types 1 and 2 are small_pool and large_pool; oversize blocks count
	// as large_pool, as in PyTorch.
	numStatTypes = 3
)

var typeNames = [numStatTypes]string{"all", "small_pool", "large_pool"}
var fieldNames = [4]string{"current", "peak", "allocated", "freed"}

// scalar statistics after the families.
var scalarNames = []string{
	"num_alloc_retries", "num_ooms", "num_sync_all_streams",
	"num_device_alloc", "num_device_free", "max_split_size",
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
		return 1
	}
	return 2
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

// shardStats holds the block counters of one shard.
type shardStats struct {
	st             [numFamilies][numStatTypes]localStat
	oversizeAllocs localStat
}

// add changes family f for a block of pool k by n, in "all" and in k's type.
func (ss *shardStats) add(f statFamily, k poolKind, n int64) {
	ss.st[f][stAll].add(n)
	ss.st[f][statType(k)].add(n)
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

// hotStats are the device-wide "all" counters touched on the cached path.
// active = allocation + pending (blocks freed but waiting on record_stream
// events), so only pending is kept apart and active's peaks are derived.
type hotStats struct {
	allocCount, allocBytes, reqBytes             atomic.Int64
	allocCountPeak, allocBytesPeak, reqBytesPeak atomic.Int64
	pendingCount, pendingBytes                   atomic.Int64
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

func (h *hotStats) free(size, req int64) {
	h.allocCount.Add(-1)
	h.allocBytes.Add(-size)
	h.reqBytes.Add(-req)
}

func (h *hotStats) reset() {
	h.allocCountPeak.Store(h.allocCount.Load())
	h.allocBytesPeak.Store(h.allocBytes.Load())
	h.reqBytesPeak.Store(h.reqBytes.Load())
	h.activeCountPeak.Store(h.allocCount.Load() + h.pendingCount.Load())
	h.activeBytesPeak.Store(h.allocBytes.Load() + h.pendingBytes.Load())
}

// Stats returns device dev's statistics in the order of StatNames.
func (p *Pool) Stats(dev int) ([]int64, error) {
	d, err := p.device(dev)
	if err != nil {
		return nil, err
	}
	var sum shardStats
	for _, s := range d.shardList() {
		s.mu.Lock()
		for f := range s.stats.st {
			for t := range s.stats.st[f] {
				a, b := &sum.st[f][t], s.stats.st[f][t]
				a.cur += b.cur
				a.peak += b.peak
				a.alloc += b.alloc
				a.freed += b.freed
			}
		}
		o := &sum.oversizeAllocs
		o.cur += s.stats.oversizeAllocs.cur
		o.peak += s.stats.oversizeAllocs.peak
		o.alloc += s.stats.oversizeAllocs.alloc
		o.freed += s.stats.oversizeAllocs.freed
		s.mu.Unlock()
	}
	// Device-wide exact values replace the summed ones where they exist.
	h := &d.hot
	sum.st[stAllocation][stAll].cur = h.allocCount.Load()
	sum.st[stAllocation][stAll].peak = h.allocCountPeak.Load()
	sum.st[stAllocatedBytes][stAll].cur = h.allocBytes.Load()
	sum.st[stAllocatedBytes][stAll].peak = h.allocBytesPeak.Load()
	sum.st[stRequestedBytes][stAll].cur = h.reqBytes.Load()
	sum.st[stRequestedBytes][stAll].peak = h.reqBytesPeak.Load()
	sum.st[stActive][stAll].peak = h.activeCountPeak.Load()
	sum.st[stActiveBytes][stAll].peak = h.activeBytesPeak.Load()
	for t := 0; t < numStatTypes; t++ {
		for f, a := range map[statFamily]*atomicStat{stSegment: &d.segments[t], stReservedBytes: &d.reserved[t]} {
			sum.st[f][t] = localStat{a.cur.Load(), a.peak.Load(), a.alloc.Load(), a.freed.Load()}
		}
	}
	out := make([]int64, 0, len(statNames))
	for f := range sum.st {
		for t := range sum.st[f] {
			s := sum.st[f][t]
			out = append(out, s.cur, s.peak, s.alloc, s.freed)
		}
	}
	o := sum.oversizeAllocs
	out = append(out, o.cur, o.peak, o.alloc, o.freed)
	os := &d.oversizeSegs
	out = append(out, os.cur.Load(), os.peak.Load(), os.alloc.Load(), os.freed.Load())
	out = append(out, d.numAllocRetries.Load(), d.numOOMs.Load(), d.numSyncAll.Load(),
		d.numDeviceAlloc.Load(), d.numDeviceFree.Load(), int64(p.cfg.MaxSplit))
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
	for _, s := range d.shardList() {
		s.mu.Lock()
		for f := range s.stats.st {
			for t := range s.stats.st[f] {
				s.stats.st[f][t].peak = s.stats.st[f][t].cur
			}
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
