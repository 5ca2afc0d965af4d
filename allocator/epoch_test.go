package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A placement stays unchanged until the shard's bins change, and while it
// is, freeing the block and asking again for its size on its stream gives
// the same block back (what export/front.cpp relies on to keep large blocks).
func TestPlacementUnchanged(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		p, err := New(NewVirtual(1, 0), Config{Expandable: expandable})
		require.NoError(t, err)
		a, pa, err := p.AllocPlaced(0, 0, 4<<20)
		require.NoError(t, err)
		require.NotNil(t, pa.Epoch, "expandable %v", expandable)
		require.True(t, pa.Unchanged(), "expandable %v: nothing happened since", expandable)
		for i := 0; i < 3; i++ { // free and again: the same block, and still unchanged
			require.NoError(t, p.Free(0, 0, a, 4<<20))
			again, pl, err := p.AllocPlaced(0, 0, 4<<20)
			require.NoError(t, err)
			require.Equal(t, a, again, "expandable %v", expandable)
			require.True(t, pl.Unchanged())
			pa = pl
		}
		// Another allocation on the same stream changes the bins.
		b, pb, err := p.AllocPlaced(0, 0, 3<<20)
		require.NoError(t, err)
		require.False(t, pa.Unchanged(), "expandable %v: the 3 MiB block changed the shard", expandable)
		require.True(t, pb.Unchanged())
		// Another stream has a shard of its own.
		c, pc, err := p.AllocPlaced(0, 0x1000, 1<<20)
		require.NoError(t, err)
		require.True(t, pb.Unchanged(), "expandable %v: another stream's allocation", expandable)
		require.NotEqual(t, pb.Epoch, pc.Epoch)
		// A free that starts to wait for record_stream events changes it too.
		require.NoError(t, p.RecordStream(c, 0x2000))
		require.NoError(t, p.Free(0, 0x1000, c, 1<<20))
		require.False(t, pc.Unchanged(), "expandable %v: a pending free", expandable)
		require.NoError(t, p.Free(0, 0, b, 3<<20))
		require.NoError(t, p.Free(0, 0, a, 4<<20))
		require.NoError(t, p.EmptyCache())
		require.NoError(t, p.CheckInvariants())
	}
}

// Private pools keep no epoch: no front cache serves them.
func TestPlacementOfPrivatePools(t *testing.T) {
	p, err := New(NewVirtual(1, 0), Config{})
	require.NoError(t, err)
	id := PoolID{First: 7}
	require.NoError(t, p.BeginAllocateToPool(0, id))
	ptr, _, err := p.AllocIn(0, 0, 4<<20, id)
	require.NoError(t, err)
	s := p.devs[0].privs[id].shards[0]
	require.NotNil(t, s)
	require.Nil(t, s.epoch)
	small, pl, err := s.alloc(1 << 20)
	require.NoError(t, err)
	require.Nil(t, pl.Epoch)
	require.False(t, pl.Unchanged())
	require.NoError(t, p.Free(0, 0, ptr, 4<<20))
	require.NoError(t, p.Free(0, 0, small, 1<<20))
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.ReleasePool(0, id, false))
}
