package allocator

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A capture that begins while an operation is between "no capture is under
// way" and the event call that acts on it must wait for that operation:
// otherwise the capture sees another thread's cuEventRecord or
// cuEventQuery, which invalidates a global-mode capture. Each case stops
// an operation at its first event call (the gate was asked just before),
// starts BeginAllocateToPool on another goroutine, and checks that it does
// not return until the operation is let go, and that no event call is made
// once it has returned. Paths: stealing another stream's idle segment
// (central.go), processing pending record_stream frees (cache.go), a
// record_stream free (events.go), and free pages moved to a mapping
// (pages.go).
func TestCaptureBeginWaitsForEventWork(t *testing.T) {
	type setup func(t *testing.T, p *Pool, f *fakeBackend) (op func() error)
	for _, c := range []struct {
		name string
		cfg  Config
		prep setup
	}{
		{"steal", Config{}, func(t *testing.T, p *Pool, f *fakeBackend) func() error {
			a, _, err := p.Alloc(0, 1, 4*mib)
			require.NoError(t, err)
			require.NoError(t, p.Free(0, 1, a, 4*mib)) // an idle segment of stream 1
			return func() error { _, _, err := p.Alloc(0, 2, 4*mib); return err }
		}},
		{"pending frees", Config{}, func(t *testing.T, p *Pool, f *fakeBackend) func() error {
			a, _, err := p.Alloc(0, 1, mib)
			require.NoError(t, err)
			require.NoError(t, p.RecordStream(a, 2))
			f.launch(2)
			require.NoError(t, p.Free(0, 1, a, mib)) // pending on stream 2's event
			return func() error { _, _, err := p.Alloc(0, 1, mib); return err }
		}},
		{"record_stream free", Config{}, func(t *testing.T, p *Pool, f *fakeBackend) func() error {
			a, _, err := p.Alloc(0, 1, mib)
			require.NoError(t, err)
			require.NoError(t, p.RecordStream(a, 2))
			return func() error { return p.Free(0, 1, a, mib) }
		}},
		{"free pages", Config{Expandable: true, UnmapFreePages: true}, func(t *testing.T, p *Pool, f *fakeBackend) func() error {
			var ptrs []uintptr
			for _, n := range []uint64{4 * mib, 6 * mib, 4 * mib} {
				x, _, err := p.Alloc(0, 0, n)
				require.NoError(t, err)
				ptrs = append(ptrs, x)
			}
			require.NoError(t, p.Free(0, 0, ptrs[1], 6*mib)) // a hole: the next growth asks the stream about it
			return func() error { _, _, err := p.Alloc(0, 0, 8*mib); return err }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(1)
			f.capacity = 256 * mib
			p, err := New(f, c.cfg)
			require.NoError(t, err)
			op := c.prep(t, p, f)

			var capturing atomic.Bool
			var lateCalls atomic.Int32
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			f.onEvent = func(string) {
				if capturing.Load() {
					lateCalls.Add(1)
				}
				once.Do(func() { close(entered); <-release })
			}
			opDone := make(chan error, 1)
			go func() { opDone <- op() }()
			<-entered
			id := PoolID{First: 7}
			begun := make(chan error, 1)
			go func() {
				err := p.BeginAllocateToPool(0, id, nil)
				capturing.Store(true) // the caller's capture begins now
				begun <- err
			}()
			select {
			case <-begun:
				t.Fatal("BeginAllocateToPool returned while an operation was acting on the gate's answer")
			case <-time.After(50 * time.Millisecond):
			}
			close(release)
			require.NoError(t, <-opDone)
			require.NoError(t, <-begun)
			require.Zero(t, lateCalls.Load(), "event calls made after the capture began")

			capturing.Store(false)
			f.onEvent = nil
			require.NoError(t, p.EndAllocateToPool(0, id))
			require.NoError(t, p.ReleasePool(0, id, false))
			f.finish(0)
			f.finish(1)
			f.finish(2)
			require.NoError(t, p.CheckInvariants())
		})
	}
}

// While a routing is open, nothing records, queries or waits for an event,
// and a release does nothing: the gate refuses every hold.
func TestGateRefusesHoldsWhileRouting(t *testing.T) {
	f := newFake(1)
	p, err := New(f, Config{})
	require.NoError(t, err)
	a, _, err := p.Alloc(0, 1, 4*mib)
	require.NoError(t, err)
	require.NoError(t, p.RecordStream(a, 2))
	id := PoolID{First: 3}
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	f.onEvent = func(op string) { t.Errorf("event call %q while a capture may be under way", op) }
	require.NoError(t, p.Free(0, 1, a, 4*mib)) // pending, its event deferred
	b, _, err := p.Alloc(0, 2, 4*mib)          // no steal
	require.NoError(t, err)
	require.NoError(t, p.EmptyCache())
	f.onEvent = nil
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.Free(0, 2, b, 4*mib))
	require.NoError(t, p.ReleasePool(0, id, false))
	require.NoError(t, p.EmptyCache())
	require.Zero(t, reservedNow(t, p))
}
