package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/internal/trace"
)

// svgLine is a polyline of a chart as written.
type svgLine struct {
	Stroke, Dash, Title string
	Points              [][2]float64
}

// svgDoc is what a chart holds: its lines and every text shown.
type svgDoc struct {
	Lines []svgLine
	Texts []string
}

// parseSVG reads a chart with encoding/xml (strict), failing the test if
// it is not well-formed XML with an svg root.
func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	var doc svgDoc
	var stack []string
	var line *svgLine
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch e := tok.(type) {
		case xml.StartElement:
			if len(stack) == 0 {
				require.Equal(t, "svg", e.Name.Local)
				require.Equal(t, "http://www.w3.org/2000/svg", e.Name.Space)
			}
			stack = append(stack, e.Name.Local)
			if e.Name.Local == "polyline" {
				doc.Lines = append(doc.Lines, svgLine{})
				line = &doc.Lines[len(doc.Lines)-1]
				for _, a := range e.Attr {
					switch a.Name.Local {
					case "stroke":
						line.Stroke = a.Value
					case "stroke-dasharray":
						line.Dash = a.Value
					case "points":
						for _, p := range strings.Fields(a.Value) {
							xs, ys, ok := strings.Cut(p, ",")
							require.True(t, ok, p)
							x, err := strconv.ParseFloat(xs, 64)
							require.NoError(t, err)
							y, err := strconv.ParseFloat(ys, 64)
							require.NoError(t, err)
							line.Points = append(line.Points, [2]float64{x, y})
						}
					}
				}
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) == 0 {
				continue
			}
			switch stack[len(stack)-1] {
			case "text":
				doc.Texts = append(doc.Texts, string(e))
			case "title":
				if len(stack) >= 2 && stack[len(stack)-2] == "polyline" {
					line.Title = string(e)
				}
			}
		}
	}
	require.Empty(t, stack)
	return doc
}

func maxOf(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// topPixel is the least pixel y of a line: its highest point.
func topPixel(l svgLine) float64 {
	top := math.Inf(1)
	for _, p := range l.Points {
		top = min(top, p[1])
	}
	return top
}

func svgOf(t *testing.T, title, xLabel, yLabel string, series []plotSeries) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, writePlotSVG(&b, title, xLabel, yLabel, series))
	return b.Bytes()
}

// A chart over seconds: one polyline per series in order, the legend and
// the title as given (escaped), ticks labelled, and the same bytes each
// time.
func TestPlotSVGGeneric(t *testing.T) {
	series := []plotSeries{
		{Name: "reserved <pool & co>", Color: "#1f77b4", X: []float64{0, 0.5, 1, 1.5}, Y: []float64{0, 2, 2, 2}},
		{Name: "allocated", Color: "#1f77b4", Dashed: true, X: []float64{0, 0.5, 1, 1.5}, Y: []float64{0, 1.5, 0.25, 1}},
	}
	b := svgOf(t, "symm top --record <gpu0>\nsecond line", "seconds", "MiB", series)
	require.Equal(t, b, svgOf(t, "symm top --record <gpu0>\nsecond line", "seconds", "MiB", series), "deterministic")
	doc := parseSVG(t, b)
	require.Len(t, doc.Lines, 2)
	require.Equal(t, "reserved <pool & co>", doc.Lines[0].Title)
	require.Empty(t, doc.Lines[0].Dash)
	require.NotEmpty(t, doc.Lines[1].Dash)
	for _, want := range []string{"symm top --record <gpu0>", "second line", "seconds", "MiB", "reserved <pool & co>", "allocated",
		"0.0", "0.2", "1.4", "2.5"} { // ticks: x by 0.2 s, y by 0.5 MiB up to 2.5 (room above 2)
		require.Contains(t, doc.Texts, want)
	}
	// The flat run of the first line is drawn as its two ends.
	require.Len(t, doc.Lines[0].Points, 3)
	// Its highest point is 2 MiB: a tick there, at the same pixel.
	f := newPlotFrame(2, series)
	require.Equal(t, pixels(f.py(2)), strconv.FormatFloat(topPixel(doc.Lines[0]), 'f', -1, 64))
	require.Equal(t, pixels(f.py(1.5)), strconv.FormatFloat(topPixel(doc.Lines[1]), 'f', -1, 64))
}

