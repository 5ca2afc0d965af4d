package allocator

// Reuse during a CUDA graph capture of blocks freed after record_stream
// (PyTorch's graph_capture_record_stream_reuse, Config.CaptureReuse).
//
// While a capture may be under way the pool records and queries no event
// (gate.go), so a block freed with record_stream streams stays pending
// until no capture is. With the setting on and a backend that is a
// CaptureGrapher, the capture graph itself can prove the block's uses over:
//
//   - at the free (markFree), the block's own stream and each of its
//     record_stream streams gets a free marker, an empty node after all the
//     work the stream has captured so far. The block stays pending, and is
//     also listed in shard.marked with its markers;
//   - at each later allocation on the block's shard (reuseMarked), the
//     pool walks the graph back from the allocating stream's capture
//     dependencies; a block whose markers are all among the nodes found
//     precedes every piece of work the stream captures from now on, on
//     every stream that used it, so it joins the bins at once: what
//     PyTorch's free_safe_blocks_in_capture does.
//
// Invariants:
//   - a block is in shard.marked at most once, and only while it is
//     pending on that shard's pending list; its markers (one per stream:
//     the shard's first, then its record_stream streams) all belong to one
//     capture;
//   - shard.reuse.seen holds only nodes reached from the shard stream's
//     capture dependencies, and with each node all its ancestors (a walk
//     that fails drops the whole set): since a stream's dependencies only
//     move forward, nodes once seen stay ancestors, and each walk stops at
//     them (PyTorch's GraphReuseContext);
//   - marks are dropped whenever processPending runs, which is only while
//     no capture can be under way: the blocks then follow the event path
//     (their events are recorded then, as for blocks freed without marks).
//
// A block whose streams are not all capturing into one capture, or whose
// markers the backend could not add, gets no marks and waits for the end of
// the capture, as with the setting off: a driver error loses nothing, it
// only delays the reuse. Reuse is only ever for the block's own stream (the
// shard), as in PyTorch.

// markedFree is a pending block with its free markers.
type markedFree struct {
	b       *block
	capture uint64
	marks   []GraphNode
}

// graphReuse is the ancestry known for the capture a shard's stream is in.
type graphReuse struct {
	capture uint64
	seen    map[GraphNode]struct{}
	stack   []GraphNode // scratch for the walk
	deps    []GraphNode // scratch for the backend's answers
}

// markFree gives block b, just made pending while a capture may be under
// way, a free marker on each of its streams, if the setting is on and
// every stream is capturing into the same capture. Called with s.mu held,
// on the slow path of a free with record_stream streams.
func (s *shard) markFree(b *block) {
	p := s.dev.pool
	if p.grapher == nil || !p.tun.captureReuse.Load() {
		return
	}
	m := markedFree{b: b, marks: make([]GraphNode, 0, 1+b.extraN)}
	ok := true
	mark := func(st uintptr) {
		if !ok {
			return
		}
		n, id, capturing, err := p.grapher.MarkFree(s.dev.idx, st)
		if err != nil || !capturing || (len(m.marks) > 0 && id != m.capture) {
			// Markers already added stay in the graph: empty nodes that
			// only restate the order the stream had.
			ok = false
			return
		}
		m.capture = id
		m.marks = append(m.marks, n)
	}
	mark(s.stream)
	b.streams(mark)
	if ok {
		s.marked = append(s.marked, m)
	}
}

// reuseMarked releases into the bins every marked block whose markers all
// precede the work s.stream captures next. Called with s.mu held by an
// allocation while a capture may be under way, only when s.marked is not
// empty and the setting is on.
func (s *shard) reuseMarked() {
	g := s.dev.pool.grapher
	r := s.reuse
	if r == nil {
		r = &graphReuse{}
		s.reuse = r
	}
	deps, id, capturing, err := g.CaptureDeps(s.dev.idx, s.stream, r.deps[:0])
	if err != nil || !capturing || len(deps) == 0 {
		r.deps = deps[:0]
		return
	}
	if r.seen == nil || r.capture != id {
		r.capture, r.seen = id, map[GraphNode]struct{}{}
	}
	stack := append(r.stack[:0], deps...)
	buf := deps[:0]
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, ok := r.seen[v]; ok {
			continue
		}
		parents, err := g.NodeDeps(s.dev.idx, v, buf[:0])
		if err != nil {
			// v's ancestors are unknown: keep no partial closure.
			r.seen, r.stack, r.deps = nil, stack[:0], buf[:0]
			return
		}
		buf = parents
		r.seen[v] = struct{}{}
		stack = append(stack, parents...)
	}
	r.stack, r.deps = stack[:0], buf[:0]

	keep := s.marked[:0]
	for _, m := range s.marked {
		if m.capture == id && r.allSeen(m.marks) {
			s.releaseMarked(m.b)
			continue
		}
		keep = append(keep, m)
	}
	clear(s.marked[len(keep):])
	s.marked = keep
}

func (r *graphReuse) allSeen(marks []GraphNode) bool {
	for _, n := range marks {
		if _, ok := r.seen[n]; !ok {
			return false
		}
	}
	return true
}

// releaseMarked takes pending block b off the pending list and puts it in
// the bins: the graph orders all its uses before what comes. s.mu held.
func (s *shard) releaseMarked(b *block) {
	keep := s.pending[:0]
	for _, pf := range s.pending {
		if pf.b != b {
			keep = append(keep, pf)
		} else if pf.ev != 0 {
			s.dev.putEvent(pf.ev)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	b.waiting = 0
	s.completePending(b)
}

// dropMarks forgets every free marker and the graph ancestry: no capture
// can be under way (processPending's callers hold the gate). s.mu held.
func (s *shard) dropMarks() {
	clear(s.marked)
	s.marked = s.marked[:0]
	s.reuse = nil
}
