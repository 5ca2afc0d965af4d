package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/gdamore/tcell/v2"
)

// The live view of symm top, drawn with tcell (github.com/gdamore/tcell/v2):
// it owns the terminal (alternate screen, raw keys, resizes) through
// terminfo, so no escape sequence is written by hand, and its simulation
// screen lets tests read what is drawn.
//
// Keys: up/down (k/j) select a row, s sorts by the next column, enter shows
// the selected process in detail, esc or backspace goes back, q or ctrl-c
// quits.

// topView is the live view's state between draws.
type topView struct {
	o        topOptions
	sortCol  int
	selected int // row index in the table
	detail   int // pid shown in detail; 0: the table
	snap     *snapshot
	rows     []row
}

func runTUI(o topOptions, rec *recorder) error {
	sc, err := tcell.NewScreen()
	if err != nil {
		return err
	}
	if err := sc.Init(); err != nil {
		return err
	}
	defer sc.Fini()
	return topLoop(sc, o, rec, nil, nil)
}

// topLoop draws and handles keys until q; refreshes come every o.interval.
// snapshots, when set (tests), replaces reading the pages; drawn, when set
// (tests), runs after each draw, on this goroutine.
func topLoop(sc tcell.Screen, o topOptions, rec *recorder, snapshots func() *snapshot, drawn func()) error {
	v := &topView{o: o, sortCol: sortIndex(o.sortBy), detail: o.pid}
	take := snapshots
	if take == nil {
		take = func() *snapshot { return takeSnapshot(o.dir) }
	}
	refresh := func() error {
		v.snap = take()
		v.rows = v.snap.rows(topColumns[v.sortCol])
		v.selected = min(v.selected, max(len(v.rows)-1, 0))
		return rec.add(v.snap)
	}
	if err := refresh(); err != nil {
		return err
	}
	events := make(chan tcell.Event, 16)
	quit := make(chan struct{})
	defer close(quit)
	go sc.ChannelEvents(events, quit)
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		v.draw(sc)
		if drawn != nil {
			drawn()
		}
		select {
		case <-tick.C:
			if err := refresh(); err != nil {
				return err
			}
		case ev := <-events:
			switch ev := ev.(type) {
			case *tcell.EventResize:
				sc.Sync()
			case *tcell.EventKey:
				if v.key(ev) {
					return nil
				}
			case nil:
				return nil
			}
		}
	}
}

// key handles one key; it reports whether to quit.
func (v *topView) key(ev *tcell.EventKey) bool {
	switch {
	case ev.Key() == tcell.KeyCtrlC || (ev.Key() == tcell.KeyRune && ev.Rune() == 'q'):
		return true
	case ev.Key() == tcell.KeyUp || (ev.Key() == tcell.KeyRune && ev.Rune() == 'k'):
		v.selected = max(v.selected-1, 0)
	case ev.Key() == tcell.KeyDown || (ev.Key() == tcell.KeyRune && ev.Rune() == 'j'):
		v.selected = min(v.selected+1, max(len(v.rows)-1, 0))
	case ev.Key() == tcell.KeyRune && ev.Rune() == 's':
		v.sortCol = (v.sortCol + 1) % len(topColumns)
		v.rows = v.snap.rows(topColumns[v.sortCol])
	case ev.Key() == tcell.KeyEnter:
		if v.selected < len(v.rows) {
			v.detail = v.rows[v.selected].page.PID
		}
	case ev.Key() == tcell.KeyEscape || ev.Key() == tcell.KeyBackspace || ev.Key() == tcell.KeyBackspace2:
		v.detail = 0
	}
	return false
}

// draw puts the text view on the screen: the table's header in reverse,
// the selected row highlighted, the device bars coloured.
func (v *topView) draw(sc tcell.Screen) {
	sc.Clear()
	w, h := sc.Size()
	lines := v.snap.textView(topColumns[v.sortCol], v.detail)
	help := "q quit  s sort  up/down select  enter details  esc back"
	header := tableHeader()
	rowAt := -1
	for y, l := range lines {
		if y >= h-1 {
			break
		}
		style := tcell.StyleDefault
		switch {
		case y == 0:
			style = style.Bold(true)
		case l == header && v.detail == 0:
			style = style.Reverse(true)
			rowAt = y + 1
		case rowAt >= 0 && y-rowAt == v.selected && y-rowAt < len(v.rows):
			style = style.Background(tcell.ColorTeal).Foreground(tcell.ColorBlack)
		case strings.HasPrefix(l, "skipped ") || strings.HasPrefix(l, "removed "):
			style = style.Foreground(tcell.ColorYellow)
		}
		if strings.HasPrefix(l, "GPU ") || strings.HasPrefix(l, "host ") {
			drawBar(sc, y, l)
			continue
		}
		put(sc, 0, y, w, l, style)
	}
	put(sc, 0, h-1, w, fmt.Sprintf("%-*s", w, help), tcell.StyleDefault.Reverse(true))
	sc.Show()
}

// drawBar draws a device line with its bar's parts in colour.
func drawBar(sc tcell.Screen, y int, l string) {
	w, _ := sc.Size()
	colors := map[rune]tcell.Color{'#': tcell.ColorGreen, '=': tcell.ColorYellow, '-': tcell.ColorRed, '.': tcell.ColorGray}
	x, inBar := 0, false
	for _, r := range l {
		if x >= w {
			return
		}
		style := tcell.StyleDefault
		switch {
		case r == '[':
			inBar = true
		case r == ']':
			inBar = false
		case inBar:
			style = style.Foreground(colors[r])
		}
		sc.SetContent(x, y, r, nil, style)
		x++
	}
}

func put(sc tcell.Screen, x, y, w int, s string, style tcell.Style) {
	for _, r := range s {
		if x >= w {
			return
		}
		sc.SetContent(x, y, r, nil, style)
		x++
	}
}
