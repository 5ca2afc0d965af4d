package symmetric

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// Usage answers at once, with the figures of the moment, while a
// rendezvous waits for a peer that does not come and holds its block's
// lock meanwhile (the statistics page reads Usage every 250 ms).
func TestUsageDoesNotWaitForARendezvous(t *testing.T) {
	const timeout = 2 * time.Second
	st := store.NewMemory()
	defer st.Close()
	var ms [2]*Manager
	var blocks [2]*Block
	var errs [2]error
	var wg sync.WaitGroup
	for r := range ms {
		ms[r] = NewManager(NewHostProvider(), Config{Timeout: timeout})
		wg.Add(1)
		go func(r int) { // both ranks join a block: a handle and a peer mapping each
			defer wg.Done()
			if blocks[r], errs[r] = ms[r].Alloc(0, 8192); errs[r] == nil {
				_, errs[r] = ms[r].Rendezvous(blocks[r].Ptr(), Group{Name: "g", Rank: r, World: 2, Store: st})
			}
		}(r)
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, Usage{Blocks: 1, Bytes: 8192, Handles: 1, PeerMappings: 1}, ms[0].Usage())

	// Rank 0 joins a second block with a group rank 1 never joins.
	b, err := ms[0].Alloc(0, 4096)
	require.NoError(t, err)
	stuck := make(chan error, 1)
	go func() {
		_, err := ms[0].Rendezvous(b.Ptr(), Group{Name: "h", Rank: 0, World: 2, Store: st})
		stuck <- err
	}()
	require.Eventually(t, func() bool {
		if b.mu.TryLock() {
			b.mu.Unlock()
			return false
		}
		return true
	}, timeout/2, time.Millisecond, "the rendezvous holds its block's lock")
	got := make(chan Usage, 1)
	go func() { got <- ms[0].Usage() }()
	select {
	case u := <-got:
		require.Equal(t, Usage{Blocks: 2, Bytes: 8192 + 4096, Handles: 1, PeerMappings: 1}, u)
	case <-time.After(timeout / 4):
		t.Fatal("Usage waited for the rendezvous")
	}
	require.Error(t, <-stuck, "the lone rank times out")
	require.Equal(t, Usage{Blocks: 2, Bytes: 8192 + 4096, Handles: 1, PeerMappings: 1}, ms[0].Usage(), "a failed rendezvous adds nothing")

	require.NoError(t, ms[0].Free(b.Ptr()))
	require.Equal(t, Usage{Blocks: 1, Bytes: 8192, Handles: 1, PeerMappings: 1}, ms[0].Usage())
	for r := range ms {
		require.NoError(t, ms[r].Free(blocks[r].Ptr()))
		require.Equal(t, Usage{}, ms[r].Usage())
	}
}
