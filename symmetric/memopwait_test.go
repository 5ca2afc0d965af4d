package symmetric

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/store"
)

// simDriver is simGPU (kernelwait_test.go) as the CUDA driver under a
// cudaProvider: its stream memory operations and events run on simGPU's
// streams in time. A stream wait takes waitTime from when the stream
// reaches it (when the peer's value comes), a write takes no time.
type simDriver struct {
	*simGPU
	waitTime time.Duration
}

func (d *simDriver) StreamWaitValue32(_ int, stream, _ uintptr, _, _ uint32) error {
	d.queue(stream, d.waitTime)
	return nil
}

func (d *simDriver) StreamWriteValue32(_ int, stream, _ uintptr, _ uint32) error {
	d.queue(stream, 0)
	return nil
}

func (d *simDriver) EventCreate(int) (uintptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ev := d.next
	d.next++
	d.marks[ev] = time.Time{} // never recorded: completed
	return ev, nil
}

func (d *simDriver) EventRecord(_ int, ev, stream uintptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.marks[ev] = d.queueLocked(stream, 0)
	return nil
}

func (d *simDriver) EventQuery(dev int, ev uintptr) (bool, error) { return d.Passed(dev, ev) }

func (d *simDriver) EventDestroy(dev int, ev uintptr) error {
	d.Forget(dev, ev, false)
	return nil
}

// simMemopGPU is the host provider for memory with a cudaProvider's
// signals and markers over a simDriver: the stream-memory-operation path
// (SYMM_SIGNALS=memop) as on a GPU.
type simMemopGPU struct {
	Provider
	c *cudaProvider
}

func (simMemopGPU) Name() string { return "simmemop" }

func (p simMemopGPU) PutSignal(dev int, stream, addr uintptr, timeout time.Duration) error {
	return p.c.PutSignal(dev, stream, addr, timeout)
}

func (p simMemopGPU) WaitSignal(dev int, stream, addr uintptr, timeout time.Duration) error {
	return p.c.WaitSignal(dev, stream, addr, timeout)
}

func (p simMemopGPU) Mark(dev int, stream uintptr) (uintptr, error) { return p.c.Mark(dev, stream) }
func (p simMemopGPU) Passed(dev int, m uintptr) (bool, error)       { return p.c.Passed(dev, m) }
func (p simMemopGPU) Forget(dev int, m uintptr, passed bool)        { p.c.Forget(dev, m, passed) }

// simMemopHandle is a world-of-one handle whose signals are stream memory
// operations on a simulated device.
func simMemopHandle(t *testing.T, timeout time.Duration) (*simDriver, *cudaProvider, *Handle) {
	d := &simDriver{simGPU: newSimGPU(t), waitTime: time.Millisecond}
	c := &cudaProvider{drv: d}
	h := soloHandle(t, simMemopGPU{Provider: NewHostProvider(), c: c}, Config{Timeout: timeout, Signals: SignalsMemop})
	return d, c, h
}

// idleEvents is whether every event the provider still has is back in its
// pool (none held, or lost, by a call that returned).
func idleEvents(d *simDriver, c *cudaProvider) bool {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	return d.markers() == len(c.events[0])
}

// A timed put or wait behind long work queued before it on its stream
// waits for that work and then gives the peer its whole timeout: no
// ErrSignalTimeout. (Polling the whole stream with the deadline counted
// from the call timed out here.)
func TestTimedMemopCallAfterLongEarlierWork(t *testing.T) {
	d, c, h := simMemopHandle(t, 10*time.Second)
	const earlier = 300 * time.Millisecond // far more than the call's 20ms
	for _, put := range []bool{false, true} {
		d.queue(simStream, earlier)
		start := time.Now()
		if put {
			require.NoError(t, h.PutSignal(0, 5, simStream, 20*time.Millisecond))
		} else {
			require.NoError(t, h.WaitSignal(0, 5, simStream, 20*time.Millisecond))
		}
		require.GreaterOrEqual(t, time.Since(start), earlier, "the call waited for its operations, after the earlier work")
	}
	require.NoError(t, h.failed())
	require.True(t, idleEvents(d, c), "both events of each call are given back")
}

