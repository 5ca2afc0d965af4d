package allocator

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

const sD = uintptr(0x4000)

// captureRig is a pool over a fakeGraph with a private pool routing, as
// during torch.cuda.graph: allocations go to graphPool; sA captures.
type captureRig struct {
	t *testing.T
	p *Pool
	g *fakeGraph
}

func newCaptureRig(t *testing.T, reuse bool) *captureRig {
	g := newFakeGraph(1)
	p, err := New(g, Config{CaptureReuse: reuse})
	require.NoError(t, err)
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	g.begin(sA, 1)
	return &captureRig{t: t, p: p, g: g}
}

func (r *captureRig) alloc(st uintptr) uintptr {
	r.t.Helper()
	ptr, _, err := r.p.AllocIn(0, st, 32, graphPool)
	require.NoError(r.t, err)
	return ptr
}

func (r *captureRig) free(st, ptr uintptr) {
	r.t.Helper()
	require.NoError(r.t, r.p.Free(0, st, ptr, 32))
}

// endCapture ends the capture and its routing, and releases the graph's
// pool: empty_cache then waits for the pending frees (their events are
// recorded only now) and completes them.
func (r *captureRig) endCapture() {
	r.t.Helper()
	r.g.end(1)
	require.NoError(r.t, r.p.EndAllocateToPool(0, graphPool))
	require.NoError(r.t, r.p.ReleasePool(0, graphPool, false))
	require.NoError(r.t, r.p.EmptyCache())
	require.Equal(r.t, stat(r.t, r.p, 0, "active.all.current"), stat(r.t, r.p, 0, "allocation.all.current"), "nothing pending after the capture")
	check(r.t, r.p)
}

// twoStreams is the shape of PyTorch's test_graph_capture_reclaim_2_streams
// up to the free of data1: data1, made on sA, is read on sB and freed.
func (r *captureRig) twoStreams() (data1 uintptr) {
	r.alloc(sA) // sink
	data1 = r.alloc(sA)
	r.g.wait(sB, sA) // fork
	r.alloc(sB)
	r.g.kernel(sB) // reads data1
	require.NoError(r.t, r.p.RecordStream(data1, sB))
	r.free(sA, data1)
	return data1
}

func TestCaptureReuseTwoStreams(t *testing.T) {
	r := newCaptureRig(t, true)
	data1 := r.twoStreams()
	data2 := r.alloc(sA)
	require.NotEqual(t, data1, data2, "before the join sB may still read data1")
	check(t, r.p)
	r.g.wait(sA, sB) // join
	r.g.kernel(sA)
	data3 := r.alloc(sA)
	require.Equal(t, data1, data3, "after the join the graph orders sB's read first")
	require.Empty(t, r.g.events, "no event during the capture")
	check(t, r.p)
	r.endCapture()
}

func TestCaptureReuseAfterJoinWithoutWork(t *testing.T) {
	// The join alone (no work after it) already makes sA's next work follow
	// sB's marker.
	r := newCaptureRig(t, true)
	data1 := r.twoStreams()
	r.g.wait(sA, sB)
	require.Equal(t, data1, r.alloc(sA))
	r.endCapture()
}

func TestCaptureReusePartialJoins(t *testing.T) {
	// PyTorch's test_graph_capture_reclaim_4_streams: data1 read on sB, sC
	// and sD; sB joins sA, sD joins sC: not yet; sC joins sA: reuse.
	r := newCaptureRig(t, true)
	data1 := r.alloc(sA)
	r.alloc(sA) // sink1
	sink3 := r.alloc(sA)
	for _, st := range []uintptr{sB, sC, sD} {
		r.g.wait(st, sA)
		r.alloc(st)
		r.g.kernel(st)
		require.NoError(t, r.p.RecordStream(data1, st))
	}
	r.free(sA, data1)
	r.g.wait(sA, sB)
	r.g.kernel(sA)
	r.g.wait(sC, sD)
	r.g.kernel(sC)
	require.NoError(t, r.p.RecordStream(sink3, sC))
	data2 := r.alloc(sA)
	require.NotEqual(t, data1, data2, "sC and sD have not joined sA")
	r.g.wait(sA, sC)
	r.g.kernel(sA)
	require.Equal(t, data1, r.alloc(sA))
	check(t, r.p)
	r.endCapture()
}

func TestCaptureReuseOnlyOnItsStream(t *testing.T) {
	// sB, fully joined, still does not get sA's block (PyTorch reuses it
	// only for its own stream); sA does.
	r := newCaptureRig(t, true)
	data1 := r.twoStreams()
	r.g.wait(sA, sB)
	r.g.wait(sB, sA)
	require.NotEqual(t, data1, r.alloc(sB))
	require.Equal(t, data1, r.alloc(sA))
	r.endCapture()
}

