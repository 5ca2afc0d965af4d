package allocator

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// segmentRecording is tests/data/torch_segment_events.json: a workload and
// the segment events PyTorch's allocator gives its trace trackers for it.
type segmentRecording struct {
	Workload [][]any `json:"workload"`
	Expected [][]any `json:"expected"`
}

var recordedStreams = map[string]uintptr{"s0": 0, "s1": 0x7000}

// replaySegmentWorkload runs rec's workload on device 0 of p and returns
// the addresses of its allocations by name.
func replaySegmentWorkload(t *testing.T, p *Pool, rec segmentRecording) map[string]uintptr {
	addrs := map[string]uintptr{}
	sizes := map[string]uint64{}
	streams := map[string]uintptr{}
	for _, op := range rec.Workload {
		switch op[0] {
		case "alloc":
			name, size, stream := op[1].(string), uint64(op[2].(float64)), recordedStreams[op[3].(string)]
			ptr, _, err := p.Alloc(0, stream, size)
			require.NoError(t, err)
			addrs[name], sizes[name], streams[name] = ptr, size, stream
		case "free":
			name := op[1].(string)
			require.NoError(t, p.Free(0, streams[name], addrs[name], sizes[name]))
		case "empty_cache":
			require.NoError(t, p.EmptyCache())
		default:
			t.Fatalf("unknown operation %v", op)
		}
	}
	return addrs
}

// The segment events of a workload are PyTorch's, in PyTorch's order, and
// nothing is queued while nobody watches.
func TestSegmentEventsMatchPyTorch(t *testing.T) {
	raw, err := os.ReadFile("../tests/data/torch_segment_events.json")
	require.NoError(t, err)
	var rec segmentRecording
	require.NoError(t, json.Unmarshal(raw, &rec))

	p, err := New(NewVirtual(1, 0), Config{})
	require.NoError(t, err)
	replaySegmentWorkload(t, p, rec)
	evs, seq, dropped := p.TakeSegmentEvents(nil)
	require.Empty(t, evs, "nobody watches: nothing queued")
	require.Zero(t, seq+dropped)

	p.WatchSegments(true)
	addrs := replaySegmentWorkload(t, p, rec)
	evs, seq, dropped = p.TakeSegmentEvents(nil)
	require.Zero(t, dropped)
	require.EqualValues(t, len(evs), seq)
	require.Equal(t, seq, p.SegmentEventsQueued())
	var got, want [][]any
	for _, e := range evs {
		got = append(got, []any{e.Action.String(), e.Addr, e.Size, e.Device, e.Stream})
		require.Equal(t, PoolID{}, e.Pool)
	}
	for _, w := range rec.Expected {
		want = append(want, []any{w[0], addrs[w[1].(string)], uint64(w[2].(float64)), int(w[3].(float64)), recordedStreams[w[4].(string)]})
	}
	require.Equal(t, want, got)

	p.WatchSegments(false)
	replaySegmentWorkload(t, p, rec)
	evs, _, _ = p.TakeSegmentEvents(nil)
	require.Empty(t, evs, "off again")
}

// Expandable segments: libsymm maps and unmaps runs of its own chunks
// (SYMM_POOL_EXPANDABLE_CHUNK, 2 MiB, one range for small and large
// requests), where PyTorch maps 2 MiB chunks for small requests and 20 MiB
// ones for large requests in separate segments: the runs differ from
// PyTorch's by design. What holds: every event is a map or an unmap, each
// run a whole number of chunks, and after empty_cache everything mapped is
// unmapped.
func TestSegmentEventsExpandable(t *testing.T) {
	raw, err := os.ReadFile("../tests/data/torch_segment_events.json")
	require.NoError(t, err)
	var rec segmentRecording
	require.NoError(t, json.Unmarshal(raw, &rec))
	p, err := New(NewVirtual(1, 0), Config{Expandable: true})
	require.NoError(t, err)
	p.WatchSegments(true)
	replaySegmentWorkload(t, p, rec)
	evs, _, _ := p.TakeSegmentEvents(nil)
	require.NotEmpty(t, evs)
	var mapped, unmapped uint64
	for _, e := range evs {
		require.Zero(t, e.Size%(2<<20), "%v: whole chunks", e)
		switch e.Action {
		case ActSegmentMap:
			mapped += e.Size
		case ActSegmentUnmap:
			unmapped += e.Size
		default:
			t.Fatalf("%v in an expandable pool", e.Action)
		}
	}
	require.Equal(t, mapped, unmapped)
}

// A watcher that stops taking loses the oldest events, counted.
func TestSegmentEventsBounded(t *testing.T) {
	p, err := New(NewVirtual(1, 0), Config{})
	require.NoError(t, err)
	p.WatchSegments(true)
	n := maxQueuedSegmentEvents/2 + 10
	for i := 0; i < n; i++ { // a segment alloc and free each
		ptr, _, err := p.Alloc(0, 0, 12<<20)
		require.NoError(t, err)
		require.NoError(t, p.Free(0, 0, ptr, 12<<20))
		require.NoError(t, p.EmptyCache())
	}
	evs, seq, dropped := p.TakeSegmentEvents(nil)
	require.Len(t, evs, maxQueuedSegmentEvents)
	require.EqualValues(t, 2*n, seq)
	require.EqualValues(t, 2*n-maxQueuedSegmentEvents, dropped)
	require.Equal(t, ActSegmentFree, evs[len(evs)-1].Action)
}
