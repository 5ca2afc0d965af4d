package allocator

// The cached path (Go's mcache): a shard's bins, its blocks' split and merge,
// its segments and idle list, all under the shard's own lock.

// alloc serves a request of n bytes from s and says where it placed it
// (Placement: a fixed segment of its own, or the shard's epoch, tell a
// front cache which freed blocks it may hand out again; export/front.cpp).
// parked (not nil: a front cache's miss, AllocAround): the blocks the cache
// still holds parked; they and its others (Front) all go back before the
// pool maps or takes memory for this request, or before it could raise a
// peak.
func (s *shard) alloc(n uint64, parked []Parked) (ptr uintptr, pl Placement, err error) {
	p := s.dev.pool
	r, k := s.src.class(n)
	if p.gcOn() && k != smallPool && s.pool == nil {
		s.dev.gcClock.Add(1) // the collector's clock: large-pool requests (gc.go)
	}
	s.mu.Lock()
	if len(s.pending) > 0 && s.dev.capture.hold() {
		s.processPending(false)
		s.dev.capture.leave()
	} else if len(s.marked) > 0 && p.tun.captureReuse.Load() {
		s.reuseMarked() // a capture may be under way (capture_reuse.go)
	}
	if parked != nil && !s.belowPeaks(r, n, k) && s.dev.holdsParked(parked) {
		s.mu.Unlock()
		s.dev.reclaimAll(parked)
		s.mu.Lock()
	}
	var b *block
	if s.src.caches() {
		b = s.findFree(r, k)
	}
	if b != nil && b.seg.hasHoles() && s.pool == nil && s.dev.holdsParked(parked) {
		// Its pages must be mapped again: memory is taken, so nothing may
		// stay parked (AllocAround), and the fit is looked for again.
		s.mu.Unlock()
		s.dev.reclaimAll(parked)
		s.mu.Lock()
		b = s.findFree(r, k)
	}
	if b == nil {
		if b, err = s.allocSlow(n, r, k, parked); err != nil {
			s.mu.Unlock()
			return 0, Placement{}, err
		}
	}
	if b.seg.hasHoles() {
		if err = s.mapFor(b, r); err != nil { // its pages were unmapped (pages.go)
			if IsOutOfMemory(err) {
				s.dev.counts.numOOMs.Add(1)
				err = s.dev.oomError(s, n, r, k, err, nil)
			}
			s.mu.Unlock()
			return 0, Placement{}, err
		}
	}
	s.take(b, r, n)
	pl = Placement{Size: b.size, Whole: b.isWholeSegment() && !s.src.grows(), Type: statType(b.seg.kind)}
	if len(s.pending) == 0 {
		// A pending free joins the bins when its events complete, at a
		// later request, without a change the count could show beforehand:
		// with any pending, no placement is claimed to stay.
		pl.Epoch, pl.Mark = s.epoch, s.changes
	}
	s.dev.hist.record(ActAlloc, b.ptr, b.req, s.stream)
	s.mu.Unlock()
	return b.ptr, pl, nil
}

func (s *shard) findFree(r uint64, k poolKind) *block {
	b := s.bins[k].find(r)
	if b != nil && k == oversizePool && b.size >= r+s.dev.pool.slack() {
		return nil
	}
	return b
}

// take hands out free block b for a request of n bytes rounded to r.
func (s *shard) take(b *block, r, n uint64) {
	s.removeFree(b)
	seg := b.seg
	if seg.idle {
		s.removeIdle(seg)
	}
	s.src.cut(s, b, r)
	s.markAllocated(b, n)
}

// markAllocated makes b, already cut to its size and out of the bins, an
// allocated block of a request of n bytes: live and counted.
func (s *shard) markAllocated(b *block, n uint64) {
	b.state = blockAllocated
	b.req = n
	s.live.put(b)
	sz := int64(b.size)
	s.stats.alloc(b.seg.kind, sz, int64(n))
	if s.dev.hot.multi.Load() {
		s.dev.hot.alloc(sz, int64(n))
	}
}

// free takes back allocated block b.
func (s *shard) free(b *block) {
	s.live.del(b)
	k := b.seg.kind
	sz := int64(b.size)
	pending := b.extraN > 0
	s.dev.hist.record(ActFreeRequested, b.ptr, b.req, s.stream)
	s.stats.free(k, sz, int64(b.req))
	if s.dev.hot.multi.Load() {
		s.dev.hot.free(sz, int64(b.req), pending)
	}
	if pending {
		s.deferFree(b)
		return
	}
	s.stats.done(k, sz)
	s.dev.hist.record(ActFreeCompleted, b.ptr, b.req, s.stream)
	s.release(b)
}

