package allocator

import "errors"

// Events: frees that must wait for other streams (record_stream), and the
// device's recycled events.

// deferFree parks b until events recorded now on its record_stream streams
// have completed. If an event cannot be recorded now, processPending records
// it later (an event recorded later on the stream covers the work queued
// before the free too); until then the block is never reused.
func (s *shard) deferFree(b *block) {
	d := s.dev
	b.state = blockPending
	s.changed() // a pending block joins the bins at a later request: the best fit may differ
	capturing := !d.capture.hold()
	if !capturing {
		defer d.capture.leave()
	}
	b.streams(func(st uintptr) {
		if capturing {
			// The stream may be capturing: record the event once no
			// capture is under way (processPending), as PyTorch defers it.
			b.waiting++
			s.pending = append(s.pending, pendingFree{b: b, stream: st})
			return
		}
		ev, err := d.getEvent()
		if err == nil {
			if err = d.pool.backend.Record(d.idx, ev, st); err != nil {
				d.putEvent(ev)
			}
		}
		if err != nil {
			ev = 0
		}
		b.waiting++
		s.pending = append(s.pending, pendingFree{b: b, ev: ev, stream: st})
	})
	if capturing {
		s.markFree(b) // graph_capture_record_stream_reuse (capture_reuse.go)
	}
}

// processPending releases the pending blocks whose events have all
// completed; with wait it first waits for every event. Called with s.mu held
// and the capture gate held (gate.hold).
func (s *shard) processPending(wait bool) error {
	d := s.dev
	s.dropMarks()
	var errs []error
	keep := s.pending[:0]
	for _, pf := range s.pending {
		done := false
		if pf.ev == 0 { // recording failed at free time: try again
			if ev, err := d.getEvent(); err != nil {
				errs = append(errs, err)
			} else if err := d.pool.backend.Record(d.idx, ev, pf.stream); err != nil {
				d.putEvent(ev)
				errs = append(errs, err)
			} else {
				pf.ev = ev
			}
		}
		if pf.ev != 0 {
			var err error
			if wait {
				err = d.pool.backend.Sync(d.idx, pf.ev)
				done = err == nil
			} else {
				done, err = d.pool.backend.Query(d.idx, pf.ev)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
		if !done {
			keep = append(keep, pf)
			continue
		}
		d.putEvent(pf.ev)
		b := pf.b
		if b.waiting--; b.waiting == 0 {
			s.completePending(b)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	return errors.Join(errs...)
}

// completePending puts pending block b, off the pending list, in the bins:
// its free is complete. s.mu held.
func (s *shard) completePending(b *block) {
	d := s.dev
	s.stats.done(b.seg.kind, int64(b.size))
	if d.hot.multi.Load() {
		d.hot.done(int64(b.size))
	}
	d.hist.record(ActFreeCompleted, b.ptr, b.req, s.stream)
	s.release(b)
}

// getEvent returns an idle event of the device, creating one if needed.
// recordOnStream records an event on s's stream, which completes once the
// work queued there now has; wait for it with waitEvent. Called with s.mu
// held and the capture gate closed.
func (s *shard) recordOnStream() (Event, error) {
	d := s.dev
	ev, err := d.getEvent()
	if err != nil {
		return 0, err
	}
	if err := d.pool.backend.Record(d.idx, ev, s.stream); err != nil {
		d.putEvent(ev)
		return 0, err
	}
	return ev, nil
}

// waitEvent waits for ev and recycles it.
func (d *device) waitEvent(ev Event) error {
	err := d.pool.backend.Sync(d.idx, ev)
	d.putEvent(ev)
	return err
}

func (d *device) getEvent() (Event, error) {
	d.evMu.Lock()
	if n := len(d.events); n > 0 {
		ev := d.events[n-1]
		d.events = d.events[:n-1]
		d.evMu.Unlock()
		return ev, nil
	}
	d.evMu.Unlock()
	return d.pool.backend.NewEvent(d.idx)
}

func (d *device) putEvent(ev Event) {
	d.evMu.Lock()
	d.events = append(d.events, ev)
	d.evMu.Unlock()
}
