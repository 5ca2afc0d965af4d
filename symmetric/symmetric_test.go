package symmetric

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/internal/mem"
	"github.com/libsymm/libsymm/store"
)

// runRanks runs fn as world ranks in goroutines of this process, each with
// its own Manager (as separate processes would have) over prov(rank), all
// sharing one in-memory store, and returns each rank's error.
func runRanks(world int, prov func(rank int) Provider, cfg Config, fn func(rank int, m *Manager, st store.Store) error) []error {
	st := store.NewMemory()
	defer st.Close()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			m := NewManager(prov(r), cfg)
			defer m.Close() // the groups' links: tests count descriptors
			errs[r] = fn(r, m, st)
		}(r)
	}
	wg.Wait()
	return errs
}

// ranks is runRanks over host providers, each rank required to succeed.
func ranks(t *testing.T, world int, fn func(rank int, m *Manager, st store.Store) error) {
	t.Helper()
	errs := runRanks(world, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second}, fn)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// timedRendezvous allocates a 4 KiB block, rendezvouses it with group name
// as rank of world and frees it; took is how long the rendezvous ran.
func timedRendezvous(m *Manager, st store.Store, name string, rank, world int, took *time.Duration) error {
	b, err := m.Alloc(0, 4096)
	if err != nil {
		return err
	}
	start := time.Now()
	_, err = m.Rendezvous(b.Ptr(), Group{Name: name, Rank: rank, World: world, Store: st})
	*took = time.Since(start)
	if ferr := m.Free(b.Ptr()); ferr != nil {
		return fmt.Errorf("free after the rendezvous: %w (%v)", ferr, err)
	}
	return err
}

func TestRegistryFindsInteriorPointers(t *testing.T) {
	m := NewManager(NewHostProvider(), Config{})
	var blocks []*Block
	for _, n := range []uint64{100, 5000, 1 << 20} {
		b, err := m.Alloc(0, n)
		require.NoError(t, err)
		blocks = append(blocks, b)
	}
	for _, b := range blocks {
		for _, off := range []uint64{0, 1, b.Size() - 1, b.Size() + 8} {
			got, o, err := m.Find(b.Ptr() + uintptr(off))
			require.NoError(t, err)
			require.Same(t, b, got)
			require.Equal(t, off, o)
		}
	}
	_, _, err := m.Find(0x1000)
	require.ErrorIs(t, err, ErrUnknownPointer)
	require.ErrorIs(t, m.Free(blocks[0].Ptr()+8), ErrUnknownPointer, "free needs the block's start")
	for _, b := range blocks {
		require.NoError(t, m.Free(b.Ptr()))
	}
	require.ErrorIs(t, m.Free(blocks[0].Ptr()), ErrUnknownPointer, "double free")
	require.Zero(t, m.Live())
	_, err = m.Alloc(0, 0)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestRendezvousSharesBuffersAndSignals(t *testing.T) {
	const world, size = 3, 8192
	ranks(t, world, func(rank int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, size)
		if err != nil {
			return err
		}
		buf := mem.Bytes(b.Ptr(), size)
		for i := range buf {
			buf[i] = byte(rank + 1)
		}
		h, err := m.Rendezvous(b.Ptr()+100, Group{Name: "g", Rank: rank, World: world, Store: st})
		if err != nil {
			return err
		}
		if again, err := m.Rendezvous(b.Ptr(), Group{Name: "g", Rank: rank, World: world, Store: st}); err != nil || again != h {
			return fmt.Errorf("second rendezvous: %v, same handle %v", err, again == h)
		}
		if err := h.Barrier(0, 0, 5*time.Second); err != nil {
			return err
		}
		for r := 0; r < world; r++ {
			if got := mem.Bytes(h.BufferPtr(r), size); got[0] != byte(r+1) || got[size-1] != byte(r+1) {
				return fmt.Errorf("rank %d's buffer holds %d", r, got[0])
			}
		}
		// Ten back-to-back signals around the ring are never merged.
		next, prev := (rank+1)%world, (rank+world-1)%world
		for i := 0; i < 10; i++ {
			if err := h.PutSignal(next, 1, 0, 5*time.Second); err != nil {
				return err
			}
			if err := h.WaitSignal(prev, 1, 0, 5*time.Second); err != nil {
				return err
			}
		}
		if err := h.WaitSignal(prev, 2, 0, 20*time.Millisecond); err == nil {
			return fmt.Errorf("a wait with no signal succeeded")
		}
		if err := h.PutSignal(world, 0, 0, 0); err == nil {
			return fmt.Errorf("put to rank %d succeeded", world)
		}
		if err := h.Barrier(0, 0, 5*time.Second); err != nil {
			return err
		}
		return m.Free(b.Ptr())
	})
}

func TestRendezvousRefusesMismatchedSizes(t *testing.T) {
	ranks(t, 2, func(rank int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, uint64(4096*(rank+1)))
		if err != nil {
			return err
		}
		defer m.Free(b.Ptr())
		_, err = m.Rendezvous(b.Ptr(), Group{Name: "x", Rank: rank, World: 2, Store: st})
		if err == nil {
			return fmt.Errorf("mismatched sizes accepted")
		}
		if want := "rank 1"; rank == 0 && !contains(err.Error(), want) {
			return fmt.Errorf("error %q does not name %s", err, want)
		}
		return nil
	})
}

