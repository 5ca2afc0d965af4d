package main

// Line charts as SVG, written by hand: a few lines over one x axis (trace
// rows, seconds: whatever the caller plots), with ticks, a legend and a
// title. The same input gives the same bytes.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// plotSeries is one line of a chart: Y[i] at X[i], in the units of the
// axes' labels. X should not go back.
type plotSeries struct {
	Name   string // in the legend
	Dashed bool   // dashed and thinner; otherwise solid
	Color  string // an SVG colour: "#1f77b4"
	X      []float64
	Y      []float64
}

// plotMaxPoints is the most points a line keeps: longer series are cut into
// runs of consecutive points, each drawn as its first x and its largest y,
// so that no peak is lost.
const plotMaxPoints = 1000

// The chart's layout, in pixels. Products added to something are
// converted with float64(), which rounds them there: never fused into a
// multiply-add (as Go may do on arm64), the same bytes on every machine.
const (
	plotW       = 960.0 // the whole image
	plotLeft    = 76.0  // room for the y ticks' labels and the y label
	plotRight   = 24.0
	plotH       = 360.0 // the plotting area
	plotTitle   = 26.0  // the first title line's baseline
	plotTitleLn = 18.0  // each further title line
	plotLegendH = 20.0  // one legend row
	plotLegendN = 2     // legend entries per row
)

// plotFrame maps data to pixels and holds the axes' ticks.
type plotFrame struct {
	top            float64 // the plotting area's top edge; it spans plotLeft..plotW-plotRight
	x0, x1, y0, y1 float64 // the data range shown
	xTicks, yTicks []float64
	xDec, yDec     int // decimals of the tick labels
}

// newPlotFrame fits the axes to the series: x over exactly their range, y
// from 0 (or below, for negative values) to the tick at or above their
// largest value.
func newPlotFrame(titleLines int, series []plotSeries) plotFrame {
	f := plotFrame{top: plotTitle + float64(plotTitleLn*float64(titleLines-1)) + 22}
	f.x0, f.x1 = math.Inf(1), math.Inf(-1)
	ymin, ymax := 0.0, 0.0
	for _, s := range series {
		for i, x := range s.X {
			f.x0, f.x1 = min(f.x0, x), max(f.x1, x)
			ymin, ymax = min(ymin, s.Y[i]), max(ymax, s.Y[i])
		}
	}
	if f.x0 > f.x1 { // no points at all
		f.x0, f.x1 = 0, 1
	}
	if f.x1 == f.x0 {
		f.x1 = f.x0 + 1
	}
	if ymax == ymin {
		ymax = ymin + 1
	}
	var xStep, yStep float64
	xStep, f.xDec = niceStep(f.x1-f.x0, 8)
	yStep, f.yDec = niceStep(ymax-ymin, 8)
	// float64(): rounded here, never fused into a later add (the same bytes
	// on every machine).
	f.y0 = float64(math.Floor(ymin/yStep) * yStep)
	f.y1 = float64(math.Ceil(ymax/yStep) * yStep)
	if f.y1-ymax < (f.y1-f.y0)/50 { // room above the highest point
		f.y1 += yStep
	}
	f.xTicks = ticks(f.x0, f.x1, xStep)
	f.yTicks = ticks(f.y0, f.y1, yStep)
	return f
}

// niceStep is the step between ticks, 1, 2 or 5 times a power of ten,
// giving at most about n ticks over span, and the decimals its labels need.
// (No logarithms: the same bytes on every machine.)
func niceStep(span float64, n int) (step float64, decimals int) {
	raw := span / float64(n)
	p := 1.0
	for p*10 <= raw {
		p *= 10
	}
	for p > raw {
		p /= 10
		decimals++
	}
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw {
			return m * p, decimals
		}
	}
	return p * 10, max(decimals-1, 0)
}

// ticks are the multiples of step from lo to hi.
func ticks(lo, hi, step float64) []float64 {
	var out []float64
	for k := math.Ceil(lo / step); k*step <= hi*(1+1e-12) && len(out) < 100; k++ {
		out = append(out, float64(k*step))
	}
	return out
}

// px and py are the pixel coordinates of data x and y.
func (f plotFrame) px(x float64) float64 {
	return plotLeft + (x-f.x0)*(plotW-plotLeft-plotRight)/(f.x1-f.x0)
}

func (f plotFrame) py(y float64) float64 {
	return f.top + plotH - (y-f.y0)*plotH/(f.y1-f.y0)
}

func (f plotFrame) bottom() float64 { return f.top + plotH }

// pixels writes a pixel coordinate: one decimal, none when it is 0.
func pixels(v float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0")
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;")

func esc(s string) string { return xmlEscaper.Replace(s) }

// checkSeries refuses what cannot be drawn.
func checkSeries(series []plotSeries) error {
	if len(series) == 0 {
		return errors.New("plot: no series")
	}
	for _, s := range series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("plot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		for i := range s.X {
			if math.IsNaN(s.X[i]) || math.IsInf(s.X[i], 0) || math.IsNaN(s.Y[i]) || math.IsInf(s.Y[i], 0) {
				return fmt.Errorf("plot: series %q: point %d is not a finite number", s.Name, i)
			}
		}
	}
	return nil
}

// downsample cuts a series longer than plotMaxPoints into runs of
// consecutive points, each the first's x and the largest y.
func downsample(s plotSeries) plotSeries {
	n := len(s.X)
	if n <= plotMaxPoints {
		return s
	}
	width := (n + plotMaxPoints - 1) / plotMaxPoints
	out := s
	out.X, out.Y = nil, nil
	for i := 0; i < n; i += width {
		y := s.Y[i]
		for _, v := range s.Y[i+1 : min(i+width, n)] {
			y = max(y, v)
		}
		out.X, out.Y = append(out.X, s.X[i]), append(out.Y, y)
	}
	return out
}

