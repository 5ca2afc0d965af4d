package symmetric

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/internal/mem"
	"github.com/libsymm/libsymm/store"
)

// blockMaps counts this process's mappings of the host provider's memfds.
func blockMaps(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Count(string(b), "memfd:symm-block")
}

const injectedMsg = "host: injected fault (SYMM_HOST_FAULTS)"

func faultyHost(t *testing.T, rate float64, seed uint64) (Provider, *host.Faults) {
	t.Helper()
	p, f, err := NewHostProviderWithFaults(rate, seed)
	require.NoError(t, err)
	return p, f
}

// Manager.Alloc over a provider whose Create fails at random, at any of its
// steps: a failed Alloc names the injected fault and leaves no block, no
// descriptor and no mapping; Free always works.
func TestAllocFreeOverFaultyHostProvider(t *testing.T) {
	fds, maps := openFDs(t), blockMaps(t)
	prov, faults := faultyHost(t, 0.2, 11)
	m := NewManager(prov, Config{})
	var live []*Block
	failed := 0
	for i := 0; i < 2000; i++ {
		if len(live) < 32 && (i%3 != 2 || len(live) == 0) {
			b, err := m.Alloc(i%2, uint64(1+i*37%70000))
			if err != nil {
				failed++
				require.ErrorIs(t, err, host.ErrInjectedFault)
				require.Contains(t, err.Error(), "symmetric allocation of")
				require.Contains(t, err.Error(), injectedMsg)
				continue
			}
			mem.Bytes(b.Ptr(), 1)[0] = 1
			live = append(live, b)
		} else {
			b := live[len(live)-1]
			live = live[:len(live)-1]
			require.NoError(t, m.Free(b.Ptr()))
		}
		require.Equal(t, len(live), m.Live())
	}
	for _, b := range live {
		require.NoError(t, m.Free(b.Ptr()))
	}
	require.Greater(t, failed, 100)
	require.EqualValues(t, failed, faults.Injected())
	require.Zero(t, m.Live())
	requireFDs(t, fds)
	require.Equal(t, maps, blockMaps(t), "memfd mappings")

	_, _, err := NewHostProviderWithFaults(-1, 0)
	require.Error(t, err)
}

// Rounds of alloc + rendezvous + free by 3 in-process ranks whose providers
// fail Create, Export and Import at random. A round whose allocations all
// succeeded rendezvouses: every rank succeeds (and sees its peers' bytes) or
// every rank fails with the injected fault named (the faulty rank's own
// error, or its peers' report of it), at once, never by a timeout; then the
// same blocks rendezvous again in a new group until it succeeds. Afterwards
// no block is live, and every descriptor and mapping made is gone.
func TestRendezvousOverFaultyHostProvider(t *testing.T) {
	const world, rounds, size = 3, 300, 10000
	fds, maps := openFDs(t), blockMaps(t)
	st := store.NewMemory()
	defer st.Close()
	ms := make([]*Manager, world)
	faults := make([]*host.Faults, world)
	for r := range ms {
		var prov Provider
		prov, faults[r] = faultyHost(t, 0.08, uint64(100+r))
		ms[r] = NewManager(prov, Config{Timeout: 10 * time.Second})
	}
	type outcome struct{ allocFailed, rvFailed, rvOK int }
	outs := make([]outcome, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rank := 0; rank < world; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[rank] = faultyRank(ms[rank], st, rank, world, rounds, size, &outs[rank].allocFailed, &outs[rank].rvFailed, &outs[rank].rvOK)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for r, m := range ms {
		require.Zero(t, m.Live(), "rank %d: live blocks", r)
		m.Close()
	}
	requireFDs(t, fds)
	require.Equal(t, maps, blockMaps(t), "memfd mappings")
	var injected int64
	for _, f := range faults {
		injected += f.Injected()
	}
	t.Logf("%d rounds: outcomes per rank %+v; %d faults injected", rounds, outs, injected)
	for r := 1; r < world; r++ {
		require.Equal(t, outs[0].rvOK, outs[r].rvOK, "all ranks succeed together")
		require.Equal(t, outs[0].rvFailed, outs[r].rvFailed, "or fail together")
	}
	require.Greater(t, outs[0].rvOK, 0, "some rendezvous succeeded")
	require.Greater(t, outs[0].rvFailed, 0, "some rendezvous failed")
}

// faultyRank is one rank of TestRendezvousOverFaultyHostProvider.
func faultyRank(m *Manager, st store.Store, rank, world, rounds int, size uint64, allocFailed, rvFailed, rvOK *int) error {
	gather := func(key string, v []byte) ([][]byte, error) {
		return store.AllGather(st, key, rank, world, v, 10*time.Second)
	}
	for round := 0; round < rounds; round++ {
		b, err := m.Alloc(0, size)
		ok := []byte{1}
		if err != nil {
			if !strings.Contains(err.Error(), injectedMsg) {
				return fmt.Errorf("round %d: alloc: %w", round, err)
			}
			*allocFailed++
			ok[0] = 0
		} else {
			buf := mem.Bytes(b.Ptr(), int(size))
			buf[0], buf[size-1] = byte(rank+1), byte(rank+1)
		}
		oks, err := gather(fmt.Sprintf("test/alloc/%d/", round), ok)
		if err != nil {
			return err
		}
		all := true
		for _, o := range oks {
			all = all && o[0] == 1
		}
		if !all { // a peer has no block: no rendezvous this round
			if b != nil {
				if err := m.Free(b.Ptr()); err != nil {
					return err
				}
			}
			continue
		}
		// A failed rendezvous leaves the block as it was: the same blocks
		// rendezvous again, in a new group, until it succeeds.
		var h *Handle
		for try := 0; h == nil; try++ {
			h, err = m.Rendezvous(b.Ptr(), Group{Name: fmt.Sprintf("round%d-%d", round, try), Rank: rank, World: world, Store: st})
			if err != nil {
				if !strings.Contains(err.Error(), injectedMsg) {
					return fmt.Errorf("round %d: rendezvous failed without naming the injected fault: %w", round, err)
				}
				if try == 50 {
					return fmt.Errorf("round %d: 50 rendezvous failed: %w", round, err)
				}
				*rvFailed++
			}
		}
		*rvOK++
		for r := 0; r < world; r++ {
			if got := mem.Bytes(h.BufferPtr(r), int(size)); got[0] != byte(r+1) || got[size-1] != byte(r+1) {
				return fmt.Errorf("round %d: rank %d's buffer holds %d", round, r, got[0])
			}
		}
		mine := fmt.Sprint(*rvFailed)
		got, err := gather(fmt.Sprintf("test/rendezvous/%d/", round), []byte(mine))
		if err != nil {
			return err
		}
		for r, v := range got {
			if string(v) != mine {
				return fmt.Errorf("round %d: a rendezvous failed on some ranks only (rank %d: %s failures, rank %d: %s)", round, rank, mine, r, v)
			}
		}
		if err := m.Free(b.Ptr()); err != nil {
			return fmt.Errorf("round %d: free: %w", round, err)
		}
	}
	return nil
}
