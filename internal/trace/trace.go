package trace

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Header is the first line of every trace.
const Header = "action,addr,size,stream"

// Action is what an event records; the names are PyTorch's TraceEntry
// actions as torch.cuda.memory._snapshot() spells them.
type Action uint8

const (
	Alloc         Action = iota // a block handed out to a caller
	FreeRequested               // the caller released it; work on its stream may still use it
	FreeCompleted               // the block may be reused: the free Replay performs
	SegmentAlloc                // the allocator took a segment from the driver
	SegmentFree                 // and gave one back
	SegmentMap                  // an expandable segment grew by mapping memory
	SegmentUnmap                // and shrank
	OOM                         // an allocation failed for lack of memory
	Snapshot                    // a snapshot was taken (no memory effect)
	numActions
)

var actionNames = [numActions]string{
	"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
	"segment_map", "segment_unmap", "oom", "snapshot",
}

func (a Action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction returns the action spelled s.
func ParseAction(s string) (Action, bool) {
	for i, n := range actionNames {
		if n == s {
			return Action(i), true
		}
	}
	return 0, false
}

// Event is one line of a trace.
type Event struct {
	Action Action
	Addr   uint64
	Size   uint64
	Stream uint64
	Line   int // line number in the file it was read from (the header is line 1); 0 if not read
}

// Trace is a parsed trace: its events in file order.
type Trace struct {
	Events []Event
}

// Error is a parse failure: the line (1 is the header) and what was wrong.
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Msg) }

// maxLine bounds one line: a valid one is under 100 bytes, so anything this
// long is not a trace, and the bound keeps a corrupt file from using memory.
const maxLine = 64 << 10

// Parse reads a trace in the CSV format. It never panics: bad input gives an
// *Error naming the line and what was wrong with it.
func Parse(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	line := 0
	t := &Trace{}
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if line == 1 {
			if err := checkHeader(text); err != nil {
				return nil, err
			}
			continue
		}
		if text == "" {
			continue
		}
		ev, err := parseLine(text, line)
		if err != nil {
			return nil, err
		}
		t.Events = append(t.Events, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, &Error{Line: line + 1, Msg: readError(err)}
	}
	if line == 0 {
		return nil, &Error{Line: 1, Msg: "empty input: missing header " + Header}
	}
	return t, nil
}

func readError(err error) string {
	if err == bufio.ErrTooLong {
		return fmt.Sprintf("line longer than %d bytes: not a trace", maxLine)
	}
	return "read failed: " + err.Error()
}

// checkHeader accepts the header with spaces after commas and a UTF-8 byte
// order mark, as spreadsheets write them.
func checkHeader(text string) error {
	if strings.ReplaceAll(strings.TrimPrefix(text, "\ufeff"), " ", "") != Header {
		return &Error{Line: 1, Msg: fmt.Sprintf("missing header %q (got %q)", Header, clip(text))}
	}
	return nil
}

// parseLine reads one event line (not blank, not the header).
func parseLine(text string, line int) (Event, error) {
	f := strings.Split(text, ",")
	if len(f) != 4 {
		return Event{}, &Error{Line: line, Msg: fmt.Sprintf("%d columns, want 4 (%s)", len(f), Header)}
	}
	a, ok := ParseAction(strings.TrimSpace(f[0]))
	if !ok {
		return Event{}, &Error{Line: line, Msg: fmt.Sprintf("unknown action %q (want one of %s)",
			clip(strings.TrimSpace(f[0])), strings.Join(actionNames[:], ", "))}
	}
	ev := Event{Action: a, Line: line}
	for i, dst := range []*uint64{&ev.Addr, &ev.Size, &ev.Stream} {
		v, err := parseField(strings.TrimSpace(f[i+1]), []string{"addr", "size", "stream"}[i])
		if err != nil {
			return Event{}, &Error{Line: line, Msg: err.Error()}
		}
		*dst = v
	}
	return ev, nil
}

func parseField(s, name string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	switch {
	case err == nil:
		return v, nil
	case s == "":
		return 0, fmt.Errorf("%s is empty", name)
	case strings.HasPrefix(s, "-"):
		return 0, fmt.Errorf("%s %q is negative", name, clip(s))
	case strings.Trim(s, "0123456789") == "":
		return 0, fmt.Errorf("%s %q does not fit in 64 bits", name, clip(s))
	}
	return 0, fmt.Errorf("%s %q is not a non-negative decimal integer", name, clip(s))
}

// clip shortens what a message quotes from the input, so a garbage line
// does not make a garbage message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Open reads the trace at path, gunzipping it when it starts with gzip's
// magic bytes (whatever its name). Errors name the path.
func Open(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%s: gzip: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	t, err := Parse(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// WriteCSV writes t in the format Parse reads; Parse of the output gives
// the same events (Line aside).
func (t *Trace) WriteCSV(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, Header)
	for _, e := range t.Events {
		fmt.Fprintf(bw, "%s,%d,%d,%d\n", e.Action, e.Addr, e.Size, e.Stream)
	}
	return bw.Flush()
}
