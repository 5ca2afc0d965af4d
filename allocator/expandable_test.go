package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

func expandablePool(t *testing.T, capacity uint64, cfg Config) (*Pool, *Virtual) {
	t.Helper()
	v := NewVirtual(1, capacity)
	cfg.Expandable = true
	p, err := New(v, cfg)
	require.NoError(t, err)
	require.True(t, p.Expandable())
	return p, v
}

// Requests that would each take a 20 MiB fixed segment share one range, and
// the pool maps only the chunks they need.
func TestExpandableGrowsInPlace(t *testing.T) {
	p, v := expandablePool(t, 0, Config{})
	var ptrs []uintptr
	for i := 0; i < 5; i++ {
		ptr, _, err := p.Alloc(0, 0, 3*mib)
		require.NoError(t, err)
		if i > 0 {
			require.Equal(t, ptrs[i-1]+3*mib, ptr, "blocks follow each other in the one range")
		}
		ptrs = append(ptrs, ptr)
	}
	require.EqualValues(t, 16*mib, stat(t, p, 0, "reserved_bytes.all.current"), "15 MiB in 2 MiB chunks")
	require.EqualValues(t, 1, stat(t, p, 0, "segment.all.current"))
	require.EqualValues(t, 16*mib, v.Used(0))
	require.NoError(t, p.CheckInvariants())
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(0, 0, ptr, 3*mib))
	}
	require.NoError(t, p.EmptyCache())
	require.Zero(t, stat(t, p, 0, "reserved_bytes.all.current"))
	segs, ranges, chunks := v.Outstanding()
	require.Zero(t, segs+ranges+chunks, "everything given back")
}

// A free block at the end grows into the next chunks: 30 MiB freed and 50 MiB
// asked maps 20 MiB more, where fixed segments would hold 80 MiB.
func TestExpandableBlockGrowsAcrossSegments(t *testing.T) {
	p, _ := expandablePool(t, 0, Config{})
	a, _, err := p.Alloc(0, 0, 30*mib)
	require.NoError(t, err)
	require.NoError(t, p.Free(0, 0, a, 30*mib))
	b, _, err := p.Alloc(0, 0, 50*mib)
	require.NoError(t, err)
	require.Equal(t, a, b, "the freed block grew in place")
	require.EqualValues(t, 50*mib, stat(t, p, 0, "reserved_bytes.all.peak"))
	require.NoError(t, p.CheckInvariants())

	fixed, err := New(NewVirtual(1, 0), Config{})
	require.NoError(t, err)
	a, _, err = fixed.Alloc(0, 0, 30*mib)
	require.NoError(t, err)
	require.NoError(t, fixed.Free(0, 0, a, 30*mib))
	_, _, err = fixed.Alloc(0, 0, 50*mib)
	require.NoError(t, err)
	m, err := fixed.StatsMap(0)
	require.NoError(t, err)
	require.EqualValues(t, 80*mib, m["reserved_bytes.all.peak"], "fixed segments for comparison")
}

// EmptyCache unmaps the chunks wholly inside a free last block, and a
// wholly free segment goes back with its range.
func TestExpandableEmptyCacheTrims(t *testing.T) {
	p, v := expandablePool(t, 0, Config{})
	a, _, err := p.Alloc(0, 0, 9*mib)
	require.NoError(t, err)
	b, _, err := p.Alloc(0, 0, 10*mib)
	require.NoError(t, err)
	require.EqualValues(t, 20*mib, v.Used(0))
	require.NoError(t, p.Free(0, 0, b, 10*mib))
	require.NoError(t, p.EmptyCache())
	require.EqualValues(t, 10*mib, stat(t, p, 0, "reserved_bytes.all.current"), "9 MiB live keep 5 chunks")
	require.EqualValues(t, 10*mib, v.Used(0))
	require.NoError(t, p.CheckInvariants())
	// The 1 MiB left free after a grows again when asked.
	c, _, err := p.Alloc(0, 0, 4*mib)
	require.NoError(t, err)
	require.Equal(t, a+9*mib, c)
	require.EqualValues(t, 14*mib, stat(t, p, 0, "reserved_bytes.all.current"))
	require.NoError(t, p.Free(0, 0, a, 9*mib))
	require.NoError(t, p.Free(0, 0, c, 4*mib))
	require.NoError(t, p.EmptyCache())
	segs, ranges, chunks := v.Outstanding()
	require.Zero(t, segs+ranges+chunks)
	require.NoError(t, p.CheckInvariants())
}

