package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/trace"
)

// TestReplayGPT2Trace replays 12 training steps of GPT-2 small (38,506
// rows recorded from PyTorch 2.11 on an H200; see testdata) through the pool
// on a virtual backend (internal/trace, as symm replay does) and compares
// libsymm's peak reserved/allocated with what PyTorch's allocator reached on
// the same run: 1.052 (native), 1.005 (expandable_segments).
func TestReplayGPT2Trace(t *testing.T) {
	tr, err := trace.Open("testdata/gpt2_train_trace.csv.gz")
	require.NoError(t, err)
	const mib = 1 << 20
	reserved := map[string]uint64{}
	for _, c := range []struct {
		name  string
		cfg   allocator.Config
		bound float64
		front uint64 // the front-cache model's largest block (trace.Options.FrontMax); 0: off
	}{
		{"default", allocator.Config{}, 1.10, 0},
		{"default, limit 16 GiB", allocator.Config{Limit: 16 << 30}, 1.10, 0},
		// Oversize blocks are reused only within 20 MiB of their size, so
		// without memory pressure the pool keeps one per logits size seen;
		// under a limit, the out-of-memory retry releases them.
		{"max_split=256MiB", allocator.Config{MaxSplit: 256 * mib}, 3, 0},
		{"max_split=256MiB, limit 16 GiB", allocator.Config{MaxSplit: 256 * mib, Limit: 16 << 30}, 1.15, 0},
		// Expandable segments grow in place, 2 MiB at a time: the goal is
		// to beat PyTorch's expandable_segments (1.005) with margin: the
		// issue's bound is 1.003 (1.0026, 14608 MiB; see the placement table
		// in allocator/expandable.go).
		{"expandable", allocator.Config{Expandable: true}, 1.003, 0},
		{"expandable, limit 15 GiB", allocator.Config{Expandable: true, Limit: 15 << 30}, 1.003, 0},
		// The library with SYMM_POOL_FRONT_CACHE=1 (off by default): a
		// front cache of blocks up to 1 MiB on one CPU. It hands its blocks back before every allocation the
		// pool serves, so it changes nothing here (1.0026, as the pool
		// alone; 1.0055 when parked blocks stayed out of the pool's view).
		// Up to 64 MiB it costs the default mode 11 % (1.164): a hit of a
		// large parked block skips the pool's best fit and breaks up the
		// hole the block would have joined. A block that is a segment of
		// its own is parked at any size: it has no hole to join, and 759
		// of the default mode's 775 hits here are such blocks, at no cost.
		// Served fewer than 1 in 8 of its first 4,096 requests, the cache
		// steps aside for the rest of the trace (export/front.cpp); without
		// that it served 1,060, to the same peaks.
		{"default, front cache 1 MiB", allocator.Config{}, 1.10, 1 << 20},
		{"expandable, front cache 1 MiB", allocator.Config{Expandable: true}, 1.003, 1 << 20},
		{"default, front cache 64 MiB", allocator.Config{}, 1.20, 64 << 20},
	} {
		r, err := trace.ReplayWith(tr, c.cfg, trace.Options{FrontMax: c.front})
		require.NoError(t, err, c.name)
		reserved[c.name] = r.PeakReserved
		// Every alloc and free_completed row replayed, each free after its
		// alloc, none out of memory.
		require.Greater(t, r.Rows, 25000, c.name)
		require.Zero(t, r.PreExisting+r.LostFrees+r.UnmatchedFrees+r.OOMs, c.name)
		alloc, res := int64(r.PeakAllocated), int64(r.PeakReserved)
		t.Logf("libsymm %-32s peak allocated %6d MiB, peak reserved %6d MiB, reserved/allocated %.3f (PyTorch native 1.052, expandable 1.005)",
			c.name, alloc/mib, res/mib, r.Ratio)
		require.Greater(t, alloc, int64(14000*mib), "the trace peaks near 15 GiB")
		require.Less(t, r.Ratio, c.bound, "reserved/allocated far above what this configuration should reach")
		if c.name == "default, front cache 1 MiB" {
			require.Greater(t, r.FrontWholeHits, 700, "segments of their own (over 10 MiB) hit the front cache")
			require.Equal(t, 1, r.FrontAsides, "few hits: the front cache steps aside")
			require.Greater(t, r.FrontAside, 4000, "the rest of the trace goes to the pool")
		}
		if os.Getenv("SYMM_TRACE_RESULT") != "" {
			fmt.Printf("| %s | %d | %d | %.3f |\n", c.name, alloc/mib, res/mib, r.Ratio)
		}
	}
	require.Equal(t, reserved["default"], reserved["default, front cache 1 MiB"], "the front cache costs no memory")
	require.Equal(t, reserved["expandable"], reserved["expandable, front cache 1 MiB"], "the front cache costs no memory")
}

