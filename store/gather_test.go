package store

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAllGather(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			noLeaks(t)
			_, another := b.open(t)
			const world = 4
			for round := 0; round < 3; round++ { // keys of one round do not leak into the next
				prefix := fmt.Sprintf("round%d/", round)
				got := make([][][]byte, world)
				errs := make([]error, world)
				var wg sync.WaitGroup
				for r := 0; r < world; r++ {
					s := another()
					wg.Add(1)
					go func() {
						defer wg.Done()
						time.Sleep(time.Duration(r) * 5 * time.Millisecond) // ranks come late
						got[r], errs[r] = AllGather(s, prefix, r, world, []byte(fmt.Sprintf("%d-%d", round, r)), 5*time.Second)
					}()
				}
				wg.Wait()
				for r := 0; r < world; r++ {
					require.NoError(t, errs[r])
					require.Len(t, got[r], world)
					for j := 0; j < world; j++ {
						require.Equal(t, fmt.Sprintf("%d-%d", round, j), string(got[r][j]), "rank %d's view of rank %d", r, j)
					}
				}
			}
		})
	}
}

func TestAllGatherNamesTheMissingRank(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			noLeaks(t)
			s, another := b.open(t)
			require.NoError(t, another().Set("g/0", []byte("x"))) // rank 0 came; ranks 2 and 3 never do
			start := time.Now()
			_, err := AllGather(s, "g/", 1, 4, []byte("y"), 150*time.Millisecond)
			took := time.Since(start)
			var ge *GatherError
			require.ErrorAs(t, err, &ge)
			require.Equal(t, 2, ge.Rank)
			require.ErrorIs(t, err, ErrTimeout)
			require.ErrorContains(t, err, "rank 2")
			require.GreaterOrEqual(t, took, 150*time.Millisecond)
			require.Less(t, took, 2*time.Second, "the deadline is shared, not per rank")
			v, err := s.Get("g/1", 0) // our entry was published all the same
			require.NoError(t, err)
			require.Equal(t, "y", string(v))
		})
	}
}

func TestAllGatherBadInput(t *testing.T) {
	s := NewMemory()
	defer s.Close()
	for _, tc := range []struct{ rank, world int }{{-1, 2}, {2, 2}, {0, 0}} {
		_, err := AllGather(s, "p/", tc.rank, tc.world, nil, time.Second)
		require.ErrorContains(t, err, "outside", "rank %d world %d", tc.rank, tc.world)
	}
	_, err := AllGather(s, "p/", 0, 1, make([]byte, maxValueLen+1), time.Second)
	require.ErrorContains(t, err, "exceeds")
	srv := newServer(t, "")
	c := dial(t, srv.Addr(), "")
	_, err = AllGather(c, "p/", 0, 1, make([]byte, maxValueLen+1), time.Second)
	require.ErrorContains(t, err, "exceeds")
	_, err = AllGather(c, string([]byte{0xff}), 0, 1, nil, time.Second)
	require.ErrorContains(t, err, "UTF-8")
	require.NoError(t, c.Close())
	_, err = AllGather(c, "p/", 0, 1, nil, time.Second)
	require.ErrorIs(t, err, ErrClosed)
}

// A batch is one write answered in one round trip: a server that answers only
// after reading every request of the batch still completes it.
func TestAllGatherIsOneBatch(t *testing.T) {
	noLeaks(t)
	addr := fakeServer(t, func(c net.Conn) {
		var reqs []frame
		for len(reqs) < 3 { // the Set and two Gets, before any reply
			n, err := readFrameLen(c, maxFrame)
			if err != nil {
				return
			}
			body, err := readFrameBody(c, n)
			if err != nil {
				return
			}
			f, err := decodeFrame(body)
			if err != nil {
				return
			}
			reqs = append(reqs, f)
		}
		var out []byte
		for i := len(reqs) - 1; i >= 0; i-- { // answered in reverse order
			out = appendFrame(out, frame{op: opReply, id: reqs[i].id, value: []byte(reqs[i].key)})
		}
		c.Write(out)
		time.Sleep(100 * time.Millisecond)
	})
	c := dial(t, addr, "")
	vals, err := AllGather(c, "k", 1, 2, []byte("v"), time.Second)
	require.NoError(t, err)
	require.Equal(t, []string{"k0", "k1"}, []string{string(vals[0]), string(vals[1])})
}

func TestAllGatherClientGivesUpOnHungServer(t *testing.T) {
	noLeaks(t)
	release := make(chan struct{})
	addr := fakeServer(t, func(c net.Conn) { <-release })
	defer close(release)
	c := dial(t, addr, "")
	c.margin = 100 * time.Millisecond
	start := time.Now()
	_, err := AllGather(c, "k", 0, 2, nil, 100*time.Millisecond)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorContains(t, err, "no reply")
	require.Less(t, time.Since(start), time.Second)
}
