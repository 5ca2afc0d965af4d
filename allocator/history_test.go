package allocator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func actions(h []TraceEntry) []string {
	var out []string
	for _, e := range h {
		out = append(out, e.Action.String())
	}
	return out
}

// Off empties the rings, and so does clear; on again without clear keeps
// them (PyTorch's recordHistory: `if (!enabled || clearHistory) clear`).
func TestRecordHistoryOffClears(t *testing.T) {
	p, _ := newPool(t, Config{})
	require.NoError(t, p.RecordHistory(true, 100, false))
	x := mustAlloc(t, p, 0, sA, 512)
	h, _ := p.History(0)
	require.Equal(t, []string{"segment_alloc", "alloc"}, actions(h))

	require.NoError(t, p.RecordHistory(true, 100, false), "on again, no clear")
	h, _ = p.History(0)
	require.Len(t, h, 2, "kept")

	require.NoError(t, p.RecordHistory(false, 0, false))
	h, _ = p.History(0)
	require.Empty(t, h, "off empties it")
	require.Empty(t, p.Snapshot().DeviceTraces[0], "and the snapshot lists nothing of it")

	require.NoError(t, p.RecordHistory(true, 100, false))
	require.NoError(t, p.Free(0, sA, x, 512))
	h, _ = p.History(0)
	require.Equal(t, []string{"free_requested", "free_completed"}, actions(h), "only what came after")
	require.NoError(t, p.RecordHistory(true, 100, true))
	h, _ = p.History(0)
	require.Empty(t, h, "clear empties it and keeps recording")
	mustAlloc(t, p, 0, sA, 512)
	h, _ = p.History(0)
	require.Equal(t, []string{"alloc"}, actions(h))
}

// A snapshot lists the history taken before its own "snapshot" event, whose
// size is the device's active bytes: the event shows in the next snapshot.
// alloc and free entries carry the requested size, as PyTorch's do.
func TestSnapshotEventOrderAndSizes(t *testing.T) {
	p, _ := newPool(t, Config{})
	require.NoError(t, p.RecordHistory(true, 100, true))
	a := mustAlloc(t, p, 0, sA, 1000) // a 1024-byte block
	b := mustAlloc(t, p, 0, sA, 3<<20)
	require.NoError(t, p.Free(0, sA, a, 1000))

	peek := p.PeekSnapshot()
	s1 := p.Snapshot()
	require.Equal(t, peek.DeviceTraces, s1.DeviceTraces, "a peek records nothing")
	tr := s1.DeviceTraces[0]
	last := tr[len(tr)-1]
	require.Equal(t, "free_completed", last.Action, "the last event before the snapshot, not the snapshot")
	require.Equal(t, uint64(1000), last.Size, "the requested size")
	for _, e := range tr {
		require.NotEqual(t, "snapshot", e.Action)
		if e.Action == "alloc" && *e.Addr == a {
			require.Equal(t, uint64(1000), e.Size)
		}
	}

	var active uint64
	for _, sg := range s1.Segments {
		active += sg.ActiveSize
	}
	require.NotZero(t, active)
	s2 := p.Snapshot()
	tr2 := s2.DeviceTraces[0]
	ev := tr2[len(tr2)-1]
	require.Equal(t, "snapshot", ev.Action)
	require.Equal(t, active, ev.Size, "the device's active bytes")
	require.Equal(t, uintptr(0), *ev.Addr)
	require.Len(t, tr2, len(tr)+1)
	require.NoError(t, p.Free(0, sA, b, 3<<20))
}

// Each entry carries the annotation current when it was recorded; the
// snapshot resolves it ("N/A": no compile context).
func TestHistoryAnnotations(t *testing.T) {
	p, _ := newPool(t, Config{})
	require.NoError(t, p.SetAnnotation("before", ""), "set before history is on: kept")
	require.NoError(t, p.RecordHistory(true, 100, true))
	x := mustAlloc(t, p, 0, sA, 512)
	require.NoError(t, p.SetAnnotation("meta", "Torch-Compiled Region: 0/0"))
	require.NoError(t, p.Free(0, sA, x, 512))
	require.NoError(t, p.SetAnnotation("", ""))
	mustAlloc(t, p, 0, sA, 512)

	got := [][2]string{}
	for _, e := range p.PeekSnapshot().DeviceTraces[0] {
		got = append(got, [2]string{e.UserMetadata, e.CompileContext})
	}
	require.Equal(t, [][2]string{
		{"before", "N/A"}, {"before", "N/A"}, // segment_alloc, alloc
		{"meta", "Torch-Compiled Region: 0/0"}, {"meta", "Torch-Compiled Region: 0/0"}, // free_requested, free_completed
		{"", "N/A"}, // alloc
	}, got)

	meta, comp := p.Annotation()
	require.Equal(t, "", meta)
	require.Equal(t, "", comp)
	require.ErrorIs(t, p.SetAnnotation(strings.Repeat("x", MaxAnnotationLen+1), ""), ErrInvalid)
	require.ErrorIs(t, p.SetAnnotation("", strings.Repeat("x", MaxAnnotationLen+1)), ErrInvalid)

	// Off drops the table but the current annotation stays current.
	require.NoError(t, p.SetAnnotation("kept", "c"))
	require.NoError(t, p.RecordHistory(false, 0, false))
	require.Len(t, p.annots.texts, 2, "the empty pair and the current one")
	require.NoError(t, p.RecordHistory(true, 100, false))
	mustAlloc(t, p, 0, sA, 512)
	tr := p.PeekSnapshot().DeviceTraces[0]
	require.Equal(t, "kept", tr[len(tr)-1].UserMetadata)
	require.Equal(t, "c", tr[len(tr)-1].CompileContext)
}

