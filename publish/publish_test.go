package publish

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func testSource(devices int, value *atomic.Int64) Source {
	names := []string{"allocated_bytes.all.current", "reserved_bytes.all.current", "num_ooms"}
	return Source{
		Devices: devices, Names: names, Backend: "host",
		Stats: func(dev int) ([]int64, error) {
			v := value.Load()
			return []int64{v, v, v}, nil
		},
		Streams: func(dev int) ([]Stream, error) {
			v := value.Load()
			return []Stream{{Stream: 0, Allocated: v, Reserved: v, Segments: v}, {Stream: 0x1000, Private: true, Allocated: v, Reserved: v, Segments: v}}, nil
		},
		Symmetric: func() Symmetric { return Symmetric{Blocks: 2, Bytes: 4096, Handles: 1, PeerMappings: 3} },
	}
}

func TestWriteAndList(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	v.Store(7)
	w, err := Create(dir, testSource(2, &v))
	require.NoError(t, err)
	fi, err := os.Stat(w.Path())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.Regexp(t, fmt.Sprintf(`^libsymm-%d-%d-[0-9a-f]{16}$`, os.Getuid(), os.Getpid()), filepath.Base(w.Path()))

	l := List(dir, os.Getuid())
	require.Empty(t, l.Problems)
	require.Len(t, l.Pages, 1)
	p := l.Pages[0]
	require.Equal(t, os.Getpid(), p.PID)
	require.True(t, strings.HasSuffix(w.Path(), "-"+p.ID))
	require.Equal(t, PIDNamespace(), p.PIDNamespace)
	require.NotZero(t, p.PIDNamespace)
	require.False(t, p.OtherNamespace)
	require.Equal(t, "host", p.Backend)
	require.Contains(t, p.Command, filepath.Base(os.Args[0]))
	require.Len(t, p.Devices, 2)
	require.EqualValues(t, 7, p.Devices[1].Stats["reserved_bytes.all.current"])
	require.Equal(t, []Stream{{Stream: 0, Allocated: 7, Reserved: 7, Segments: 7}, {Stream: 0x1000, Private: true, Allocated: 7, Reserved: 7, Segments: 7}}, p.Devices[0].Streams)
	require.Equal(t, Symmetric{Blocks: 2, Bytes: 4096, Handles: 1, PeerMappings: 3}, p.Symmetric)

	v.Store(9)
	w.Update()
	require.EqualValues(t, 9, List(dir, os.Getuid()).Pages[0].Devices[0].Stats["num_ooms"])
	require.NoError(t, w.Close())
	require.Empty(t, List(dir, os.Getuid()).Pages, "removed at close")
}

// A reader never sees a page half written: every value of a copy it keeps
// comes from the same update.
func TestNoTornReads(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(4, &v))
	require.NoError(t, err)
	defer w.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }() // before Close, on any exit
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := int64(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v.Store(i)
			w.Update()
			// Updates far more often than the library's four a second,
			// with gaps a reader can fall into even when it is slow: the
			// race detector on a loaded 2-core machine made reads take
			// longer than a 300 µs gap, and then a 1 ms one, for 1,000
			// tries in a row, after which a reader gives up. Reads still
			// overlap updates often (2,000 reads over dozens of them).
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for i := 0; i < 2000; i++ {
		l := List(dir, os.Getuid())
		require.Empty(t, l.Problems)
		require.Len(t, l.Pages, 1)
		want := l.Pages[0].Devices[0].Stats["num_ooms"]
		for _, d := range l.Pages[0].Devices {
			for name, x := range d.Stats {
				require.Equal(t, want, x, "device %d %s", d.Index, name)
			}
			for _, s := range d.Streams {
				require.Equal(t, want, s.Allocated)
				require.Equal(t, want, s.Segments)
			}
		}
	}
}