// Work queued on the stream after the operations (here by another thread
// while the call waits) is not waited for. (Polling the whole stream timed
// out here.)
func TestTimedMemopCallIgnoresLaterWork(t *testing.T) {
	d, _, h := simMemopHandle(t, 10*time.Second)
	d.firstPoll = func() { d.queue(simStream, 1500*time.Millisecond) }
	start := time.Now()
	require.NoError(t, h.WaitSignal(0, 5, simStream, 20*time.Millisecond))
	require.Less(t, time.Since(start), time.Second, "the later work was not waited for")
	require.NoError(t, h.failed())
}

// A peer late past the timeout, counted from when the stream reaches the
// operations: ErrSignalTimeout naming the peer (a put: it has not taken
// our previous signal), without failing the handle (the queued wait takes
// the late signal itself).
func TestTimedMemopCallLatePeer(t *testing.T) {
	d, c, h := simMemopHandle(t, 10*time.Second)
	d.waitTime = 400 * time.Millisecond
	d.queue(simStream, 100*time.Millisecond)
	start := time.Now()
	err := h.PutSignal(0, 5, simStream, 50*time.Millisecond)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, `put_signal to rank 0 on channel 5 of group "solo" (rank 0): rank 0 has not taken our previous signal: `+
		"signal wait timed out: the put did not complete within 50ms of the stream reaching it (the stream stays blocked until the signal comes)")
	require.GreaterOrEqual(t, took, 150*time.Millisecond, "the earlier work, then the whole timeout")
	require.Less(t, took, 400*time.Millisecond)
	require.NoError(t, h.failed())
	require.True(t, idleEvents(d, c))

	err = h.WaitSignal(0, 5, simStream, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, `wait_signal from rank 0 on channel 5 of group "solo" (rank 0): signal wait timed out: the wait did not complete`)
}

// Earlier work that holds the stream past SYMM_TIMEOUT_MS (here longer than
// the call's timeout): ErrSignalTimeout that says so and blames no peer;
// the handle stays usable and the operations run once that work is done.
func TestTimedMemopCallBehindStuckEarlierWork(t *testing.T) {
	d, c, h := simMemopHandle(t, 200*time.Millisecond) // the wait for earlier work: max(200ms, 20ms)
	for _, put := range []bool{true, false} {
		d.queue(simStream, 600*time.Millisecond)
		start := time.Now()
		var err error
		if put {
			err = h.PutSignal(0, 7, simStream, 20*time.Millisecond)
		} else {
			err = h.WaitSignal(0, 7, simStream, 20*time.Millisecond)
		}
		took := time.Since(start)
		require.ErrorIs(t, err, ErrSignalTimeout)
		op, what := "wait", `wait_signal from rank 0 on channel 7 of group "solo" (rank 0): `
		if put {
			op, what = "put", `put_signal to rank 0 on channel 7 of group "solo" (rank 0): `
		}
		require.ErrorContains(t, err, what+"signal wait timed out: the stream has not reached the "+op+
			" within 200ms: earlier work on it is still running (no peer was waited for; the "+op+" stays queued and runs once that work is done)")
		require.NotContains(t, err.Error(), "has not taken our previous signal")
		require.GreaterOrEqual(t, took, 200*time.Millisecond)
		require.Less(t, took, 550*time.Millisecond)
		require.NoError(t, h.failed(), "no peer was waited for")
		require.True(t, idleEvents(d, c), "both events are destroyed, not kept")
		time.Sleep(time.Until(start.Add(650 * time.Millisecond)))
		require.NoError(t, h.WaitSignal(0, 7, simStream, 20*time.Millisecond), "the stream is free again")
	}
}

