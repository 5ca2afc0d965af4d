package allocator

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

var graphPool = PoolID{First: 7}

func TestPrivatePoolKeepsItsMemory(t *testing.T) {
	p, f := newPool(t, Config{})
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	a, _, err := p.AllocIn(0, sA, 1<<20, graphPool)
	require.NoError(t, err)
	b, _, err := p.AllocIn(0, sA, 4<<20, graphPool)
	require.NoError(t, err)
	require.NoError(t, p.Free(0, sA, a, 1<<20)) // freed inside the capture
	a2, _, err := p.AllocIn(0, sA, 1<<20, graphPool)
	require.NoError(t, err)
	require.Equal(t, a, a2, "a block freed in the pool is reused by the pool at once")
	require.NoError(t, p.Free(0, sA, a2, 1<<20))
	require.NoError(t, p.EndAllocateToPool(0, graphPool))
	check(t, p)

	// Outside the pool nothing of it is handed out, even after empty_cache.
	require.NoError(t, p.EmptyCache())
	segs := f.allocs
	for _, n := range []uint64{1 << 20, 4 << 20, 512} {
		x := mustAlloc(t, p, 0, sA, n)
		require.NotEqual(t, a, x)
		require.NotEqual(t, b, x)
		require.NoError(t, p.Free(0, sA, x, n))
	}
	require.Greater(t, f.allocs, segs, "the default pool took segments of its own")
	pools, err := p.Pools(0)
	require.NoError(t, err)
	require.Len(t, pools, 1)
	require.Equal(t, PoolInfo{ID: graphPool, Uses: 1, Active: 0, Segments: 2, Reserved: 2<<20 /* small */ + 20<<20}, pools[0])
	require.Equal(t, int64(2<<20+20<<20+20<<20+2<<20), stat(t, p, 0, "reserved_bytes.all.current"))

	// The output tensor b outlives the graph: release goes ahead (PyTorch),
	// b stays valid, and its segment goes back once freed and emptied.
	require.NoError(t, p.ReleasePool(0, graphPool, false))
	require.NoError(t, p.EmptyCache())
	pools, _ = p.Pools(0)
	require.Len(t, pools, 1, "a released pool with a live block stays until it is freed")
	require.Equal(t, 1, pools[0].Segments)
	require.NoError(t, p.Free(0, sA, b, 4<<20))
	require.NoError(t, p.EmptyCache())
	pools, _ = p.Pools(0)
	require.Empty(t, pools)
	require.Zero(t, stat(t, p, 0, "reserved_bytes.all.current"))
	require.Zero(t, f.used[0])
	check(t, p)
}

func TestPrivatePoolSharedByTwoGraphs(t *testing.T) {
	p, f := newPool(t, Config{})
	for i := 0; i < 2; i++ {
		require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
		x, _, err := p.AllocIn(0, sA, 3<<20, graphPool)
		require.NoError(t, err)
		require.NoError(t, p.Free(0, sA, x, 3<<20))
		require.NoError(t, p.EndAllocateToPool(0, graphPool))
	}
	require.Equal(t, 1, f.allocs, "the second graph reused the first one's segment")
	require.NoError(t, p.ReleasePool(0, graphPool, true))
	require.NoError(t, p.EmptyCache())
	require.Equal(t, 0, f.frees, "one graph still uses the pool")
	require.NoError(t, p.ReleasePool(0, graphPool, true))
	require.NoError(t, p.EmptyCache())
	require.Equal(t, 1, f.frees)
	check(t, p)
}

func TestPrivatePoolBadInput(t *testing.T) {
	p, _ := newPool(t, Config{})
	other := PoolID{Second: 3}
	require.ErrorIs(t, p.BeginAllocateToPool(0, PoolID{}, nil), ErrInvalid)
	require.ErrorIs(t, p.BeginAllocateToPool(9, graphPool, nil), ErrInvalid)
	require.ErrorContains(t, p.EndAllocateToPool(0, other), "end of allocation to pool (0, 3) on device 0: no such pool")
	require.ErrorContains(t, p.ReleasePool(0, other, true), "release of pool (0, 3) on device 0: no such pool")
	_, _, err := p.AllocIn(0, sA, 512, other)
	require.ErrorIs(t, err, ErrInvalid)

	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	x, _, err := p.AllocIn(0, sA, 512, graphPool)
	require.NoError(t, err)
	require.NoError(t, p.EndAllocateToPool(0, graphPool))
	require.ErrorContains(t, p.EndAllocateToPool(0, graphPool), "no allocation to it was begun")
	_, _, err = p.AllocIn(0, sA, 512, graphPool)
	require.ErrorContains(t, err, "no allocation to that pool is under way")

	// Strict release with a live block: refused, nothing changes.
	err = p.ReleasePool(0, graphPool, true)
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "1 blocks (512 bytes) of it are still allocated")
	pools, _ := p.Pools(0)
	require.Equal(t, 1, pools[0].Uses)
	require.NoError(t, p.Free(0, sA, x, 512))
	require.NoError(t, p.ReleasePool(0, graphPool, true))
	require.ErrorContains(t, p.ReleasePool(0, graphPool, true), "already released")
	require.NoError(t, p.EmptyCache())
	require.ErrorContains(t, p.ReleasePool(0, graphPool, true), "no such pool")
	check(t, p)
}