// Past maxAnnotations distinct pairs the table drops those no entry refers
// to, renumbering the rings: every entry still reads its own annotation.
func TestHistoryAnnotationsCompact(t *testing.T) {
	p, _ := newPool(t, Config{})
	const ring = 64
	require.NoError(t, p.RecordHistory(true, ring, true))
	n := maxAnnotations + 500
	for i := 0; i < n; i++ {
		require.NoError(t, p.SetAnnotation(fmt.Sprintf("step %d", i), ""))
		x := mustAlloc(t, p, 0, sA, 512)
		require.NoError(t, p.Free(0, sA, x, 512))
	}
	require.LessOrEqual(t, len(p.annots.texts), maxAnnotations)
	h, _ := p.History(0)
	require.Len(t, h, ring)
	tr := p.PeekSnapshot().DeviceTraces[0]
	require.Len(t, tr, ring)
	// The last ring entries: 3 per step (alloc, free_requested, free_completed).
	for i, e := range tr {
		step := n - 1 - (ring-1-i)/3
		require.Equal(t, fmt.Sprintf("step %d", step), e.UserMetadata, "entry %d (%s)", i, e.Action)
	}
	meta, _ := p.Annotation()
	require.Equal(t, fmt.Sprintf("step %d", n-1), meta)
}

// Segment events for a watcher carry the annotation too.
func TestSegmentEventsAnnotated(t *testing.T) {
	p, _ := newPool(t, Config{})
	p.WatchSegments(true)
	require.NoError(t, p.SetAnnotation("seg", "region"))
	mustAlloc(t, p, 0, sA, 512)
	evs, _, _ := p.TakeSegmentEvents(nil)
	require.NotEmpty(t, evs)
	require.Equal(t, "seg", evs[0].UserMetadata)
	require.Equal(t, "region", evs[0].CompileContext)
}

// With history off, recording costs one atomic load and no allocation; on,
// with the ring full, no allocation either.
func TestHistoryRecordAllocs(t *testing.T) {
	p, _ := newPool(t, Config{})
	h := &p.devs[0].hist
	require.Zero(t, testing.AllocsPerRun(100, func() { h.record(ActAlloc, 1, 2, 3) }))
	require.NoError(t, p.RecordHistory(true, 4, true))
	require.NoError(t, p.SetAnnotation("m", "c"))
	for i := 0; i < 4; i++ {
		h.record(ActAlloc, 1, 2, 3)
	}
	require.Zero(t, testing.AllocsPerRun(100, func() { h.record(ActAlloc, 1, 2, 3) }))
}

// As in PyTorch's snapshot: a free block reports the request of the
// allocation freed into it last (the freed block absorbs its free
// neighbours, and their requests are forgotten), a block never handed out
// 0, and a segment's requested size counts its active blocks, pending ones
// too.
func TestSnapshotRequestedSizes(t *testing.T) {
	p, _ := newPool(t, Config{})
	blocks := func() []SnapshotBlock {
		s := p.Snapshot()
		require.Len(t, s.Segments, 1)
		return s.Segments[0].Blocks
	}
	a := mustAlloc(t, p, 0, sA, 1000) // 1024 bytes
	b := mustAlloc(t, p, 0, sA, 3000) // 3072 bytes
	c := mustAlloc(t, p, 0, sA, 512)
	require.NoError(t, p.Free(0, sA, a, 1000))
	bl := blocks()
	require.Equal(t, []string{"inactive", "active_allocated", "active_allocated", "inactive"},
		[]string{bl[0].State, bl[1].State, bl[2].State, bl[3].State})
	require.Equal(t, []uint64{1000, 3000, 512, 0},
		[]uint64{bl[0].RequestedSize, bl[1].RequestedSize, bl[2].RequestedSize, bl[3].RequestedSize})

	require.NoError(t, p.Free(0, sA, b, 3000)) // merges into a's block
	bl = blocks()
	require.Len(t, bl, 3)
	require.Equal(t, uint64(1024+3072), bl[0].Size)
	require.Equal(t, uint64(3000), bl[0].RequestedSize, "the freed block's request, not its neighbour's")

	require.NoError(t, p.RecordStream(c, sB)) // its free waits for sB
	require.NoError(t, p.Free(0, sA, c, 512))
	s := p.Snapshot()
	require.Equal(t, "active_pending_free", s.Segments[0].Blocks[1].State)
	require.Equal(t, uint64(512), s.Segments[0].RequestedSize, "a pending block's request counts")
	require.Equal(t, uint64(0), s.Segments[0].AllocatedSize)
	check(t, p)
}
