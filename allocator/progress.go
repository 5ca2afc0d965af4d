package allocator

import "time"

// How far a shard's stream has got: what free pages (pages.go) may be
// unmapped without waiting for it, and the one wait a growth makes for it
// at the device's peak.

// passed advances s.safe to the frees the stream has passed, without
// waiting: a quiet event is recorded after the latest free when none is
// outstanding, and asked (not waited for) whether it completed. Once one
// has, the next is recorded at once when frees came after it, so that the
// next mapping asks about the stream's progress up to this one rather than
// up to the one before (a mapping that found its event done would
// otherwise record the next only at the following mapping, and the pages
// freed in between would wait two mappings). An event that cannot be
// recorded or asked leaves s.safe as it is: pages then stay mapped, and the
// pool maps new memory instead. Called with s.mu held.
func (s *shard) passed() {
	d := s.dev
	if !s.quietSet && !s.recordQuiet() {
		return
	}
	done, err := d.pool.backend.Query(d.idx, s.quiet)
	if err != nil || done {
		d.putEvent(s.quiet)
		s.quietSet = false
	}
	if err == nil && done {
		s.safe = max(s.safe, s.quietTag) // a release may have waited further
		s.recordQuiet()
	}
}

// recordQuiet records the quiet event after the latest free, when frees
// came after what s.safe covers; it reports whether one is outstanding.
// Called with s.mu held and none outstanding.
func (s *shard) recordQuiet() bool {
	if s.safe == s.frees {
		return false
	}
	ev, err := s.recordOnStream()
	if err != nil {
		return false
	}
	s.quiet, s.quietTag, s.quietSet = ev, s.frees, true
	return true
}

// DefaultFreePagesWait is the library's Config.FreePagesWait: long enough
// for a GPU to drain what a CPU ahead of it has queued in the usual case
// (a stream the host outruns by thousands of small kernels), short enough
// that a stream held by a kernel waiting for a peer this very thread is
// about to meet costs a tenth of a second once per such mapping, after
// which the pool maps new memory as it would have.
const DefaultFreePagesWait = 100 * time.Millisecond

// awaitFreePages lets a growth wait for the free pages its own stream has
// not passed yet, where bytes matter: when mapping r bytes of new memory
// would raise the device's peak of reserved bytes while free pages of s
// that the stream has not been seen to pass would give back at least half
// of them. A host that runs ahead of its GPU (a decode loop that never
// synchronizes) otherwise finds every page it freed still unpassed
// whenever it maps, and its peak is each hole's high mark, as if no page
// were ever unmapped. It records an event on the stream after the latest
// free and waits for it without s.mu, at most Config.FreePagesWait (the
// stream may be held by a kernel waiting for a peer that this thread is
// about to meet), once per count of frees; then it looks for a fit again,
// and the mapping that follows (makeRoom) unmaps what the stream passed.
// Returns a block that fits now, or nil to go on. Called and returns with
// s.mu held.
func (s *shard) awaitFreePages(r uint64, k poolKind) *block {
	d := s.dev
	wait := d.pool.cfg.FreePagesWait
	if wait <= 0 || !d.pool.cfg.UnmapFreePages || !s.src.grows() || s.safe == s.frees || s.waitedTag == s.frees {
		return nil
	}
	res := &d.reserved[stAll]
	if res.cur.Load()+int64(r) <= res.peak.Load() {
		return nil // below the peak: new memory costs no peak bytes
	}
	_, known := s.freePages(r, span{}, s.safe)
	_, all := s.freePages(r, span{}, s.frees)
	if all-known < r/2 {
		return nil
	}
	if !d.capture.hold() {
		return nil // a capture may be under way: no event is recorded
	}
	defer d.capture.leave()
	ev, err := s.recordOnStream()
	if err != nil {
		return nil
	}
	tag := s.frees
	s.waitedTag = tag
	s.mu.Unlock()
	done := d.pollEvent(ev, wait)
	s.mu.Lock()
	if !done {
		return nil
	}
	s.safe = max(s.safe, tag)
	return s.findFree(r, k)
}

// pollEvent reports whether ev completed within limit, asking without
// blocking in the driver (a blocked Sync could not be given up), and
// recycles it. Called without any shard's lock.
func (d *device) pollEvent(ev Event, limit time.Duration) bool {
	t0 := time.Now()
	nap := 20 * time.Microsecond
	for {
		done, err := d.pool.backend.Query(d.idx, ev)
		if err != nil || done || time.Since(t0) >= limit {
			d.putEvent(ev)
			return err == nil && done
		}
		time.Sleep(nap)
		nap = min(2*nap, time.Millisecond)
	}
}
