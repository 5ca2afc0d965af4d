package symmetric

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// What a rendezvous of the host backend asks of the store, per rank
// (rendezvous.go, link.go, exchange.go, store/gather.go), phase by phase:
//
//	phase                                        store requests        round trips: Client / Memory
//	the group's link (its first rendezvous only)  1 Set + world Gets    1 / world+1
//	descriptors + import + map (exchange)        none: Unix datagrams  0 / 0
//	check (validate), pointer arrays             none                  0 / 0
//	completion (agree "done")                    none: Unix datagrams  0 / 0
//	registration (register)                      none: the host provider is no Registrar
//	                                             (NCCL's agreement is datagrams too)
//
// So the group's first rendezvous sends opsPerWorld·world + opsFixed =
// world + 1 requests in one round trip on a Client (a batched all-gather is
// one write and its replies), or world + 1 round trips on a store that does
// not batch; bytes: the rank's own link record and the world+1 keys go out,
// every rank's record comes back. Every later rendezvous of the group sends
// nothing to the store: its steps are messages on the ranks' connections,
// 2·(world−1) sent and received per rank. A rendezvous of a block already
// joined with the group returns the handle the block holds (Rendezvous)
// and sends nothing at all.
const (
	opsPerWorld = 1 // the Gets of the link's all-gather
	opsFixed    = 1 // its Set
	tripsClient = 1 // one all-gather on a store that batches
)

// rankTraffic is one rank's store traffic in the steps of
// TestRendezvousStoreTraffic, and what it needs to bound the bytes.
type rankTraffic struct {
	first, second, again store.Traffic
	metaMax              int // the longest metadata record the rank gathered
}

// rendezvousTraffic runs world host ranks, each through its own Counting
// store: on a Client of one Server (each rank's own connection, as
// processes have), or on one shared Memory. Each rank rendezvouses a block
// with group "g", then another block, then the first block again.
func rendezvousTraffic(t *testing.T, world int, client bool) []rankTraffic {
	t.Helper()
	var srv *store.Server
	if client {
		var err error
		srv, err = store.NewServer("", "")
		require.NoError(t, err)
		defer srv.Close()
	}
	out := make([]rankTraffic, world)
	errs := runRanks(world, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, shared store.Store) error {
			var st *store.Counting
			if client {
				c, err := store.Dial(srv.Addr(), "", 2*time.Second)
				if err != nil {
					return err
				}
				st = store.Count(c)
				defer st.Close()
			} else {
				st = store.Count(shared) // runRanks closes the Memory
			}
			g := Group{Name: "g", Rank: rank, World: world, Store: st}
			var blocks [2]*Block
			for i := range blocks {
				b, err := m.Alloc(0, 4096)
				if err != nil {
					return err
				}
				defer m.Free(b.Ptr())
				blocks[i] = b
			}
			measure := func(b *Block, into *store.Traffic) (*Handle, error) {
				before := st.Traffic()
				h, err := m.Rendezvous(b.Ptr(), g)
				*into = st.Traffic().Sub(before)
				return h, err
			}
			r := &out[rank]
			h, err := measure(blocks[0], &r.first)
			if err != nil {
				return err
			}
			if _, err := measure(blocks[1], &r.second); err != nil {
				return err
			}
			again, err := measure(blocks[0], &r.again)
			if err != nil {
				return err
			}
			if again != h {
				return fmt.Errorf("the re-rendezvous made a new handle")
			}
			for _, p := range m.links[g.Name].peers { // what the link gathered
				raw, err := json.Marshal(p) // the record as the rank published it
				if err != nil {
					return err
				}
				r.metaMax = max(r.metaMax, len(raw))
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return out
}

// The store traffic of a rendezvous grows at most linearly with the world:
// per rank at most opsPerWorld·world + opsFixed requests, in tripsClient
// round trips on a Client, with bytes bounded by the metadata records and
// keys (the derivation above), at the group's first rendezvous only;
// doubling the world at most doubles each. A later rendezvous of the group,
// and a re-rendezvous of a joined block, cost the store nothing.
func TestRendezvousStoreTraffic(t *testing.T) {
	for _, client := range []bool{true, false} {
		name := map[bool]string{true: "client", false: "memory"}[client]
		t.Run(name, func(t *testing.T) {
			var prev store.Traffic // the busiest rank's, one world down
			for _, world := range []int{2, 4, 8} {
				var most store.Traffic // the busiest rank's, per count, over both fresh rendezvous
				for rank, r := range rendezvousTraffic(t, world, client) {
					tr := r.first
					ops := int64(opsPerWorld*world + opsFixed)
					require.LessOrEqual(t, tr.Ops(), ops, "world %d rank %d: requests", world, rank)
					require.Zero(t, tr.Adds+tr.Deletes, "world %d rank %d", world, rank)
					if client {
						require.LessOrEqual(t, tr.RoundTrips, int64(tripsClient), "world %d rank %d: round trips", world, rank)
					} else {
						require.Equal(t, tr.Ops(), tr.RoundTrips, "a Memory store answers each request alone")
					}
					keyMax := len(fmt.Sprintf("symm/g/link1/%d", world-1))
					require.LessOrEqual(t, tr.BytesSent, int64(r.metaMax)+ops*int64(keyMax), "world %d rank %d: bytes sent", world, rank)
					require.LessOrEqual(t, tr.BytesReceived, int64(world*r.metaMax), "world %d rank %d: bytes received", world, rank)
					most = store.Traffic{Sets: max(most.Sets, tr.Sets), Gets: max(most.Gets, tr.Gets),
						RoundTrips: max(most.RoundTrips, tr.RoundTrips),
						BytesSent:  max(most.BytesSent, tr.BytesSent), BytesReceived: max(most.BytesReceived, tr.BytesReceived)}
					require.Equal(t, store.Traffic{}, r.second, "world %d rank %d: a later rendezvous of the group uses the store", world, rank)
					require.Equal(t, store.Traffic{}, r.again, "world %d rank %d: a re-rendezvous of the same block uses the store", world, rank)
				}
				t.Logf("world %d, busiest rank: %d requests (%d Sets, %d Gets), %d round trips, %d bytes sent, %d received",
					world, most.Ops(), most.Sets, most.Gets, most.RoundTrips, most.BytesSent, most.BytesReceived)
				if world > 2 { // from world/2 to world: at most twice the traffic per rank
					require.LessOrEqual(t, most.Ops(), 2*prev.Ops(), "requests per rank, world %d against %d", world, world/2)
					require.LessOrEqual(t, most.RoundTrips, 2*prev.RoundTrips, "round trips per rank, world %d against %d", world, world/2)
					require.LessOrEqual(t, most.BytesSent, 2*prev.BytesSent, "bytes sent per rank, world %d against %d", world, world/2)
					require.LessOrEqual(t, most.BytesReceived, 2*prev.BytesReceived, "bytes received per rank, world %d against %d", world, world/2)
				}
				prev = most
			}
		})
	}
}