// polylinePoints writes a series' points in pixels, leaving out the middle
// of a horizontal run and repeats (the line drawn is the same).
func (f plotFrame) polylinePoints(s plotSeries) string {
	xs, ys := make([]string, len(s.X)), make([]string, len(s.X))
	for i := range s.X {
		xs[i], ys[i] = pixels(f.px(s.X[i])), pixels(f.py(s.Y[i]))
	}
	var b strings.Builder
	last := -1
	for i := range xs {
		if last >= 0 && xs[i] == xs[last] && ys[i] == ys[last] {
			continue
		}
		if last >= 0 && i+1 < len(xs) && ys[i] == ys[last] && ys[i+1] == ys[i] {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(xs[i] + "," + ys[i])
		last = i
	}
	return b.String()
}

// strokeStyle is a line's stroke: solid, or dashed and thinner.
func strokeStyle(s plotSeries) string {
	if s.Dashed {
		return fmt.Sprintf(`stroke="%s" stroke-width="1.2" stroke-dasharray="5 3"`, esc(s.Color))
	}
	return fmt.Sprintf(`stroke="%s" stroke-width="1.8"`, esc(s.Color))
}

// writePlotSVG writes a standalone SVG image: the series as lines (in
// order, the first underneath), axes with ticks and labels, the title (its
// lines: the first in bold) above and the legend below. Series longer than
// plotMaxPoints are downsampled, keeping each run's largest y.
func writePlotSVG(w io.Writer, title, xLabel, yLabel string, series []plotSeries) error {
	if err := checkSeries(series); err != nil {
		return err
	}
	drawn := make([]plotSeries, len(series))
	for i, s := range series {
		drawn[i] = downsample(s)
	}
	lines := strings.Split(title, "\n")
	f := newPlotFrame(len(lines), drawn)
	legendTop := f.bottom() + 58
	legendRows := (len(drawn) + plotLegendN - 1) / plotLegendN
	height := legendTop + float64(plotLegendH*float64(legendRows)) + 6
	right := plotW - plotRight

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %[1]s %[2]s" font-family="sans-serif" font-size="12">`+"\n",
		pixels(plotW), pixels(height))
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(lines[0]))
	fmt.Fprintf(&b, `<rect width="%s" height="%s" fill="white"/>`+"\n", pixels(plotW), pixels(height))
	for i, l := range lines {
		style := `font-size="15" font-weight="bold"`
		if i > 0 {
			style = `font-size="12"`
		}
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle" %s>%s</text>`+"\n",
			pixels(plotW/2), pixels(plotTitle+float64(plotTitleLn*float64(i))), style, esc(l))
	}

	// Grid and ticks.
	b.WriteString(`<g stroke="#e4e4e4" stroke-width="1">` + "\n")
	for _, y := range f.yTicks {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%[2]s"/>`+"\n", pixels(plotLeft), pixels(f.py(y)), pixels(right))
	}
	for _, x := range f.xTicks {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%[1]s" y2="%[3]s"/>`+"\n", pixels(f.px(x)), pixels(f.top), pixels(f.bottom()))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g fill="#333">` + "\n")
	for _, y := range f.yTicks {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n",
			pixels(plotLeft-6), pixels(f.py(y)+4), strconv.FormatFloat(y, 'f', f.yDec, 64))
	}
	for _, x := range f.xTicks {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n",
			pixels(f.px(x)), pixels(f.bottom()+16), strconv.FormatFloat(x, 'f', f.xDec, 64))
	}
	fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n",
		pixels((plotLeft+right)/2), pixels(f.bottom()+36), esc(xLabel))
	midY := pixels(f.top + plotH/2)
	fmt.Fprintf(&b, `<text x="18" y="%s" text-anchor="middle" transform="rotate(-90 18 %[1]s)">%s</text>`+"\n", midY, esc(yLabel))
	b.WriteString("</g>\n")
	fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#888"/>`+"\n",
		pixels(plotLeft), pixels(f.top), pixels(right-plotLeft), pixels(plotH))

	// The lines.
	b.WriteString(`<g fill="none" stroke-linejoin="round">` + "\n")
	for _, s := range drawn {
		fmt.Fprintf(&b, `<polyline %s points="%s"><title>%s</title></polyline>`+"\n", strokeStyle(s), f.polylinePoints(s), esc(s.Name))
	}
	b.WriteString("</g>\n")

	// The legend: plotLegendN entries a row.
	colW := (right - plotLeft) / plotLegendN
	b.WriteString(`<g fill="#222">` + "\n")
	for i, s := range drawn {
		x := plotLeft + float64(colW*float64(i%plotLegendN))
		y := legendTop + float64(plotLegendH*float64(i/plotLegendN))
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%[2]s" %[4]s/>`+"\n", pixels(x), pixels(y-4), pixels(x+32), strokeStyle(s))
		fmt.Fprintf(&b, `<text x="%s" y="%s">%s</text>`+"\n", pixels(x+40), pixels(y), esc(s.Name))
	}
	b.WriteString("</g>\n</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// writePlotHTML writes a minimal HTML page showing writePlotSVG's image
// inline.
func writePlotHTML(w io.Writer, title, xLabel, yLabel string, series []plotSeries) error {
	var svg bytes.Buffer
	if err := writePlotSVG(&svg, title, xLabel, yLabel, series); err != nil {
		return err
	}
	head, _, _ := strings.Cut(title, "\n")
	var b bytes.Buffer
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>%s</title>\n</head>\n<body>\n", esc(head))
	b.Write(svg.Bytes())
	b.WriteString("</body>\n</html>\n")
	_, err := w.Write(b.Bytes())
	return err
}
