package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const gpt2Trace = "../../bench/testdata/gpt2_train_trace.csv.gz"

// tableRow returns the fields after the configuration name of the text
// table's row named name: allocated MiB, reserved MiB, ratio, physical MiB,
// time-averaged ratio, OOMs.
func tableRow(t *testing.T, out, name string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, name+"  "); ok {
			f := strings.Fields(rest)
			require.Len(t, f, 6, line)
			return f
		}
	}
	t.Fatalf("no row %q in\n%s", name, out)
	return nil
}

func writeTrace(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.csv")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

func TestReplayGPT2Text(t *testing.T) {
	code, out, errOut := runCLI("replay", gpt2Trace)
	require.Equal(t, exitOK, code, errOut)
	require.Empty(t, errOut)
	require.Contains(t, out, "38506 rows, 25597 alloc/free_completed replayed; 0 pre-existing blocks, 0 lost frees, 0 unmatched frees")
	// The trace's own figures. PyTorch's memory_stats said 15,067 MiB
	// allocated and 15,854 reserved: the ~497 MiB more are GPT-2 small's
	// parameters, allocated before recording began and never freed.
	require.Equal(t, []string{"14570", "15324", "1.052", "-", "-", "0"}, tableRow(t, out, "recorded (trace)"))
	def := tableRow(t, out, "default")
	ratio, err := strconv.ParseFloat(def[2], 64)
	require.NoError(t, err)
	require.Less(t, ratio, 1.10, out)
	require.Equal(t, def[1], def[3], "fixed segments: the physical peak is the reserved one")
	// Over the whole run the pool holds about 4x what the program has live:
	// a caching allocator keeps its peak between steps.
	avg, err := strconv.ParseFloat(def[4], 64)
	require.NoError(t, err)
	require.InDelta(t, 4.3, avg, 0.3, out)
	require.Equal(t, "0", def[5])
	tableRow(t, out, "expandable")

	code, out, errOut = runCLI("replay", "--expandable", gpt2Trace)
	require.Equal(t, exitOK, code, errOut)
	tableRow(t, out, "expandable")
	require.NotContains(t, out, "default")
}

type replayOut struct {
	Trace         string
	Rows          int
	CapacityBytes uint64 `json:"capacity_bytes"`
	FrontCache    uint64 `json:"front_cache_bytes"`
	StreamLag     int    `json:"stream_lag_rows"`
	ChunkBytes    uint64 `json:"chunk_bytes"`
	AllocConf     string `json:"alloc_conf"`
	Recorded      struct {
		PeakAllocated uint64   `json:"peak_allocated_bytes"`
		PeakReserved  *uint64  `json:"peak_reserved_bytes"`
		Ratio         *float64 `json:"reserved_per_allocated"`
		OOMs          int      `json:"ooms"`
	}
	Configurations []struct {
		Name           string
		PeakAllocated  uint64  `json:"peak_allocated_bytes"`
		PeakReserved   uint64  `json:"peak_reserved_bytes"`
		Ratio          float64 `json:"reserved_per_allocated"`
		BackendPeak    uint64  `json:"backend_peak_bytes"`
		Rows           int     `json:"rows_replayed"`
		PreExisting    int     `json:"pre_existing"`
		LostFrees      int     `json:"lost_frees"`
		UnmatchedFrees int     `json:"unmatched_frees"`
		OOMs           int
	}
}

func replayJSONOut(t *testing.T, args ...string) replayOut {
	t.Helper()
	code, out, errOut := runCLI(append([]string{"replay", "--json"}, args...)...)
	require.Equal(t, exitOK, code, errOut)
	var r replayOut
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	return r
}

func TestReplayGPT2JSON(t *testing.T) {
	r := replayJSONOut(t, gpt2Trace)
	require.Equal(t, 38506, r.Rows)
	require.Equal(t, uint64(14570), r.Recorded.PeakAllocated>>20)
	require.NotNil(t, r.Recorded.PeakReserved)
	require.Equal(t, uint64(15324), *r.Recorded.PeakReserved>>20)
	require.InDelta(t, 1.052, *r.Recorded.Ratio, 0.001)
	require.Len(t, r.Configurations, 2)
	require.Equal(t, "default", r.Configurations[0].Name)
	require.Equal(t, "expandable", r.Configurations[1].Name)
	d := r.Configurations[0]
	require.Less(t, d.Ratio, 1.10)
	require.Equal(t, 25597, d.Rows)
	require.Equal(t, d.PeakReserved, d.BackendPeak)
}

// Two streams, memory allocated before recording began, a lost free, no
// segment rows.
const twoStreams = `action,addr,size,stream
alloc,4096,1048576,0
alloc,8192,1048576,7
free_completed,100,4096,7
free_requested,4096,1048576,0
free_completed,4096,1048576,0
alloc,8192,1048576,7
free_completed,8192,1048576,7
`

// --stream-lag reaches the replay and its JSON: with a lagging stream the
// peak is never lower than with one that keeps up.
func TestReplayStreamLagFlag(t *testing.T) {
	now := replayJSONOut(t, gpt2Trace, "--expandable")
	late := replayJSONOut(t, gpt2Trace, "--expandable", "--stream-lag", "10")
	require.Zero(t, now.StreamLag)
	require.Equal(t, 10, late.StreamLag)
	require.GreaterOrEqual(t, late.Configurations[0].PeakReserved, now.Configurations[0].PeakReserved)
}

// --chunk is read as the library reads SYMM_POOL_EXPANDABLE_CHUNK, and the
// chunk reported is the one mapped: rounded up to the 2 MiB granularity.
func TestReplayChunkAsTheLibraryReadsIt(t *testing.T) {
	path := writeTrace(t, twoStreams)
	for _, c := range []struct {
		flag string
		want uint64
	}{{"1", 2 << 20}, {"5MiB", 6 << 20}, {"20MiB", 20 << 20}, {"1TiB", 1 << 40}} {
		require.Equal(t, c.want, replayJSONOut(t, path, "--chunk", c.flag).ChunkBytes, c.flag)
	}
	require.EqualValues(t, 20<<20, replayJSONOut(t, path).ChunkBytes, "the library's default")
}

func TestReplayTwoStreams(t *testing.T) {
	path := writeTrace(t, twoStreams)
	r := replayJSONOut(t, path)
	require.Equal(t, uint64(1048576*2+4096), r.Recorded.PeakAllocated)
	require.Nil(t, r.Recorded.PeakReserved, "no segment rows: unknown")
	require.Nil(t, r.Recorded.Ratio)
	for _, c := range r.Configurations {
		require.Equal(t, 1, c.PreExisting, c.Name)
		require.Equal(t, 1, c.LostFrees, c.Name)
		require.Equal(t, 6, c.Rows, c.Name) // the lost free is counted apart
		// Stream 0: a 2 MiB small segment; stream 7: another, holding
		// the pre-existing 4 KiB and 1 MiB. Expandable: a chunk of the
		// granularity for each stream, as PyTorch's small pool maps (big
		// chunks only where a segment grows by a whole one).
		require.Equal(t, uint64(4<<20), c.PeakReserved, c.Name)
		require.Equal(t, uint64(2<<20+4096), c.PeakAllocated, c.Name)
	}

	code, out, _ := runCLI("replay", path, "--capacity", "2MiB")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "1 pre-existing blocks, 1 lost frees, 0 unmatched frees")
	require.Equal(t, []string{"2", "-", "-", "-", "-", "0"}, tableRow(t, out, "recorded (trace)"))
	// Stream 0's first 1 MiB needs a second 2 MiB segment: out of memory.
	require.Equal(t, "1", tableRow(t, out, "default")[5])
}