// TestReplayRecordedTraces replays the two traces recorded on an H100 with
// bench/workloads.py --record-trace (PyTorch 2.11, native allocator; see
// bench/RESULTS.md): ResNet-50 training with a batch of 8 to 128 at random,
// and GPT-2-style fp16 inference with a growing KV cache. Expandable
// segments must do at least as well as PyTorch's expandable_segments did on
// the same runs, and the default mode as well as PyTorch's native allocator
// (both measured on the GPU in the same runs as the traces).
func TestReplayRecordedTraces(t *testing.T) {
	for _, c := range []struct {
		trace                       string
		rows                        int
		native, expandable, exBound float64 // PyTorch's figures (reserved/allocated); our bound
		front                       uint64
	}{
		{"testdata/cnn_train_trace.csv.gz", 66385, 1.314, 1.011, 1.005, 0},
		{"testdata/cnn_train_trace.csv.gz", 66385, 1.314, 1.011, 1.005, 1 << 20},
		{"testdata/llm_infer_trace.csv.gz", 331278, 1.308, 1.075, 1.07, 0},
		{"testdata/llm_infer_trace.csv.gz", 331278, 1.308, 1.075, 1.07, 1 << 20},
	} {
		tr, err := trace.Open(c.trace)
		require.NoError(t, err)
		for _, cfg := range []struct {
			name  string
			cfg   allocator.Config
			bound float64
		}{
			{"default", allocator.Config{}, c.native + 0.002},
			{"expandable", allocator.Config{Expandable: true}, c.exBound},
		} {
			r, err := trace.ReplayWith(tr, cfg.cfg, trace.Options{FrontMax: c.front})
			require.NoError(t, err)
			require.Equal(t, c.rows, r.Rows, c.trace)
			require.Zero(t, r.PreExisting+r.LostFrees+r.UnmatchedFrees+r.OOMs, c.trace)
			t.Logf("%s, %s, front cache %d: reserved/allocated %.4f (PyTorch native %.3f, expandable %.3f)",
				c.trace, cfg.name, c.front, r.Ratio, c.native, c.expandable)
			require.Less(t, r.Ratio, cfg.bound, "%s %s", c.trace, cfg.name)
			if os.Getenv("SYMM_TRACE_RESULT") != "" {
				fmt.Printf("| %s | %s | %d | %d | %d | %.4f |\n", c.trace, cfg.name, c.front>>20,
					r.PeakAllocated>>20, r.PeakReserved>>20, r.Ratio)
			}
		}
	}
}

// TestReplayFSDPTrace replays 36 steps of FSDP2 (fully_shard) GPT-2 small,
// rank 0 of 2 (bench/fsdp.py --record-trace on 2 × H200, PyTorch's
// allocator): three streams, compute, all-gather and reduce-scatter. The
// default mode reserved 16,272 MiB here, 7.7 % above the 15,112 MiB the
// trace's segment rows add up to, while a stream stole another's idle
// segment of any size larger than it needed (steal.go); now each stream
// reserves the segments PyTorch's allocator did, and no segment moves
// across streams. What remains above the recorded figure (370 MiB) is
// memory PyTorch reserved before recording began: the trace's allocations
// outside every recorded segment reach 343 MiB live at once, and the
// replay must reserve them, where the segment rows do not count them.
func TestReplayFSDPTrace(t *testing.T) {
	tr, err := trace.Open("testdata/fsdp_gpt2_w2_trace.csv.gz")
	require.NoError(t, err)
	const mib = 1 << 20
	rec := tr.Recorded()
	require.True(t, rec.HasReserved)
	require.EqualValues(t, 15112, rec.PeakReserved/mib, "PyTorch's recorded peak reserved")
	require.EqualValues(t, 343, preRecordingLive(tr)/mib, "live bytes outside every recorded segment")
	for _, c := range []struct {
		name  string
		cfg   allocator.Config
		front uint64
		most  uint64 // MiB
	}{
		// At most the recorded peak plus what PyTorch held outside it
		// (15,455 MiB), with 30 MiB to spare; it reaches 15,482.
		{"default", allocator.Config{}, 0, 15482},
		{"default, front cache 1 MiB", allocator.Config{}, 1 << 20, 15482},
		{"expandable", allocator.Config{Expandable: true}, 0, 14718},
		{"expandable, front cache 1 MiB", allocator.Config{Expandable: true}, 1 << 20, 14718},
	} {
		r, err := trace.ReplayWith(tr, c.cfg, trace.Options{FrontMax: c.front})
		require.NoError(t, err, c.name)
		require.Equal(t, 103631, r.Rows, c.name)
		require.Zero(t, r.PreExisting+r.LostFrees+r.UnmatchedFrees+r.OOMs, c.name)
		t.Logf("%-30s peak allocated %6d MiB, peak reserved %6d MiB (PyTorch's segment rows: %d MiB)",
			c.name, r.PeakAllocated/mib, r.PeakReserved/mib, rec.PeakReserved/mib)
		require.LessOrEqual(t, r.PeakReserved/mib, c.most, c.name)
		require.LessOrEqual(t, r.PeakReserved, rec.PeakReserved+preRecordingLive(tr)+30*mib, c.name)
		if os.Getenv("SYMM_TRACE_RESULT") != "" {
			fmt.Printf("| fsdp | %s | %d | %d | %.4f |\n", c.name, r.PeakAllocated>>20, r.PeakReserved>>20, r.Ratio)
		}
	}
}

// preRecordingLive is the most bytes the trace's blocks hold at once at
// addresses outside every segment its segment rows recorded so far: memory
// the recording allocator had reserved before recording began.
func preRecordingLive(tr *trace.Trace) uint64 {
	type span struct{ lo, hi uint64 }
	var segs []span
	live := map[uint64]uint64{}
	var cur, peak uint64
	for _, e := range tr.Events {
		switch e.Action {
		case trace.SegmentAlloc, trace.SegmentMap:
			segs = append(segs, span{e.Addr, e.Addr + e.Size})
		case trace.Alloc:
			inside := false
			for _, s := range segs {
				if e.Addr >= s.lo && e.Addr < s.hi {
					inside = true
					break
				}
			}
			if !inside && e.Size > 0 {
				live[e.Addr] = e.Size
				cur += e.Size
				peak = max(peak, cur)
			}
		case trace.FreeCompleted:
			if n, ok := live[e.Addr]; ok {
				cur -= n
				delete(live, e.Addr)
			}
		}
	}
	return peak
}