func TestCaptureReuseOff(t *testing.T) {
	r := newCaptureRig(t, false)
	data1 := r.twoStreams()
	r.g.wait(sA, sB)
	r.g.kernel(sA)
	require.NotEqual(t, data1, r.alloc(sA), "off: deferred until the capture ends")
	require.Zero(t, r.g.calls["mark"]+r.g.calls["deps"]+r.g.calls["node"], "off: the graph is not touched")
	r.endCapture()
}

func TestCaptureReuseSettingChangedMidCapture(t *testing.T) {
	// Freed while off: deferred until the capture ends even once on, as in
	// PyTorch (no markers were recorded).
	r := newCaptureRig(t, false)
	data1 := r.twoStreams()
	_, err := r.p.ApplyTorchSettings("graph_capture_record_stream_reuse:True")
	require.NoError(t, err)
	require.True(t, r.p.CaptureReuse())
	r.g.wait(sA, sB)
	require.NotEqual(t, data1, r.alloc(sA))

	// Freed while on, then turned off: no scan, so no reuse.
	x := r.alloc(sA)
	r.g.wait(sB, sA)
	r.g.kernel(sB)
	require.NoError(t, r.p.RecordStream(x, sB))
	r.free(sA, x)
	_, err = r.p.ApplyTorchSettings("expandable_segments:False") // keeps it
	require.NoError(t, err)
	require.True(t, r.p.CaptureReuse())
	_, err = r.p.ApplyTorchSettings("graph_capture_record_stream_reuse:False")
	require.NoError(t, err)
	r.g.wait(sA, sB)
	require.NotEqual(t, x, r.alloc(sA))
	r.endCapture()
}

func TestCaptureReuseStreamNotCapturing(t *testing.T) {
	// sC never joined the capture: its use cannot be ordered by the graph.
	r := newCaptureRig(t, true)
	data1 := r.twoStreams()
	x := r.alloc(sA)
	r.g.wait(sB, sA)
	r.g.kernel(sB)
	require.NoError(t, r.p.RecordStream(x, sB))
	require.NoError(t, r.p.RecordStream(x, sC))
	r.free(sA, x)
	r.g.wait(sA, sB)
	r.g.kernel(sA)
	y := r.alloc(sA)
	require.Equal(t, data1, y, "data1 had only sB")
	require.NotEqual(t, x, r.alloc(sA), "x was used on sC, which is not capturing")
	r.endCapture()
}

func TestCaptureReuseWithoutGrapher(t *testing.T) {
	// A backend that cannot see graphs (host): the setting changes nothing.
	p, _ := newPool(t, Config{CaptureReuse: true})
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	a, _, err := p.AllocIn(0, sA, 32, graphPool)
	require.NoError(t, err)
	require.NoError(t, p.RecordStream(a, sB))
	require.NoError(t, p.Free(0, sA, a, 32))
	b, _, err := p.AllocIn(0, sA, 32, graphPool)
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	require.NoError(t, p.EndAllocateToPool(0, graphPool))
	check(t, p)
}

func TestCaptureReuseDriverErrors(t *testing.T) {
	boom := errors.New("FAKE_ERROR_STREAM_CAPTURE_INVALIDATED")
	t.Run("mark", func(t *testing.T) {
		// The second marker fails: the block keeps no marks and waits for
		// the end of the capture; nothing is lost.
		r := newCaptureRig(t, true)
		r.alloc(sA)
		data1 := r.alloc(sA)
		r.g.wait(sB, sA)
		r.g.kernel(sB)
		require.NoError(t, r.p.RecordStream(data1, sB))
		r.g.failNth("mark", 2, boom) // sB's marker, after sA's

		r.free(sA, data1)
		r.g.wait(sA, sB)
		r.g.kernel(sA)
		require.NotEqual(t, data1, r.alloc(sA))
		check(t, r.p)
		r.endCapture()
	})
	for _, op := range []string{"deps", "node"} {
		t.Run(op, func(t *testing.T) {
			// The walk fails once: no reuse at that allocation; the next
			// walks again from scratch and reuses.
			r := newCaptureRig(t, true)
			data1 := r.twoStreams()
			r.g.wait(sA, sB)
			r.g.kernel(sA)
			r.g.fail[op] = boom
			require.NotEqual(t, data1, r.alloc(sA))
			check(t, r.p)
			require.Equal(t, data1, r.alloc(sA))
			r.endCapture()
		})
	}
}

func TestCaptureReuseIncrementalWalk(t *testing.T) {
	// Nodes seen once are not asked for again within a capture.
	r := newCaptureRig(t, true)
	data1 := r.twoStreams()
	r.alloc(sA)
	walked := r.g.calls["node"]
	require.NotZero(t, walked)
	r.g.kernel(sA)
	r.alloc(sA)
	require.Equal(t, walked+1, r.g.calls["node"], "only the new node is walked")
	r.g.wait(sA, sB)
	require.Equal(t, data1, r.alloc(sA))
	r.endCapture()
}
