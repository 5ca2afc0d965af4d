package allocator

import (
	"fmt"
	"sort"
)

// CheckInvariants walks every structure of the pool and reports the first
// broken invariant: blocks tile their segments, free blocks never touch, each
// free block sits in the bin of its size, the live table holds exactly the
// allocated blocks, the idle list exactly the wholly free segments, no two
// segments overlap, the address map holds exactly the segments, and every statistic equals what the blocks add up to.
// It locks each shard in turn; run it while no other goroutine uses the pool.
func (p *Pool) CheckInvariants() error {
	var spans []addrSpan
	for _, d := range p.devs {
		if err := p.checkDevice(d, &spans); err != nil {
			return err
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return fmt.Errorf("segments [%#x,%#x) and [%#x,%#x) overlap", spans[i-1].lo, spans[i-1].hi, spans[i].lo, spans[i].hi)
		}
	}
	// The address map (segmap.go) holds exactly the segments, each found
	// at both ends of its range.
	if n := p.byAddr.len(); n != len(spans) {
		return fmt.Errorf("the address map holds %d segments, the shards %d", n, len(spans))
	}
	for _, sp := range spans {
		if p.byAddr.find(sp.lo) != sp.seg || p.byAddr.find(sp.hi-1) != sp.seg {
			return fmt.Errorf("the address map does not find the segment [%#x,%#x)", sp.lo, sp.hi)
		}
	}
	return nil
}

// addrSpan is the address range a segment takes (its reservation, for an
// expandable one).
type addrSpan struct {
	lo, hi uintptr
	seg    *segment
}

// deviceTally is what the blocks of a device's shards add up to.
type deviceTally struct {
	reserved, segs, chunkMapped, kept              int64
	allocs, allocBytes, reqBytes, pendN, pendBytes int64
}

// tally checks each shard of d (shard.check) and adds up its blocks and
// segments; each segment's span goes into spans.
func (d *device) tally(spans *[]addrSpan) (deviceTally, error) {
	var t deviceTally
	for _, s := range d.shardList() {
		s.mu.Lock()
		err := s.check(func(seg *segment) {
			lo, hi := seg.span()
			*spans = append(*spans, addrSpan{lo, hi, seg})
		})
		c := &s.stats.c[stAll]
		t.allocs += c.nAlloc - c.nFree
		t.allocBytes += c.bAlloc - c.bFree
		t.reqBytes += c.rAlloc - c.rFree
		t.pendN += c.nFree - c.nDone
		t.pendBytes += c.bFree - c.bDone
		for seg := s.segs; seg != nil; seg = seg.snext {
			m := int64(seg.mappedBytes(d.expand.chunk))
			t.reserved += m
			t.segs++
			if seg.expSeg != nil {
				t.chunkMapped += m
			}
		}
		t.kept += int64(s.kept.total())
		s.mu.Unlock()
		if err != nil {
			return t, fmt.Errorf("device %d stream %#x: %w", d.idx, s.stream, err)
		}
	}
	return t, nil
}

// checkDevice compares d's counters with what its blocks add up to.
func (p *Pool) checkDevice(d *device, spans *[]addrSpan) error {
	t, err := d.tally(spans)
	if err != nil {
		return err
	}
	type check struct {
		name      string
		got, want int64
	}
	d.budget.reserveMu.Lock()
	committed := int64(d.budget.committed)
	d.budget.reserveMu.Unlock()
	checks := []check{
		{"reserved_bytes", d.reserved[stAll].cur.Load(), t.reserved},
		{"segment", d.segments[stAll].cur.Load(), t.segs},
		// Between operations nothing is being asked of the backend, so the
		// limit counts the segments and the chunks kept spare only.
		{"bytes counted against the limit", committed, t.reserved + t.kept},
	}
	if err := p.auditChunks(d); err != nil {
		return err
	}
	if p.keeper != nil {
		m, sp := p.keeper.Chunks(d.idx)
		checks = append(checks, check{"backend's mapped chunk bytes", int64(m), t.chunkMapped},
			check{"backend's spare chunk bytes", int64(sp), t.kept})
	}
	if d.hot.multi.Load() {
		checks = append(checks,
			check{"device allocation", d.hot.allocCount.Load(), t.allocs},
			check{"device allocated_bytes", d.hot.allocBytes.Load(), t.allocBytes},
			check{"device requested_bytes", d.hot.reqBytes.Load(), t.reqBytes},
			check{"device pending", d.hot.pendingCount.Load(), t.pendN},
			check{"device pending bytes", d.hot.pendingBytes.Load(), t.pendBytes})
	}
	for _, c := range checks {
		if c.got != c.want {
			return fmt.Errorf("device %d: %s is %d, blocks add up to %d", d.idx, c.name, c.got, c.want)
		}
	}
	if r := d.reserved[1].cur.Load() + d.reserved[2].cur.Load(); r != t.reserved {
		return fmt.Errorf("device %d: reserved small+large %d != %d", d.idx, r, t.reserved)
	}
	return nil
}

