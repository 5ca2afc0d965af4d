package allocator

// Stealing idle segments across streams, the part of Go's mcentral this
// pool has: a default-pool shard takes another stream's idle fixed segment
// once the work queued on it has completed. There is no central list; the
// shards' own idle lists are walked.

// steal moves an idle segment of another stream of the same device to s, if
// one fits r and the work its stream had queued when it became a candidate
// has completed. It never waits: a shard busy with its own lock is skipped,
// and a segment whose event has not completed is left for a later call.
// Called with s.mu held.
func (s *shard) steal(r uint64, k poolKind) *block {
	d := s.dev
	if s.pool != nil || s.src.grows() || !d.capture.hold() {
		// Private pools take nothing from others; an expandable segment
		// stays with its stream (as in PyTorch): it grows in place, and
		// goes back whole at release, and every default-pool shard of an
		// expandable Pool has only those. While a capture may be under way,
		// no event may be recorded or queried.
		return nil
	}
	defer d.capture.leave()
	for _, o := range d.shardList() {
		if o == s || o.pool != nil || !o.mu.TryLock() {
			continue
		}
		seen := 0
		for seg := o.idle; seg != nil && seen < 64; seg = seg.inext {
			seen++
			if seg.kind != k || seg.size < r || (k == oversizePool && seg.size >= r+d.pool.slack) {
				continue
			}
			if !o.segmentQuiet(seg) {
				continue
			}
			o.removeIdle(seg)
			o.removeFree(seg.head)
			o.removeSeg(seg)
			s.addSeg(seg)
			s.insertFree(seg.head)
			s.addIdle(seg)
			o.mu.Unlock()
			return seg.head
		}
		o.mu.Unlock()
	}
	return nil
}

// segmentQuiet reports whether the owner stream's work on idle segment seg
// has completed, recording the event that tells on first ask. Called with
// o.mu held.
func (o *shard) segmentQuiet(seg *segment) bool {
	d := o.dev
	if !seg.hasEvent {
		ev, err := d.getEvent()
		if err != nil {
			return false
		}
		if err := d.pool.backend.Record(d.idx, ev, o.stream); err != nil {
			d.putEvent(ev)
			return false
		}
		seg.stealEvent, seg.hasEvent = ev, true
	}
	done, err := d.pool.backend.Query(d.idx, seg.stealEvent)
	return err == nil && done
}
