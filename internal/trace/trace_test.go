package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// gpt2 is the real trace: 12 training steps of GPT-2 small recorded from
// PyTorch 2.11 on an H200 (bench/testdata).
const gpt2 = "../../bench/testdata/gpt2_train_trace.csv.gz"

const mib = 1 << 20

func mustParse(t *testing.T, s string) *Trace {
	t.Helper()
	tr, err := Parse(strings.NewReader(s))
	require.NoError(t, err)
	return tr
}

func TestParseEveryAction(t *testing.T) {
	in := "action,addr,size,stream\r\n" +
		"alloc,16,512,0\r\n" +
		"\n" +
		" free_requested , 16 , 512 , 7 \n" +
		"free_completed,16,512,7\n" +
		"segment_alloc,1,2097152,0\nsegment_free,1,2097152,0\n" +
		"segment_map,3,2097152,0\nsegment_unmap,3,2097152,0\n" +
		"oom,0,1024,0\nsnapshot,0,0,0" // no final newline
	tr := mustParse(t, in)
	require.Len(t, tr.Events, 9)
	require.Equal(t, Event{Action: FreeRequested, Addr: 16, Size: 512, Stream: 7, Line: 4}, tr.Events[1])
	for i, e := range tr.Events {
		require.Equal(t, Action(i), e.Action)
	}
	require.Equal(t, "snapshot", tr.Events[8].Action.String())
	require.Equal(t, 11, tr.Events[8].Line)
}

func TestParseHeaderVariants(t *testing.T) {
	for _, h := range []string{"action,addr,size,stream", "\ufeffaction, addr, size, stream", "  action,addr,size,stream\r"} {
		tr := mustParse(t, h+"\nalloc,1,2,3\n")
		require.Len(t, tr.Events, 1, "%q", h)
	}
	require.Empty(t, mustParse(t, "action,addr,size,stream\n").Events)
}

// Each bad input fails with its own message naming the line.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "line 1: empty input: missing header action,addr,size,stream"},
		{"alloc,1,2,0\n", `line 1: missing header "action,addr,size,stream" (got "alloc,1,2,0")`},
		{"action,addr,size\n", `line 1: missing header`},
		{"action,addr,size,stream\nalloc,1,2\n", "line 2: 3 columns, want 4 (action,addr,size,stream)"},
		{"action,addr,size,stream\nalloc,1,2,0\nalloc,1,2,0,9\n", "line 3: 5 columns, want 4"},
		{"action,addr,size,stream\nmalloc,1,2,0\n", `line 2: unknown action "malloc" (want one of alloc, free_requested,`},
		{"action,addr,size,stream\nalloc,x1,2,0\n", `line 2: addr "x1" is not a non-negative decimal integer`},
		{"action,addr,size,stream\nalloc,1,-2,0\n", `line 2: size "-2" is negative`},
		{"action,addr,size,stream\nalloc,1,2,\n", "line 2: stream is empty"},
		{"action,addr,size,stream\nalloc,1,2.5,0\n", `line 2: size "2.5" is not a non-negative decimal integer`},
		{"action,addr,size,stream\nalloc,1,18446744073709551616,0\n", `line 2: size "18446744073709551616" does not fit in 64 bits`},
		{"action,addr,size,stream\n\n\nalloc,0x10,2,0\n", `line 4: addr "0x10"`},
		{"action,addr,size,stream\n" + strings.Repeat("a", maxLine+1), "line 2: line longer than 65536 bytes: not a trace"},
	} {
		_, err := Parse(strings.NewReader(c.in))
		require.Error(t, err, "%q", clip(c.in))
		require.Contains(t, err.Error(), c.want, "%q", clip(c.in))
		var pe *Error
		require.True(t, errors.As(err, &pe))
	}
}

