package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/trace"
)

const replaySynopsis = "TRACE [--expandable] [--unmap-free-pages] [--limit SIZE] [--max-split SIZE] [--chunk SIZE] [--capacity SIZE] [--stream-lag ROWS] [--front-cache SIZE] [--alloc-conf SETTINGS] [--plot FILE] [--json]"

// sizeFlag is a byte count given as allocator.ParseSize reads it ("16GiB").
type sizeFlag uint64

func (s *sizeFlag) String() string { return fmt.Sprint(uint64(*s)) }
func (s *sizeFlag) Set(v string) error {
	n, err := allocator.ParseSize(v)
	*s = sizeFlag(n)
	return err
}

type replayOptions struct {
	path                      string
	expandableOnly, asJSON    bool
	unmapFreePages            bool
	limit, maxSplit, capacity sizeFlag
	chunk                     chunkFlag
	frontCache                sizeFlag
	// streamLag is --stream-lag: rows the virtual device's streams lag
	// the host by (0: every event completes at once).
	streamLag int
	// allocConf is --alloc-conf: PyTorch allocator settings, parsed into torch.
	allocConf string
	torch     allocator.TorchConf
	// plot is --plot's FILE ("": none); given names the flags given but
	// --plot and --json, as the chart's title shows them.
	plot  string
	given string
}

// replay runs a recorded trace through the pool on a virtual device, once per
// configuration, and prints the peaks beside the trace's own.
func replay(args []string, stdout, stderr io.Writer) int {
	o, code, done := replayFlags(args, stderr)
	if done {
		return code
	}
	tr, err := trace.Open(o.path)
	if err != nil {
		fmt.Fprintln(stderr, "symm replay:", err)
		return exitFailure
	}
	samples := 0
	if o.plot != "" {
		samples = plotMaxPoints
	}
	rows := make([]replayRow, 0, 2)
	for _, c := range o.configs() {
		res, err := trace.ReplayWith(tr, c.cfg, trace.Options{Capacity: uint64(o.capacity), FrontMax: uint64(o.frontCache), Samples: samples, StreamLag: o.streamLag})
		if err != nil {
			fmt.Fprintf(stderr, "symm replay: %s: %s: %v\n", o.path, c.name, err)
			return exitFailure
		}
		rows = append(rows, replayRow{Name: c.name, Result: res})
	}
	rec := tr.Recorded()
	if o.plot != "" {
		if err := writeReplayPlot(o, rec, tr.RecordedSeries(samples), rows); err != nil {
			fmt.Fprintln(stderr, "symm replay: --plot:", err)
			return exitFailure
		}
	}
	if o.asJSON {
		return writeReplayJSON(stdout, stderr, o, len(tr.Events), rec, rows)
	}
	writeReplayText(stdout, o.path, len(tr.Events), rec, rows)
	return exitOK
}