// A series longer than plotMaxPoints is cut to at most that many, keeping
// its peak.
func TestPlotDownsampleKeepsThePeak(t *testing.T) {
	const n = 12345
	s := plotSeries{Name: "long", Color: "#000", X: make([]float64, n), Y: make([]float64, n)}
	for i := range n {
		s.X[i], s.Y[i] = float64(i), float64(i%97)
	}
	s.Y[4321] = 1000
	d := downsample(s)
	require.LessOrEqual(t, len(d.X), plotMaxPoints)
	require.Equal(t, 1000.0, maxOf(d.Y))
	require.Equal(t, 0.0, d.X[0])
	doc := parseSVG(t, svgOf(t, "long", "x", "y", []plotSeries{s}))
	require.Len(t, doc.Lines, 1)
	require.LessOrEqual(t, len(doc.Lines[0].Points), plotMaxPoints)
	f := newPlotFrame(1, []plotSeries{d})
	require.Equal(t, pixels(f.py(1000)), strconv.FormatFloat(topPixel(doc.Lines[0]), 'f', -1, 64))
}

func TestPlotRefusesWhatCannotBeDrawn(t *testing.T) {
	var b bytes.Buffer
	require.ErrorContains(t, writePlotSVG(&b, "t", "x", "y", nil), "no series")
	require.ErrorContains(t, writePlotSVG(&b, "t", "x", "y", []plotSeries{{Name: "a", X: []float64{1}}}), `series "a" has 1 x and 0 y values`)
	require.ErrorContains(t, writePlotSVG(&b, "t", "x", "y", []plotSeries{{Name: "a", X: []float64{1}, Y: []float64{math.NaN()}}}),
		`series "a": point 0 is not a finite number`)
	require.Zero(t, b.Len())
	// An empty series is drawn as an empty line.
	doc := parseSVG(t, svgOf(t, "t", "x", "y", []plotSeries{{Name: "empty"}, {Name: "one", X: []float64{3}, Y: []float64{4}}}))
	require.Len(t, doc.Lines, 2)
}

// replayedSeries replays as `symm replay ARGS --plot` does and returns the
// chart's series, its unit (bytes per unit of y) and the peaks each line
// must reach, in bytes.
func replayedSeries(t *testing.T, args ...string) (series []plotSeries, unit float64, peaks []uint64) {
	t.Helper()
	o, _, done := replayFlags(args, io.Discard)
	require.False(t, done)
	tr, err := trace.Open(o.path)
	require.NoError(t, err)
	var rows []replayRow
	for _, c := range o.configs() {
		res, err := trace.ReplayWith(tr, c.cfg, trace.Options{Capacity: uint64(o.capacity), FrontMax: uint64(o.frontCache), Samples: plotMaxPoints})
		require.NoError(t, err)
		rows = append(rows, replayRow{Name: c.name, Result: res})
	}
	rec := tr.Recorded()
	_, yLabel, series := replayPlot(o, rec, tr.RecordedSeries(plotMaxPoints), rows)
	unit = map[string]float64{"GiB": 1 << 30, "MiB": 1 << 20}[yLabel]
	require.NotZero(t, unit, yLabel)
	if rec.HasReserved {
		peaks = append(peaks, rec.PeakReserved)
	}
	peaks = append(peaks, rec.PeakAllocated)
	for _, r := range rows {
		peaks = append(peaks, r.PeakReserved, r.PeakAllocated)
	}
	return series, unit, peaks
}

