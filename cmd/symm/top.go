package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/publish"
	"github.com/libsymm/libsymm/topology"
)

// symm top: every libsymm process of this user on the machine, from the
// statistics pages they publish (package publish), and the devices' memory
// from NVML. Nothing changes in the watched programs.

const topSynopsis = "[--json] [--once] [-n N] [--interval D] [--sort COLUMN] [--pid PID] [--record FILE] [--dir DIR]"

type topOptions struct {
	json, once bool
	n          int
	interval   time.Duration
	sortBy     string
	pid        int
	record     string
	dir        string
}

// topColumns are the columns --sort and the s key choose from.
var topColumns = []string{"reserved", "allocated", "peak", "cached", "pid", "command"}

func top(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("top", topSynopsis, stderr)
	var o topOptions
	fs.BoolVar(&o.json, "json", false, "print one snapshot as JSON and exit")
	fs.BoolVar(&o.once, "once", false, "print the table once and exit")
	fs.IntVar(&o.n, "n", 0, "with text output (--once, or standard output not a terminal), print `N` tables (0: until interrupted)")
	fs.DurationVar(&o.interval, "interval", time.Second, "time between refreshes, a duration `D` (250ms, 2s)")
	fs.StringVar(&o.sortBy, "sort", "reserved", "`COLUMN` to sort by: "+strings.Join(topColumns, ", "))
	fs.IntVar(&o.pid, "pid", 0, "show process `PID` in detail: pools, streams, symmetric memory")
	fs.StringVar(&o.record, "record", "", "record every refresh in `FILE`: FILE.jsonl gets one JSON snapshot per line, FILE.svg or FILE.html a chart of allocated and reserved bytes per process over time, rewritten at each refresh")
	fs.StringVar(&o.dir, "dir", "", "look for the statistics pages in `DIR` (default: SYMM_PUBLISH_DIR, else /dev/shm)")
	if code, done := parse(fs, args); done {
		return code
	}
	if code := o.check(stderr); code != exitOK {
		return code
	}
	var first *snapshot
	if o.pid != 0 {
		// The process asked for must publish now; once shown, it may end
		// (the view then says so).
		first = takeSnapshot(o.dir)
		if first.page(o.pid) == nil {
			fmt.Fprintf(stderr, "symm top: --pid %d: no statistics page of this process in %s (not running, not a libsymm process of this user, or SYMM_PUBLISH=0)\n", o.pid, o.dir)
			return exitFailure
		}
	}
	if o.json {
		return printSnapshotJSON(o, first, stdout, stderr)
	}
	rec, err := newRecorder(o.record)
	if err != nil {
		fmt.Fprintf(stderr, "symm top: %v\n", err)
		return exitFailure
	}
	defer rec.close()
	if f, ok := stdout.(*os.File); ok && !o.once && term.IsTerminal(int(f.Fd())) {
		if err := runTUI(o, rec); err != nil {
			fmt.Fprintf(stderr, "symm top: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	return runText(o, rec, first, stdout, stderr)
}

// check refuses bad flags (exitUsage) and a directory that is not there
// (exitFailure); it fills in o.dir when --dir was not given.
func (o *topOptions) check(stderr io.Writer) int {
	switch {
	case o.interval < 10*time.Millisecond:
		fmt.Fprintf(stderr, "symm top: --interval must be at least 10ms, not %s\n", o.interval)
		return exitUsage
	case o.n < 0:
		fmt.Fprintf(stderr, "symm top: -n must be 0 or more, not %d\n", o.n)
		return exitUsage
	case sortIndex(o.sortBy) < 0:
		fmt.Fprintf(stderr, "symm top: --sort %q: want one of %s\n", o.sortBy, strings.Join(topColumns, ", "))
		return exitUsage
	case o.pid < 0:
		fmt.Fprintf(stderr, "symm top: --pid must be a process id, not %d\n", o.pid)
		return exitUsage
	}
	if o.record != "" {
		if ext := filepath.Ext(o.record); ext != ".jsonl" && ext != ".svg" && ext != ".html" {
			fmt.Fprintf(stderr, "symm top: --record %q: want a file ending in .jsonl, .svg or .html\n", o.record)
			return exitUsage
		}
	}
	dirFrom := "--dir " + o.dir
	if o.dir == "" {
		o.dir, dirFrom = publish.Dir(os.Getenv), publish.Dir(os.Getenv)
		if v := settings.PublishDir.Get(os.Getenv); v != "" {
			dirFrom = settings.PublishDir.Name + "=" + v
		}
	}
	if st, err := os.Stat(o.dir); err != nil || !st.IsDir() {
		why := "not a directory"
		if errors.Is(err, os.ErrNotExist) {
			why = "no such directory"
		} else if err != nil {
			why = err.Error()
		}
		fmt.Fprintf(stderr, "symm top: %s: %s (where libsymm processes publish their statistics pages)\n", dirFrom, why)
		return exitFailure
	}
	return exitOK
}

// printSnapshotJSON is --json: one snapshot, of process --pid alone when given.
func printSnapshotJSON(o topOptions, first *snapshot, stdout, stderr io.Writer) int {
	s := first
	if s == nil {
		s = takeSnapshot(o.dir)
	} else {
		s.Processes = []*publish.Page{s.page(o.pid)}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err == nil {
		_, err = stdout.Write(append(jsonSafe(b), '\n'))
	}
	if err != nil {
		fmt.Fprintf(stderr, "symm top: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func sortIndex(col string) int {
	for i, c := range topColumns {
		if c == col {
			return i
		}
	}
	return -1
}

// snapshot is what symm top shows at one moment (and --json prints). Its
// strings come from other programs (command lines) and from a shared
// directory (file names): they are shown only through textView, which
// escapes them, or as JSON.
type snapshot struct {
	Time      time.Time               `json:"time"`
	Processes []*publish.Page         `json:"processes"`
	GPUs      []topology.GPUMemory    `json:"gpus,omitempty"`
	GPUError  string                  `json:"gpu_error,omitempty"`
	Problems  []publish.Problem       `json:"problems,omitempty"`
	Removed   []string                `json:"removed,omitempty"`
	Totals    map[device]deviceTotals `json:"-"`
}

// device is one device with a bar: a GPU (NVML's figures beside the
// processes') or a device of the host backend (host memory, named so),
// counted apart even where their indices are the same.
type device struct {
	host  bool
	index int
}

// deviceOf is device index of a process whose pool runs on backend.
func deviceOf(backend string, index int) device { return device{host: backend == "host", index: index} }

func (d device) String() string {
	if d.host {
		return fmt.Sprintf("host %d", d.index)
	}
	return fmt.Sprintf("GPU %d", d.index)
}

// deviceTotals sums the libsymm processes' figures of one device.
type deviceTotals struct{ allocated, reserved int64 }

func takeSnapshot(dir string) *snapshot {
	l := publish.List(dir, os.Getuid())
	s := &snapshot{Time: time.Now(), Processes: l.Pages, Problems: l.Problems, Removed: l.Removed}
	if s.Processes == nil {
		s.Processes = []*publish.Page{}
	}
	if g, err := topology.MemoryUse(""); err != nil {
		s.GPUError = err.Error()
	} else {
		s.GPUs = g
	}
	s.sum()
	return s
}

// sum fills Totals from the processes' pages.
func (s *snapshot) sum() {
	s.Totals = map[device]deviceTotals{}
	for _, p := range s.Processes {
		for _, d := range p.Devices {
			k := deviceOf(p.Backend, d.Index)
			t := s.Totals[k]
			t.allocated += d.Stats["allocated_bytes.all.current"]
			t.reserved += d.Stats["reserved_bytes.all.current"]
			s.Totals[k] = t
		}
	}
}

// cachedBytes is reserved less allocated, never below zero: a page of a
// writer that does not clamp (an older libsymm) may carry allocated above
// reserved, read shard by shard.
func cachedBytes(allocated, reserved int64) int64 { return max(reserved-allocated, 0) }

// row is one process on one device: a line of the table.
type row struct {
	page                                    *publish.Page
	dev                                     int
	allocated, reserved, peak, cached, ooms int64
}

// rows lists every process on every device it has reserved memory on
// (device 0 for a process that has reserved nothing yet), sorted by column
// col, largest first (pid and command: ascending).
func (s *snapshot) rows(col string) []row {
	var out []row
	for _, p := range s.Processes {
		var devs []publish.Device
		for _, d := range p.Devices {
			if d.Stats["reserved_bytes.all.peak"] != 0 {
				devs = append(devs, d)
			}
		}
		if len(devs) == 0 && len(p.Devices) > 0 {
			devs = p.Devices[:1]
		}
		for _, d := range devs {
			st := d.Stats
			out = append(out, row{page: p, dev: d.Index,
				allocated: st["allocated_bytes.all.current"], reserved: st["reserved_bytes.all.current"],
				peak: st["reserved_bytes.all.peak"], cached: cachedBytes(st["allocated_bytes.all.current"], st["reserved_bytes.all.current"]),
				ooms: st["num_ooms"]})
		}
	}
	key := func(r row) int64 {
		switch col {
		case "allocated":
			return r.allocated
		case "peak":
			return r.peak
		case "cached":
			return r.cached
		}
		return r.reserved
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch col {
		case "pid":
			return a.page.PID < b.page.PID || (a.page.PID == b.page.PID && a.dev < b.dev)
		case "command":
			return a.page.Command < b.page.Command || (a.page.Command == b.page.Command && a.page.PID < b.page.PID)
		}
		if key(a) != key(b) {
			return key(a) > key(b)
		}
		return a.page.PID < b.page.PID || (a.page.PID == b.page.PID && a.dev < b.dev)
	})
	return out
}

// human writes a byte count in binary units, at most 6 characters wide.
func human(b int64) string {
	neg := b < 0
	if neg {
		b = -b
	}
	v, unit := float64(b), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	s := fmt.Sprintf("%.0f %s", v, unit)
	if unit != "B" && v < 100 {
		s = fmt.Sprintf("%.1f %s", v, unit)
	}
	if neg {
		s = "-" + s
	}
	return s
}

// tableHeader and tableLine format the process table.
const tableFormat = "%7s %3s %10s %10s %10s %10s %5s %-14s %s"

func tableHeader() string {
	return fmt.Sprintf(tableFormat, "PID", "DEV", "ALLOCATED", "RESERVED", "PEAK", "CACHED", "OOMS", "SYMMETRIC", "COMMAND")
}

func tableLine(r row) string {
	sym := "-"
	if s := r.page.Symmetric; s.Blocks > 0 {
		sym = fmt.Sprintf("%d/%s", s.Blocks, human(int64(s.Bytes)))
	}
	return fmt.Sprintf(tableFormat, pidLabel(r.page), fmt.Sprint(r.dev), human(r.allocated), human(r.reserved),
		human(r.peak), human(r.cached), fmt.Sprint(r.ooms), sym, oneLine(r.page.Command))
}

// pidLabel is a page's pid, marked with * when it is a pid of another pid
// namespace (not one of this /proc).
func pidLabel(p *publish.Page) string {
	if p.OtherNamespace {
		return fmt.Sprintf("%d*", p.PID)
	}
	return fmt.Sprint(p.PID)
}

// oneLine is a command line on one line: runs of white space (newlines of
// a python -c script included) become one space. Other control characters
// are left for printable to escape.
func oneLine(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f'
	}), " ")
}

// printable escapes what a terminal would act on instead of showing: C0
// controls, DEL and C1 controls (U+0080-U+009F: a terminal may take U+009B
// for CSI) as \xNN or \u00NN, and bytes that are not UTF-8 as \xNN. Every
// line symm top shows, in text or in the live view, passes through it:
// command lines and file names are other programs' text.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if isControl(r) || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x80 && isControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case isControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// jsonSafe escapes DEL and the C1 controls in encoded JSON (encoding/json
// escapes those of C0 in strings), so that JSON printed to a terminal
// carries no control either. Outside strings JSON is printable ASCII, so every one found is in
// a string, where \u00NN means the same character.
func jsonSafe(b []byte) []byte {
	unescaped := func(r rune) bool { return r >= 0x7f && r <= 0x9f }
	if !bytes.ContainsFunc(b, unescaped) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if unescaped(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// barWidth is the device bars' width in cells.
const barWidth = 50

// bar draws one device: libsymm's allocated (#), its cached free (=), the
// device's other used memory (-: CUDA contexts, libraries, other processes)
// and free memory (.), from NVML's totals; without them, allocated within
// reserved only (always so on the host backend). The bar is always
// barWidth cells, whatever the figures (allocated above reserved, reserved
// above NVML's total, a total of 0).
func (s *snapshot) bar(dev device) string {
	t := s.Totals[dev]
	cached := cachedBytes(t.allocated, t.reserved)
	var g *topology.GPUMemory
	for i := range s.GPUs {
		if !dev.host && s.GPUs[i].Index == dev.index {
			g = &s.GPUs[i]
		}
	}
	if g == nil {
		parts := barParts(max(t.reserved, t.allocated), t.allocated)
		return fmt.Sprintf("%-6s [%s%s] %s allocated, %s cached", dev, strings.Repeat("#", parts[0]),
			strings.Repeat("=", barWidth-parts[0]), human(t.allocated), human(cached))
	}
	total, other := int64(g.Total), max(int64(g.Used)-t.reserved, 0)
	parts := barParts(total, t.allocated, cached, other)
	b := strings.Repeat("#", parts[0]) + strings.Repeat("=", parts[1]) + strings.Repeat("-", parts[2])
	b += strings.Repeat(".", barWidth-parts[0]-parts[1]-parts[2])
	return fmt.Sprintf("%-6s [%s] %s allocated, %s cached, %s other, %s free of %s", dev, b,
		human(t.allocated), human(cached), human(other), human(int64(g.Free)), human(total))
}

// barParts gives each of parts its share of barWidth cells, as a part of
// total, in order, each clamped so that the parts never take more than
// barWidth cells together (nor less than 0 each).
func barParts(total int64, parts ...int64) []int {
	out := make([]int, len(parts))
	left := barWidth
	for i, p := range parts {
		n := 0
		if total > 0 && p > 0 {
			n = int(min(float64(barWidth)*float64(p)/float64(total), barWidth))
		}
		out[i] = min(n, left)
		left -= out[i]
	}
	return out
}

// devicesShown are the devices with a bar: NVML's GPUs (else the GPUs the
// processes use), then the host backend's devices the processes use.
func (s *snapshot) devicesShown() []device {
	var out []device
	for _, g := range s.GPUs {
		out = append(out, device{index: g.Index})
	}
	for d := range s.Totals {
		if d.host || len(s.GPUs) == 0 {
			out = append(out, d)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return (!a.host && b.host) || (a.host == b.host && a.index < b.index)
	})
	return out
}

// textView is what the text output and the live view print: a title, the
// device bars, the table (or a process in detail) and the problems.
func (s *snapshot) textView(col string, pid int) []string {
	procs := "processes"
	if len(s.Processes) == 1 {
		procs = "process"
	}
	lines := []string{fmt.Sprintf("symm top - %s - %d libsymm %s - sorted by %s",
		s.Time.Format("15:04:05"), len(s.Processes), procs, col)}
	for _, d := range s.devicesShown() {
		lines = append(lines, s.bar(d))
	}
	if len(s.GPUs) == 0 {
		lines = append(lines, "(no NVML: device bars show libsymm's memory only; # allocated, = cached free)")
	} else {
		lines = append(lines, "(# libsymm allocated, = libsymm cached free, - other used: CUDA contexts, other processes; . free)")
	}
	lines = append(lines, "")
	if pid != 0 {
		lines = append(lines, s.detail(pid)...)
	} else {
		lines = append(lines, tableHeader())
		other := false
		for _, r := range s.rows(col) {
			lines = append(lines, tableLine(r))
			other = other || r.page.OtherNamespace
		}
		if len(s.Processes) == 0 {
			lines = append(lines, "(no libsymm process of this user publishes statistics here)")
		}
		if other {
			lines = append(lines, "(* a pid of another pid namespace, e.g. a container sharing /dev/shm: not a pid of this /proc)")
		}
	}
	for _, p := range s.Problems {
		lines = append(lines, fmt.Sprintf("skipped %s: %s", p.Path, p.Err))
	}
	for _, r := range s.Removed {
		lines = append(lines, fmt.Sprintf("removed %s: its process is gone", r))
	}
	for i, l := range lines {
		lines[i] = printable(l)
	}
	return lines
}

// detail describes one process: per device its pools (size classes),
// libsymm's own counters and its streams, then its symmetric memory.
// page is process pid's page (the last listed, if pages of several pid
// namespaces carry it); nil when it publishes none.
func (s *snapshot) page(pid int) *publish.Page {
	var p *publish.Page
	for _, q := range s.Processes {
		if q.PID == pid {
			p = q
		}
	}
	return p
}

func (s *snapshot) detail(pid int) []string {
	p := s.page(pid)
	if p == nil {
		return []string{fmt.Sprintf("process %d publishes no statistics here (gone, or not a libsymm process of this user)", pid)}
	}
	lines := []string{fmt.Sprintf("process %s: %s (backend %s, refreshed every %d ms)", pidLabel(p), oneLine(p.Command), p.Backend, p.Interval)}
	if p.OtherNamespace {
		lines = append(lines, fmt.Sprintf("(pid %d of pid namespace pid:[%d], not this one's; page %s)", p.PID, p.PIDNamespace, p.ID))
	}
	for _, d := range p.Devices {
		st := d.Stats
		lines = append(lines, "", fmt.Sprintf("device %d", d.Index),
			fmt.Sprintf("  %-26s %10s %10s %10s %10s %9s", "pool", "allocated", "reserved", "peak res.", "cached", "segments"))
		for _, pool := range []struct{ name, key string }{{"all", "all"}, {"small blocks (<= 1 MiB)", "small_pool"}, {"large blocks", "large_pool"}} {
			a, r := st["allocated_bytes."+pool.key+".current"], st["reserved_bytes."+pool.key+".current"]
			lines = append(lines, fmt.Sprintf("  %-26s %10s %10s %10s %10s %9d", pool.name, human(a), human(r),
				human(st["reserved_bytes."+pool.key+".peak"]), human(cachedBytes(a, r)), st["segment."+pool.key+".current"]))
		}
		lines = append(lines, fmt.Sprintf("  allocations %d (peak %d), OOMs %d, retries %d, front-cache hits %d, chunk maps %d, unmaps %d",
			st["allocation.all.current"], st["allocation.all.peak"], st["num_ooms"], st["num_alloc_retries"],
			st["num_front_cache_hits"], st["num_chunk_maps"], st["num_chunk_unmaps"]))
		if len(d.Streams) > 0 {
			lines = append(lines, fmt.Sprintf("  %-20s %-8s %10s %10s %9s", "stream", "pool", "allocated", "reserved", "segments"))
			for _, x := range d.Streams {
				pool := "default"
				if x.Private {
					pool = "private"
				}
				lines = append(lines, fmt.Sprintf("  %#-20x %-8s %10s %10s %9d", x.Stream, pool, human(x.Allocated), human(x.Reserved), x.Segments))
			}
		}
	}
	sy := p.Symmetric
	lines = append(lines, "", fmt.Sprintf("symmetric memory: %d blocks, %s, %d handles mapping %d peer blocks",
		sy.Blocks, human(int64(sy.Bytes)), sy.Handles, sy.PeerMappings))
	return lines
}

// runText prints the text view every interval (n times; 0: until
// interrupted), or once with --once.
// runText prints a table every o.interval; first, when set, is the first.
func runText(o topOptions, rec *recorder, first *snapshot, stdout, stderr io.Writer) int {
	n := o.n
	if o.once {
		n = 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	for i := 0; n == 0 || i < n; i++ {
		if i > 0 {
			select {
			case <-stop:
				return exitOK
			case <-time.After(o.interval):
			}
			fmt.Fprintln(stdout)
		}
		s := first
		if i > 0 || s == nil {
			s = takeSnapshot(o.dir)
		}
		if err := rec.add(s); err != nil {
			fmt.Fprintf(stderr, "symm top: %v\n", err)
			return exitFailure
		}
		fmt.Fprintln(stdout, strings.Join(s.textView(o.sortBy, o.pid), "\n"))
	}
	return exitOK
}
