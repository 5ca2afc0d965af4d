package trace

import "github.com/libsymm/libsymm/allocator"

// This file samples the memory held over a trace, for charts: the replayed
// pool's (Options.Samples, Result.Series) and the recorded run's
// (RecordedSeries).

// Point is the memory at one row of a trace, or the most over a run of
// rows.
type Point struct {
	// Row is the row of the trace, counting its events from 1 (the header
	// and blank lines are not rows); 0 is before the first row, where the
	// blocks allocated before recording began are live. A downsampled
	// point stands for the rows from Row to the next point's.
	Row int
	// Allocated and Reserved are bytes; a downsampled point holds the most
	// of each over its rows (not necessarily at the same row), so the
	// series' maxima are the run's peaks.
	Allocated, Reserved uint64
}

// sampler keeps, of a state that changes at rows 0..rows, the most of each
// field within each bucket of width consecutive rows: at most samples
// points however long the trace. A row's state is every state observed at
// it (the last stays), or, with none, the state before it.
type sampler struct {
	width, rows int
	seen        int   // the last row observed (-1: none)
	bucket      int   // the bucket open now
	cur, top    Point // the state now; the most within the open bucket
	out         []Point
}

// newSampler returns a sampler of rows 0..rows in at most samples points,
// or nil when samples is not positive.
func newSampler(rows, samples int) *sampler {
	if samples <= 0 {
		return nil
	}
	return &sampler{width: max(1, (rows+samples)/samples), rows: rows, seen: -1} // ceil((rows+1)/samples)
}

// observe records the state after (part of) row row; rows never go back.
func (s *sampler) observe(row int, allocated, reserved uint64) {
	if row > s.seen {
		s.carry(row)
		s.seen = row
	}
	s.moveTo(row / s.width)
	s.cur.Allocated, s.cur.Reserved = allocated, reserved
	s.top.Allocated, s.top.Reserved = max(s.top.Allocated, allocated), max(s.top.Reserved, reserved)
}

// carry counts the state now in the buckets of the rows after the last
// observed and before row, which held it.
func (s *sampler) carry(row int) {
	first, last := s.seen+1, row-1
	if first > last {
		return
	}
	for b := first / s.width; b <= last/s.width; b++ {
		s.moveTo(b)
		s.top.Allocated, s.top.Reserved = max(s.top.Allocated, s.cur.Allocated), max(s.top.Reserved, s.cur.Reserved)
	}
}

// moveTo closes the buckets before bucket b.
func (s *sampler) moveTo(b int) {
	for s.bucket < b {
		s.out = append(s.out, Point{Row: s.bucket * s.width, Allocated: s.top.Allocated, Reserved: s.top.Reserved})
		s.bucket++
		s.top = Point{}
	}
}

// finish closes every bucket up to the last row and returns the points.
func (s *sampler) finish() []Point {
	s.carry(s.rows + 1)
	s.moveTo(s.rows/s.width + 1)
	return s.out
}

// rowSetter is a player that play tells which row its next calls come from
// (before the pre-existing blocks, it is 0).
type rowSetter interface{ setRow(row int) }

func (r *replayer) setRow(row int) {
	r.row = row
	r.v.Tick(row)
}

// statAllocated and statReserved are the indexes in Pool.Stats of
// allocated_bytes.all.current and reserved_bytes.all.current.
var statAllocated, statReserved = func() (int, int) {
	a, r := -1, -1
	for i, n := range allocator.StatNames() {
		switch n {
		case "allocated_bytes.all.current":
			a = i
		case "reserved_bytes.all.current":
			r = i
		}
	}
	return a, r
}()

// sample records the pool's allocated and reserved bytes now. Reserved is
// reserved_bytes.all.current, whose peak is Result.PeakReserved (the table's
// peak reserved), not the backend's bytes in use (Result.BackendPeak);
// allocated is allocated_bytes.all.current (block sizes, blocks parked in
// the front cache model included), whose peak is Result.PeakAllocated.
func (r *replayer) sample() {
	if r.series == nil {
		return
	}
	st, err := r.pool.Stats(0)
	if err != nil {
		return // device 0 always exists
	}
	r.series.observe(r.row, uint64(st[statAllocated]), uint64(st[statReserved]))
}

// RecordedSeries samples the trace's own figures (Recorded) over its rows
// in at most samples points (none when samples is not positive): allocated
// is the running sum whose peak is Recorded.PeakAllocated, reserved the
// running sum of segment rows whose peak is Recorded.PeakReserved (0 at
// every row when the trace has no segment rows: see HasReserved).
func (t *Trace) RecordedSeries(samples int) []Point {
	rows := len(t.Events)
	alloc := &seriesSummer{s: newSampler(rows, samples)}
	if alloc.s == nil {
		return nil
	}
	_ = t.play(alloc) // seriesSummer never fails
	out := alloc.s.finish()

	// Reserved: the running sum, raised by the deepest point it reaches
	// below zero (as peakReserved).
	var cur, low int64
	for _, e := range t.Events {
		cur += segmentDelta(e)
		low = min(low, cur)
	}
	res := newSampler(rows, samples)
	cur = -low
	res.observe(0, 0, uint64(cur))
	for i, e := range t.Events {
		if d := segmentDelta(e); d != 0 {
			cur += d
			res.observe(i+1, 0, uint64(cur))
		}
	}
	for i, p := range res.finish() {
		out[i].Reserved = p.Reserved
	}
	return out
}

// segmentDelta is what a row adds to the segment memory held.
func segmentDelta(e Event) int64 {
	switch e.Action {
	case SegmentAlloc, SegmentMap:
		return int64(e.Size)
	case SegmentFree, SegmentUnmap:
		return -int64(e.Size)
	}
	return 0
}

// seriesSummer is summer sampling its running sum at every block.
type seriesSummer struct {
	summer
	row int
	s   *sampler
}

func (s *seriesSummer) setRow(row int) { s.row = row }

func (s *seriesSummer) alloc(e Event, pre bool) error {
	_ = s.summer.alloc(e, pre)
	s.s.observe(s.row, s.cur, 0)
	return nil
}

func (s *seriesSummer) free(a, by Event, lost bool) error {
	_ = s.summer.free(a, by, lost)
	s.s.observe(s.row, s.cur, 0)
	return nil
}
