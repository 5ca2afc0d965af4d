package allocator

import (
	"errors"
	"fmt"
)

// expandableSource serves the default pool's expandable segments: the
// segment source of every default-pool shard of an expandable Pool. The
// segments it hands a shard grow (s.grow), so they never move to another
// stream; every other segment source's segments are fixed. What the
// segments are and how they grow and shrink is expandable.go's; what the
// shard asks of its source, and the release that waits for the stream
// before it unmaps, are here.
type expandableSource struct{ p *Pool }

func (e expandableSource) class(n uint64) (uint64, poolKind) {
	r := e.p.rounded(n)
	return r, expandableKind(r)
}

func (expandableSource) caches() bool { return true }
func (expandableSource) grows() bool  { return true }

// cut splits off whatever b holds beyond r (every block of an expandable
// segment may be split), from the end cutsHigh picks (the placement rule,
// expandable.go), and stamps the block with its birth (nearNewer's order).
func (expandableSource) cut(s *shard, b *block, r uint64) {
	if cutsHigh(b, r) {
		s.splitHigh(b, r)
	} else if b.size > r {
		s.splitTail(b, r)
	}
	s.births++
	b.born = s.births
}

// newMemory maps chunks into the growing segment of kind k, or into a new
// one (growExpandable).
func (expandableSource) newMemory(s *shard, r uint64, k poolKind) (*block, error) {
	return s.growExpandable(r, k)
}

// giveBack unmaps what is mapped of seg (uncounting it run by run) and
// gives back its range. The memory is gone with the unmap; a range that
// cannot be given back leaks address space only, so the segment goes all
// the same and the failure is reported late.
func (expandableSource) giveBack(s *shard, seg *segment) (late, err error) {
	d := s.dev
	if err := s.dropMapped(seg, 0, seg.size); err != nil {
		return nil, fmt.Errorf("releasing a %d-byte expandable segment at %#x on device %d: %w", seg.size, seg.ptr, d.idx, err)
	}
	if err := d.pool.exp.FreeRange(d.idx, seg.ptr, seg.vsize); err != nil {
		d.counts.numReleaseFailures.Add(1)
		late = fmt.Errorf("giving back the address range of an expandable segment at %#x on device %d: %w", seg.ptr, d.idx, err)
	}
	for k := range s.grow {
		if s.grow[k] == seg {
			s.grow[k] = nil
		}
	}
	return late, nil
}

func (expandableSource) release(s *shard) error { return s.releaseExpandable() }

// releaseExpandable gives back what the expandable segments of s hold
// unused: a wholly free segment is unmapped and its range given back, the
// chunks wholly inside the free last block of the others are unmapped, and
// with UnmapFreePages every other free page too. Called with the capture
// gate held, s.mu not held.
//
// cuMemUnmap does not wait for work that may still use the memory. Once the
// pending frees are waited for (releaseCached does that first), the only
// work that can use an idle chunk is work queued on s's own stream before
// the chunk became free. So an event is recorded on that stream under s.mu
// and waited for without it, once: a stream that never finishes (a kernel
// waiting for a lost peer) then stalls only this call, never an allocation
// of the stream, and the rest of the device is never synchronized.
// Whatever was free when the event was recorded and has not been handed out
// since is quiet once it completes: s.births tells whether anything was
// handed out (for the tails), block.freedAt whether a free page was freed
// again since (s.frees, for free pages). A stream that keeps allocating
// meanwhile makes the pool list and wait again, a few times; then the tails
// stay for the next release, rather than wait with s.mu held.
func (s *shard) releaseExpandable() error {
	const tries = 3
	var errs []error
	for try := 0; try < tries; try++ {
		s.mu.Lock()
		then := s.expandableCuts()
		births, frees := s.births, s.frees
		pages := s.dev.pool.cfg.UnmapFreePages && s.safe < frees
		if len(then) == 0 && !pages {
			s.mu.Unlock()
			break
		}
		err := s.waitForStream()
		if err != nil {
			errs = append(errs, err)
			s.mu.Unlock()
			break
		}
		s.safe = max(s.safe, frees) // the stream has passed every free counted then
		errs = append(errs, s.unmapFreePages(s.safe))
		done := s.births == births
		if done {
			errs = append(errs, s.applyCuts(then))
		}
		s.mu.Unlock()
		if done {
			break
		}
		// The stream took blocks meanwhile: list again.
	}
	s.mu.Lock()
	if s.kept.total() != 0 { // left by a mapping whose release of spare chunks failed
		errs = append(errs, s.dropSpare())
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// waitForStream waits until the work queued on s's stream now has
// completed, through an event recorded under s.mu and waited for without
// it. Called and returns with s.mu held, and the capture gate held.
func (s *shard) waitForStream() error {
	ev, err := s.recordOnStream()
	if err == nil {
		s.mu.Unlock()
		err = s.dev.waitEvent(ev)
		s.mu.Lock()
	}
	if err != nil {
		s.dev.counts.numReleaseFailures.Add(1)
		return fmt.Errorf("waiting for stream %#x before unmapping on device %d: %w", s.stream, s.dev.idx, err)
	}
	return nil
}

// cut is what release takes of expandable segment seg: everything from
// offset from (a chunk boundary) to its mapped end; from == 0 is the whole
// segment (wholly free).
type cut struct {
	seg  *segment
	from uint64
}

// expandableCuts lists what release may take of s's expandable segments
// now. Called with s.mu held.
func (s *shard) expandableCuts() []cut {
	var cuts []cut
	for seg := s.segs; seg != nil; seg = seg.snext {
		if seg.idle {
			cuts = append(cuts, cut{seg: seg})
			continue
		}
		tail := seg.tail
		if tail.state != blockFree {
			continue
		}
		if keep := s.dev.expand.cutPoint(seg, uint64(tail.ptr-seg.ptr)); keep < seg.size {
			cuts = append(cuts, cut{seg: seg, from: keep})
		}
	}
	return cuts
}

// applyCuts releases what then (from expandableCuts before s's stream was
// waited for) and the segments now agree is free: a part freed since then
// may still be in use by the stream and stays. Nothing was handed out of s
// since then. Called with s.mu held.
func (s *shard) applyCuts(then []cut) error {
	var errs []error
	for _, now := range s.expandableCuts() {
		for _, c := range then {
			if c.seg != now.seg {
				continue
			}
			from := max(c.from, now.from)
			if from == 0 {
				errs = append(errs, s.releaseSegment(now.seg))
			} else if from < now.seg.size {
				errs = append(errs, s.trim(now.seg, from))
			}
		}
	}
	return errors.Join(errs...)
}
