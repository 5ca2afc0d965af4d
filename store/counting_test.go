package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCountingCountsEachCall(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			s, _ := b.open(t)
			c := Count(s)
			require.NoError(t, c.Set("k", []byte("value")))
			v, err := c.Get("k", time.Second)
			require.NoError(t, err)
			require.Equal(t, "value", string(v))
			_, err = c.Get("missing", time.Millisecond)
			require.ErrorIs(t, err, ErrTimeout)
			n, err := c.Add("n", 3)
			require.NoError(t, err)
			require.EqualValues(t, 3, n)
			require.NoError(t, c.Delete("k"))
			got := c.Traffic()
			require.Equal(t, Traffic{Sets: 1, Gets: 2, Adds: 1, Deletes: 1, RoundTrips: 5,
				BytesSent: 1 + 5 + 1 + 7 + 1 + 8 + 1, BytesReceived: 5 + 8}, got)
			require.EqualValues(t, 5, got.Ops())
			require.Equal(t, Traffic{Deletes: 1, RoundTrips: 1, BytesSent: 1}, got.Sub(Traffic{Sets: 1, Gets: 2, Adds: 1,
				RoundTrips: 4, BytesSent: 1 + 5 + 1 + 7 + 1 + 8, BytesReceived: 5 + 8}))
		})
	}
}

// An all-gather through a Counting is sent as it would be without it: one
// batch, one round trip, on a Client; a Set and world Gets, each its own
// round trip, on a store that does not batch (Memory, and the test's owned
// Prefix view, which hides its Client).
func TestCountingAllGather(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			_, another := b.open(t)
			const world = 3
			counts := make([]*Counting, world)
			errs := make([]error, world)
			var wg sync.WaitGroup
			for r := range counts {
				counts[r] = Count(another())
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[r] = AllGather(counts[r], "g/", r, world, []byte(fmt.Sprintf("v%d", r)), 5*time.Second)
				}()
			}
			wg.Wait()
			trips := int64(1)
			if !batches(another()) {
				trips = 1 + world
			}
			require.Equal(t, b.name == "tcp", trips == 1)
			for r, c := range counts {
				require.NoError(t, errs[r])
				require.Equal(t, Traffic{Sets: 1, Gets: world, RoundTrips: trips,
					BytesSent: 3 + 2 + world*3, BytesReceived: world * 2}, c.Traffic(), "rank %d", r)
			}
		})
	}
}

// On a store that does not batch, a gather's Gets stop at the first missing
// entry, and only the Gets sent are counted.
func TestCountingAllGatherMissingRank(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	require.NoError(t, m.Set("g/0", []byte("x")))
	c := Count(m)
	_, err := AllGather(c, "g/", 1, 4, []byte("y"), 20*time.Millisecond)
	var ge *GatherError
	require.ErrorAs(t, err, &ge)
	require.Equal(t, 2, ge.Rank)
	require.Equal(t, Traffic{Sets: 1, Gets: 3, RoundTrips: 4, BytesSent: 3 + 1 + 3*3, BytesReceived: 2}, c.Traffic())
}

// A Counting over a Prefix view of a Client, and a Prefix view of a
// Counting, still batch: one round trip per all-gather.
func TestCountingBatchesThroughPrefix(t *testing.T) {
	srv := newServer(t, "")
	inner := Count(Prefix(dial(t, srv.Addr(), ""), "p/"))
	outer := Count(dial(t, srv.Addr(), ""))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, s := range []Store{inner, Prefix(outer, "p/")} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = AllGather(s, "g/", r, 2, []byte("v"), 5*time.Second)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, Traffic{Sets: 1, Gets: 2, RoundTrips: 1, BytesSent: 3 + 1 + 2*3, BytesReceived: 2}, inner.Traffic())
	require.Equal(t, Traffic{Sets: 1, Gets: 2, RoundTrips: 1, BytesSent: 5 + 1 + 2*5, BytesReceived: 2}, outer.Traffic())
}
