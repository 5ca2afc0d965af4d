package allocator

// Stealing idle segments across streams, the part of Go's mcentral this
// pool has: a default-pool shard takes another stream's idle fixed segment
// once the work queued on it has completed. There is no central list; the
// shards' own idle lists are walked.
//
// Which segment. The thief takes the smallest idle segment that fits the
// request and is no larger than the segment it would otherwise ask the
// backend for (segmentSize): a steal replaces a new segment, never does
// worse than one. A larger segment stays with its stream. Taking one (the
// rule until this one: the first idle segment that fit, at any size) split
// it for the request and left the rest in the thief's bins, where its owner
// could no longer reach it and where the thief's later requests cut it up
// further. On the FSDP2 trace (bench/testdata/fsdp_gpt2_w2_trace.csv.gz:
// compute, all-gather and reduce-scatter streams) the compute stream took
// the all-gather stream's 152 MiB segment for a 3 MiB request and the
// reduce-scatter stream 198 MiB segments of the compute stream for 75 MiB;
// the compute stream's 1,572 MiB logits segment then held blocks of 23 and
// 94 MiB its own segments had held, and a 1,534 MiB logits request took a
// segment of its own: peak reserved 16,272 MiB, 7.7 % above PyTorch's
// allocator, which never moves a segment across streams. With this rule,
// 15,482 MiB: each stream reserves the segments PyTorch's allocator did.
// Of the traces in bench/testdata only that one has more than one stream.

// steal moves to s the smallest idle segment of another stream of the same
// device that fits r and is at most the segment s would allocate for r, if
// the work its stream had queued when it became a candidate has completed.
// It never waits: a shard busy with its own lock is skipped, and a segment
// whose event has not completed is left for a later call. Called with s.mu
// held.
func (s *shard) steal(r uint64, k poolKind) *block {
	d := s.dev
	if s.pool != nil || s.src.grows() || !d.capture.hold() {
		// Private pools take nothing from others; an expandable segment
		// stays with its stream (as in PyTorch): it grows in place, and
		// goes back whole at release, and an expandable shard has only
		// those (stealCandidate skips them too). While a capture may be under way,
		// no event may be recorded or queried.
		return nil
	}
	defer d.capture.leave()
	most := segmentSize(r, k, d.pool.largeSegSize())
	if k == oversizePool {
		// An oversize block is never split: a segment up to the reuse
		// tolerance larger is handed out whole, as a cached one is
		// (findFree), and leaves no rest behind.
		most = r + d.pool.slack() - 1
	}
	// A few tries: the chosen segment's owner may use it between the
	// choice and the move.
	for try := 0; try < 4; try++ {
		seg, o := s.stealCandidate(r, k, most)
		if seg == nil || !o.mu.TryLock() {
			return nil
		}
		// Owned by o (owner: written under the locks of the shards it
		// moved between, not necessarily o's), its other fields are o's to
		// write, under o.mu, which is held.
		if seg.owner.Load() != o || !seg.idle || !o.segmentQuiet(seg) {
			o.mu.Unlock()
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
	return nil
}

// stealCandidate returns the smallest idle segment of pool k, of r to most
// bytes, of another default-pool shard of s's device whose owner's work has
// completed (segmentQuiet), and that shard; nil when none. It looks at up
// to 64 idle segments per shard and skips a shard whose lock is taken.
// Called with s.mu held; returns holding no other shard's lock.
func (s *shard) stealCandidate(r uint64, k poolKind, most uint64) (*segment, *shard) {
	var best *segment
	var owner *shard
	for _, o := range s.dev.shardList() {
		if o == s || o.pool != nil || o.src.grows() || !o.mu.TryLock() {
			continue // expandable segments stay with their stream
		}
		seen := 0
		for seg := o.idle; seg != nil && seen < 64; seg = seg.inext {
			seen++
			if seg.kind != k || seg.size < r || seg.size > most || (best != nil && seg.size >= best.size) {
				continue
			}
			if !o.segmentQuiet(seg) {
				continue
			}
			best, owner = seg, o
		}
		o.mu.Unlock()
	}
	return best, owner
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