// cudaMemopHandle is a world-of-one handle on GPU 0 whose signals are
// stream memory operations, and a stream of its own whose work is held by
// a stream wait on gate (a host-mapped word: store 1 to release it) and
// whose other gates are gate+8, gate+16, ...
func cudaMemopHandle(t *testing.T, timeout time.Duration) (h *Handle, stream, gate, gateDev uintptr) {
	if os.Getenv("SYMM_TEST_DEVICE") != "cuda" {
		t.Skip("needs a GPU: SYMM_TEST_DEVICE=cuda")
	}
	prov, err := NewCUDAProvider()
	require.NoError(t, err)
	m := NewManager(prov, Config{Timeout: timeout, Signals: SignalsMemop})
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	b, err := m.Alloc(0, 1<<20)
	require.NoError(t, err)
	h, err = m.Rendezvous(b.Ptr(), Group{Name: "memop", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	s, err := cuda.StreamCreate(0)
	require.NoError(t, err)
	gate, gateDev, err = cuda.HostAllocMapped(0, 4096)
	require.NoError(t, err)
	t.Cleanup(func() {
		for i := uintptr(0); i < 4; i++ {
			word(gate + 8*i).Store(1)
		}
		require.NoError(t, cuda.StreamSynchronize(0, s))
		require.NoError(t, cuda.StreamDestroy(0, s))
		require.NoError(t, cuda.HostFree(0, gate))
		require.NoError(t, cuda.StreamSynchronize(0, 0))
		require.NoError(t, m.Free(b.Ptr()))
	})
	return h, s, gate, gateDev
}

// On a GPU (stream memory operations, SYMM_SIGNALS=memop): a timed wait on
// a stream held by earlier work for longer than the call's timeout (a
// stream wait on a host word, released later), while another thread queues
// more work behind it, waits for the earlier work, gives the peer its whole
// timeout from there and returns once its own operations are done, not the
// stream's. (Polling the whole stream timed out after 100ms here.)
func TestMemopTimedCallBehindEarlierAndLaterWork(t *testing.T) {
	h, s, gate, gateDev := cudaMemopHandle(t, 10*time.Second)
	earlier, later := word(gate), word(gate+8) // their low 32 bits are waited for
	require.NoError(t, cuda.StreamWaitValue32(0, s, gateDev, 1, cuda.WaitValueGEQ))
	require.NoError(t, h.PutSignal(0, 4, s, 0))
	const hold = 800 * time.Millisecond // far more than the call's 100ms, less than SYMM_TIMEOUT_MS
	queued := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the call is waiting by now
		queued <- cuda.StreamWaitValue32(0, s, gateDev+8, 1, cuda.WaitValueGEQ)
		time.Sleep(hold - 100*time.Millisecond)
		earlier.Store(1)
	}()
	start := time.Now()
	err := h.WaitSignal(0, 4, s, 100*time.Millisecond)
	took := time.Since(start)
	require.NoError(t, err)
	require.NoError(t, <-queued)
	require.GreaterOrEqual(t, took, hold, "the call waited for the earlier work")
	require.NoError(t, h.failed())
	done, err := cuda.StreamQuery(0, s)
	require.NoError(t, err)
	require.False(t, done, "the later work still holds the stream: the call did not wait for it")
	later.Store(1)
	require.NoError(t, cuda.StreamSynchronize(0, s))
	require.NoError(t, h.PutSignal(0, 4, s, time.Second))
	require.NoError(t, h.WaitSignal(0, 4, s, time.Second))
}

// On a GPU: earlier work that holds the stream past SYMM_TIMEOUT_MS gives a
// timed wait ErrSignalTimeout that blames no peer; the handle stays usable,
// and the queued wait takes the signal put later (from another stream).
func TestMemopTimedCallBehindStuckEarlierWork(t *testing.T) {
	h, s, gate, gateDev := cudaMemopHandle(t, 300*time.Millisecond)
	require.NoError(t, cuda.StreamWaitValue32(0, s, gateDev, 1, cuda.WaitValueGEQ))
	start := time.Now()
	err := h.WaitSignal(0, 4, s, 50*time.Millisecond)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "the stream has not reached the wait within 300ms: earlier work on it is still running")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.NoError(t, h.failed(), "no peer was waited for")
	word(gate).Store(1)
	other, err := cuda.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, cuda.StreamDestroy(0, other)) }()
	require.NoError(t, h.PutSignal(0, 4, other, time.Second))
	require.NoError(t, cuda.StreamSynchronize(0, s), "the queued wait took the signal")
	require.NoError(t, cuda.StreamSynchronize(0, other))
	require.NoError(t, h.PutSignal(0, 4, s, time.Second))
	require.NoError(t, h.WaitSignal(0, 4, s, time.Second))
}

