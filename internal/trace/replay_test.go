package trace

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
)

// Two streams each get their own segments: the same rows on one stream
// reserve half as much.
func TestReplayHonoursStreams(t *testing.T) {
	const rows = `action,addr,size,stream
alloc,1,1048576,0
alloc,2,1048576,%s
free_completed,1,1048576,0
free_completed,2,1048576,%s
`
	one, err := Replay(mustParse(t, fmt.Sprintf(rows, "0", "0")), allocator.Config{}, 0)
	require.NoError(t, err)
	two, err := Replay(mustParse(t, fmt.Sprintf(rows, "7", "7")), allocator.Config{}, 0)
	require.NoError(t, err)
	// Time-averaged: after the four rows the pool holds 2, 2, 2, 2 MiB (one
	// stream) or 2, 4, 4, 4 (two) while 1, 2, 1, 0 MiB are live.
	require.Equal(t, Result{PeakAllocated: 2 * mib, PeakReserved: 2 * mib, Ratio: 1, BackendPeak: 2 * mib, TimeAveraged: 2, Rows: 4}, one)
	require.Equal(t, Result{PeakAllocated: 2 * mib, PeakReserved: 4 * mib, Ratio: 2, BackendPeak: 4 * mib, TimeAveraged: 3.5, Rows: 4}, two)
}

func TestReplayPreexistingLostAndUnmatched(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,4096,0
free_completed,50,3145728,5
alloc,1,8192,0
free_completed,1,8192,0
free_completed,1,8192,0
alloc,3,0,0
free_completed,60,4096,5
`)
	res, err := Replay(tr, allocator.Config{}, 0)
	require.NoError(t, err)
	require.Equal(t, 2, res.PreExisting)
	require.Equal(t, 1, res.LostFrees)
	require.Equal(t, 1, res.UnmatchedFrees)
	require.Equal(t, 5, res.Rows) // 2 allocs, 3 frees matched; size 0 and the double free skipped
	// Both pre-existing blocks (3 MiB + 4 KiB, stream 5) are live from the
	// start: with the 4 KiB of the first row, 3 MiB + 8 KiB at the peak.
	require.Equal(t, uint64(3*mib+8192), res.PeakAllocated)
	// Stream 5: a 20 MiB segment (1 MiB < 3 MiB < 10 MiB) and a 2 MiB small
	// one; stream 0: a 2 MiB small one.
	require.Equal(t, uint64(24*mib), res.PeakReserved)
}

// Out of memory is counted, not fatal; the failed block's free is skipped.
func TestReplayCountsOOM(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,10485760,0
alloc,2,10485760,0
free_completed,2,10485760,0
free_completed,1,10485760,0
alloc,3,10485760,0
alloc,4,18446744073709551615,0
`)
	res, err := Replay(tr, allocator.Config{}, 16*mib)
	require.NoError(t, err)
	require.Equal(t, 2, res.OOMs) // the second 10 MiB, and a size beyond any device
	require.Equal(t, 6, res.Rows)
	require.Equal(t, uint64(10*mib), res.PeakAllocated)
	require.Equal(t, uint64(10*mib), res.BackendPeak) // the third alloc reused the first's segment
}

// The pool's limit produces OOMs as the device's capacity does.
func TestReplayLimit(t *testing.T) {
	tr := mustParse(t, "action,addr,size,stream\nalloc,1,10485760,0\nalloc,2,10485760,0\n")
	res, err := Replay(tr, allocator.Config{Limit: 16 * mib}, 0)
	require.NoError(t, err)
	require.Equal(t, 1, res.OOMs)
}

// The front-cache model parks small freed blocks: a request of the same size
// and stream reuses one without the pool; any other request gives them back
// to the pool first; at the end nothing is left parked.
func TestReplayFrontCacheModel(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,1048576,0
alloc,2,1048576,0
free_completed,1,1048576,0
alloc,3,1048576,0
free_completed,3,1048576,0
alloc,4,1044480,0
free_completed,4,1044480,0
free_completed,2,1048576,0
alloc,5,4194304,0
free_completed,5,4194304,0
`)
	for _, front := range []uint64{0, 1 << 20, 4 << 20} {
		res, err := ReplayWith(tr, allocator.Config{}, Options{FrontMax: front})
		require.NoError(t, err)
		require.Equal(t, 10, res.Rows, "front %d", front)
		require.Zero(t, res.OOMs)
		// Row 6 (1 MiB - 4 KiB) misses the parked 1 MiB block: the pool
		// takes it back rather than growing a second small segment.
		require.Equal(t, uint64(2*mib+20*mib), res.PeakReserved, "front %d: one small and one large segment", front)
		require.Equal(t, uint64(4*mib), res.PeakAllocated, "front %d", front)
	}
	// Expandable segments: the same, in one segment per stream.
	res, err := ReplayWith(tr, allocator.Config{Expandable: true}, Options{FrontMax: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, uint64(4*mib), res.PeakReserved)
}

// A block over the front cache's size limit is parked, and reused by the
// next request of its size and stream, while its shard has not changed
// since it was placed; a change in between (another allocation) sends it
// back to the pool. The peaks are those of the pool alone.
func TestReplayFrontCacheUnchangedShard(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,4194304,0
free_completed,1,4194304,0
alloc,2,4194304,0
alloc,3,2097152,0
free_completed,2,4194304,0
alloc,4,4194304,0
free_completed,4,4194304,0
free_completed,3,2097152,0
`)
	for _, ex := range []bool{false, true} {
		on := replayFrontLikePool(t, tr, ex)
		require.Equal(t, 1, on.FrontUnchangedHits, "expandable %v: row 3 reuses row 1's block; row 6 misses", ex)
		require.Equal(t, 1, on.FrontHits, "expandable %v", ex)
	}
}