func TestWriteCSVRoundTrip(t *testing.T) {
	tr := mustParse(t, "action,addr,size,stream\nalloc, 5 ,10,3\n\nfree_completed,5,10,3\noom,0,1,0\n")
	var buf bytes.Buffer
	require.NoError(t, tr.WriteCSV(&buf))
	require.Equal(t, "action,addr,size,stream\nalloc,5,10,3\nfree_completed,5,10,3\noom,0,1,0\n", buf.String())
	back := mustParse(t, buf.String())
	require.Equal(t, withoutLines(tr.Events), withoutLines(back.Events))
}

func withoutLines(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, e := range evs {
		e.Line = 0
		out[i] = e
	}
	return out
}

// Open decides on gzip by the first bytes, not by the name.
func TestOpenGzipByMagic(t *testing.T) {
	dir := t.TempDir()
	text := "action,addr,size,stream\nalloc,1,4096,0\nfree_completed,1,4096,0\n"
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte(text))
	require.NoError(t, zw.Close())
	files := map[string][]byte{"plain.gz": []byte(text), "zipped.csv": z.Bytes(), "zipped": z.Bytes()}
	for name, data := range files {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o644))
		tr, err := Open(path)
		require.NoError(t, err, name)
		require.Len(t, tr.Events, 2, name)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(filepath.Join(dir, "missing.csv"))
	require.ErrorIs(t, err, os.ErrNotExist)

	bad := filepath.Join(dir, "bad.csv")
	require.NoError(t, os.WriteFile(bad, []byte("action,addr,size,stream\nalloc,1\n"), 0o644))
	_, err = Open(bad)
	require.EqualError(t, err, bad+": line 2: 2 columns, want 4 (action,addr,size,stream)")

	cut := filepath.Join(dir, "cut.csv.gz")
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte(strings.Repeat("action,addr,size,stream\n", 1)))
	require.NoError(t, zw.Close())
	require.NoError(t, os.WriteFile(cut, z.Bytes()[:z.Len()-6], 0o644)) // truncated
	_, err = Open(cut)
	require.ErrorContains(t, err, cut+": line 2: read failed: unexpected EOF")

	notGzip := filepath.Join(dir, "magic.csv")
	require.NoError(t, os.WriteFile(notGzip, []byte{0x1f, 0x8b, 0}, 0o644))
	_, err = Open(notGzip)
	require.ErrorContains(t, err, notGzip+": gzip:")
}

func TestRecordedPairsLikeReplay(t *testing.T) {
	tr := mustParse(t, `action,addr,size,stream
alloc,1,10,0
alloc,1,20,0
free_completed,100,1000,0
alloc,2,0,0
free_requested,1,20,0
free_completed,1,20,0
free_completed,1,20,0
segment_free,7,4096,0
segment_alloc,8,8192,0
oom,0,5,0
`)
	// 1000 pre-existing + 10, then the lost free of 10 before the 20: peak 1020.
	r := tr.Recorded()
	require.Equal(t, Recorded{PeakAllocated: 1020, PeakReserved: 8192, HasReserved: true, OOMs: 1}, r)
	// Segments: 4096 held before the trace began (freed first), then a new
	// one of 8192: the peak is 8192, the 4096 gone by then.
}

func TestRecordedNoSegments(t *testing.T) {
	r := mustParse(t, "action,addr,size,stream\nalloc,1,10,0\n").Recorded()
	require.Equal(t, Recorded{PeakAllocated: 10}, r)
}

func TestRecordedGPT2(t *testing.T) {
	tr, err := Open(gpt2)
	require.NoError(t, err)
	require.Len(t, tr.Events, 38506) // 12,949 alloc, 12,648 free_requested and free_completed each, 261 segment_alloc
	r := tr.Recorded()
	// PyTorch's memory_stats said 15,067 MiB allocated and 15,854 MiB
	// reserved; the ~497 MiB more are GPT-2 small's 124 M fp32 parameters
	// (and their segments), allocated before recording and never freed.
	require.Equal(t, uint64(15277885448), r.PeakAllocated) // 14,570 MiB
	require.True(t, r.HasReserved)
	require.Equal(t, uint64(16068378624), r.PeakReserved) // 15,324 MiB: no segment_free in the trace
	require.Zero(t, r.OOMs)
}