func TestRendezvousBadGroup(t *testing.T) {
	m := NewManager(NewHostProvider(), Config{Timeout: 100 * time.Millisecond})
	b, err := m.Alloc(0, 64)
	require.NoError(t, err)
	defer m.Free(b.Ptr())
	st := store.NewMemory()
	for _, g := range []Group{{Name: "g", Rank: 2, World: 2, Store: st}, {Name: "", Rank: 0, World: 1, Store: st},
		{Name: "g", Rank: 0, World: 1}, {Name: "g", Rank: 0, World: 1000, Store: st}} {
		_, err := m.Rendezvous(b.Ptr(), g)
		require.ErrorIs(t, err, ErrInvalid, "%+v", g)
	}
	_, err = m.Rendezvous(b.Ptr(), Group{Name: "alone", Rank: 0, World: 2, Store: st})
	require.ErrorContains(t, err, "rank 1 did not publish")
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "single", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	require.NoError(t, h.Barrier(0, 0, time.Second))
	require.False(t, HasMulticastSupport())
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// hostLabels gives a test wrapper of the host provider the host's
// capability of device labels (LabelDevices), which an embedded Provider
// interface does not carry: its ranks may share device 0.
type hostLabels struct{}

func (hostLabels) CheckDevice(int, uint64) error { return nil }

// failingImport is a host provider whose Import fails.
type failingImport struct {
	Provider
	hostLabels
}

func (failingImport) Import(int, int, uint64) (*Mem, error) {
	return nil, fmt.Errorf("injected import failure")
}

// A rank that cannot map a peer fails, and every other rank learns it at
// once (not at the timeout), with the failing rank named; nothing stays mapped.
func TestRendezvousFailureReachesEveryRank(t *testing.T) {
	const world = 3
	took := make([]time.Duration, world)
	errs := runRanks(world, func(r int) Provider {
		if r == 2 {
			return failingImport{Provider: NewHostProvider()}
		}
		return NewHostProvider()
	}, Config{Timeout: 10 * time.Second}, func(r int, m *Manager, st store.Store) error {
		return timedRendezvous(m, st, "f", r, world, &took[r])
	})
	for r := 0; r < world; r++ {
		require.ErrorContains(t, errs[r], "injected import failure", "rank %d", r)
		require.Less(t, took[r], 5*time.Second, "rank %d waited for the timeout", r)
	}
	require.ErrorContains(t, errs[0], "rank 2 (pid")
}

// peeringHost is a host provider whose device is named id, and which refuses
// the pairs in refuse ("a>b": a cannot map b).
type peeringHost struct {
	Provider
	id     string
	refuse map[string]bool
}

func (p peeringHost) DeviceID(int) (string, error) { return p.id, nil }
func (p peeringHost) CanMap(a, b string) error {
	if p.refuse[a+">"+b] {
		return fmt.Errorf("GPU %s cannot map memory of GPU %s: no peer-to-peer path between them (link: SYS)", a, b)
	}
	return nil
}

// A group with an unmappable pair is refused by every rank, quickly, with
// an error naming both devices; when only one rank can tell (it alone sees
// both devices), the others learn it from that rank instead of timing out.
func TestRendezvousRefusesUnmappablePeers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		judges map[int]bool // ranks that see the bad pair
	}{{"every rank sees it", map[int]bool{0: true, 1: true, 2: true}}, {"only rank 2 sees it", map[int]bool{2: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			const world = 3
			took := make([]time.Duration, world)
			errs := runRanks(world, func(r int) Provider {
				p := peeringHost{Provider: NewHostProvider(), id: fmt.Sprintf("bus%d", r), refuse: map[string]bool{}}
				if tc.judges[r] {
					p.refuse["bus0>bus2"] = true
				}
				return p
			}, Config{Timeout: 10 * time.Second}, func(r int, m *Manager, st store.Store) error {
				return timedRendezvous(m, st, "p", r, world, &took[r])
			})
			for r := 0; r < world; r++ {
				require.ErrorContains(t, errs[r], "GPU bus0 cannot map memory of GPU bus2: no peer-to-peer path", "rank %d", r)
				require.ErrorContains(t, errs[r], "rank 0 cannot map rank 2's block", "rank %d", r)
				require.Less(t, took[r], 5*time.Second, "rank %d waited for the timeout", r)
			}
		})
	}
}

func TestWorldWithinDirectAccess(t *testing.T) {
	for _, tc := range []struct {
		name   string
		judges map[int]bool
		want   bool
	}{{"all paths", nil, true}, {"one rank sees a missing path", map[int]bool{1: true}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			const world = 3
			got := make([]bool, world)
			errs := runRanks(world, func(r int) Provider {
				p := peeringHost{Provider: NewHostProvider(), id: fmt.Sprintf("bus%d", r), refuse: map[string]bool{}}
				if tc.judges[r] {
					p.refuse["bus2>bus0"] = true
				}
				return p
			}, Config{Timeout: 5 * time.Second}, func(r int, m *Manager, st store.Store) (err error) {
				for k := 0; k < 2; k++ { // twice: calls of one group do not mix
					if got[r], err = m.WorldWithinDirectAccess(0, Group{Name: "w", Rank: r, World: world, Store: st}); err != nil {
						return err
					}
				}
				return nil
			})
			for r := 0; r < world; r++ {
				require.NoError(t, errs[r])
				require.Equal(t, tc.want, got[r], "rank %d", r)
			}
		})
	}
	m := NewManager(NewHostProvider(), Config{Timeout: time.Second})
	ok, err := m.WorldWithinDirectAccess(0, Group{Name: "h", Rank: 0, World: 2, Store: store.NewMemory()})
	require.NoError(t, err)
	require.True(t, ok, "host memory is shared by every process")
	_, err = m.WorldWithinDirectAccess(0, Group{Name: "h", Rank: 2, World: 2})
	require.ErrorIs(t, err, ErrInvalid)
}
