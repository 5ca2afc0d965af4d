package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// symm top --record: every refresh kept as a JSON line, or drawn as a chart.

// recorder keeps what --record asks for: snapshots as JSON lines, or a
// chart of allocated and reserved bytes per process over time.
type recorder struct {
	path   string
	jsonl  *os.File
	start  time.Time
	series map[string]*plotSeries // by name
	order  []string
	colors map[string]string // by process and device
}

// topPalette colours the processes of a recorded chart, in order of
// appearance.
var topPalette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

func newRecorder(path string) (*recorder, error) {
	r := &recorder{path: path, series: map[string]*plotSeries{}, colors: map[string]string{}}
	if path == "" {
		return r, nil
	}
	if filepath.Ext(path) == ".jsonl" {
		// 0600 like the pages it copies, and never through a link.
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
		if err == nil {
			if err = f.Chmod(0o600); err != nil { // made by someone else before
				f.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("--record: %w", err)
		}
		r.jsonl = f
	}
	return r, nil
}

func (r *recorder) add(s *snapshot) error {
	if r.path == "" {
		return nil
	}
	if r.jsonl != nil {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		if _, err := r.jsonl.Write(append(jsonSafe(b), '\n')); err != nil {
			return fmt.Errorf("--record: %w", err)
		}
		return nil
	}
	if r.start.IsZero() {
		r.start = s.Time
	}
	t := s.Time.Sub(r.start).Seconds()
	for _, p := range s.Processes {
		for _, d := range p.Devices {
			if d.Stats["reserved_bytes.all.peak"] == 0 {
				continue
			}
			for _, k := range []struct {
				what   string
				stat   string
				dashed bool
			}{{"reserved", "reserved_bytes.all.current", false}, {"allocated", "allocated_bytes.all.current", true}} {
				key := fmt.Sprintf("pid %d %s", p.PID, deviceOf(p.Backend, d.Index))
				name := key + " " + k.what
				ps := r.series[name]
				if ps == nil {
					if _, ok := r.colors[key]; !ok {
						r.colors[key] = topPalette[len(r.colors)%len(topPalette)]
					}
					ps = &plotSeries{Name: name, Dashed: k.dashed, Color: r.colors[key]}
					r.series[name] = ps
					r.order = append(r.order, name)
				}
				ps.X = append(ps.X, t)
				ps.Y = append(ps.Y, float64(d.Stats[k.stat]))
			}
		}
	}
	return r.writePlot()
}

// writePlot rewrites the chart, through a new temporary file (0600, like
// the pages it draws) renamed over it, so that a recorder stopped at any
// moment leaves a whole chart behind and no link is followed.
func (r *recorder) writePlot() error {
	var series []plotSeries
	for _, n := range r.order {
		series = append(series, *r.series[n])
	}
	f, err := os.CreateTemp(filepath.Dir(r.path), "."+filepath.Base(r.path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("--record: %w", err)
	}
	tmp := f.Name()
	title := "symm top --record: memory of libsymm processes over time"
	if filepath.Ext(r.path) == ".html" {
		err = writePlotHTML(f, title, "seconds", "bytes", series)
	} else {
		err = writePlotSVG(f, title, "seconds", "bytes", series)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, r.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--record: %w", err)
	}
	return nil
}

func (r *recorder) close() {
	if r.jsonl != nil {
		r.jsonl.Close()
	}
}