// watchdogIdle is whether the watchdog holds no signal of m's any more.
func watchdogIdle(m *Manager) bool {
	m.dog.mu.Lock()
	defer m.dog.mu.Unlock()
	return !m.dog.running && len(m.dog.pending) == 0
}

// A put and a wait queued without a timeout behind work that holds the
// stream for longer than SYMM_TIMEOUT_MS, with more such work queued after
// them: the watchdog counts SYMM_TIMEOUT_MS from when the stream reaches
// them, and the later work is not theirs, so the handle does not fail.
// (Counting from when they were queued failed the handle here, although no
// peer was late.)
func TestUntimedMemopCallAfterLongEarlierWork(t *testing.T) {
	d, c, h := simMemopHandle(t, 200*time.Millisecond)
	d.queue(simStream, 600*time.Millisecond)
	start := time.Now()
	require.NoError(t, h.PutSignal(0, 5, simStream, 0))
	require.NoError(t, h.WaitSignal(0, 5, simStream, 0))
	require.Less(t, time.Since(start), 100*time.Millisecond, "the calls only queue")
	d.queue(simStream, 600*time.Millisecond)
	require.Eventually(t, func() bool { return watchdogIdle(h.m) }, 3*time.Second, time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond, "the watch ended when the stream passed the calls")
	require.Less(t, time.Since(start), 1100*time.Millisecond, "the later work was not waited for")
	require.NoError(t, h.failed(), "no peer was late")
	require.True(t, idleEvents(d, c), "both events of each call are given back")
}

// A peer late past SYMM_TIMEOUT_MS, counted from when the stream reaches
// the untimed wait (behind earlier work): the watchdog fails the handle
// then, not before, naming the call.
func TestUntimedMemopCallLatePeerBehindEarlierWork(t *testing.T) {
	d, c, h := simMemopHandle(t, 200*time.Millisecond)
	d.waitTime = 800 * time.Millisecond
	d.queue(simStream, 300*time.Millisecond)
	start := time.Now()
	require.NoError(t, h.WaitSignal(0, 6, simStream, 0))
	require.Eventually(t, func() bool { return h.failed() != nil }, 3*time.Second, time.Millisecond)
	took := time.Since(start)
	require.GreaterOrEqual(t, took, 500*time.Millisecond, "the earlier work, then the whole SYMM_TIMEOUT_MS")
	require.Less(t, took, 800*time.Millisecond)
	err := h.failed()
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, `wait_signal from rank 0 on channel 6 of group "solo" (rank 0) did not complete within 200ms (SYMM_TIMEOUT_MS) of the stream reaching it`)
	require.Eventually(t, func() bool { return watchdogIdle(h.m) }, 3*time.Second, time.Millisecond)
	require.True(t, idleEvents(d, c), "the event before the wait is given back, the one after it destroyed")
}