// replayFlags reads the flags and the one TRACE argument, which may come
// before, between or after the flags (the flag package alone stops at the
// first argument that is not a flag).
func replayFlags(args []string, stderr io.Writer) (o replayOptions, code int, done bool) {
	fs := newFlags("replay", replaySynopsis, stderr)
	fs.BoolVar(&o.expandableOnly, "expandable", false, "replay only the expandable-segment configuration (default: default and expandable)")
	fs.BoolVar(&o.unmapFreePages, "unmap-free-pages", true, "expandable segments unmap the chunks wholly inside free blocks whenever the pool maps memory (as many as it maps) and at release, as the library does by default (SYMM_POOL_UNMAP_FREE_PAGES); --unmap-free-pages=false: only a segment's free tail is unmapped, at release (SYMM_POOL_UNMAP_FREE_PAGES=0)")
	fs.Var(&o.limit, "limit", "cap the pool's reserved bytes at this `SIZE` (16GiB), as SYMM_POOL_LIMIT; allocations past it count as OOMs")
	fs.Var(&o.maxSplit, "max-split", "blocks of at least this `SIZE` are never split, as SYMM_POOL_MAX_SPLIT (more than 1MiB; default off)")
	fs.Var(&o.chunk, "chunk", "expandable segments map big chunks of this `SIZE` where a mapping covers a whole one (2MiB chunks elsewhere), as SYMM_POOL_EXPANDABLE_CHUNK (default: the library's, the large segment size: 20MiB, or --alloc-conf's large_segment_size_mb)")
	fs.IntVar(&o.streamLag, "stream-lag", 0, "the virtual device's streams lag the host by this many `ROWS` of the trace: an event completes that many rows after it is recorded, or when the pool waits for it (0: at once, as if the GPU kept up); 10 reproduced an H100's peaks on GPT-2 training and LLM inference")
	fs.Var(&o.capacity, "capacity", "the virtual device's memory, a `SIZE` (default 1PiB: no out-of-memory)")
	fs.Var(&o.frontCache, "front-cache", "model the library's front cache on one CPU: the last 64 freed blocks of each pool (small, large) of at most this `SIZE`, any fixed segment of its own, and any freed while its shard was unchanged since it was placed, stay parked; where it serves fewer than 1 in 8 of 4,096 allocations it steps aside for the next 65,536, as the library does (the library's default is 1MiB, SYMM_POOL_FRONT_CACHE_MAX; default here: off, the pool alone)")
	fs.StringVar(&o.allocConf, "alloc-conf", "", "PyTorch allocator `SETTINGS` applied as the library applies PYTORCH_CUDA_ALLOC_CONF (roundup_power2_divisions, garbage_collection_threshold, max_split_size_mb, ...); --limit and --max-split win for their fields, and each row sets its own expandable_segments")
	fs.StringVar(&o.plot, "plot", "", "also write a chart of allocated and reserved bytes over the trace's rows, recorded and per configuration, to `FILE`: an SVG image (FILE ending in .svg) or an HTML page showing it (.html)")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object instead of the table")
	var pos []string
	for {
		if code, done := parseHelp(fs, args); done {
			return o, code, true
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	switch {
	case len(pos) == 0:
		fmt.Fprintln(stderr, "symm replay: missing TRACE (a CSV trace, plain or gzip; python -m symm.trace writes one)")
	case len(pos) > 1:
		fmt.Fprintf(stderr, "symm replay: unexpected argument %q (one TRACE only)\n", pos[1])
	case o.streamLag < 0:
		fmt.Fprintf(stderr, "symm replay: --stream-lag must be 0 or more rows, not %d\n", o.streamLag)
	case o.capacity == 0 && flagGiven(fs, "capacity"):
		fmt.Fprintln(stderr, "symm replay: --capacity must be more than 0 bytes (without it: 1PiB, no out-of-memory)")
	case o.maxSplit != 0 && o.maxSplit <= 1<<20:
		fmt.Fprintf(stderr, "symm replay: --max-split must be more than 1MiB (small blocks are always split), not %d bytes\n", o.maxSplit)
	case o.frontCache != 0 && (o.frontCache < 512 || o.frontCache > 64<<20):
		fmt.Fprintf(stderr, "symm replay: --front-cache must be from 512 B to 64MiB (or 0: off), not %d bytes\n", o.frontCache)
	case o.plot != "" && plotFormat(o.plot) == "":
		fmt.Fprintf(stderr, "symm replay: --plot %q: FILE must end in .svg (an SVG image) or .html (an HTML page)\n", o.plot)
		return o, exitUsage, true
	default:
		tc, warns, err := allocator.ParseTorchAllocConf(o.allocConf)
		if err != nil {
			fmt.Fprintf(stderr, "symm replay: --alloc-conf %q: %v\n", o.allocConf, err)
			return o, exitUsage, true
		}
		for _, w := range warns {
			fmt.Fprintln(stderr, "symm replay: --alloc-conf: "+w)
		}
		o.path, o.torch, o.given = pos[0], tc, givenFlags(fs)
		return o, 0, false
	}
	fs.Usage()
	return o, exitUsage, true
}

// parseHelp parses args like parse, but leaves arguments that are not flags
// to the caller.
func parseHelp(fs *flag.FlagSet, args []string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, true
		}
		return exitUsage, true
	}
	return 0, false
}

type namedConfig struct {
	name string
	cfg  allocator.Config
}

func (o replayOptions) configs() []namedConfig {
	base := o.torch.Config()
	base.AllocConf, base.Expandable = o.allocConf, false
	if o.limit != 0 {
		base.Limit, base.LimitFraction = uint64(o.limit), 0
	}
	if o.maxSplit != 0 {
		base.MaxSplit = uint64(o.maxSplit)
	}
	exp := base
	exp.Expandable, exp.ExpandableChunk, exp.UnmapFreePages = true, o.chunkBytes(), o.unmapFreePages
	if o.unmapFreePages { // as the library's defaults (ConfigFromEnv): a lagging stream is waited for at the peak
		exp.FreePagesWait = allocator.DefaultFreePagesWait
	}
	if o.expandableOnly {
		return []namedConfig{{"expandable", exp}}
	}
	return []namedConfig{{"default", base}, {"expandable", exp}}
}

