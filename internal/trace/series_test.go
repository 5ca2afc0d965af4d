package trace

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
)

// A pre-existing block, a segment row, allocs and frees: with more samples
// than rows, one point per row, each the state after its row.
const seriesRows = `action,addr,size,stream
segment_alloc,0,2097152,0
alloc,1,1048576,0
free_completed,50,4096,0
alloc,2,524288,0
free_completed,1,1048576,0
segment_free,0,2097152,0
`

func TestSeriesOnePointPerRow(t *testing.T) {
	tr := mustParse(t, seriesRows)
	const k = 1024
	require.Equal(t, []Point{
		{0, 4 * k, 0}, // the pre-existing block is live from the start; nothing reserved before the first row
		{1, 4 * k, 2 * mib},
		{2, 4*k + mib, 2 * mib},
		{3, mib, 2 * mib},
		{4, mib + 512*k, 2 * mib},
		{5, 512 * k, 2 * mib},
		{6, 512 * k, 0},
	}, tr.RecordedSeries(100))
	res, err := ReplayWith(tr, allocator.Config{}, Options{Samples: 100})
	require.NoError(t, err)
	// One 2 MiB small segment from the start (the pre-existing block); the
	// segment rows do nothing to the pool.
	require.Equal(t, []Point{
		{0, 4 * k, 2 * mib},
		{1, 4 * k, 2 * mib},
		{2, 4*k + mib, 2 * mib},
		{3, mib, 2 * mib},
		{4, mib + 512*k, 2 * mib},
		{5, 512 * k, 2 * mib},
		{6, 512 * k, 2 * mib},
	}, res.Series)
}

// Downsampled, each point is the most over its rows: 7 rows (0..6) in 3
// points of 3 rows.
func TestSeriesBucketsKeepTheMost(t *testing.T) {
	tr := mustParse(t, seriesRows)
	const k = 1024
	require.Equal(t, []Point{{0, 4*k + mib, 2 * mib}, {3, mib + 512*k, 2 * mib}, {6, 512 * k, 0}}, tr.RecordedSeries(3))
	require.Len(t, tr.RecordedSeries(1), 1)
	require.Equal(t, Point{0, mib + 512*k, 2 * mib}, tr.RecordedSeries(1)[0])
	require.Nil(t, tr.RecordedSeries(0))
}

// The sampler against every row written out: a row holds the most observed
// at it, or with none the state before it; a bucket, the most of its rows.
func TestSamplerMatchesEveryRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		rows, samples := rng.IntN(60), 1+rng.IntN(20)
		s := newSampler(rows, samples)
		perRow := make([]Point, rows+1)
		var cur Point
		row := 0
		for row <= rows {
			if rng.IntN(3) == 0 { // a row without an observation: the state before it
				perRow[row] = Point{Row: row, Allocated: max(perRow[row].Allocated, cur.Allocated), Reserved: max(perRow[row].Reserved, cur.Reserved)}
				row++
				continue
			}
			for range 1 + rng.IntN(3) {
				cur = Point{Allocated: rng.Uint64N(100), Reserved: rng.Uint64N(100)}
				s.observe(row, cur.Allocated, cur.Reserved)
				perRow[row] = Point{Row: row, Allocated: max(perRow[row].Allocated, cur.Allocated), Reserved: max(perRow[row].Reserved, cur.Reserved)}
			}
			row++
		}
		width := (rows + samples) / samples
		var want []Point
		for i, p := range perRow {
			if i%width == 0 {
				want = append(want, Point{Row: i})
			}
			w := &want[len(want)-1]
			w.Allocated, w.Reserved = max(w.Allocated, p.Allocated), max(w.Reserved, p.Reserved)
		}
		got := s.finish()
		require.LessOrEqual(t, len(got), samples)
		require.Equal(t, want, got, "rows %d, samples %d", rows, samples)
	}
}