// Under a limit, growth that would pass it first releases what other streams
// keep (the out-of-memory retry), as with fixed segments.
func TestExpandableLimitReleasesOtherStreams(t *testing.T) {
	p, _ := expandablePool(t, 0, Config{Limit: 24 * mib})
	a, _, err := p.Alloc(0, 1, 10*mib)
	require.NoError(t, err)
	require.NoError(t, p.Free(0, 1, a, 10*mib))
	b, _, err := p.Alloc(0, 2, 20*mib)
	require.NoError(t, err, "stream 1's idle range is released for stream 2")
	require.LessOrEqual(t, stat(t, p, 0, "reserved_bytes.all.peak"), int64(24*mib))
	_, _, err = p.Alloc(0, 2, 8*mib)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.Contains(t, err.Error(), "limit")
	require.NoError(t, p.Free(0, 2, b, 20*mib))
	require.NoError(t, p.CheckInvariants())
}

// A device too small: an ordinary out-of-memory error, nothing kept.
func TestExpandableOutOfMemory(t *testing.T) {
	p, v := expandablePool(t, 16*mib, Config{})
	a, _, err := p.Alloc(0, 0, 8*mib)
	require.NoError(t, err)
	_, _, err = p.Alloc(0, 0, 12*mib)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.EqualValues(t, 8*mib, v.Used(0), "a refused growth maps nothing")
	require.EqualValues(t, 1, stat(t, p, 0, "num_ooms"))
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.Free(0, 0, a, 8*mib))
	b, _, err := p.Alloc(0, 0, 12*mib)
	require.NoError(t, err, "the freed block grows into the chunks now free")
	require.NoError(t, p.Free(0, 0, b, 12*mib))
	require.NoError(t, p.EmptyCache())
	require.Zero(t, v.Used(0))
}

// A chunk that cannot be mapped mid-growth is an out-of-memory error after
// the release-and-retry; the segment stays consistent and its blocks intact.
func TestExpandableMapFailureMidGrowth(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 * mib // also the size of each range, in Go memory
	p, err := New(fb, Config{Expandable: true})
	require.NoError(t, err)
	a, _, err := p.Alloc(0, 0, 3*mib)
	require.NoError(t, err)
	copy(fb.mem(a, 4), "keep")
	fb.failAlloc = fakeOOM{}
	b, _, err := p.Alloc(0, 0, 5*mib)
	require.NoError(t, err, "the retry after one refused map succeeds")
	fb.capacity = fb.used[0]
	_, _, err = p.Alloc(0, 0, 5*mib)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.Equal(t, "keep", string(fb.mem(a, 4)))
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.Free(0, 0, a, 3*mib))
	require.NoError(t, p.Free(0, 0, b, 5*mib))
	require.NoError(t, p.EmptyCache())
	require.Empty(t, fb.mapped)
	require.Empty(t, fb.ranges)
}

// record_stream: a block used on another stream is reused only once that
// stream's work is done, in expandable segments too.
func TestExpandableRecordStream(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 * mib
	p, err := New(fb, Config{Expandable: true})
	require.NoError(t, err)
	a, _, err := p.Alloc(0, 0, 4*mib)
	require.NoError(t, err)
	require.NoError(t, p.RecordStream(a, 7))
	fb.launch(7)
	require.NoError(t, p.Free(0, 0, a, 4*mib))
	b, _, err := p.Alloc(0, 0, 4*mib)
	require.NoError(t, err)
	require.NotEqual(t, a, b, "stream 7 has not finished with a")
	fb.finish(7)
	c, _, err := p.Alloc(0, 0, 4*mib)
	require.NoError(t, err)
	require.Equal(t, a, c)
	require.NoError(t, p.CheckInvariants())
}

// Streams get ranges of their own; private pools (graph captures) stay fixed.
func TestExpandableStreamsAndPrivatePools(t *testing.T) {
	p, _ := expandablePool(t, 0, Config{})
	_, _, err := p.Alloc(0, 1, mib)
	require.NoError(t, err)
	_, _, err = p.Alloc(0, 2, mib)
	require.NoError(t, err)
	id := PoolID{First: 1}
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	_, _, err = p.AllocIn(0, 3, 5*mib, id)
	require.NoError(t, err)
	require.NoError(t, p.EndAllocateToPool(0, id))
	snap := p.Snapshot()
	require.Len(t, snap.Segments, 3)
	expandable := 0
	for _, s := range snap.Segments {
		if s.IsExpandable {
			expandable++
			require.EqualValues(t, 2*mib, s.TotalSize)
		} else {
			require.NotZero(t, s.PoolID, "the fixed segment is the private pool's")
		}
	}
	require.Equal(t, 2, expandable)
	require.Equal(t, true, snap.AllocatorSettings["expandable_segments"])
	require.NoError(t, p.CheckInvariants())
}