// chunkBytes is the big chunk replayed, as the pool maps it on the virtual
// device (rounded up to its granularity): --chunk, else the library's
// default for the settings given (allocator.Config.DefaultExpandableChunk).
func (o replayOptions) chunkBytes() uint64 {
	c := uint64(o.chunk)
	if c == 0 {
		c = o.torch.Config().DefaultExpandableChunk()
	}
	g, _ := allocator.NewVirtual(1, 0).Granularity(0)
	return allocator.ExpandableChunkBytes(c, g)
}

// chunkFlag is --chunk, read by the library's own parser of
// SYMM_POOL_EXPANDABLE_CHUNK: what the library refuses, replay refuses.
type chunkFlag uint64

func (c *chunkFlag) String() string { return fmt.Sprint(uint64(*c)) }
func (c *chunkFlag) Set(v string) error {
	n, err := allocator.ParseExpandableChunk(v)
	*c = chunkFlag(n)
	return err
}

// replayRow is one configuration's result; in JSON, its name beside the
// fields of trace.Result.
type replayRow struct {
	Name string `json:"name"`
	trace.Result
}

const mib = 1 << 20

// writeReplayText prints the counts, then one row per configuration after
// the trace's own figures (reserved "-" when the trace has no segment rows).
func writeReplayText(w io.Writer, path string, n int, rec trace.Recorded, rows []replayRow) {
	r0 := rows[0].Result // the counts below are the trace's: every configuration has the same
	fmt.Fprintf(w, "trace %s: %d rows, %d alloc/free_completed replayed; %d pre-existing blocks, %d lost frees, %d unmatched frees\n",
		path, n, r0.Rows, r0.PreExisting, r0.LostFrees, r0.UnmatchedFrees)
	const format = "%-18s  %20s  %19s  %18s  %19s  %17s  %5s\n"
	fmt.Fprintf(w, format, "configuration", "peak allocated (MiB)", "peak reserved (MiB)", "reserved/allocated",
		"peak physical (MiB)", "time-averaged r/a", "OOMs")
	reserved, ratio := "-", "-"
	if rec.HasReserved {
		reserved = fmt.Sprint(rec.PeakReserved / mib)
		ratio = fmt.Sprintf("%.3f", rec.Ratio())
	}
	fmt.Fprintf(w, format, "recorded (trace)", fmt.Sprint(rec.PeakAllocated/mib), reserved, ratio, "-", "-", fmt.Sprint(rec.OOMs))
	for _, r := range rows {
		fmt.Fprintf(w, format, r.Name, fmt.Sprint(r.PeakAllocated/mib), fmt.Sprint(r.PeakReserved/mib),
			fmt.Sprintf("%.3f", r.Ratio), fmt.Sprint(r.BackendPeak/mib), fmt.Sprintf("%.3f", r.TimeAveraged), fmt.Sprint(r.OOMs))
	}
}

// replayJSON is the --json output: bytes, not MiB. The recorded reserved
// figure and its ratio are null when the trace has no segment rows; limit
// and max split are 0 when not given (no limit, off); chunk is the one
// replayed (--chunk or the library's default);
// alloc_conf is --alloc-conf's text ("" when not given).
type replayJSON struct {
	Trace          string      `json:"trace"`
	Rows           int         `json:"rows"`
	LimitBytes     uint64      `json:"limit_bytes"`
	MaxSplitBytes  uint64      `json:"max_split_bytes"`
	ChunkBytes     uint64      `json:"chunk_bytes"`
	CapacityBytes  uint64      `json:"capacity_bytes"`
	FrontCache     uint64      `json:"front_cache_bytes"`
	StreamLag      int         `json:"stream_lag_rows"`
	AllocConf      string      `json:"alloc_conf"`
	Recorded       recordJSON  `json:"recorded"`
	Configurations []replayRow `json:"configurations"`
}

type recordJSON struct {
	PeakAllocated uint64   `json:"peak_allocated_bytes"`
	PeakReserved  *uint64  `json:"peak_reserved_bytes"`
	Ratio         *float64 `json:"reserved_per_allocated"`
	OOMs          int      `json:"ooms"`
}

// capacity is the memory of the virtual device the replays ran on (0 given:
// the backend's default), asked of the backend so as not to repeat it here.
func capacity(given uint64) uint64 {
	_, total, _ := allocator.NewVirtual(1, given).MemInfo(0)
	return total
}

func writeReplayJSON(stdout, stderr io.Writer, o replayOptions, n int, rec trace.Recorded, rows []replayRow) int {
	out := replayJSON{
		Trace: o.path, Rows: n, LimitBytes: uint64(o.limit), MaxSplitBytes: uint64(o.maxSplit),
		ChunkBytes: o.chunkBytes(), CapacityBytes: capacity(uint64(o.capacity)), FrontCache: uint64(o.frontCache), StreamLag: o.streamLag,
		AllocConf:      o.allocConf,
		Recorded:       recordJSON{PeakAllocated: rec.PeakAllocated, OOMs: rec.OOMs},
		Configurations: rows,
	}
	if rec.HasReserved {
		ratio := rec.Ratio()
		out.Recorded.PeakReserved, out.Recorded.Ratio = &rec.PeakReserved, &ratio
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(stderr, "symm replay:", err)
		return exitFailure
	}
	return exitOK
}

