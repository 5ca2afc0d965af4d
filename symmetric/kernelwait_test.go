package symmetric

import (
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/kernels"
)

// simGPU is the host provider posing as a device that runs the signal
// kernels itself (kernelRunner), with streams in time: the work queued on a
// stream ends at a known time, a kernel takes kernelTime from when the
// stream reaches it, and a marker (an event) passes once the work queued
// before it has ended. A kernel writes report into its status word (0:
// none), as one whose wait gave up does.
type simGPU struct {
	Provider
	mu         sync.Mutex
	tail       map[uintptr]time.Time // when each stream's queued work ends
	marks      map[uintptr]time.Time // when each marker passes
	next       uintptr
	kernelTime time.Duration
	report     uint64
	launches   int
	forgotten  int
	firstPoll  func() // run once, on the first Passed
	pages      [][]byte
}

func newSimGPU(t *testing.T) *simGPU {
	g := &simGPU{Provider: NewHostProvider(), tail: map[uintptr]time.Time{}, marks: map[uintptr]time.Time{},
		next: 1, kernelTime: time.Millisecond}
	t.Cleanup(func() {
		for _, p := range g.pages {
			unix.Munmap(p)
		}
	})
	return g
}

func (*simGPU) Name() string  { return "simgpu" }
func (*simGPU) kernelDevice() {}

// queue puts d of work at the end of stream and returns when it starts.
func (g *simGPU) queue(stream uintptr, d time.Duration) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queueLocked(stream, d)
}

func (g *simGPU) queueLocked(stream uintptr, d time.Duration) time.Time {
	start := time.Now()
	if t := g.tail[stream]; t.After(start) {
		start = t
	}
	g.tail[stream] = start.Add(d)
	return start
}

func (g *simGPU) Mark(_ int, stream uintptr) (uintptr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.next
	g.next++
	g.marks[m] = g.queueLocked(stream, 0)
	return m, nil
}

func (g *simGPU) Passed(_ int, m uintptr) (bool, error) {
	g.mu.Lock()
	hook := g.firstPoll
	g.firstPoll = nil
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.marks[m]
	if !ok {
		return false, errors.New("simgpu: unknown marker")
	}
	return !time.Now().Before(at), nil
}

func (g *simGPU) Forget(_ int, m uintptr, _ bool) {
	g.mu.Lock()
	delete(g.marks, m)
	g.forgotten++
	g.mu.Unlock()
}

func (g *simGPU) LaunchKernel(_ int, _ uintptr, _, _ uint32, stream uintptr, words []uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queueLocked(stream, g.kernelTime)
	g.launches++
	if g.report != 0 {
		word(uintptr(words[len(words)-1])).Store(g.report) // device address = host address
	}
	return nil
}

func (g *simGPU) HostMapped(_ int, n uint64) (host, device uintptr, err error) {
	p, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return 0, 0, err
	}
	g.mu.Lock()
	g.pages = append(g.pages, p)
	g.mu.Unlock()
	a := uintptrOfBytes(p)
	return a, a, nil
}

// markers is how many markers are still held (not forgotten).
func (g *simGPU) markers() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.marks)
}

// simHandle is a world-of-one handle over g whose signals are g's kernels.
func simHandle(t *testing.T, g *simGPU, timeout time.Duration) *Handle {
	h := soloHandle(t, g, Config{Timeout: timeout, Signals: SignalsKernel})
	m := h.m
	m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} }) // no NVRTC: the kernels are g's
	for id := range h.kstat.fns {
		h.kstat.fns[id].Store(uintptr(id + 1))
	}
	require.NoError(t, m.KernelsReady(0))
	return h
}

const simStream = 0x5000

// A timed call behind long work queued before it on its stream waits for
// that work and then gives the peer its whole timeout: no ErrSignalTimeout,
// the handle stays usable. (Waiting for the whole stream with the deadline
// counted from the launch failed the handle here.)
func TestTimedKernelCallAfterLongEarlierWork(t *testing.T) {
	g := newSimGPU(t)
	h := simHandle(t, g, 10*time.Second)
	const earlier = 1500 * time.Millisecond // longer than 2 × 20ms + 1s
	g.queue(simStream, earlier)
	start := time.Now()
	require.NoError(t, h.WaitSignal(0, 5, simStream, 20*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), earlier, "the call waited for the kernel, after the earlier work")
	require.NoError(t, h.failed())
	require.Equal(t, 0, g.markers(), "both events are given back")

	// The all-reduce with a timeout is waited for alike.
	g.queue(simStream, earlier)
	out := make([]uint32, 4)
	require.NoError(t, h.OneShotAllReduce(AllReduce{Count: 4, Dtype: kernels.Float32, Op: "sum", Out: uintptrOf(out),
		Stream: simStream, Timeout: 20 * time.Millisecond}))
	require.NoError(t, h.Barrier(1, simStream, 20*time.Millisecond), "the handle has not failed")
	require.Equal(t, 2, g.launches, "a barrier in a world of one launches nothing")
}