// --plot draws, for the recorded run and each configuration, reserved
// (solid) and allocated (dashed) over the trace's rows: the highest point
// of each line is the peak the table reports, to the byte in the data and
// to the pixel in the image; the table and the JSON are unchanged.
func TestReplayPlot(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gpt2.svg")
	code, plain, _ := runCLI("replay", gpt2Trace)
	require.Equal(t, exitOK, code)
	code, out, errOut := runCLI("replay", gpt2Trace, "--plot", file)
	require.Equal(t, exitOK, code, errOut)
	require.Empty(t, errOut)
	require.Equal(t, plain, out, "the table is the same with --plot")
	svg, err := os.ReadFile(file)
	require.NoError(t, err)
	doc := parseSVG(t, svg)

	series, unit, peaks := replayedSeries(t, gpt2Trace, "--plot", file)
	require.Len(t, doc.Lines, 6, "reserved and allocated: recorded, default, expandable")
	require.Len(t, series, 6)
	f := newPlotFrame(1, series)
	for i, s := range series {
		require.LessOrEqual(t, len(s.X), plotMaxPoints)
		top := maxOf(s.Y)
		require.Equal(t, peaks[i], uint64(top*unit), s.Name)
		require.Equal(t, pixels(f.py(top)), strconv.FormatFloat(topPixel(doc.Lines[i]), 'f', -1, 64), s.Name)
		require.Equal(t, s.Name, doc.Lines[i].Title)
		require.Equal(t, i%2 == 1, doc.Lines[i].Dash != "", "%s: allocated dashed, reserved solid", s.Name)
		require.Equal(t, doc.Lines[i-i%2].Stroke, doc.Lines[i].Stroke, "one colour per configuration")
	}
	require.NotEqual(t, doc.Lines[0].Stroke, doc.Lines[2].Stroke)
	require.NotEqual(t, doc.Lines[2].Stroke, doc.Lines[4].Stroke)
	// The legend names each line with the peak of the table's row.
	rec, def, exp := tableRow(t, out, "recorded (trace)"), tableRow(t, out, "default"), tableRow(t, out, "expandable")
	for _, want := range []string{
		"recorded (trace): reserved, peak " + rec[1] + " MiB", "recorded (trace): allocated, peak " + rec[0] + " MiB",
		"libsymm default: reserved, peak " + def[1] + " MiB", "libsymm default: allocated, peak " + def[0] + " MiB",
		"libsymm expandable: reserved, peak " + exp[1] + " MiB", "libsymm expandable: allocated, peak " + exp[0] + " MiB",
		"Allocated and reserved memory over the trace gpt2_train_trace.csv.gz", "row of the trace", "GiB", "35000", "14",
	} {
		require.Contains(t, doc.Texts, want)
	}

	// The same bytes every time; the JSON is the same with --plot.
	code, _, _ = runCLI("replay", gpt2Trace, "--plot", file)
	require.Equal(t, exitOK, code)
	again, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, svg, again)
	code, jsonPlain, _ := runCLI("replay", "--json", gpt2Trace)
	require.Equal(t, exitOK, code)
	code, jsonPlot, _ := runCLI("replay", "--json", gpt2Trace, "--plot", file)
	require.Equal(t, exitOK, code)
	require.Equal(t, jsonPlain, jsonPlot)

	// .html: a page with the same image inline.
	page := filepath.Join(dir, "gpt2.html")
	code, _, errOut = runCLI("replay", gpt2Trace, "--plot", page)
	require.Equal(t, exitOK, code, errOut)
	html, err := os.ReadFile(page)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(html, []byte("<!DOCTYPE html>\n")), string(html[:50]))
	require.Contains(t, string(html), "<title>Allocated and reserved memory over the trace gpt2_train_trace.csv.gz</title>")
	require.Contains(t, string(html), string(svg))
	require.True(t, bytes.HasSuffix(html, []byte("</html>\n")))
}

