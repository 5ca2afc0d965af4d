package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What a cache in front of the pool served itself counts in the cumulative
// allocated and freed figures (as PyTorch counts every malloc and free),
// never in current values or peaks, and ResetAccumulated starts it again.
func TestFrontServedCounts(t *testing.T) {
	var served FrontCounts
	p, err := New(NewVirtual(1, 0), Config{Front: &testFront{served: func(int) FrontCounts { return served }}})
	require.NoError(t, err)
	ptr, _, err := p.Alloc(0, 0, 1<<20)
	require.NoError(t, err)
	served[1].N, served[1].Bytes, served[1].Req = 9, 9<<20, 9<<20 // nine reuses in front
	m, err := p.StatsMap(0)
	require.NoError(t, err)
	for _, k := range []string{"allocation.all.allocated", "allocation.small_pool.allocated", "active.all.allocated"} {
		require.Equal(t, int64(10), m[k], k)
	}
	require.Equal(t, int64(9), m["allocation.all.freed"])
	require.Equal(t, int64(10<<20), m["allocated_bytes.small_pool.allocated"])
	require.Equal(t, int64(10<<20), m["requested_bytes.all.allocated"])
	require.Equal(t, int64(1), m["allocation.all.current"])
	require.Equal(t, int64(1), m["allocation.all.peak"])
	require.Zero(t, m["allocation.large_pool.allocated"])
	require.Equal(t, int64(9), m["num_front_cache_hits"])
	require.NoError(t, p.ResetAccumulated(0))
	served[1].N++
	m, err = p.StatsMap(0)
	require.NoError(t, err)
	require.Equal(t, int64(1), m["allocation.all.allocated"], "counted from the reset")
	require.NoError(t, p.Free(0, 0, ptr, 1<<20))
}