// auditChunks compares, chunk by chunk, what each expandable segment of d
// books as mapped (below seg.size and not a hole) with what the backend has
// mapped in its range, when the backend can tell (ChunkAuditor): after any
// failure the two must still agree, or a block may be handed out over
// memory that is gone.
func (p *Pool) auditChunks(d *device) error {
	a, ok := p.backend.(ChunkAuditor)
	if !ok || p.exp == nil {
		return nil
	}
	for _, s := range d.shardList() {
		s.mu.Lock()
		var err error
		for seg := s.segs; seg != nil && err == nil; seg = seg.snext {
			if seg.expSeg == nil {
				continue
			}
			have, total, aerr := a.MappedChunks(d.idx, seg.ptr, seg.size)
			if aerr != nil {
				err = fmt.Errorf("device %d: expandable segment %#x: %w", d.idx, seg.ptr, aerr)
				break
			}
			if len(have) == 0 || seg.size%uint64(len(have)) != 0 {
				err = fmt.Errorf("device %d: expandable segment %#x: the backend describes %d bytes in %d chunks", d.idx, seg.ptr, seg.size, len(have))
				break
			}
			g := seg.size / uint64(len(have)) // the backend's granularity divides the pool's chunk
			for i, m := range have {
				off := uint64(i) * g
				if want := !seg.holes.has(off / d.expand.chunk); m != want {
					err = fmt.Errorf("device %d: expandable segment %#x (%d of %d bytes): the chunk at offset %d is mapped %v in the backend, %v in the pool's books",
						d.idx, seg.ptr, seg.size, seg.vsize, off, m, want)
					break
				}
			}
			if mb := seg.mappedBytes(d.expand.chunk); err == nil && total != mb {
				err = fmt.Errorf("device %d: expandable segment %#x: the backend has %d bytes of its range mapped, the pool's books %d",
					d.idx, seg.ptr, total, mb)
			}
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// check verifies one shard; called with s.mu held.
func (s *shard) check(visit func(*segment)) error {
	var tl tally
	if err := s.checkSegments(visit, &tl); err != nil {
		return err
	}
	if err := s.checkBins(tl.nFree); err != nil {
		return err
	}
	if s.live.n != tl.nLive {
		return fmt.Errorf("%d allocated blocks, live table holds %d", tl.nLive, s.live.n)
	}
	if err := s.checkPending(tl.nPending); err != nil {
		return err
	}
	return s.checkStats(&tl)
}

// tally is what the blocks of a shard add up to: the statistics they imply
// and how many blocks are in each state.
type tally struct {
	st                     [numFamilies][numStatTypes]localStat
	nFree, nLive, nPending int
}

// checkSegments walks every segment of s and its blocks (visit sees each
// segment), checking their tiling and links, and tallies them.
func (s *shard) checkSegments(visit func(*segment), tl *tally) error {
	idle := map[*segment]bool{}
	for seg := s.idle; seg != nil; seg = seg.inext {
		if !seg.idle || seg.owner.Load() != s {
			return fmt.Errorf("idle list holds segment %#x not marked idle of this shard", seg.ptr)
		}
		idle[seg] = true
	}
	for seg := s.segs; seg != nil; seg = seg.snext {
		visit(seg)
		if seg.owner.Load() != s {
			return fmt.Errorf("segment %#x on the list of a shard it does not name", seg.ptr)
		}
		if seg.head == nil || seg.head.ptr != seg.ptr || seg.head.prev != nil {
			return fmt.Errorf("segment %#x: bad head block", seg.ptr)
		}
		var total uint64
		for b := seg.head; b != nil; b = b.next {
			if b.seg != seg {
				return fmt.Errorf("block %#x names another segment", b.ptr)
			}
			if b.ptr != seg.ptr+uintptr(total) {
				return fmt.Errorf("segment %#x: block %#x at offset %d, expected %d", seg.ptr, b.ptr, b.ptr-seg.ptr, total)
			}
			if b.size == 0 || b.size%minBlock != 0 || b.ptr%minBlock != 0 {
				return fmt.Errorf("block %#x: size %d or address not a multiple of %d", b.ptr, b.size, minBlock)
			}
			if b.next != nil && b.next.prev != b {
				return fmt.Errorf("block %#x: broken neighbour links", b.ptr)
			}
			total += b.size
			if err := s.tallyBlock(b, tl); err != nil {
				return err
			}
		}
		if total != seg.size {
			return fmt.Errorf("segment %#x: blocks add up to %d of %d bytes", seg.ptr, total, seg.size)
		}
		if err := s.checkShape(seg); err != nil {
			return err
		}
		whole := seg.head.next == nil && seg.head.state == blockFree
		if whole != idle[seg] {
			return fmt.Errorf("segment %#x: wholly free %v but on idle list %v", seg.ptr, whole, idle[seg])
		}
	}
	return nil
}

// tallyBlock counts block b by its state.
func (s *shard) tallyBlock(b *block, tl *tally) error {
	t := statType(b.seg.kind)
	switch b.state {
	case blockFree:
		tl.nFree++
		if b.next != nil && b.next.state == blockFree {
			return fmt.Errorf("free blocks %#x and %#x are neighbours", b.ptr, b.next.ptr)
		}
		if !b.isWholeSegment() {
			tl.st[stInactiveSplit][t].cur++
			tl.st[stInactiveSplitBytes][t].cur += int64(b.size)
		}
	case blockAllocated:
		tl.nLive++
		if s.live.get(b.ptr) != b {
			return fmt.Errorf("allocated block %#x missing from the live table", b.ptr)
		}
		tl.st[stAllocation][t].cur++
		tl.st[stAllocatedBytes][t].cur += int64(b.size)
		tl.st[stRequestedBytes][t].cur += int64(b.req)
		tl.st[stActive][t].cur++
		tl.st[stActiveBytes][t].cur += int64(b.size)
		if b.req == 0 || roundSize(b.req) > b.size {
			return fmt.Errorf("block %#x of %d bytes holds a request of %d", b.ptr, b.size, b.req)
		}
	case blockPending:
		tl.nPending++
		tl.st[stActive][t].cur++
		tl.st[stActiveBytes][t].cur += int64(b.size)
	}
	return nil
}

// checkBins checks that the bins hold exactly the nFree free blocks, each
// in its own bin, and that the bitmaps agree with the lists.
func (s *shard) checkBins(nFree int) error {
	binned := 0
	for k := range s.bins {
		bs := &s.bins[k]
		for i, h := range bs.heads {
			if (h != nil) != (bs.bitmap[i/64]&(1<<(i%64)) != 0) {
				return fmt.Errorf("pool %v bin %d: bitmap disagrees with list", poolKind(k), i)
			}
			for b := h; b != nil; b = b.fnext {
				binned++
				if b.state != blockFree || binIndex(b.size) != i || b.seg.kind != poolKind(k) || b.seg.owner.Load() != s {
					return fmt.Errorf("block %#x (%d bytes) misfiled in %v bin %d", b.ptr, b.size, poolKind(k), i)
				}
			}
		}
	}
	if binned != nFree {
		return fmt.Errorf("%d free blocks, %d in bins", nFree, binned)
	}
	return nil
}

// checkPending checks that the pending list names the nPending pending
// blocks, each as many times as it waits for events.
func (s *shard) checkPending(nPending int) error {
	pend := map[*block]int{}
	for _, pf := range s.pending {
		pend[pf.b]++
	}
	if len(pend) != nPending {
		return fmt.Errorf("%d pending blocks, %d on the pending list", nPending, len(pend))
	}
	for b, n := range pend {
		if b.state != blockPending || b.waiting != n {
			return fmt.Errorf("pending block %#x waits for %d events, has %d entries", b.ptr, b.waiting, n)
		}
	}
	// Marked blocks (capture_reuse.go): pending here, once each, with a
	// marker per stream.
	seen := map[*block]bool{}
	for _, m := range s.marked {
		if pend[m.b] == 0 || seen[m.b] {
			return fmt.Errorf("marked block %#x is not pending on its shard, or marked twice", m.b.ptr)
		}
		seen[m.b] = true
		if len(m.marks) != 1+m.b.extraN {
			return fmt.Errorf("marked block %#x has %d markers for %d streams", m.b.ptr, len(m.marks), 1+m.b.extraN)
		}
	}
	return nil
}

// checkStats compares the shard's statistics with what its blocks add up to.
func (s *shard) checkStats(tl *tally) error {
	want := &tl.st
	for t := 1; t < numStatTypes; t++ {
		for f := range want {
			want[f][stAll].cur += want[f][t].cur
		}
	}
	for t := range s.stats.c {
		c := &s.stats.c[t]
		got := map[statFamily]int64{
			stAllocation:         c.nAlloc - c.nFree,
			stAllocatedBytes:     c.bAlloc - c.bFree,
			stRequestedBytes:     c.rAlloc - c.rFree,
			stActive:             c.nAlloc - c.nDone,
			stActiveBytes:        c.bAlloc - c.bDone,
			stInactiveSplit:      s.stats.inactive[t].cur,
			stInactiveSplitBytes: s.stats.inactiveBytes[t].cur,
		}
		for f, g := range got {
			if g != want[f][t].cur {
				return fmt.Errorf("%s.%s.current is %d, blocks add up to %d", familyNames[f], typeNames[t], g, want[f][t].cur)
			}
		}
	}
	return nil
}

func (s *shard) checkShape(seg *segment) error {
	last := seg.head
	for last.next != nil {
		last = last.next
	}
	if seg.tail != last {
		return fmt.Errorf("segment %#x: tail names block %#x, the last block is %#x", seg.ptr, seg.tail.ptr, last.ptr)
	}
	if (seg.expSeg != nil) != s.src.grows() {
		return fmt.Errorf("segment %#x (%d bytes of address space reserved) is in a shard whose segments grow: %v",
			seg.ptr, seg.reservedRange(), s.src.grows())
	}
	if seg.expSeg == nil {
		if s.grow[seg.kind] == seg {
			return fmt.Errorf("fixed segment %#x is named as the growing one", seg.ptr)
		}
		return nil
	}
	c := s.dev.expand.chunk
	if c == 0 || seg.size%c != 0 || seg.size > seg.vsize {
		return fmt.Errorf("expandable segment %#x: %d of %d bytes mapped, chunk %d",
			seg.ptr, seg.size, seg.vsize, c)
	}
	if err := checkHoles(seg, c); err != nil {
		return err
	}
	return checkBigs(seg, s.dev.expand)
}

// checkBigs verifies that every big chunk of expandable segment seg lies
// below its size with no hole in it, and that the count is right.
func checkBigs(seg *segment, g expandGeometry) error {
	x, starts := &seg.bigs, &seg.bigStarts
	for _, set := range []*chunkSet{x, starts} {
		if set.n != set.count() {
			return fmt.Errorf("expandable segment %#x: %d chunks counted in a big chunk's set, %d marked", seg.ptr, set.n, set.count())
		}
	}
	if x.n > 0 && g.big == g.chunk {
		return fmt.Errorf("expandable segment %#x: %d big chunks marked where the pool maps none", seg.ptr, x.n)
	}
	// Walk the granules: each big chunk is a start and big/chunk marked
	// granules, none a hole, all below size.
	per := g.big / g.chunk
	for i := uint64(0); i < uint64(len(x.bits))*64; i++ {
		if starts.has(i) {
			for j := i; j < i+per; j++ {
				off := j * g.chunk
				if !x.has(j) || (j > i && starts.has(j)) || seg.holes.has(j) || off >= seg.size {
					return fmt.Errorf("expandable segment %#x (%d bytes mapped): the big chunk at offset %d is not %d mapped bytes (at %d)", seg.ptr, seg.size, i*g.chunk, g.big, off)
				}
			}
			i += per - 1
		} else if x.has(i) {
			return fmt.Errorf("expandable segment %#x: the chunk at offset %d is marked in a big chunk that starts nowhere", seg.ptr, i*g.chunk)
		}
	}
	return nil
}

// checkHoles verifies that every unmapped chunk of expandable segment seg
// lies below its size and wholly inside one free block, and that the count
// is right.
func checkHoles(seg *segment, c uint64) error {
	h := &seg.holes
	if h.n != h.count() {
		return fmt.Errorf("expandable segment %#x: %d unmapped chunks counted, %d marked", seg.ptr, h.n, h.count())
	}
	marked := 0
	for b := seg.head; b != nil; b = b.next {
		lo, hi := uint64(b.ptr-seg.ptr), uint64(b.ptr-seg.ptr)+b.size
		for off := lo / c * c; off < hi; off += c {
			if !h.has(off / c) {
				continue
			}
			if b.state != blockFree || off < lo || off+c > hi {
				return fmt.Errorf("expandable segment %#x: chunk at offset %d is unmapped under block %#x (+%d, state %d)",
					seg.ptr, off, b.ptr, b.size, b.state)
			}
			marked++
		}
	}
	if marked != h.n {
		return fmt.Errorf("expandable segment %#x: %d unmapped chunks, %d of them under its blocks", seg.ptr, h.n, marked)
	}
	return nil
}