// The flags given are in the title; without segment rows there is no
// recorded reserved line; small traces are drawn in MiB.
func TestReplayPlotFlagsAndSmallTrace(t *testing.T) {
	path := writeTrace(t, twoStreams)
	file := filepath.Join(t.TempDir(), "small.SVG")
	code, _, errOut := runCLI("replay", path, "--expandable", "--capacity", "14.5GiB", "--chunk=4MiB", "--plot", file, "--json")
	require.Equal(t, exitOK, code, errOut)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	doc := parseSVG(t, b)
	require.Len(t, doc.Lines, 3, "recorded allocated; expandable reserved and allocated")
	require.Contains(t, doc.Texts, "replayed with --capacity 14.5GiB --chunk 4MiB --expandable")
	require.Contains(t, doc.Texts, "MiB")
	require.Contains(t, doc.Texts, "recorded (trace): allocated, peak 2 MiB")
	require.Contains(t, doc.Texts, "libsymm expandable: reserved, peak 4 MiB") // a 2 MiB granule per stream: no 4 MiB chunk fits a 1 MiB growth
	series, unit, peaks := replayedSeries(t, path, "--expandable", "--capacity", "14.5GiB", "--chunk=4MiB", "--plot", file)
	for i, s := range series {
		require.Equal(t, peaks[i], uint64(maxOf(s.Y)*unit), s.Name)
		require.Equal(t, []float64{0, 1, 2, 3, 4, 5, 6, 7}, s.X, "one point per row: 7 rows and row 0")
	}
}

// A FILE that is neither .svg nor .html is bad usage; one that cannot be
// written, a failure: each one line on stderr, nothing on stdout.
func TestReplayPlotBadFile(t *testing.T) {
	path := writeTrace(t, twoStreams)
	dir := t.TempDir()
	for _, c := range []struct {
		file string
		code int
		msg  string
	}{
		{filepath.Join(dir, "chart.png"), exitUsage,
			`symm replay: --plot "` + filepath.Join(dir, "chart.png") + `": FILE must end in .svg (an SVG image) or .html (an HTML page)` + "\n"},
		{filepath.Join(dir, "svg"), exitUsage, "FILE must end in .svg (an SVG image) or .html (an HTML page)\n"},
		{filepath.Join(dir, "none", "chart.svg"), exitFailure,
			"symm replay: --plot: open " + filepath.Join(dir, "none", "chart.svg") + ": no such file or directory\n"},
		{dir + "/", exitUsage, "FILE must end in .svg"},
	} {
		code, out, errOut := runCLI("replay", path, "--plot", c.file)
		require.Equal(t, c.code, code, "%s: %s", c.file, errOut)
		require.Empty(t, out, c.file)
		require.Contains(t, errOut, c.msg, c.file)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		_, err := os.Stat(c.file)
		require.True(t, os.IsNotExist(err) || c.file == dir+"/", c.file)
	}
	// A directory named like an image: the write fails.
	sub := filepath.Join(dir, "dir.svg")
	require.NoError(t, os.Mkdir(sub, 0o755))
	code, out, errOut := runCLI("replay", path, "--plot", sub)
	require.Equal(t, exitFailure, code)
	require.Empty(t, out)
	require.Equal(t, "symm replay: --plot: open "+sub+": is a directory\n", errOut)
}

// docs/replay_gpt2.svg, the image docs/REPLAY.md shows, is what the tool
// draws now.
func TestReplayPlotDocsImage(t *testing.T) {
	file := filepath.Join(t.TempDir(), "replay_gpt2.svg")
	code, _, errOut := runCLI("replay", gpt2Trace, "--plot", file)
	require.Equal(t, exitOK, code, errOut)
	got, err := os.ReadFile(file)
	require.NoError(t, err)
	want, err := os.ReadFile("../../docs/replay_gpt2.svg")
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got),
		"docs/replay_gpt2.svg is not what the tool draws: go run ./cmd/symm replay bench/testdata/gpt2_train_trace.csv.gz --plot docs/replay_gpt2.svg")
}
