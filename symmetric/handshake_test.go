package symmetric

import (
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// Two threads of each rank rendezvous two blocks of one group at once, and
// on rank 0 the thread that came first is overtaken on its way to the
// link. The handshakes are numbered in the order they take the link, so
// both ranks run them in the same order and both succeed.
func TestHandshakesNumberedInLinkOrder(t *testing.T) {
	var calls atomic.Int32
	beforeLink = func(g Group) {
		// Rank 0's second call: the first of the two threads below.
		if g.Name == "overtaken" && g.Rank == 0 && calls.Add(1) == 2 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	defer func() { beforeLink = nil }()
	errs := runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 3 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			first, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(first.Ptr())
			// The link is made first, so that both threads below find it.
			if _, err := m.Rendezvous(first.Ptr(), Group{Name: "overtaken", Rank: rank, World: 2, Store: st}); err != nil {
				return err
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(i) * 50 * time.Millisecond) // thread 0 comes first
					b, err := m.Alloc(0, 4096)
					if err != nil {
						errs[i] = err
						return
					}
					defer m.Free(b.Ptr())
					_, errs[i] = m.Rendezvous(b.Ptr(), Group{Name: "overtaken", Rank: rank, World: 2, Store: st})
				}()
			}
			wg.Wait()
			return errors.Join(errs...)
		})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
}

// A rank fails with a cause whose JSON encoding is several times its length
// (control characters): its note still reaches the peer, which fails at
// once naming it, not at the timeout.
func TestLongFailureReachesThePeer(t *testing.T) {
	injectedDetail = ": " + strings.Repeat("\x01<", 30<<10)
	defer func() { injectedDetail = "" }()
	start := time.Now()
	errs := runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			if rank == 1 {
				m.cfg.FailAt = "arrays"
			}
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(b.Ptr())
			_, err = m.Rendezvous(b.Ptr(), Group{Name: "long", Rank: rank, World: 2, Store: st})
			return err
		})
	require.ErrorContains(t, errs[1], "injected failure at arrays")
	require.ErrorIs(t, errs[0], ErrPeerFailed)
	require.ErrorContains(t, errs[0], "rank 1")
	require.ErrorContains(t, errs[0], "injected failure at arrays")
	require.Less(t, time.Since(start), 3*time.Second, "rank 0 learned of the failure before its timeout")
}

// heldDescriptors counts the descriptors that notes waiting on l (stashed,
// or read ahead into its inbox) keep open, after giving its readers time to
// take what is on the way.
func heldDescriptors(l *link) int {
	time.Sleep(200 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.stash {
		n += len(s.fds)
	}
	for more := true; more; {
		select {
		case a := <-l.inbox:
			n += len(a.n.fds)
			l.stash = append(l.stash, a.n)
		default:
			more = false
		}
	}
	return n
}

// Rank 2 fails a rendezvous at once; rank 1 comes late and sends its block
// to rank 0 after rank 0 has failed. Rank 0 keeps no descriptor of rank 1's
// block: the late note is dropped, its descriptor closed, as it arrives.
func TestFailedHandshakeKeepsNoDescriptor(t *testing.T) {
	var calls atomic.Int32
	beforeLink = func(g Group) {
		if g.Name == "late" && g.Rank == 1 && calls.Add(1) == 2 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	defer func() { beforeLink = nil }()
	held := make(chan int, 1)
	errs := runRanks(3, func(int) Provider { return NewHostProvider() }, Config{Timeout: 3 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			g := Group{Name: "late", Rank: rank, World: 3, Store: st}
			first, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(first.Ptr())
			if _, err := m.Rendezvous(first.Ptr(), g); err != nil {
				return err
			}
			if rank == 2 {
				m.cfg.FailAt = "send"
			}
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(b.Ptr())
			if _, err := m.Rendezvous(b.Ptr(), g); err == nil {
				return errors.New("the rendezvous that rank 2 failed succeeded")
			}
			if rank == 0 {
				time.Sleep(500 * time.Millisecond) // rank 1's late block has come
				held <- heldDescriptors(m.links["late"])
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	require.Zero(t, <-held, "descriptors rank 0 keeps of the failed rendezvous")
}

// A peer that sends without end (malformed notes, back to back) cannot hold
// a handshake past its deadline: the wait checks it at every message.
func TestStreamOfBadNotesEndsAtTheDeadline(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ms := []*Manager{NewManager(NewHostProvider(), Config{Timeout: 2 * time.Second}), NewManager(NewHostProvider(), Config{Timeout: 2 * time.Second})}
	defer ms[0].Close()
	defer ms[1].Close()
	var wg sync.WaitGroup
	for r := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := ms[r].Alloc(0, 4096)
			require.NoError(t, err)
			_, err = ms[r].Rendezvous(b.Ptr(), Group{Name: "flood", Rank: r, World: 2, Store: st})
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	to := ms[1].links["flood"].conns[0]
	stop := make(chan struct{})
	var flooders sync.WaitGroup
	for range 4 {
		flooders.Add(1)
		go func() {
			defer flooders.Done()
			for {
				select {
				case <-stop:
					return
				default:
					to.SendWithin([]byte("junk"), nil, time.Second)
				}
			}
		}()
	}
	defer flooders.Wait()
	defer close(stop)
	time.Sleep(50 * time.Millisecond)
	b, err := ms[0].Alloc(0, 4096)
	require.NoError(t, err)
	ms[0].cfg.Timeout = 300 * time.Millisecond
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := ms[0].Rendezvous(b.Ptr(), Group{Name: "flood", Rank: 0, World: 2, Store: st})
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.ErrorContains(t, err, "stray messages ignored")
	case <-time.After(5 * time.Second):
		t.Fatalf("still waiting %v after a deadline of 300ms", time.Since(start))
	}
}