// replayFrontLikePool replays tr with the front-cache model (1 MiB) and
// without, checks that the peaks are the same, and returns the former.
func replayFrontLikePool(t *testing.T, tr *Trace, expandable bool) Result {
	off, err := ReplayWith(tr, allocator.Config{Expandable: expandable}, Options{})
	require.NoError(t, err)
	on, err := ReplayWith(tr, allocator.Config{Expandable: expandable}, Options{FrontMax: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, off.PeakReserved, on.PeakReserved, "expandable %v", expandable)
	require.Equal(t, off.PeakAllocated, on.PeakAllocated, "expandable %v", expandable)
	return on
}

// Peaks with the front cache are the true ones: a block parked when a
// request of another size comes goes back to the pool before the pool
// serves it, so it is never counted next to that request.
func TestReplayFrontCachePeaksAreExact(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,1048576,0
free_completed,1,1048576,0
alloc,2,524288,0
free_completed,2,524288,0
`)
	for _, ex := range []bool{false, true} {
		res, err := ReplayWith(tr, allocator.Config{Expandable: ex}, Options{FrontMax: 1 << 20})
		require.NoError(t, err)
		require.Equal(t, uint64(mib), res.PeakAllocated, "expandable %v: 1 MiB, not 1.5", ex)
	}
}

func TestReplayEmpty(t *testing.T) {
	res, err := Replay(mustParse(t, "action,addr,size,stream\nsnapshot,0,0,0\n"), allocator.Config{}, 0)
	require.NoError(t, err)
	require.Equal(t, Result{}, res)
}

func TestReplayBadConfig(t *testing.T) {
	_, err := Replay(mustParse(t, Header+"\n"), allocator.Config{LimitFraction: 2}, 0)
	require.ErrorContains(t, err, "limit fraction 2 is outside [0, 1]")
}

// The real trace replays cleanly, near PyTorch's native ratio (1.052).
func TestReplayGPT2(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 25,597 rows")
	}
	tr, err := Open(gpt2)
	require.NoError(t, err)
	res, err := Replay(tr, allocator.Config{}, 0)
	require.NoError(t, err)
	require.Equal(t, 12949+12648, res.Rows)
	require.Zero(t, res.PreExisting+res.LostFrees+res.UnmatchedFrees+res.OOMs)
	require.Greater(t, res.PeakAllocated, uint64(14500*mib))
	require.Less(t, res.Ratio, 1.10)
	require.Equal(t, res.PeakReserved, res.BackendPeak)
}

// Unmapping free pages inside expandable segments whenever the pool maps
// memory keeps the memory held within 1 % of the live bytes at the peak on
// every recorded trace, and the backend's peak is the pool's. The ratios
// and chunk map and unmap counts are the ones docs/REPLAY.md quotes
// (--unmap-free-pages); the longest free runs go first (allocator/pages.go).
func TestReplayUnmapFreePages(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every recorded trace twice")
	}
	quoted := map[string][2]string{ // without, with
		"gpt2_train": {"1.003", "1.001"}, "cnn_train": {"1.004", "1.001"}, "llm_infer": {"1.067", "1.006"},
	}
	calls := map[string][3]int64{ // maps without; maps and unmaps with
		"gpt2_train": {395, 441, 49}, "cnn_train": {161, 360, 217}, "llm_infer": {82, 223, 148},
	}
	for _, name := range []string{"gpt2_train", "cnn_train", "llm_infer"} {
		tr, err := Open("../../bench/testdata/" + name + "_trace.csv.gz")
		require.NoError(t, err)
		off, err := Replay(tr, allocator.Config{Expandable: true}, 0)
		require.NoError(t, err)
		on, err := Replay(tr, allocator.Config{Expandable: true, UnmapFreePages: true}, 0)
		require.NoError(t, err)
		require.Zero(t, on.OOMs, name)
		require.Equal(t, off.PeakAllocated, on.PeakAllocated, name)
		require.LessOrEqual(t, on.Ratio, 1.01, name)
		require.Less(t, on.PeakReserved, off.PeakReserved, name)
		require.Equal(t, on.PeakReserved, on.BackendPeak, name)
		require.Equal(t, quoted[name], [2]string{fmt.Sprintf("%.3f", off.Ratio), fmt.Sprintf("%.3f", on.Ratio)}, name)
		require.Zero(t, off.ChunkUnmaps, name)
		require.Equal(t, calls[name], [3]int64{off.ChunkMaps, on.ChunkMaps, on.ChunkUnmaps}, name)
	}
}

// A parked small block survives a miss of the large pool (whose bins it is
// not in, and which passes no peak: rows 1-4 set them) and serves the next
// request of its size; the peaks are those of the pool alone.
func TestReplayFrontCacheKeepsOtherPools(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,4194304,0
alloc,9,8192,0
free_completed,9,8192,0
free_completed,1,4194304,0
alloc,2,4096,0
free_completed,2,4096,0
alloc,3,2097152,0
alloc,4,4096,0
free_completed,4,4096,0
free_completed,3,2097152,0
`)
	require.Equal(t, 1, replayFrontLikePool(t, tr, false).FrontHits, "row 8 reuses row 5's block across row 7's miss")
	require.Zero(t, replayFrontLikePool(t, tr, true).FrontHits, "one pool for all sizes: row 7's miss takes it back")
}

