package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
)

// TestGPUCaptureReuse runs the shape of PyTorch's
// test_graph_capture_reclaim_2_streams on the driver, through the pool: a
// block made on s1 and used on s2 (record_stream) is freed during the
// capture; before s2 joins s1 it is not reused, after the join it is.
func TestGPUCaptureReuse(t *testing.T) {
	b, _ := gpu(t)
	d := b.d
	if _, err := d.need(fnGraphAddEmptyNode); err != nil {
		t.Skipf("no graph functions: %v", err)
	}
	s1, err := d.streamCreate(0)
	require.NoError(t, err)
	defer d.streamDestroy(0, s1)
	s2, err := d.streamCreate(0)
	require.NoError(t, err)
	defer d.streamDestroy(0, s2)
	fork, err := d.eventCreate(0)
	require.NoError(t, err)
	defer d.eventDestroy(0, fork)
	join, err := d.eventCreate(0)
	require.NoError(t, err)
	defer d.eventDestroy(0, join)

	for _, reuse := range []bool{true, false} {
		p, err := allocator.New(b, allocator.Config{CaptureReuse: reuse})
		require.NoError(t, err)
		id := allocator.PoolID{First: 99}
		require.NoError(t, p.BeginAllocateToPool(0, id, nil))
		alloc := func(st uintptr) uintptr {
			ptr, _, err := p.AllocIn(0, st, 32, id)
			require.NoError(t, err)
			return ptr
		}
		require.NoError(t, d.beginCapture(0, s1))
		alloc(s1) // sink
		data1 := alloc(s1)
		require.NoError(t, d.eventRecord(0, fork, s1))
		require.NoError(t, d.streamWait(0, s2, fork)) // s2 joins the capture
		alloc(s2)
		require.NoError(t, p.RecordStream(data1, s2))
		require.NoError(t, p.Free(0, s1, data1, 32))
		require.NotEqual(t, data1, alloc(s1), "before the join")

		// The graph as the driver sees it: s1's dependencies lead back to
		// its own marker, not to s2's. Off, the free added no marker: s1
		// has captured nothing yet, so it depends on nothing.
		deps, capID, capturing, err := b.CaptureDeps(0, s1, nil)
		require.NoError(t, err)
		require.True(t, capturing)
		require.NotZero(t, capID)
		if reuse {
			require.NotEmpty(t, deps)
			_, err = b.NodeDeps(0, deps[0], nil)
			require.NoError(t, err)
		} else {
			require.Empty(t, deps)
		}

		require.NoError(t, d.eventRecord(0, join, s2))
		require.NoError(t, d.streamWait(0, s1, join))
		data3 := alloc(s1)
		if reuse {
			require.Equal(t, data1, data3, "after the join")
		} else {
			require.NotEqual(t, data1, data3, "off: deferred until the capture ends")
		}
		require.NoError(t, d.endCapture(0, s1))
		require.NoError(t, p.EndAllocateToPool(0, id))
		require.NoError(t, p.ReleasePool(0, id, false))
		require.NoError(t, d.streamSync(0, s1))
		require.NoError(t, d.streamSync(0, s2))
	}

	// A stream that is not capturing gets no marker.
	_, _, capturing, err := b.MarkFree(0, s2)
	require.NoError(t, err)
	require.False(t, capturing)
	_, _, capturing, err = b.MarkFree(0, 0)
	require.NoError(t, err)
	require.False(t, capturing)
}