// Without segment rows the recorded reserved is 0 throughout; the empty
// trace has one point, row 0.
func TestSeriesNoSegmentsAndEmpty(t *testing.T) {
	tr := mustParse(t, "action,addr,size,stream\nalloc,1,512,0\nfree_completed,1,512,0\n")
	require.Equal(t, []Point{{0, 0, 0}, {1, 512, 0}, {2, 0, 0}}, tr.RecordedSeries(10))
	empty := mustParse(t, Header+"\n")
	require.Equal(t, []Point{{0, 0, 0}}, empty.RecordedSeries(10))
	res, err := ReplayWith(empty, allocator.Config{}, Options{Samples: 10})
	require.NoError(t, err)
	require.Equal(t, []Point{{0, 0, 0}}, res.Series)
}

// Sampling changes nothing else, and the series is not in the JSON.
func TestSeriesLeavesTheResultAlone(t *testing.T) {
	tr := mustParse(t, seriesRows)
	plain, err := ReplayWith(tr, allocator.Config{Expandable: true}, Options{})
	require.NoError(t, err)
	require.Nil(t, plain.Series)
	sampled, err := ReplayWith(tr, allocator.Config{Expandable: true}, Options{Samples: 5})
	require.NoError(t, err)
	require.NotEmpty(t, sampled.Series)
	a, err := json.Marshal(plain)
	require.NoError(t, err)
	b, err := json.Marshal(sampled)
	require.NoError(t, err)
	require.Equal(t, string(a), string(b))
	sampled.Series = nil
	require.Equal(t, plain, sampled)
}

// seriesMax returns the most allocated and reserved of a series, checking
// that its rows start at 0, rise, and stay within the trace.
func seriesMax(t *testing.T, s []Point, rows, samples int, what string) (allocated, reserved uint64) {
	t.Helper()
	require.NotEmpty(t, s, what)
	require.LessOrEqual(t, len(s), samples, what)
	require.Zero(t, s[0].Row, what)
	for i, p := range s {
		if i > 0 {
			require.Greater(t, p.Row, s[i-1].Row, what)
		}
		require.LessOrEqual(t, p.Row, rows, what)
		allocated, reserved = max(allocated, p.Allocated), max(reserved, p.Reserved)
	}
	return allocated, reserved
}

// On every recorded trace, the downsampled series' maxima are the peaks
// the replay and the trace report, to the byte.
func TestSeriesMaxIsThePeak(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every recorded trace five times")
	}
	const samples = 1000
	for _, name := range []string{"gpt2_train", "cnn_train", "llm_infer"} {
		tr, err := Open("../../bench/testdata/" + name + "_trace.csv.gz")
		require.NoError(t, err)
		rows := len(tr.Events)
		rec := tr.Recorded()
		require.True(t, rec.HasReserved, name)
		a, r := seriesMax(t, tr.RecordedSeries(samples), rows, samples, name+" recorded")
		require.Equal(t, rec.PeakAllocated, a, name)
		require.Equal(t, rec.PeakReserved, r, name)
		for _, c := range []struct {
			what string
			cfg  allocator.Config
			o    Options
		}{
			{"default", allocator.Config{}, Options{}},
			{"expandable", allocator.Config{Expandable: true}, Options{}},
			{"expandable, free pages unmapped", allocator.Config{Expandable: true, UnmapFreePages: true}, Options{}},
			{"default, front cache", allocator.Config{}, Options{FrontMax: 1 << 20}},
			{"default, out of memory", allocator.Config{}, Options{Capacity: rec.PeakAllocated}},
		} {
			c.o.Samples = samples
			res, err := ReplayWith(tr, c.cfg, c.o)
			require.NoError(t, err)
			what := name + " " + c.what
			a, r := seriesMax(t, res.Series, rows, samples, what)
			require.Equal(t, res.PeakAllocated, a, what)
			require.Equal(t, res.PeakReserved, r, what)
		}
	}
}