// Big chunks (here 5 MiB, rounded to 6) map whole slots inside what a
// segment grows by, the granularity the rest: a small request holds 2 MiB,
// not a big chunk, and release unmaps each chunk with its own size.
func TestExpandableChunk(t *testing.T) {
	p, v := expandablePool(t, 0, Config{ExpandableChunk: 5 * mib})
	small, _, err := p.Alloc(0, 0, mib)
	require.NoError(t, err)
	require.EqualValues(t, 2*mib, stat(t, p, 0, "reserved_bytes.all.current"), "one chunk of the granularity")
	require.Equal(t, map[uint64]int{2 * mib: 1}, v.Created())
	// 20 MiB after the 1 MiB block: the segment grows from 2 to 22 MiB,
	// [2, 6) and [18, 22) by the granularity, [6, 18) as two big chunks.
	big, _, err := p.Alloc(0, 0, 20*mib)
	require.NoError(t, err)
	require.EqualValues(t, 22*mib, stat(t, p, 0, "reserved_bytes.all.current"))
	require.Equal(t, map[uint64]int{2 * mib: 5, 6 * mib: 2}, v.Created())
	require.NoError(t, p.CheckInvariants())
	// ChunkAt names the physical chunk under any address of the segment.
	for _, c := range []struct{ at, base, size uint64 }{
		{0, 0, 2 * mib}, {3 * mib, 2 * mib, 2 * mib}, {6 * mib, 6 * mib, 6 * mib},
		{11 * mib, 6 * mib, 6 * mib}, {12 * mib, 12 * mib, 6 * mib}, {21*mib + 5, 20 * mib, 2 * mib},
	} {
		base, size, err := p.ChunkAt(big, small+uintptr(c.at))
		require.NoError(t, err)
		require.Equal(t, [2]uint64{c.base, c.size}, [2]uint64{uint64(base - small), size}, "chunk at offset %d", c.at)
	}
	_, _, err = p.ChunkAt(big, small+22*mib)
	require.ErrorIs(t, err, ErrInvalid, "past the mapped end")
	_, _, err = p.ChunkAt(small+40*mib, small)
	require.ErrorIs(t, err, ErrUnknownPointer)
	c, err := p.SegmentChunk(big + 10*mib)
	require.NoError(t, err)
	require.EqualValues(t, 6*mib, c)
	require.NoError(t, p.Free(0, 0, big, 20*mib))
	require.NoError(t, p.EmptyCache())
	require.EqualValues(t, 2*mib, stat(t, p, 0, "reserved_bytes.all.current"), "unmapped chunk by chunk, each with its size")
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.Free(0, 0, small, mib))
	require.NoError(t, p.EmptyCache())
	segs, ranges, chunks := v.Outstanding()
	require.Zero(t, segs+ranges+chunks)
}

// hideExpander offers a backend without its Expander methods.
type hideExpander struct{ Backend }

func TestExpandableNeedsExpander(t *testing.T) {
	_, err := New(hideExpander{NewVirtual(1, 0)}, Config{Expandable: true})
	require.ErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), "cannot reserve address space")
}

// The cached path allocates nothing on the Go heap in expandable mode too.
func TestExpandableCachedPathAllocatesNothing(t *testing.T) {
	p, _ := expandablePool(t, 0, Config{})
	warm, _, err := p.Alloc(0, 0, mib)
	require.NoError(t, err)
	require.NoError(t, p.Free(0, 0, warm, mib))
	avg := testing.AllocsPerRun(1000, func() {
		ptr, _, err := p.Alloc(0, 0, mib)
		if err != nil {
			panic(err)
		}
		if err := p.Free(0, 0, ptr, mib); err != nil {
			panic(err)
		}
	})
	require.Zero(t, avg)
}