func TestReplayFlagsAfterOrBeforeTrace(t *testing.T) {
	path := writeTrace(t, twoStreams)
	a := replayJSONOut(t, "--limit", "1GiB", path, "--max-split", "256MiB", "--chunk", "4MiB")
	require.Equal(t, path, a.Trace)
	require.Equal(t, uint64(1<<50), a.CapacityBytes, "the virtual backend's default")
	b := replayJSONOut(t, path, "--capacity=8GiB")
	require.Equal(t, uint64(8<<30), b.CapacityBytes)
	require.Zero(t, b.FrontCache, "off unless asked for")
	c := replayJSONOut(t, path, "--front-cache", "1MiB")
	require.Equal(t, uint64(1<<20), c.FrontCache)
}

// --alloc-conf replays PyTorch's settings as the library applies them:
// roundup_power2_divisions:4 serves 5 MiB + 1 byte with a 6 MiB block.
func TestReplayAllocConf(t *testing.T) {
	path := writeTrace(t, "action,addr,size,stream\nalloc,4096,5242881,0\nfree_completed,4096,5242881,0\n")
	plain := replayJSONOut(t, path)
	require.Empty(t, plain.AllocConf)
	for _, c := range plain.Configurations {
		require.Equal(t, uint64(5<<20+512), c.PeakAllocated, c.Name)
	}
	r := replayJSONOut(t, path, "--alloc-conf", "roundup_power2_divisions:4,garbage_collection_threshold:0.5")
	require.Equal(t, "roundup_power2_divisions:4,garbage_collection_threshold:0.5", r.AllocConf)
	for _, c := range r.Configurations {
		require.Equal(t, uint64(6<<20), c.PeakAllocated, c.Name)
	}
	code, _, errOut := runCLI("replay", path, "--alloc-conf", "max_split_size_mb:5")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `symm replay: --alloc-conf "max_split_size_mb:5": invalid argument: max_split_size_mb:5: too small`)
	code, _, errOut = runCLI("replay", path, "--alloc-conf", "release_lock_on_cudamalloc:True")
	require.Equal(t, exitOK, code)
	require.Contains(t, errOut, "symm replay: --alloc-conf: release_lock_on_cudamalloc:True is ignored")
}