// Work queued on the stream after the kernel (here by another thread while
// the call waits) is not waited for: the call returns when its kernel is
// done, without ErrSignalTimeout. (Waiting for the whole stream failed the
// handle here.)
func TestTimedKernelCallIgnoresLaterWork(t *testing.T) {
	g := newSimGPU(t)
	h := simHandle(t, g, 10*time.Second)
	g.firstPoll = func() { g.queue(simStream, 1500*time.Millisecond) }
	start := time.Now()
	require.NoError(t, h.WaitSignal(0, 5, simStream, 20*time.Millisecond))
	require.Less(t, time.Since(start), time.Second, "the later work was not waited for")
	require.NoError(t, h.failed())
	require.NoError(t, h.PutSignal(0, 5, simStream, 20*time.Millisecond))
}

// A kernel that reports a late peer still fails the call and the handle,
// naming the peer; so does one that never finishes once the stream has
// reached it.
func TestTimedKernelCallReportsALatePeer(t *testing.T) {
	g := newSimGPU(t)
	h := simHandle(t, g, 10*time.Second)
	g.queue(simStream, 300*time.Millisecond)
	g.report = 1<<63 | kernels.OpWait<<56 | 0<<32 | 5
	err := h.WaitSignal(0, 5, simStream, 20*time.Millisecond)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "wait_signal from rank 0 on channel 5")
	require.ErrorContains(t, err, "rank 0's signal on channel 5 did not come within 20ms")
	require.ErrorIs(t, h.failed(), ErrSignalTimeout)

	g = newSimGPU(t)
	h = simHandle(t, g, 10*time.Second)
	g.kernelTime = time.Hour
	start := time.Now()
	err = h.WaitSignal(0, 6, simStream, 20*time.Millisecond)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "the kernel did not finish within 1.04s of the stream reaching it")
	require.GreaterOrEqual(t, time.Since(start), 1040*time.Millisecond)
	require.ErrorIs(t, h.failed(), ErrSignalTimeout)
}

// Earlier work that holds the stream past SYMM_TIMEOUT_MS: the call gives
// up with ErrSignalTimeout saying so, but the handle does not fail (no peer
// was waited for); the watchdog reads the kernel's word once the stream has
// passed it, gives it back, and fails the handle only if the kernel
// reported a late peer.
func TestTimedKernelCallBehindStuckEarlierWork(t *testing.T) {
	for _, late := range []bool{false, true} {
		g := newSimGPU(t)
		h := simHandle(t, g, 200*time.Millisecond) // the wait for earlier work: max(200ms, 2 × 20ms + 1s)
		if late {
			g.report = 1<<63 | kernels.OpWait<<56 | 0<<32 | 7
		}
		g.queue(simStream, 1600*time.Millisecond)
		start := time.Now()
		err := h.WaitSignal(0, 7, simStream, 20*time.Millisecond)
		took := time.Since(start)
		require.ErrorIs(t, err, ErrSignalTimeout)
		require.ErrorContains(t, err, "the stream has not reached the kernel within 1.04s: earlier work on it is still running")
		require.GreaterOrEqual(t, took, 1040*time.Millisecond)
		require.Less(t, took, 1500*time.Millisecond)
		require.NoError(t, h.failed(), "no peer was waited for")
		slab := func() int {
			h.m.kern.slab.mu.Lock()
			defer h.m.kern.slab.mu.Unlock()
			return len(h.m.kern.slab.free)
		}
		before := slab()
		require.Eventually(t, func() bool { return slab() == before+1 }, 3*time.Second, time.Millisecond,
			"the watchdog gives the word back once the stream has passed the kernel")
		require.Equal(t, 0, g.markers())
		if late {
			err := h.failed()
			require.ErrorIs(t, err, ErrSignalTimeout)
			require.ErrorContains(t, err, "rank 0's signal on channel 7 did not come within 20ms")
		} else {
			require.NoError(t, h.failed())
			require.NoError(t, h.WaitSignal(0, 7, simStream, 20*time.Millisecond))
		}
	}
}

func uintptrOfBytes(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// A kernel queued without a timeout behind work that holds the stream for
// longer than SYMM_TIMEOUT_MS: the kernel counts its timeout from when it
// starts (the device's clock, read in the kernel), and the watchdog only
// reads its report, with no deadline of its own, so the handle does not
// fail.
func TestUntimedKernelCallAfterLongEarlierWork(t *testing.T) {
	g := newSimGPU(t)
	h := simHandle(t, g, 100*time.Millisecond)
	g.queue(simStream, 400*time.Millisecond)
	mk, err := g.Mark(0, simStream)
	require.NoError(t, err)
	require.NoError(t, h.WaitSignal(0, 5, simStream, 0))
	require.NoError(t, h.PutSignal(0, 5, simStream, 0))
	g.queue(simStream, 400*time.Millisecond)
	require.Eventually(t, func() bool { ok, _ := g.Passed(0, mk); return ok }, 2*time.Second, time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, h.failed())
	require.Equal(t, 2, g.launches)
}
