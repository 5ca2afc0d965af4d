package allocator

import "errors"

// Garbage collection of cached segments: PyTorch's garbage_collection_threshold
// (c10/cuda/CUDACachingAllocator.cpp, garbage_collect_cached_blocks), on the
// slow path only.
//
// When a request finds no cached block and would ask the backend for a new
// segment, and the device has a cap (its limit: Limit, LimitFraction,
// SetLimit or SetMemoryFraction; PyTorch's allowed_memory_maximum, which
// exists only with a memory fraction) and reserves more than
// GCThreshold × cap, the collector frees idle segments until it has freed
// the excess (reserved − GCThreshold × cap) or nothing is left to free.
//
// Candidates are what PyTorch's collector looks at: the default pool's whole
// free segments of the large and oversize pools (PyTorch's large_blocks that
// are not split), of every stream of the device, that are not expandable.
// Their age is the number of large-pool requests on the device since they
// became idle (PyTorch counts get_free_block calls on the large pool). Each
// round frees every candidate at least as old as the candidates' mean age,
// without stopping at the target mid-round (so that the collector does not
// run again at once), and rounds repeat while the target is not reached.
//
// While an allocation to a private pool is routed on the device (a CUDA
// graph capture may be under way) nothing is collected: freeing device
// memory there could invalidate the capture.

// collectGarbage runs the collector when s's request (rounded to r bytes, of
// pool k) is about to take a new segment and the device is over the line,
// then looks for a fitting block again. Called and returns with s.mu held
// (released meanwhile: the collector takes other shards' locks).
func (s *shard) collectGarbage(r uint64, k poolKind) (*block, error) {
	d := s.dev
	if !d.pool.gcOn() || !s.src.caches() || d.capture.routing() || d.gcLine() == 0 {
		return nil, nil
	}
	s.mu.Unlock()
	err := d.collectGarbage()
	s.mu.Lock()
	if err != nil {
		return nil, err
	}
	return s.findFree(r, k), nil
}

// gcLine is the reserved bytes above which the collector runs: GCThreshold ×
// the device's cap. 0 when the collector is off or the device has no cap, or
// when the device is not over the line.
func (d *device) gcLine() uint64 {
	lim := d.budget.limit.Load()
	if !d.pool.gcOn() || lim == 0 {
		return 0
	}
	line := uint64(d.pool.gcThreshold() * float64(lim))
	if uint64(d.reserved[stAll].cur.Load()) <= line {
		return 0
	}
	return line
}

// gcCandidate reports whether seg, idle in shard s, may be collected.
func gcCandidate(s *shard, seg *segment) bool {
	return s.pool == nil && !s.src.grows() && seg.kind != smallPool
}

// collectGarbage frees idle segments as described above. Called with no
// shard lock held.
func (d *device) collectGarbage() error {
	// The gate stays held while segments go back (the check in the caller
	// was only a snapshot).
	if !d.capture.hold() {
		return nil
	}
	defer d.capture.leave()
	// One collector at a time: a second one would collect again what the
	// first already brought under the line.
	d.gcMu.Lock()
	defer d.gcMu.Unlock()
	line := d.gcLine()
	if line == 0 {
		return nil
	}
	target := uint64(d.reserved[stAll].cur.Load()) - line
	now := d.gcClock.Load()
	var freed uint64
	for freed < target {
		// The mean age of the candidates now (recounted each round: other
		// threads may have used or freed segments meanwhile).
		var total float64
		n := 0
		for _, s := range d.shardList() {
			if s.pool != nil {
				continue
			}
			s.mu.Lock()
			for seg := s.idle; seg != nil; seg = seg.inext {
				if gcCandidate(s, seg) {
					total += float64(now - min(seg.idleAt, now))
					n++
				}
			}
			s.mu.Unlock()
		}
		if n == 0 {
			return nil
		}
		mean := total / float64(n)
		round := uint64(0)
		var errs []error
		for _, s := range d.shardList() {
			if s.pool != nil {
				continue
			}
			s.mu.Lock()
			for seg := s.idle; seg != nil; {
				next := seg.inext
				if gcCandidate(s, seg) && float64(now-min(seg.idleAt, now)) >= mean {
					size := seg.size
					if err := s.releaseSegment(seg); err != nil {
						errs = append(errs, err)
					} else {
						round += size
					}
				}
				seg = next
			}
			s.mu.Unlock()
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if round == 0 {
			return nil
		}
		freed += round
	}
	return nil
}
