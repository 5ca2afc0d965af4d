package trace

// This file holds the one definition of which rows pair up, shared by the
// trace's own figures (Recorded) and the replay through a pool (Replay), so
// that the two always count the same blocks.

// player receives the blocks of a trace as play walks them.
type player interface {
	// alloc begins a block. pre: the block was allocated before recording
	// began (e is the free_completed row that ends it).
	alloc(e Event, pre bool) error
	// free ends the block begun by a. by is the free_completed row, or for
	// a lost free (lost true) the alloc row that reuses a's address.
	free(a, by Event, lost bool) error
	// unmatched reports a free_completed row whose address is not live
	// although an alloc of it was seen before (a double free).
	unmatched(e Event)
}

// play walks the alloc and free_completed rows of t:
//
//  1. first an alloc of each pre-existing block (see preexisting), in the
//     order of the rows that free them;
//  2. then the rows in order: an alloc begins a block, after ending the one
//     still live at the same address if any (its free was lost); a
//     free_completed ends the live block at its address.
//
// Rows of size 0 and all other actions are skipped. Invariant: every block
// begun is ended at most once, and a block is live at most once per address.
func (t *Trace) play(p player) error {
	live := map[uint64]Event{} // address -> the row that began its block
	for _, e := range t.preexisting() {
		live[e.Addr] = e
		if err := p.alloc(e, true); err != nil {
			return err
		}
	}
	rs, _ := p.(rowSetter)
	for i, e := range t.Events {
		if e.Size == 0 || (e.Action != Alloc && e.Action != FreeCompleted) {
			continue
		}
		if rs != nil {
			rs.setRow(i + 1)
		}
		if err := step(p, live, e); err != nil {
			return err
		}
	}
	return nil
}

// step plays one alloc or free_completed row.
func step(p player, live map[uint64]Event, e Event) error {
	old, isLive := live[e.Addr]
	if e.Action == FreeCompleted {
		if !isLive {
			p.unmatched(e)
			return nil
		}
		delete(live, e.Addr)
		return p.free(old, e, false)
	}
	if isLive {
		if err := p.free(old, e, true); err != nil {
			return err
		}
	}
	live[e.Addr] = e
	return p.alloc(e, false)
}

// preexisting returns the free_completed rows (of size > 0) whose address
// had no alloc in any earlier row: blocks allocated before recording began
// (PyTorch's history is a ring of max_entries events, and whatever was
// allocated before it was switched on is not in it either).
func (t *Trace) preexisting() []Event {
	seen := map[uint64]bool{}
	var out []Event
	for _, e := range t.Events {
		if e.Size == 0 || seen[e.Addr] {
			continue
		}
		switch e.Action {
		case Alloc:
			seen[e.Addr] = true
		case FreeCompleted:
			seen[e.Addr] = true
			out = append(out, e)
		}
	}
	return out
}

// Recorded is what the trace itself says about the run it recorded.
type Recorded struct {
	// PeakAllocated is the most bytes live at once: the running sum of the
	// sizes of alloc rows minus those of free_completed rows, paired as
	// Replay pairs them (pre-existing blocks live from the start, a lost
	// free ends its block when its address is allocated again). Sizes are
	// what callers asked for, so this is a little below what an allocator
	// reports as allocated (block sizes, rounded up). Blocks allocated
	// before recording and never freed are invisible to the trace.
	PeakAllocated uint64
	// PeakReserved is the most segment memory held at once, from the
	// segment_alloc/segment_map (+) and segment_free/segment_unmap (-) rows,
	// counting from the least memory that must have been held before the
	// first row for the sum never to go negative. Valid only if HasReserved.
	PeakReserved uint64
	HasReserved  bool
	// OOMs is the number of oom rows.
	OOMs int
}

// Ratio is PeakReserved / PeakAllocated: 0 when reserved is unknown or
// nothing was allocated.
func (r Recorded) Ratio() float64 {
	if !r.HasReserved || r.PeakAllocated == 0 {
		return 0
	}
	return float64(r.PeakReserved) / float64(r.PeakAllocated)
}

// Recorded computes the trace's own figures.
func (t *Trace) Recorded() Recorded {
	var s summer
	_ = t.play(&s) // summer never fails
	r := Recorded{PeakAllocated: s.peak}
	r.PeakReserved, r.HasReserved = t.peakReserved()
	for _, e := range t.Events {
		if e.Action == OOM {
			r.OOMs++
		}
	}
	return r
}

// summer adds up the live bytes; cur is always the sum of the sizes of the
// blocks begun and not ended, so it never goes below zero.
type summer struct{ cur, peak uint64 }

func (s *summer) alloc(e Event, _ bool) error {
	s.cur += e.Size
	s.peak = max(s.peak, s.cur)
	return nil
}

func (s *summer) free(a, _ Event, _ bool) error {
	s.cur -= a.Size
	return nil
}

func (s *summer) unmatched(Event) {}

// peakReserved is the peak of the running sum of segment rows, raised by
// the lowest point the sum reaches below zero (memory reserved before the
// trace began).
func (t *Trace) peakReserved() (peak uint64, known bool) {
	var cur, high, low int64
	for _, e := range t.Events {
		switch e.Action {
		case SegmentAlloc, SegmentMap:
			cur += int64(e.Size)
		case SegmentFree, SegmentUnmap:
			cur -= int64(e.Size)
		default:
			continue
		}
		known = true
		high, low = max(high, cur), min(low, cur)
	}
	return uint64(high - low), known
}