// While a pool is routing (a capture may be under way), the pool records and
// queries no event: a cross-stream steal waits, and record_stream frees are
// parked until no capture is under way.
func TestNoEventsWhileRouting(t *testing.T) {
	p, f := newPool(t, Config{})
	x := mustAlloc(t, p, 0, sA, 1<<20)
	y := mustAlloc(t, p, 0, sA, 8<<20)
	require.NoError(t, p.RecordStream(y, sC))
	require.NoError(t, p.Free(0, sA, x, 1<<20))
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	require.NoError(t, p.Free(0, sA, y, 8<<20))
	allocs := f.allocs
	z := mustAlloc(t, p, 0, sB, 1<<20) // would steal sA's idle segment otherwise
	require.NotEqual(t, x, z)
	require.Equal(t, allocs+1, f.allocs)
	require.Empty(t, f.events, "no event created, recorded or queried during the capture")
	require.Equal(t, int64(1), stat(t, p, 0, "active.all.current")-stat(t, p, 0, "allocation.all.current"), "y is pending")
	require.NoError(t, p.EndAllocateToPool(0, graphPool))

	// After the capture the parked free records its event and completes.
	f.launch(sC)
	_ = mustAlloc(t, p, 0, sA, 512)
	require.Len(t, f.events, 1)
	f.finish(sC)
	_ = mustAlloc(t, p, 0, sA, 512)
	require.Equal(t, stat(t, p, 0, "active.all.current"), stat(t, p, 0, "allocation.all.current"))
	check(t, p)
}

func TestAllocSegmentGoesBackAtOnce(t *testing.T) {
	p, f := newPool(t, Config{})
	// The sizes PyTorch's caching allocator asks a MemPool for.
	for _, n := range []uint64{2 << 20, 20 << 20, 34 << 20} {
		ptr, bsize, err := p.AllocSegment(0, sA, n)
		require.NoError(t, err)
		require.Equal(t, n, bsize, "exactly the size asked: no rounding up to a larger segment")
		require.Equal(t, n, f.used[0])
		require.Equal(t, int64(n), stat(t, p, 0, "allocated_bytes.all.current"))
		require.NoError(t, p.Free(0, sA, ptr, n))
		require.Zero(t, f.used[0], "freed to the backend at once")
		require.Zero(t, stat(t, p, 0, "reserved_bytes.all.current"))
		check(t, p)
	}
	require.Equal(t, int64(34<<20), stat(t, p, 0, "reserved_bytes.all.peak"))

	f.capacity = 64 << 20
	_, _, err := p.AllocSegment(0, sA, 65<<20)
	require.ErrorIs(t, err, ErrOutOfMemory)
	check(t, p)
}

