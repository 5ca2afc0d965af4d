package symmetric

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// streamProvider is the host provider with stream semantics for signals, as
// on a GPU, on one stream: put and wait only queue, and a marker records
// "what was queued"; the test decides whether the signals queued complete
// (a stuck one holds the stream for good: markers recorded after it never
// pass, those before it do).
type streamProvider struct {
	Provider
	mu      sync.Mutex
	next    uintptr
	passed  map[uintptr]bool
	forgot  int
	stuck   bool // puts and waits queued from now on never complete
	blocked bool // a stuck one is queued
}

func newStreamProvider() *streamProvider {
	return &streamProvider{Provider: NewHostProvider(), next: 1, passed: map[uintptr]bool{}}
}

// Name is not "host": the handle does not treat it as the host backend,
// whose calling thread waits for every signal (hostBound).
func (p *streamProvider) Name() string { return "stream" }

func (p *streamProvider) PutSignal(int, uintptr, uintptr, time.Duration) error  { return p.signal() }
func (p *streamProvider) WaitSignal(int, uintptr, uintptr, time.Duration) error { return p.signal() }

func (p *streamProvider) signal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = p.blocked || p.stuck
	return nil
}

func (p *streamProvider) Mark(int, uintptr) (uintptr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.next
	p.next++
	p.passed[m] = !p.blocked
	return m, nil
}

func (p *streamProvider) Passed(_ int, m uintptr) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.passed[m], nil
}

func (p *streamProvider) Forget(int, uintptr, bool) {
	p.mu.Lock()
	p.forgot++
	p.mu.Unlock()
}

func (p *streamProvider) forgotten() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forgot
}

// A queued signal nobody answers: the call itself returns (the stream
// waits), the watchdog fails the handle after the timeout, and every later
// call on it returns SYMM_ERR_TIMEOUT's error naming group, rank and
// channel. Signals that complete leave nothing behind (both markers of each
// are given back).
func TestWatchdogFailsAStuckSignal(t *testing.T) {
	prov := newStreamProvider()
	m := NewManager(prov, Config{Timeout: 150 * time.Millisecond})
	st := store.NewMemory()
	defer st.Close()
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "dog", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)

	for i := 0; i < 20; i++ {
		require.NoError(t, h.PutSignal(0, 1, 0, 0))
		require.NoError(t, h.WaitSignal(0, 1, 0, 0))
	}
	require.Eventually(t, func() bool { return prov.forgotten() == 80 }, 2*time.Second, time.Millisecond,
		"every passed marker is returned")
	require.NoError(t, h.failed())

	prov.mu.Lock()
	prov.stuck = true
	prov.mu.Unlock()
	start := time.Now()
	require.NoError(t, h.WaitSignal(0, 3, 0, 0), "the call only queues the wait")
	require.Less(t, time.Since(start), 100*time.Millisecond)
	require.Eventually(t, func() bool { return h.failed() != nil }, 3*time.Second, time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	err = h.Barrier(0, 0, 0)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, `wait_signal from rank 0 on channel 3 of group "dog" (rank 0) did not complete within 150ms`)
	require.ErrorIs(t, h.PutSignal(0, 0, 0, 0), ErrSignalTimeout, "the failure sticks to the handle")
	require.NoError(t, m.Free(b.Ptr()))
}
