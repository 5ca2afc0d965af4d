package symmetric

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// A rendezvous that fails on every rank (rank 1's block differs in size)
// leaves the group's link usable: the next rendezvous of the group
// succeeds, and notes left over from the failed one are dropped, not taken
// for the next one's.
func TestLinkSurvivesAFailedRendezvous(t *testing.T) {
	const world = 3
	errs := runRanks(world, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			g := Group{Name: "again", Rank: rank, World: world, Store: st}
			size := uint64(4096)
			if rank == 1 {
				size = 8192
			}
			bad, err := m.Alloc(0, size)
			if err != nil {
				return err
			}
			defer m.Free(bad.Ptr())
			if _, err := m.Rendezvous(bad.Ptr(), g); err == nil {
				return fmt.Errorf("a rendezvous of blocks of different sizes succeeded")
			} else if want := "every rank must allocate the same size"; !strings.Contains(err.Error(), want) {
				return fmt.Errorf("the failure %q does not say %q", err, want)
			}
			for i := range 3 {
				b, err := m.Alloc(0, 4096)
				if err != nil {
					return err
				}
				h, err := m.Rendezvous(b.Ptr(), g)
				if err != nil {
					return fmt.Errorf("rendezvous %d after the failed one: %w", i, err)
				}
				if err := checkPeers(h, rank, world); err != nil {
					return err
				}
				if err := m.Free(b.Ptr()); err != nil {
					return err
				}
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// checkPeers writes rank+1 into the first byte of h's buffer, waits until
// every peer's holds that peer's rank+1 (each peer's mapping is that
// rank's block), then meets the others in a barrier, so that no rank
// frees its block while another still reads it.
func checkPeers(h *Handle, rank, world int) error {
	mine := hostBytes(h.BufferPtr(rank), 2)
	mine[0] = byte(rank + 1)
	deadline := time.Now().Add(5 * time.Second)
	for j := range world {
		for hostBytes(h.BufferPtr(j), 1)[0] != byte(j+1) {
			if time.Now().After(deadline) {
				return fmt.Errorf("rank %d's buffer, as rank %d maps it, holds %d", j, rank, hostBytes(h.BufferPtr(j), 1)[0])
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	return h.Barrier(0, 0, 5*time.Second)
}

// Ranks that run ahead of each other through many rendezvous of one group
// (random pauses between them) take each other's notes for the right
// rendezvous: a note for a later step or a later rendezvous waits in the
// stash. Only the group's first rendezvous uses the store.
func TestLinkRanksAtDifferentPaces(t *testing.T) {
	const world, rounds = 4, 25
	errs := runRanks(world, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, shared store.Store) error {
			st := store.Count(shared)
			g := Group{Name: "pace", Rank: rank, World: world, Store: st}
			rng := rand.New(rand.NewPCG(uint64(rank), 7))
			var blocks []*Block
			defer func() {
				for _, b := range blocks {
					m.Free(b.Ptr())
				}
			}()
			for i := range rounds {
				if i == 1 {
					if tr := st.Traffic(); tr.Ops() != int64(world+1) {
						return fmt.Errorf("the group's first rendezvous made %d store requests, want %d", tr.Ops(), world+1)
					}
				}
				b, err := m.Alloc(0, uint64(4096*(1+i%3)))
				if err != nil {
					return err
				}
				blocks = append(blocks, b)
				time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond)
				h, err := m.Rendezvous(b.Ptr(), g)
				if err != nil {
					return fmt.Errorf("rendezvous %d: %w", i, err)
				}
				if h.BufferPtr(rank) != b.Ptr() {
					return fmt.Errorf("rendezvous %d: the handle's own buffer is not the block", i)
				}
				if i%5 == 0 {
					if err := checkPeers(h, rank, world); err != nil {
						return fmt.Errorf("rendezvous %d: %w", i, err)
					}
				}
			}
			if tr := st.Traffic(); tr.Ops() != int64(world+1) {
				return fmt.Errorf("%d rendezvous made %d store requests, want %d (the first's)", rounds, tr.Ops(), world+1)
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// After Close, or with another store, the group's link is made again
// through the store, on every rank, and rendezvous go on.
func TestLinkMadeAgain(t *testing.T) {
	const world = 2
	other := store.NewMemory()
	defer other.Close()
	errs := runRanks(world, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			join := func(st store.Store) error {
				b, err := m.Alloc(0, 4096)
				if err != nil {
					return err
				}
				defer m.Free(b.Ptr())
				h, err := m.Rendezvous(b.Ptr(), Group{Name: "remade", Rank: rank, World: world, Store: st})
				if err != nil {
					return err
				}
				return checkPeers(h, rank, world)
			}
			if err := join(st); err != nil {
				return err
			}
			first := m.links["remade"].peers[rank].Socket
			m.Close()
			if err := join(st); err != nil {
				return fmt.Errorf("after Close: %w", err)
			}
			second := m.links["remade"].peers[rank].Socket
			if err := join(other); err != nil {
				return fmt.Errorf("with another store: %w", err)
			}
			third := m.links["remade"].peers[rank].Socket
			if first == second || second == third {
				return fmt.Errorf("the link was not made again: %s, %s, %s", first, second, third)
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// CloseStore closes and forgets the links of the groups joined through that
// store (symm_store_close), and only those, with their handshake counters.
func TestCloseStoreClosesItsGroups(t *testing.T) {
	const world = 2
	errs := runRanks(world, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			other := store.NewMemory() // each rank's own: a world of one
			defer other.Close()
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(b.Ptr())
			if _, err := m.Rendezvous(b.Ptr(), Group{Name: "kept", Rank: rank, World: world, Store: st}); err != nil {
				return err
			}
			c, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(c.Ptr())
			if _, err := m.Rendezvous(c.Ptr(), Group{Name: "solo", Rank: 0, World: 1, Store: other}); err != nil {
				return err
			}
			m.CloseStore(other)
			m.mu.Lock()
			solo, kept := m.links["solo"], m.links["kept"]
			soloSeq := m.seq[seqKey{"solo", kindRendezvous}]
			m.mu.Unlock()
			if solo != nil || kept == nil || kept.conns == nil {
				return fmt.Errorf("CloseStore closed the wrong links: solo kept %v, kept open %v", solo != nil, kept != nil && kept.conns != nil)
			}
			if soloSeq != 0 {
				return fmt.Errorf("CloseStore kept the closed group's counter (%d)", soloSeq)
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// BenchmarkRendezvous is one rendezvous of a fresh 4 KiB host block by 2
// ranks (goroutines with managers of their own) of a group already linked,
// with the block's allocation and free outside the timing: the protocol's
// own cost, without a driver's import.
func BenchmarkRendezvous(b *testing.B) {
	const world = 2
	st := store.NewMemory()
	defer st.Close()
	ms := make([]*Manager, world)
	for r := range ms {
		ms[r] = NewManager(NewHostProvider(), Config{Timeout: 5 * time.Second, Trace: os.Getenv("SYMM_TRACE_RENDEZVOUS") == "1"})
		defer ms[r].Close()
	}
	start, done := make([]chan *Block, world), make(chan error, world)
	for r := range start {
		start[r] = make(chan *Block)
		go func() {
			for blk := range start[r] {
				_, err := ms[r].Rendezvous(blk.Ptr(), Group{Name: "bench", Rank: r, World: world, Store: st})
				done <- err
			}
		}()
	}
	var took time.Duration
	round := func() {
		blocks := make([]*Block, world)
		for r := range blocks {
			var err error
			blocks[r], err = ms[r].Alloc(0, 4096)
			require.NoError(b, err)
		}
		t0 := time.Now()
		for r := range blocks {
			start[r] <- blocks[r]
		}
		for range world {
			require.NoError(b, <-done)
		}
		took += time.Since(t0)
		for r := range blocks {
			require.NoError(b, ms[r].Free(blocks[r].Ptr()))
		}
	}
	round() // the group's link
	took = 0
	b.ResetTimer()
	for range b.N {
		round()
	}
	// Timed by hand: StartTimer/StopTimer stop the world at every call.
	b.ReportMetric(float64(took.Nanoseconds())/float64(b.N), "ns/rendezvous")
	for r := range start {
		close(start[r])
	}
}