// A barrier of two ranks queued without a timeout, as stream memory
// operations on one simulated device: behind earlier work longer than
// SYMM_TIMEOUT_MS it fails nothing; with a peer late past SYMM_TIMEOUT_MS
// of the stream reaching it, the watchdog fails the handle naming the
// peers.
func TestUntimedMemopBarrierBehindEarlierWork(t *testing.T) {
	d := &simDriver{simGPU: newSimGPU(t), waitTime: time.Millisecond}
	c := &cudaProvider{drv: d}
	var took time.Duration
	var failure error
	errs := runRanks(2, func(int) Provider { return simMemopGPU{Provider: NewHostProvider(), c: c} },
		Config{Timeout: 200 * time.Millisecond, Signals: SignalsMemop, AllowOverlappingDevices: true},
		func(rank int, m *Manager, st store.Store) error {
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(b.Ptr())
			h, err := m.Rendezvous(b.Ptr(), Group{Name: "bar", Rank: rank, World: 2, Store: st})
			if err != nil || rank != 0 {
				return err
			}
			d.queue(simStream, 500*time.Millisecond)
			if err := h.Barrier(1, simStream, 0); err != nil {
				return err
			}
			for !watchdogIdle(m) {
				time.Sleep(time.Millisecond)
			}
			if err := h.failed(); err != nil {
				return fmt.Errorf("no peer was late: %w", err)
			}
			d.waitTime = 600 * time.Millisecond // the peer is late
			d.queue(simStream, 300*time.Millisecond)
			start := time.Now()
			if err := h.Barrier(1, simStream, 0); err != nil {
				return err
			}
			for h.failed() == nil && time.Since(start) < 3*time.Second {
				time.Sleep(time.Millisecond)
			}
			took, failure = time.Since(start), h.failed()
			for !watchdogIdle(m) {
				time.Sleep(time.Millisecond)
			}
			return nil
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, failure, ErrSignalTimeout)
	require.ErrorContains(t, failure, `barrier on channel 1 of group "bar" (rank 0): a signal from or to rank(s) [1] did not complete within 200ms (SYMM_TIMEOUT_MS) of the stream reaching it`)
	require.GreaterOrEqual(t, took, 500*time.Millisecond, "the earlier work, then the whole SYMM_TIMEOUT_MS")
	require.Less(t, took, 800*time.Millisecond)
	require.True(t, idleEvents(d, c))
}

// A put and a wait as stream memory operations queued without a timeout
// make no Go heap allocation, their two events and the watchdog included
// (their descriptions are formatted only on failure; they made 4 per pair
// before). Some pairs wait for the watchdog to go idle and start again.
func TestUntimedMemopCallsAllocateNothing(t *testing.T) {
	d, _, h := simMemopHandle(t, 10*time.Second)
	d.waitTime = 0
	require.NoError(t, h.PutSignal(0, 2, simStream, 0))
	require.NoError(t, h.WaitSignal(0, 2, simStream, 0))
	require.Eventually(t, func() bool { return watchdogIdle(h.m) }, 3*time.Second, time.Millisecond)
	n := 0
	allocs := testing.AllocsPerRun(1000, func() {
		if err := h.PutSignal(0, 2, simStream, 0); err != nil {
			t.Fatal(err)
		}
		if err := h.WaitSignal(0, 2, simStream, 0); err != nil {
			t.Fatal(err)
		}
		if n++; n%100 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	})
	require.Zero(t, allocs)
	require.Eventually(t, func() bool { return watchdogIdle(h.m) }, 3*time.Second, time.Millisecond)
	require.NoError(t, h.failed())
}

// On a GPU (stream memory operations, SYMM_SIGNALS=memop): a put and a wait
// queued without a timeout behind earlier work that holds the stream for
// longer than SYMM_TIMEOUT_MS (a stream wait on a host word, released
// later), with more such work queued after them: the watchdog counts from
// when the stream reaches them and stops watching once they are done, so
// the handle does not fail. (Counting from when they were queued failed the
// handle 300ms after the calls here.)
func TestMemopTimedCallUntimedBehindEarlierAndLaterWork(t *testing.T) {
	h, s, gate, gateDev := cudaMemopHandle(t, 300*time.Millisecond)
	earlier, later := word(gate), word(gate+8) // their low 32 bits are waited for
	require.NoError(t, cuda.StreamWaitValue32(0, s, gateDev, 1, cuda.WaitValueGEQ))
	require.NoError(t, h.PutSignal(0, 4, s, 0))
	require.NoError(t, h.WaitSignal(0, 4, s, 0))
	require.NoError(t, cuda.StreamWaitValue32(0, s, gateDev+8, 1, cuda.WaitValueGEQ))
	time.Sleep(800 * time.Millisecond) // far more than SYMM_TIMEOUT_MS
	require.NoError(t, h.failed(), "the stream has not reached the calls yet")
	earlier.Store(1)
	require.Eventually(t, func() bool { return watchdogIdle(h.m) }, 3*time.Second, time.Millisecond,
		"the watch ends once the stream has passed the calls")
	time.Sleep(500 * time.Millisecond)
	done, err := cuda.StreamQuery(0, s)
	require.NoError(t, err)
	require.False(t, done, "the later work still holds the stream")
	require.NoError(t, h.failed(), "neither the earlier nor the later work is a late peer")
	later.Store(1)
	require.NoError(t, cuda.StreamSynchronize(0, s))
	require.NoError(t, h.PutSignal(0, 4, s, time.Second))
	require.NoError(t, h.WaitSignal(0, 4, s, time.Second))
}
