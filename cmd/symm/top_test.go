package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gdamore/tcell/v2"
	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/publish"
	"github.com/libsymm/libsymm/topology"
)

// fakePage publishes, from this test process, a page whose device 0 holds
// allocated and reserved bytes, in dir.
func fakePage(t *testing.T, dir string, allocated, reserved *atomic.Int64) *publish.Writer {
	t.Helper()
	names := allocator.StatNames()
	w, err := publish.Create(dir, publish.Source{
		Devices: 2, Names: names, Backend: "host",
		Stats: func(dev int) ([]int64, error) {
			v := make([]int64, len(names))
			for i, n := range names {
				switch {
				case dev != 0:
				case n == "allocated_bytes.all.current" || n == "allocated_bytes.large_pool.current":
					v[i] = allocated.Load()
				case n == "reserved_bytes.all.current" || n == "reserved_bytes.all.peak" || n == "reserved_bytes.large_pool.current":
					v[i] = reserved.Load()
				case n == "num_ooms":
					v[i] = 2
				}
			}
			return v, nil
		},
		Streams: func(dev int) ([]publish.Stream, error) {
			if dev != 0 {
				return nil, nil
			}
			return []publish.Stream{{Stream: 0x7f00, Allocated: allocated.Load(), Reserved: reserved.Load(), Segments: 3}}, nil
		},
		Symmetric: func() publish.Symmetric {
			return publish.Symmetric{Blocks: 1, Bytes: 1 << 20, Handles: 1, PeerMappings: 1}
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	return w
}

func runSymm(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestTopJSONAndText(t *testing.T) {
	dir := t.TempDir()
	var a, r atomic.Int64
	a.Store(3 << 20)
	r.Store(8 << 20)
	fakePage(t, dir, &a, &r)
	require.NoError(t, os.WriteFile(filepath.Join(dir, publish.Name(os.Getuid(), 1, 1)), []byte("garbage"), 0o600))

	code, out, errs := runSymm(t, "top", "--json", "--dir", dir)
	require.Equal(t, exitOK, code, errs)
	var snap struct {
		Processes []publish.Page    `json:"processes"`
		Problems  []publish.Problem `json:"problems"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &snap))
	require.Len(t, snap.Processes, 1)
	p := snap.Processes[0]
	require.Equal(t, os.Getpid(), p.PID)
	require.EqualValues(t, 3<<20, p.Devices[0].Stats["allocated_bytes.all.current"])
	require.EqualValues(t, 8<<20, p.Devices[0].Stats["reserved_bytes.all.current"])
	require.Len(t, snap.Problems, 1)
	require.Contains(t, snap.Problems[0].Err, "shorter than the")

	code, out, errs = runSymm(t, "top", "--once", "--dir", dir)
	require.Equal(t, exitOK, code, errs)
	require.Contains(t, out, "1 libsymm process - sorted by reserved")
	require.Contains(t, out, "\nhost 0 [", "a host-backend device is named so, not GPU 0")
	require.Contains(t, out, tableHeader())
	require.Regexp(t, `\n +`+itoa(os.Getpid())+` +0 +3\.0 MiB +8\.0 MiB +8\.0 MiB +5\.0 MiB +2 +1/1\.0 MiB `, out)
	require.Contains(t, out, "skipped "+filepath.Join(dir, publish.Name(os.Getuid(), 1, 1)))

	code, out, _ = runSymm(t, "top", "--once", "--dir", dir, "--pid", itoa(os.Getpid()))
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "process "+itoa(os.Getpid())+":")
	require.Contains(t, out, "large blocks")
	require.Regexp(t, `0x7f00 +default +3\.0 MiB +8\.0 MiB +3`, out)
	require.Contains(t, out, "symmetric memory: 1 blocks, 1.0 MiB, 1 handles mapping 1 peer blocks")

	// Text output when standard output is not a terminal: -n tables.
	code, out, _ = runSymm(t, "top", "-n", "2", "--interval", "10ms", "--dir", dir)
	require.Equal(t, exitOK, code)
	require.Equal(t, 2, strings.Count(out, tableHeader()))
}

func TestTopBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--sort", "size"}, `--sort "size": want one of reserved, allocated`},
		{[]string{"--interval", "1ms"}, "--interval must be at least 10ms"},
		{[]string{"-n", "-1"}, "-n must be 0 or more"},
		{[]string{"--record", "out.png"}, "want a file ending in .jsonl, .svg or .html"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--pid", "-3"}, "--pid must be a process id, not -3"},
	} {
		code, _, errs := runSymm(t, append([]string{"top"}, c.args...)...)
		require.Equal(t, exitUsage, code, c.args)
		require.Contains(t, errs, c.want, c.args)
	}
	code, _, errs := runSymm(t, "top", "--once", "--record", filepath.Join(t.TempDir(), "no", "such", "dir.jsonl"))
	require.Equal(t, exitFailure, code)
	require.Contains(t, errs, "--record")
}

// A directory that is not there, and a process that publishes nothing, are
// errors: symm top would otherwise show an empty table as if all were well.
func TestTopMissingDirOrProcess(t *testing.T) {
	empty := t.TempDir()
	file := filepath.Join(empty, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for _, c := range []struct {
		env  string // SYMM_PUBLISH_DIR
		args []string
		want string
	}{
		{"", []string{"--once", "--dir", "/nonexistent"}, "symm top: --dir /nonexistent: no such directory"},
		{"", []string{"--json", "--dir", "/nonexistent"}, "symm top: --dir /nonexistent: no such directory"},
		{"/nonexistent", []string{"--once"}, "symm top: SYMM_PUBLISH_DIR=/nonexistent: no such directory"},
		{"", []string{"--once", "--dir", file}, "symm top: --dir " + file + ": not a directory"},
		{"", []string{"--once", "--dir", empty, "--pid", "999999"}, "symm top: --pid 999999: no statistics page of this process in " + empty},
		{empty, []string{"--json", "--pid", "999999"}, "symm top: --pid 999999: no statistics page"},
	} {
		t.Setenv("SYMM_PUBLISH_DIR", c.env)
		code, out, errs := runSymm(t, append([]string{"top"}, c.args...)...)
		require.Equal(t, exitFailure, code, c.args)
		require.Contains(t, errs, c.want, c.args)
		require.Empty(t, out, c.args)
	}

	// --json with --pid: that process alone.
	dir := t.TempDir()
	var a, r atomic.Int64
	fakePage(t, dir, &a, &r)
	require.NoError(t, os.WriteFile(filepath.Join(dir, publish.Name(os.Getuid(), 1, 1)), []byte("garbage"), 0o600))
	code, out, errs := runSymm(t, "top", "--json", "--dir", dir, "--pid", itoa(os.Getpid()))
	require.Equal(t, exitOK, code, errs)
	var snap struct {
		Processes []publish.Page `json:"processes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &snap))
	require.Len(t, snap.Processes, 1)
	require.Equal(t, os.Getpid(), snap.Processes[0].PID)
}

func TestTopRecord(t *testing.T) {
	dir := t.TempDir()
	var a, r atomic.Int64
	a.Store(1 << 20)
	r.Store(2 << 20)
	w := fakePage(t, dir, &a, &r)
	out := t.TempDir()
	jsonl, svg := filepath.Join(out, "run.jsonl"), filepath.Join(out, "run.svg")
	for _, f := range []string{jsonl, svg} {
		grown := make(chan struct{})
		go func() { // the process's memory grows while it is recorded
			defer close(grown)
			for i := 0; i < 5; i++ {
				time.Sleep(15 * time.Millisecond)
				a.Add(1 << 20)
				r.Add(1 << 20)
				w.Update()
			}
		}()
		code, _, errs := runSymm(t, "top", "-n", "5", "--interval", "20ms", "--dir", dir, "--record", f)
		<-grown
		require.Equal(t, exitOK, code, errs)
	}
	b, err := os.ReadFile(jsonl)
	require.NoError(t, err)
	require.Equal(t, 5, strings.Count(string(b), "\n"), "one snapshot per refresh")
	b, err = os.ReadFile(svg)
	require.NoError(t, err)
	require.NoError(t, xml.Unmarshal(b, new(struct{})), "a well-formed SVG")
	require.Contains(t, string(b), "pid "+itoa(os.Getpid())+" host 0 reserved")
	require.Contains(t, string(b), "pid "+itoa(os.Getpid())+" host 0 allocated")
}

// The live view on tcell's simulation screen: what it draws, and the keys.
func TestTopLiveView(t *testing.T) {
	dir := t.TempDir()
	var a, r atomic.Int64
	a.Store(3 << 20)
	r.Store(8 << 20)
	fakePage(t, dir, &a, &r)
	sc := tcell.NewSimulationScreen("UTF-8")
	require.NoError(t, sc.Init())
	sc.SetSize(140, 30)
	defer sc.Fini()
	// The screen is read where it is drawn, on the view's goroutine (the
	// simulation screen is not safe to read while it draws).
	var mu sync.Mutex
	var shown string
	read := func() string { return screenText(sc) }
	done := make(chan error)
	go func() {
		done <- topLoop(sc, topOptions{interval: 20 * time.Millisecond, sortBy: "reserved", dir: dir}, &recorder{}, nil,
			func() { mu.Lock(); shown = read(); mu.Unlock() })
	}()
	text := func() string { mu.Lock(); defer mu.Unlock(); return shown }
	waitFor := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Contains(text(), want) }, 5*time.Second, 10*time.Millisecond, "screen lacks %q:\n%s", want, text())
	}
	waitFor("sorted by reserved")
	waitFor(tableHeader())
	waitFor("q quit  s sort")
	sc.InjectKey(tcell.KeyRune, 's', tcell.ModNone)
	waitFor("sorted by allocated")
	sc.InjectKey(tcell.KeyEnter, 0, tcell.ModNone)
	waitFor("process " + itoa(os.Getpid()) + ":")
	sc.InjectKey(tcell.KeyEscape, 0, tcell.ModNone)
	waitFor(tableHeader())
	sc.InjectKey(tcell.KeyRune, 'q', tcell.ModNone)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("q did not end the live view")
	}
}

// screenText is what the simulation screen shows, a line per row, every
// rune of every cell (a cell drawn with several runes shows them all).
func screenText(sc tcell.SimulationScreen) string {
	cells, w, h := sc.GetContents()
	var b strings.Builder
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			if rs := cells[y*w+x].Runes; len(rs) > 0 {
				for _, r := range rs {
					b.WriteRune(r)
				}
			} else {
				b.WriteByte(' ')
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func itoa(n int) string { return strconv.Itoa(n) }

// A page may carry allocated above reserved (a writer that summed its pool
// shard by shard and did not clamp): no bar, table or detail breaks on it,
// with or without NVML, whatever NVML says.
func TestTopAllocatedAboveReserved(t *testing.T) {
	st := map[string]int64{
		"allocated_bytes.all.current": 9 << 20, "reserved_bytes.all.current": 5 << 20, "reserved_bytes.all.peak": 5 << 20,
		"allocated_bytes.large_pool.current": 9 << 20, "reserved_bytes.large_pool.current": 5 << 20,
	}
	page := &publish.Page{PID: 7, Command: "train.py", Backend: "cuda", Devices: []publish.Device{{Index: 0, Stats: st,
		Streams: []publish.Stream{{Stream: 1, Allocated: 9 << 20, Reserved: 5 << 20}}}}}
	for name, gpus := range map[string][]topology.GPUMemory{
		"no NVML":                  nil,
		"NVML":                     {{Index: 0, Total: 16 << 20, Used: 6 << 20, Free: 10 << 20}},
		"reserved above the total": {{Index: 0, Total: 4 << 20, Used: 8 << 20}},
		"no total":                 {{Index: 0}},
	} {
		s := &snapshot{Time: time.Now(), Processes: []*publish.Page{page}, GPUs: gpus,
			Totals: map[device]deviceTotals{{index: 0}: {allocated: 9 << 20, reserved: 5 << 20}}}
		for _, pid := range []int{0, 7} {
			lines := s.textView("cached", pid)
			bar := lines[1]
			require.True(t, strings.HasPrefix(bar, "GPU 0  ["), "%s: %s", name, bar)
			require.Equal(t, barWidth, strings.Index(bar, "]")-strings.Index(bar, "[")-1, "%s: %s", name, bar)
			require.Contains(t, bar, "0 B cached", name)
			require.NotContains(t, strings.Join(lines, "\n"), "-4.0 MiB", name)
		}
		sc := tcell.NewSimulationScreen("UTF-8")
		require.NoError(t, sc.Init())
		sc.SetSize(140, 30)
		v := &topView{snap: s, rows: s.rows("reserved")}
		v.draw(sc)
		require.Contains(t, screenText(sc), "GPU 0  [", name)
		sc.Fini()
	}
}

// The title counts processes in words ("1 libsymm process"); each device's
// bar is named for what it is, a GPU or a device of the host backend, and
// a host-backend process's memory is never added to a GPU's bar of the same
// index.
func TestTopTitleAndDeviceNames(t *testing.T) {
	stats := func(mib int64) map[string]int64 {
		return map[string]int64{"allocated_bytes.all.current": mib << 20, "reserved_bytes.all.current": mib << 20,
			"reserved_bytes.all.peak": mib << 20}
	}
	gpu := &publish.Page{PID: 7, Command: "train.py", Backend: "cuda", Devices: []publish.Device{{Index: 0, Stats: stats(4)}}}
	hostPage := &publish.Page{PID: 8, Command: "test.py", Backend: "host", Devices: []publish.Device{{Index: 0, Stats: stats(2)}}}
	for _, c := range []struct {
		pages []*publish.Page
		gpus  []topology.GPUMemory
		title string
		bars  []string
	}{
		{nil, nil, "0 libsymm processes", nil},
		{[]*publish.Page{hostPage}, nil, "1 libsymm process -", []string{"host 0 [", "2.0 MiB allocated"}},
		{[]*publish.Page{gpu}, nil, "1 libsymm process -", []string{"GPU 0  [", "4.0 MiB allocated"}},
		{[]*publish.Page{gpu, hostPage}, nil, "2 libsymm processes", []string{"GPU 0  [", "4.0 MiB allocated", "host 0 [", "2.0 MiB allocated"}},
		{[]*publish.Page{hostPage, gpu}, []topology.GPUMemory{{Index: 0, Total: 16 << 20, Used: 4 << 20}, {Index: 1, Total: 16 << 20}},
			"2 libsymm processes", []string{"GPU 0  [", "4.0 MiB allocated", "GPU 1  [", "0 B allocated", "host 0 [", "2.0 MiB allocated"}},
	} {
		s := &snapshot{Time: time.Now(), Processes: c.pages, GPUs: c.gpus}
		s.sum()
		lines := s.textView("reserved", 0)
		require.Contains(t, lines[0], " - "+c.title, lines[0])
		require.Len(t, s.devicesShown(), len(c.bars)/2)
		for i := 0; i < len(c.bars); i += 2 {
			bar := lines[1+i/2]
			require.True(t, strings.HasPrefix(bar, c.bars[i]), "%q: want %q", bar, c.bars[i])
			require.Contains(t, bar, c.bars[i+1], bar)
		}
	}
}

// Command lines and file names are shown escaped: no control character of
// another program (C0, DEL, C1) nor a byte that is not UTF-8 reaches the
// terminal, in the text view, JSON or the live view.
func TestTopEscapesControlCharacters(t *testing.T) {
	dir := t.TempDir()
	var a, r atomic.Int64
	a.Store(1 << 20)
	r.Store(2 << 20)
	w := fakePage(t, dir, &a, &r)
	evil := "python \x1b]0;pwned\x07\x1b[2J\u009b31m\x7f\xff end"
	f, err := os.OpenFile(w.Path(), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(append([]byte(evil), 0), 80) // the page's command line
	require.NoError(t, err)
	require.NoError(t, f.Close())
	bad := filepath.Join(dir, "libsymm-"+itoa(os.Getuid())+"-\x1b]0;title\x07")
	require.NoError(t, os.WriteFile(bad, nil, 0o600))

	clean := func(what, s string) {
		t.Helper()
		for _, r := range s {
			ok := r == '\n' || (r >= 0x20 && r != 0x7f && (r < 0x80 || r > 0x9f) && r != utf8.RuneError)
			require.True(t, ok, "%s shows %U raw:\n%q", what, r, s)
		}
	}
	code, out, errs := runSymm(t, "top", "--once", "--dir", dir)
	require.Equal(t, exitOK, code, errs)
	clean("the text view", out)
	require.Contains(t, out, `python \x1b]0;pwned\x07\x1b[2J\u009b31m\x7f\xff end`)
	require.Contains(t, out, "skipped "+dir+"/libsymm-"+itoa(os.Getuid())+`-\x1b]0;title\x07: not a page name`)
	code, out, errs = runSymm(t, "top", "--once", "--dir", dir, "--pid", itoa(os.Getpid()))
	require.Equal(t, exitOK, code, errs)
	clean("the detail view", out)
	require.Contains(t, out, `python \x1b]0;pwned`)
	code, out, errs = runSymm(t, "top", "--json", "--dir", dir)
	require.Equal(t, exitOK, code, errs)
	clean("JSON", out)
	var snap struct {
		Processes []publish.Page    `json:"processes"`
		Problems  []publish.Problem `json:"problems"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &snap))
	require.Equal(t, strings.ToValidUTF8(evil, "\ufffd"), snap.Processes[0].Command, "JSON escapes, and keeps, what it can")
	require.Equal(t, bad, snap.Problems[0].Path)

	sc := tcell.NewSimulationScreen("UTF-8")
	require.NoError(t, sc.Init())
	sc.SetSize(200, 30)
	defer sc.Fini()
	shown := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- topLoop(sc, topOptions{interval: time.Hour, sortBy: "reserved", dir: dir}, &recorder{}, nil, func() {
			select {
			case shown <- screenText(sc):
			default:
			}
		})
	}()
	text := <-shown
	sc.InjectKey(tcell.KeyRune, 'q', tcell.ModNone)
	require.NoError(t, <-done)
	clean("the live view", text)
	require.Contains(t, text, `python \x1b]0;pwned`)
	require.Contains(t, text, `-\x1b]0;title\x07`)
}

// --record files are 0600, like the pages they copy, and written through no
// link.
func TestTopRecordFilesArePrivate(t *testing.T) {
	dir := t.TempDir()
	var a, r atomic.Int64
	a.Store(1 << 20)
	r.Store(2 << 20)
	fakePage(t, dir, &a, &r)
	out := t.TempDir()
	record := func(path string) (int, string) {
		code, _, errs := runSymm(t, "top", "-n", "2", "--interval", "10ms", "--dir", dir, "--record", path)
		return code, errs
	}
	old := filepath.Join(out, "old.jsonl") // made before, readable by all
	require.NoError(t, os.WriteFile(old, nil, 0o644))
	for _, f := range []string{"run.jsonl", "run.svg", "run.html", "old.jsonl"} {
		path := filepath.Join(out, f)
		code, errs := record(path)
		require.Equal(t, exitOK, code, errs)
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}
	target := filepath.Join(out, "target")
	require.NoError(t, os.WriteFile(target, []byte("keep"), 0o644))
	link := filepath.Join(out, "link.jsonl")
	require.NoError(t, os.Symlink(target, link))
	code, errs := record(link)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errs, "--record")
	linkSVG := filepath.Join(out, "link.svg")
	require.NoError(t, os.Symlink(target, linkSVG))
	code, errs = record(linkSVG)
	require.Equal(t, exitOK, code, errs)
	fi, err := os.Lstat(linkSVG)
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular(), "the chart replaces the link")
	b, err := os.ReadFile(target)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b), "the link's target is untouched")
	tmps, err := filepath.Glob(filepath.Join(out, "*.tmp"))
	require.NoError(t, err)
	require.Empty(t, tmps)
}
