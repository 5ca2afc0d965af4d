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
		// The library as loaded: a front cache of blocks up to 1 MiB on
		// one CPU. It hands its blocks back before every allocation the
		// pool serves, so it changes nothing here (1.0026, as the pool
		// alone; 1.0055 when parked blocks stayed out of the pool's view).
		// Up to 64 MiB it costs the default mode 11 % (1.164): a hit of a
		// large parked block skips the pool's best fit and breaks up the
		// hole the block would have joined. A block that is a segment of
		// its own is parked at any size: it has no hole to join, and 1,034
		// of the default mode's 1,052 hits here are such blocks, at no cost.
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
			require.Greater(t, r.FrontWholeHits, 1000, "segments of their own (over 10 MiB) hit the front cache")
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