// A page whose process is gone (SIGKILL leaves it behind) is removed by the
// next listing; a page that cannot be trusted or read is reported, never
// read.
func TestStaleForeignAndGarbagePages(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	defer w.Close()

	// A dead process's page: this page's bytes under the pid of a child
	// that has exited.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid
	b, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	binary.LittleEndian.PutUint32(b[16:], uint32(dead))
	id := binary.LittleEndian.Uint64(b[offID:])
	stale := filepath.Join(dir, Name(os.Getuid(), dead, id))
	require.NoError(t, os.WriteFile(stale, b, 0o600))

	garbage := filepath.Join(dir, Name(os.Getuid(), 1, 1))
	require.NoError(t, os.WriteFile(garbage, []byte("not a page at all"), 0o600))
	open := filepath.Join(dir, Name(os.Getuid(), 2, id))
	require.NoError(t, os.WriteFile(open, b, 0o644))
	odd := filepath.Join(dir, UserPrefix(os.Getuid())+"x")
	require.NoError(t, os.WriteFile(odd, nil, 0o600))
	// Not this user's, or not a page: not looked at.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "libsymm-x"), nil, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, Name(os.Getuid()+1, 3, 3)), nil, 0o600))

	l := List(dir, os.Getuid())
	require.Len(t, l.Pages, 1)
	require.Equal(t, []string{stale}, l.Removed)
	_, err = os.Stat(stale)
	require.True(t, os.IsNotExist(err), "the dead process's page is gone")
	errs := map[string]string{}
	for _, p := range l.Problems {
		errs[p.Path] = p.Err
	}
	require.Len(t, errs, 3)
	require.Contains(t, errs[garbage], "shorter than the 384-byte header")
	require.Contains(t, errs[open], "lets other users read or write it")
	require.Contains(t, errs[odd], "not a page name")
}

func TestParseRejects(t *testing.T) {
	var v atomic.Int64
	w, err := Create(t.TempDir(), testSource(1, &v))
	require.NoError(t, err)
	defer w.Close()
	good, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	_, err = Parse(good)
	require.NoError(t, err)
	for name, c := range map[string]struct {
		edit func(b []byte) []byte
		want string
	}{
		"magic":    {func(b []byte) []byte { b[0] = 'X'; return b }, "not a libsymm statistics page"},
		"version":  {func(b []byte) []byte { b[8] = 9; return b }, "page version 9"},
		"size":     {func(b []byte) []byte { return b[:len(b)-1] }, "page says"},
		"devices":  {func(b []byte) []byte { binary.LittleEndian.PutUint32(b[52:], 1000); return b }, "1000 devices"},
		"names":    {func(b []byte) []byte { binary.LittleEndian.PutUint32(b[360:], 5); return b }, "statistic names at 5"},
		"streams":  {func(b []byte) []byte { binary.LittleEndian.PutUint32(b[headerSize+3*8:], 99); return b }, "99 streams in use"},
		"nstats":   {func(b []byte) []byte { binary.LittleEndian.PutUint32(b[56:], 2); return b }, ""},
		"too long": {func(b []byte) []byte { return append(b, 0) }, "page says"},
	} {
		b := c.edit(append([]byte(nil), good...))
		_, err := Parse(b)
		require.Error(t, err, name)
		require.Contains(t, err.Error(), c.want, name)
	}
}

func TestStartTicksAndDir(t *testing.T) {
	a, err := StartTicks(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, a)
	_, err = StartTicks(1 << 30)
	require.Error(t, err)
	require.Equal(t, "/dev/shm", Dir(func(string) string { return "" }))
	require.Equal(t, "/x", Dir(func(string) string { return "/x" }))
}

// FuzzParse: no input panics the parser; what it accepts has the counts it
// claims.
func FuzzParse(f *testing.F) {
	var v atomic.Int64
	w, err := Create(f.TempDir(), testSource(2, &v))
	if err != nil {
		f.Fatal(err)
	}
	good, _ := os.ReadFile(w.Path())
	w.Close()
	f.Add(good)
	f.Add(good[:headerSize])
	f.Add([]byte("SYMMPUB1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			return
		}
		if len(p.Devices) != int(binary.LittleEndian.Uint32(b[52:])) {
			t.Fatalf("%d devices parsed, page says %d", len(p.Devices), binary.LittleEndian.Uint32(b[52:]))
		}
	})
}