// release puts block b (allocated or pending, already out of every table)
// back in the bins, merged with free neighbours.
func (s *shard) release(b *block) {
	// b.req stays: a free block reports the request of the allocation
	// freed into it last, as PyTorch's snapshot does (its freed block
	// absorbs its free neighbours, so theirs are forgotten).
	b.state = blockFree
	b.extraN = 0
	b.extraMore = nil
	if p := b.prev; p != nil && p.state == blockFree {
		s.removeFree(p)
		p.req = b.req
		p.size += b.size
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		} else {
			p.seg.tail = p
		}
		s.recycle(b)
		b = p
	}
	if nx := b.next; nx != nil && nx.state == blockFree {
		s.removeFree(nx)
		b.size += nx.size
		b.next = nx.next
		if nx.next != nil {
			nx.next.prev = b
		} else {
			b.seg.tail = b
		}
		s.recycle(nx)
	}
	// The merged block as a whole counts as freed now. Only free pages
	// read the count (Config.UnmapFreePages, pages.go); counting in every
	// shard costs less than asking whether this one needs it.
	s.frees++
	b.freedAt = s.frees
	s.insertFree(b)
	if b.isWholeSegment() {
		s.addIdle(b.seg)
	}
}

// splitTail cuts b down to its first n bytes (0 < n < b.size); the rest of
// it becomes a free block right after it, in its bin.
func (s *shard) splitTail(b *block, n uint64) {
	rest := s.newBlock()
	*rest = block{ptr: b.ptr + uintptr(n), size: b.size - n, seg: b.seg, prev: b, next: b.next, freedAt: b.freedAt}
	if b.next != nil {
		b.next.prev = rest
	} else {
		b.seg.tail = rest
	}
	b.next = rest
	b.size = n
	s.insertFree(rest)
}

func (s *shard) insertFree(b *block) {
	s.changed()
	s.bins[b.seg.kind].insert(b)
	if !b.isWholeSegment() {
		b.splitFree = true
		s.stats.inactiveSplit(b.seg.kind, 1, int64(b.size))
	}
}

func (s *shard) removeFree(b *block) {
	s.changed()
	s.bins[b.seg.kind].remove(b)
	if b.splitFree {
		b.splitFree = false
		s.stats.inactiveSplit(b.seg.kind, -1, -int64(b.size))
	}
}

func (s *shard) newBlock() *block {
	if b := s.spare; b != nil {
		s.spare = b.fnext
		b.fnext = nil
		return b
	}
	return new(block)
}

func (s *shard) recycle(b *block) {
	*b = block{fnext: s.spare}
	s.spare = b
}

func (s *shard) addSeg(seg *segment) {
	seg.owner.Store(s)
	seg.sprev = nil
	seg.snext = s.segs
	if s.segs != nil {
		s.segs.sprev = seg
	}
	s.segs = seg
}

func (s *shard) removeSeg(seg *segment) {
	if seg.sprev != nil {
		seg.sprev.snext = seg.snext
	} else {
		s.segs = seg.snext
	}
	if seg.snext != nil {
		seg.snext.sprev = seg.sprev
	}
	seg.sprev, seg.snext = nil, nil
}

func (s *shard) addIdle(seg *segment) {
	seg.idle = true
	if s.dev.pool.gcOn() {
		seg.idleAt = s.dev.gcClock.Load()
	}
	seg.iprev = nil
	seg.inext = s.idle
	if s.idle != nil {
		s.idle.iprev = seg
	}
	s.idle = seg
}

// removeIdle takes seg off the idle list; its owner is using it again, so a
// steal event recorded earlier no longer covers it.
func (s *shard) removeIdle(seg *segment) {
	if seg.iprev != nil {
		seg.iprev.inext = seg.inext
	} else {
		s.idle = seg.inext
	}
	if seg.inext != nil {
		seg.inext.iprev = seg.iprev
	}
	seg.iprev, seg.inext, seg.idle = nil, nil, false
	if seg.hasEvent {
		s.dev.putEvent(seg.stealEvent)
		seg.hasEvent = false
	}
}