func TestHistoryAndSnapshot(t *testing.T) {
	p, _ := newPool(t, Config{})
	require.ErrorIs(t, p.RecordHistory(true, 0, false), ErrInvalid)
	require.NoError(t, p.RecordHistory(true, 100, true))
	a := mustAlloc(t, p, 0, sA, 1000)
	b := mustAlloc(t, p, 0, sA, 3<<20)
	require.NoError(t, p.Free(0, sA, a, 1000))
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	g, _, err := p.AllocIn(0, sB, 4096, graphPool)
	require.NoError(t, err)
	require.NoError(t, p.EndAllocateToPool(0, graphPool))

	h, err := p.History(0)
	require.NoError(t, err)
	var acts []string
	for _, e := range h {
		acts = append(acts, e.Action.String())
		require.NotZero(t, e.TimeUS)
	}
	require.Equal(t, []string{"segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed", "segment_alloc", "alloc"}, acts)
	require.Equal(t, b, h[3].Addr)

	snap := p.Snapshot()
	require.Len(t, snap.Segments, 3)
	var poolSeg *SnapshotSegment
	for i := range snap.Segments {
		s := &snap.Segments[i]
		var sum uint64
		for _, bl := range s.Blocks {
			sum += bl.Size
		}
		require.Equal(t, s.TotalSize, sum, "blocks tile the segment")
		if s.PoolID != [2]uint64{} {
			poolSeg = s
		}
	}
	require.NotNil(t, poolSeg)
	require.Equal(t, [2]uint64{7, 0}, poolSeg.PoolID)
	require.Equal(t, g, poolSeg.Blocks[0].Address)
	require.Equal(t, "active_allocated", poolSeg.Blocks[0].State)
	require.Equal(t, uint64(4096), poolSeg.Blocks[0].RequestedSize)
	require.Equal(t, "small", poolSeg.SegmentType)

	raw, err := p.SnapshotJSON()
	require.NoError(t, err)
	var generic map[string]any
	require.NoError(t, json.Unmarshal(raw, &generic))
	seg := generic["segments"].([]any)[0].(map[string]any)
	for _, k := range []string{"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
		"stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"} {
		require.Contains(t, seg, k)
	}
	// As in PyTorch, a snapshot lists the history taken before its own
	// "snapshot" event: this one shows the event of p.Snapshot() above, last,
	// sized by the device's active bytes (a's block is free again).
	tr := generic["device_traces"].([]any)[0].([]any)
	last := tr[len(tr)-1].(map[string]any)
	require.Equal(t, "snapshot", last["action"])
	var active float64
	for _, s := range generic["segments"].([]any) {
		active += s.(map[string]any)["active_size"].(float64)
	}
	require.Equal(t, active, last["size"])
	require.Equal(t, "alloc", tr[len(tr)-2].(map[string]any)["action"], "the event before it: g's alloc")
	for _, k := range []string{"action", "addr", "size", "stream", "time_us", "frames", "compile_context", "user_metadata"} {
		require.Contains(t, tr[0].(map[string]any), k)
	}

	// The ring keeps the newest entries; off empties it, as PyTorch's does.
	require.NoError(t, p.RecordHistory(true, 3, false))
	for i := 0; i < 10; i++ {
		x := mustAlloc(t, p, 0, sA, 512)
		require.NoError(t, p.Free(0, sA, x, 512))
	}
	h, _ = p.History(0)
	require.Len(t, h, 3)
	require.Equal(t, ActFreeCompleted, h[2].Action)
	require.NoError(t, p.RecordHistory(false, 0, false))
	h2, _ := p.History(0)
	require.Empty(t, h2, "off empties the ring")
	x := mustAlloc(t, p, 0, sA, 512)
	require.NoError(t, p.Free(0, sA, x, 512))
	h2, _ = p.History(0)
	require.Empty(t, h2, "nothing recorded while off")
}

// OOM is recorded with the device's free bytes, as PyTorch's trace does.
func TestHistoryRecordsOOM(t *testing.T) {
	p, f := newPool(t, Config{})
	require.NoError(t, p.RecordHistory(true, 10, true))
	f.capacity = 8 << 20
	_, _, err := p.Alloc(0, sA, 9<<20)
	require.ErrorIs(t, err, ErrOutOfMemory)
	h, _ := p.History(0)
	require.Equal(t, ActOOM, h[len(h)-1].Action)
	require.Equal(t, uintptr(8<<20), h[len(h)-1].Addr)
	require.Equal(t, uint64(9<<20), h[len(h)-1].Size)
}

// While a pool is routing (a capture may be under way on any stream of the
// device), nothing goes back to the backend: not at empty_cache, not in the
// out-of-memory retry. The driver forbids freeing and unmapping during a
// global-mode capture, and PyTorch releases nothing then either. Once the
// routes end, the same memory is released.
func TestNothingReleasedWhileRouting(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		t.Run(fmt.Sprintf("expandable=%v", expandable), func(t *testing.T) {
			f := newFake(2)
			f.capacity = 64 << 20 // before New: expandable ranges are sized from it
			p, err := New(f, Config{Expandable: expandable})
			require.NoError(t, err)
			x := mustAlloc(t, p, 0, sA, 30<<20)
			require.NoError(t, p.Free(0, sA, x, 30<<20))
			reserved := stat(t, p, 0, "reserved_bytes.all.current")
			require.NotZero(t, reserved)
			frees, mapped := f.frees, len(f.mapped)

			require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
			require.NoError(t, p.EmptyCache())
			// Another stream's request the cache cannot serve: out of memory,
			// with the cached segment kept.
			_, _, err = p.Alloc(0, sB, 60<<20)
			require.ErrorIs(t, err, ErrOutOfMemory)
			require.Equal(t, frees, f.frees, "a segment was freed while a capture may be under way")
			require.Equal(t, mapped, len(f.mapped), "chunks were unmapped while a capture may be under way")
			require.Equal(t, reserved, stat(t, p, 0, "reserved_bytes.all.current"))
			require.NoError(t, p.EndAllocateToPool(0, graphPool))

			require.NoError(t, p.EmptyCache())
			require.Zero(t, stat(t, p, 0, "reserved_bytes.all.current"), "released once no capture is under way")
			require.NoError(t, p.ReleasePool(0, graphPool, true))
			check(t, p)
		})
	}
}