// Each bad input: its exit code and its own message.
func TestReplayBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	require.NoError(t, os.WriteFile(bad, []byte("action,addr,size,stream\nalloc,1,512,0\nalloc,1\n"), 0o644))
	action := filepath.Join(dir, "action.csv")
	require.NoError(t, os.WriteFile(action, []byte("action,addr,size,stream\nmalloc,1,512,0\n"), 0o644))
	noHeader := filepath.Join(dir, "noheader.csv")
	require.NoError(t, os.WriteFile(noHeader, []byte("alloc,1,512,0\n"), 0o644))
	gz := filepath.Join(dir, "cut.csv")
	require.NoError(t, os.WriteFile(gz, []byte{0x1f, 0x8b, 8, 0, 0}, 0o644))
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--help"}, exitOK, "usage: symm replay TRACE [--expandable]"},
		{nil, exitUsage, "symm replay: missing TRACE"},
		{[]string{bad, bad}, exitUsage, `symm replay: unexpected argument "` + bad + `" (one TRACE only)`},
		{[]string{bad, "--bogus"}, exitUsage, "flag provided but not defined: --bogus"},
		{[]string{bad, "--limit", "lots"}, exitUsage, `invalid value "lots" for flag --limit: invalid argument: size "lots": unknown unit`},
		{[]string{bad, "--max-split", "1MiB"}, exitUsage, "symm replay: --max-split must be more than 1MiB"},
		{[]string{bad, "--front-cache", "100"}, exitUsage, "symm replay: --front-cache must be from 512 B to 64MiB (or 0: off), not 100 bytes"},
		{[]string{bad, "--front-cache", "65MiB"}, exitUsage, "symm replay: --front-cache must be from 512 B to 64MiB"},
		{[]string{bad, "--capacity", "0"}, exitUsage, "symm replay: --capacity must be more than 0 bytes"},
		{[]string{bad, "--chunk", "0"}, exitUsage, `invalid value "0" for flag --chunk: invalid argument: SYMM_POOL_EXPANDABLE_CHUNK="0": want a size from 1 byte to 1 TiB`},
		{[]string{bad, "--chunk", "2TiB"}, exitUsage, `SYMM_POOL_EXPANDABLE_CHUNK="2TiB": want a size from 1 byte to 1 TiB`},
		{[]string{bad, "--stream-lag", "-1"}, exitUsage, "symm replay: --stream-lag must be 0 or more rows, not -1"},
		{[]string{bad, "--stream-lag", "soon"}, exitUsage, `invalid value "soon" for flag --stream-lag`},
		{[]string{bad, "--capacity=0GiB"}, exitUsage, "symm replay: --capacity must be more than 0 bytes"},
		{[]string{bad, "--limit", "1.5"}, exitUsage, `size "1.5": a size without a unit is a whole number of bytes`},
		{[]string{filepath.Join(dir, "none.csv")}, exitFailure, "symm replay: open " + filepath.Join(dir, "none.csv") + ": no such file or directory\n"},
		{[]string{bad}, exitFailure, "symm replay: " + bad + ": line 3: 2 columns, want 4 (action,addr,size,stream)\n"},
		{[]string{action}, exitFailure, `symm replay: ` + action + `: line 2: unknown action "malloc"`},
		{[]string{noHeader}, exitFailure, `symm replay: ` + noHeader + `: line 1: missing header "action,addr,size,stream"`},
		{[]string{gz}, exitFailure, "symm replay: " + gz + ": gzip: unexpected EOF\n"},
	} {
		code, out, errOut := runCLI(append([]string{"replay"}, c.args...)...)
		require.Equal(t, c.code, code, "%v: %s%s", c.args, out, errOut)
		require.Contains(t, out+errOut, c.msg, "%v", c.args)
		if code == exitFailure {
			require.Empty(t, out, "%v", c.args)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		}
	}
}