func TestConfigFromEnvExpandable(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, _, err := ConfigFromEnv(env(map[string]string{"SYMM_POOL_EXPANDABLE": "1", "SYMM_POOL_EXPANDABLE_CHUNK": "8MiB"}))
	require.NoError(t, err)
	require.True(t, c.Expandable)
	require.EqualValues(t, 8*mib, c.ExpandableChunk)
	c, _, err = ConfigFromEnv(env(map[string]string{"SYMM_POOL_EXPANDABLE": "0"}))
	require.NoError(t, err)
	require.False(t, c.Expandable)
	c, warns, err := ConfigFromEnv(env(map[string]string{"SYMM_POOL_EXPANDABLE": "1", "SYMM_POOL_UNMAP_FREE_PAGES": "1"}))
	require.NoError(t, err)
	require.True(t, c.UnmapFreePages)
	require.Empty(t, warns)
	// Without expandable segments the chunk and the unmapping are what
	// they would do once turned on at run time.
	c, warns, err = ConfigFromEnv(env(map[string]string{"SYMM_POOL_UNMAP_FREE_PAGES": "0", "PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:40"}))
	require.NoError(t, err)
	require.Empty(t, warns)
	require.False(t, c.UnmapFreePages)
	require.EqualValues(t, 40*mib, c.ExpandableChunk)
	c, _, err = ConfigFromEnv(env(map[string]string{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "SYMM_POOL_UNMAP_FREE_PAGES": "0"}))
	require.NoError(t, err)
	require.True(t, c.Expandable)
	require.False(t, c.UnmapFreePages)
	for _, bad := range []map[string]string{
		{"SYMM_POOL_EXPANDABLE": "yes"},
		{"SYMM_POOL_UNMAP_FREE_PAGES": "on"},
		{"SYMM_POOL_EXPANDABLE_CHUNK": "0"},
		{"SYMM_POOL_EXPANDABLE_CHUNK": "2 parsecs"},
		{"SYMM_POOL_EXPANDABLE_CHUNK": "2TiB"},
	} {
		_, _, err := ConfigFromEnv(env(bad))
		require.ErrorIs(t, err, ErrInvalid, "%v", bad)
	}
}

// shardOf returns the default-pool shard of stream on device 0.
func shardOf(t *testing.T, p *Pool, stream uintptr) *shard {
	t.Helper()
	for _, s := range p.devs[0].shardList() {
		if s.stream == stream && s.pool == nil {
			return s
		}
	}
	t.Fatalf("no shard for stream %#x", stream)
	return nil
}

// Release unmaps memory only once the work its stream queued on it has
// completed, and waits for that stream alone, without the shard's lock: a
// stream that never finishes must not hold up every allocation on it.
func TestExpandableReleaseWaitsForItsStreamOnly(t *testing.T) {
	f := newFake(1)
	f.capacity = 256 * mib // the size of each range reserved
	p, err := New(f, Config{Expandable: true})
	require.NoError(t, err)
	const stream, other = 7, 9
	keep, _, err := p.Alloc(0, stream, 4*mib)
	require.NoError(t, err)
	tail, _, err := p.Alloc(0, stream, 30*mib)
	require.NoError(t, err)
	whole, _, err := p.Alloc(0, other, 6*mib)
	require.NoError(t, err)
	f.use(stream, tail, 30*mib)
	f.use(other, whole, 6*mib)
	require.NoError(t, p.Free(0, stream, tail, 30*mib))
	require.NoError(t, p.Free(0, other, whole, 6*mib))
	f.launch(99) // a stream that never finishes, using none of this memory

	var syncs, locked int
	f.onSync = func() {
		syncs++
		for _, st := range []uintptr{stream, other} {
			s := shardOf(t, p, st)
			if !s.mu.TryLock() {
				locked++
				continue
			}
			s.mu.Unlock()
		}
	}
	require.NoError(t, p.EmptyCache(), "the fake refuses an unmap before the stream's work completed")
	require.Equal(t, 2, syncs, "one wait per stream with something to unmap")
	require.Zero(t, locked, "no shard lock held while waiting")
	require.EqualValues(t, 4*mib, stat(t, p, 0, "reserved_bytes.all.current"), "the tail trimmed, the other stream's segment released")
	f.mem(keep, 4*mib) // still mapped
	require.NoError(t, p.CheckInvariants())
	f.mu.Lock()
	require.Less(t, f.completed[99], f.submitted[99], "the busy stream was never synchronized")
	f.mu.Unlock()
}