// plotFormat is "svg" or "html", as FILE ends (in any case); "" otherwise.
func plotFormat(file string) string {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".svg":
		return "svg"
	case ".html":
		return "html"
	}
	return ""
}

// flagGiven reports whether flag name was on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// givenFlags writes the flags given but --plot and --json, as a command
// line would (sizes in GiB or MiB when they are at least that).
func givenFlags(fs *flag.FlagSet) string {
	var out []string
	fs.Visit(func(f *flag.Flag) {
		switch v := f.Value.(type) {
		case *sizeFlag:
			out = append(out, "--"+f.Name+" "+sizeText(uint64(*v)))
		case *chunkFlag:
			out = append(out, "--"+f.Name+" "+sizeText(uint64(*v)))
		default:
			if f.Name == "plot" || f.Name == "json" {
				return
			}
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				out = append(out, "--"+f.Name)
				return
			}
			out = append(out, "--"+f.Name+" "+f.Value.String())
		}
	})
	return strings.Join(out, " ")
}

// sizeText writes a byte count as --limit takes it: 14.5GiB, 64MiB, 4096.
func sizeText(n uint64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', -1, 64) + "GiB"
	case n >= mib:
		return strconv.FormatFloat(float64(n)/mib, 'f', -1, 64) + "MiB"
	}
	return strconv.FormatUint(n, 10)
}

// plotColors are the lines' colours, per configuration.
var plotColors = map[string]string{"recorded": "#555555", "default": "#1f77b4", "expandable": "#d62728"}

// replayPlot is the chart of a replay: per configuration (the trace's own
// figures first), reserved as a solid line and allocated as a dashed one,
// in GiB (MiB when everything is under 1 GiB) over the trace's rows. The
// replayed lines are the pool's allocated_bytes and reserved_bytes (their
// peaks are the table's), the recorded ones the trace's running sums (no
// reserved line when the trace has no segment rows).
func replayPlot(o replayOptions, rec trace.Recorded, recSeries []trace.Point, rows []replayRow) (title, yLabel string, series []plotSeries) {
	top := max(rec.PeakAllocated, rec.PeakReserved)
	for _, r := range rows {
		top = max(top, r.PeakAllocated, r.PeakReserved)
	}
	unit, yLabel := float64(1<<30), "GiB"
	if top < 1<<30 {
		unit, yLabel = mib, "MiB"
	}
	add := func(name, color string, pts []trace.Point, reserved bool, peak uint64) {
		s := plotSeries{Color: color, Dashed: !reserved, X: make([]float64, len(pts)), Y: make([]float64, len(pts))}
		what := "allocated"
		if reserved {
			what = "reserved"
		}
		s.Name = fmt.Sprintf("%s: %s, peak %d MiB", name, what, peak/mib)
		for i, p := range pts {
			v := p.Allocated
			if reserved {
				v = p.Reserved
			}
			s.X[i], s.Y[i] = float64(p.Row), float64(v)/unit
		}
		series = append(series, s)
	}
	if rec.HasReserved {
		add("recorded (trace)", plotColors["recorded"], recSeries, true, rec.PeakReserved)
	}
	add("recorded (trace)", plotColors["recorded"], recSeries, false, rec.PeakAllocated)
	for _, r := range rows {
		add("libsymm "+r.Name, plotColors[r.Name], r.Series, true, r.PeakReserved)
		add("libsymm "+r.Name, plotColors[r.Name], r.Series, false, r.PeakAllocated)
	}
	title = "Allocated and reserved memory over the trace " + filepath.Base(o.path)
	if o.given != "" {
		title += "\nreplayed with " + o.given
	}
	return title, yLabel, series
}

// writeReplayPlot writes --plot's file: SVG or HTML, as its name ends.
func writeReplayPlot(o replayOptions, rec trace.Recorded, recSeries []trace.Point, rows []replayRow) error {
	title, yLabel, series := replayPlot(o, rec, recSeries, rows)
	write := writePlotSVG
	if plotFormat(o.plot) == "html" {
		write = writePlotHTML
	}
	var b bytes.Buffer
	if err := write(&b, title, "row of the trace", yLabel, series); err != nil {
		return err
	}
	return os.WriteFile(o.plot, b.Bytes(), 0o644)
}