// The front-cache model steps aside where it serves few requests, as the
// library does (export/front.cpp's judge): after 4,096 allocations of which
// it served fewer than 1 in 8, the next 65,536 go to the pool and their
// frees are never parked; then it serves repeats again. Its peaks are the
// pool's own throughout.
func TestFrontModelStepsAside(t *testing.T) {
	var csv strings.Builder
	csv.WriteString("action,addr,size,stream\n")
	addr := uint64(1 << 40)
	pair := func(size uint64, times int) {
		for i := 0; i < times; i++ {
			fmt.Fprintf(&csv, "alloc,%d,%d,0\nfree_completed,%d,%d,0\n", addr, size, addr, size)
			addr += 1 << 20
		}
	}
	pair(2048, 1024) // hits: in use
	for i := 0; i < 3*frontSample; i++ {
		pair(512+uint64(i%2)*512, 1) // each miss hands back the other size's block: no hits
	}
	pair(512, 1000)  // aside: none served in front
	pair(512, 70000) // back in use within 65,536: hits again
	tr, err := Parse(strings.NewReader(csv.String()))
	require.NoError(t, err)
	res, err := ReplayWith(tr, allocator.Config{}, Options{FrontMax: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, 1, res.FrontAsides)
	require.Equal(t, frontAside, res.FrontAside, "allocations sent to the pool while aside")
	total := 1024 + 3*frontSample + 1000 + 70000
	require.Equal(t, 2*total, res.Rows)
	// The first 4,096 allocations include the first phase's 1,023 hits: in
	// use. The next 4,096, alternating, have none: aside from allocation
	// 8,193 to 73,728. Then every allocation of the last phase hits but its
	// first.
	require.Equal(t, 1023+(total-2*frontSample-frontAside-1), res.FrontHits)
	require.Equal(t, uint64(2048), res.PeakAllocated, "one block at a time, parked ones never counted in a peak")
	off, err := ReplayWith(tr, allocator.Config{}, Options{})
	require.NoError(t, err)
	require.Equal(t, off.PeakReserved, res.PeakReserved, "the pool's own peaks")
}

// With a lagging stream (Options.StreamLag) a free page is not known passed
// at the next mapping, and the pool maps new memory instead: the peak rises.
// The library's wait at the peak (Config.FreePagesWait) lets the stream
// catch up and takes the peak back to what a stream that keeps up gives.
func TestReplayStreamLag(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,4194304,0
alloc,2,8388608,0
alloc,3,4194304,0
free_completed,2,8388608,0
alloc,4,10485760,0
free_completed,1,4194304,0
free_completed,3,4194304,0
free_completed,4,10485760,0
`)
	cfg := allocator.Config{Expandable: true, UnmapFreePages: true}
	peak := func(lag int, wait time.Duration) uint64 {
		c := cfg
		c.FreePagesWait = wait
		res, err := ReplayWith(tr, c, Options{StreamLag: lag})
		require.NoError(t, err)
		return res.PeakReserved
	}
	require.EqualValues(t, 18*mib, peak(0, 0), "16 - 8 + 10 MiB: the freed block's chunks moved")
	require.EqualValues(t, 26*mib, peak(100, 0), "16 + 10 MiB: its free not passed yet")
	require.EqualValues(t, 18*mib, peak(100, allocator.DefaultFreePagesWait), "the growth past the peak waited for the stream")
}