// A stream that keeps allocating while release waits for it: what it took
// meanwhile stays mapped, and release still ends, never waiting with the
// shard's lock held: after a few tries the tail it could not prove quiet
// stays, for the next release.
func TestExpandableReleaseWhileTheStreamAllocates(t *testing.T) {
	f := newFake(1)
	f.capacity = 256 * mib // the size of each range reserved
	p, err := New(f, Config{Expandable: true})
	require.NoError(t, err)
	const stream = 7
	a, _, err := p.Alloc(0, stream, 4*mib)
	require.NoError(t, err)
	b, _, err := p.Alloc(0, stream, 40*mib)
	require.NoError(t, err)
	f.use(stream, b, 40*mib)
	require.NoError(t, p.Free(0, stream, b, 40*mib))

	var taken []uintptr
	lockedSyncs := 0
	s := shardOf(t, p, stream)
	f.onSync = func() {
		if !s.mu.TryLock() {
			lockedSyncs++
			return
		}
		s.mu.Unlock()
		ptr, _, err := p.Alloc(0, stream, 8*mib)
		require.NoError(t, err)
		f.use(stream, ptr, 8*mib) // queued after the event: not waited for
		taken = append(taken, ptr)
	}
	require.NoError(t, p.EmptyCache())
	require.Zero(t, lockedSyncs, "no wait with the lock held")
	require.Len(t, taken, 3)
	require.Greater(t, stat(t, p, 0, "reserved_bytes.all.current"), int64(28*mib), "the tail stays mapped")
	for _, ptr := range append(taken, a) {
		f.mem(ptr, 4*mib)
	}
	require.NoError(t, p.CheckInvariants())
	f.onSync = nil
	for _, ptr := range taken {
		require.NoError(t, p.Free(0, stream, ptr, 8*mib))
	}
	f.finish(stream)
	require.NoError(t, p.Free(0, stream, a, 4*mib))
	require.NoError(t, p.EmptyCache())
	require.Zero(t, stat(t, p, 0, "reserved_bytes.all.current"))
}

// A process whose requests are all small holds one chunk of the
// granularity per stream, as PyTorch's small pool maps 2 MiB pages, not a
// big chunk each.
func TestExpandableSmallRequestsPerStream(t *testing.T) {
	p, v := expandablePool(t, 0, Config{ExpandableChunk: 20 * mib, UnmapFreePages: true})
	var live []struct {
		s, p uintptr
		n    uint64
	}
	for i := 0; i < 400; i++ {
		s := uintptr(i%2) * 7
		n := uint64(512 + (i*7919)%(64<<10))
		ptr, _, err := p.Alloc(0, s, n)
		require.NoError(t, err)
		live = append(live, struct {
			s, p uintptr
			n    uint64
		}{s, ptr, n})
		if len(live) > 40 { // at most about 1.3 MiB live per stream
			require.NoError(t, p.Free(0, live[0].s, live[0].p, live[0].n))
			live = live[1:]
		}
	}
	require.EqualValues(t, 4*mib, stat(t, p, 0, "reserved_bytes.all.peak"), "2 MiB per stream")
	require.Equal(t, map[uint64]int{2 * mib: 2}, v.Created())
	require.NoError(t, p.CheckInvariants())
}

// Virtual's lagging streams: an event completes lag ticks after it is
// recorded, or when asked twice within one tick (a host waiting), or
// synced.
func TestVirtualStreamLag(t *testing.T) {
	v := NewVirtual(1, 0)
	v.SetStreamLag(3)
	v.Tick(10)
	ev, err := v.NewEvent(0)
	require.NoError(t, err)
	require.NoError(t, v.Record(0, ev, 0))
	done, err := v.Query(0, ev)
	require.NoError(t, err)
	require.False(t, done, "recorded at tick 10")
	v.Tick(12)
	done, _ = v.Query(0, ev)
	require.False(t, done, "tick 12")
	done, _ = v.Query(0, ev)
	require.True(t, done, "asked again within tick 12: the host waits, the stream catches up")
	require.NoError(t, v.Record(0, ev, 0))
	done, _ = v.Query(0, ev)
	require.False(t, done, "recorded again")
	v.Tick(15)
	done, _ = v.Query(0, ev)
	require.True(t, done, "tick 15: three after")
	require.NoError(t, v.Record(0, ev, 0))
	require.NoError(t, v.Sync(0, ev))
	done, _ = v.Query(0, ev)
	require.True(t, done, "synced")
}

// Out of memory in an expandable segment names the block it needed, not a
// fixed segment's size: a 1 TiB chunk setting does not make it 20 MiB.
func TestExpandableOOMNamesTheBlock(t *testing.T) {
	p, _ := expandablePool(t, 64*mib, Config{ExpandableChunk: 1 << 40})
	_, _, err := p.Alloc(0, 0, 100*mib)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.ErrorContains(t, err, "requested 104857600 bytes (a 104857600-byte block of the large_pool's expandable segment)")
}
