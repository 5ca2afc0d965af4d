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
		a, pa, err := p.Alloc(0, 0, 4<<20)
		require.NoError(t, err)
		require.NotNil(t, pa.Epoch, "expandable %v", expandable)
		require.True(t, pa.Unchanged(), "expandable %v: nothing happened since", expandable)
		for i := 0; i < 3; i++ { // free and again: the same block, and still unchanged
			require.NoError(t, p.Free(0, 0, a, 4<<20))
			again, pl, err := p.Alloc(0, 0, 4<<20)
			require.NoError(t, err)
			require.Equal(t, a, again, "expandable %v", expandable)
			require.True(t, pl.Unchanged())
			pa = pl
		}
		// Another allocation on the same stream changes the bins.
		b, pb, err := p.Alloc(0, 0, 3<<20)
		require.NoError(t, err)
		require.False(t, pa.Unchanged(), "expandable %v: the 3 MiB block changed the shard", expandable)
		require.True(t, pb.Unchanged())
		// Another stream has a shard of its own.
		c, pc, err := p.Alloc(0, 0x1000, 1<<20)
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

// While a freed block waits for record_stream events, no placement is
// claimed to stay: the pending block joins the bins at a later request (once
// its events completed), with no change beforehand, and the best fit may
// then place the same request elsewhere (FuzzPoolOpsExpandable found one: a
// 4 KiB pending block below the freed one).
func TestPlacementWithPendingFrees(t *testing.T) {
	for _, expandable := range []bool{false, true} {
		fb := newFake(1)
		fb.capacity = 64 << 20 // an expandable segment reserves the device's memory as address space
		p, err := New(fb, Config{Expandable: expandable})
		require.NoError(t, err)
		small, _, err := p.Alloc(0, 0, 4096)
		require.NoError(t, err)
		require.NoError(t, p.RecordStream(small, 0x2000))
		fb.launch(0x2000) // the other stream has work queued: the free stays pending
		require.NoError(t, p.Free(0, 0, small, 4096))
		a, pa, err := p.Alloc(0, 0, 9<<20)
		require.NoError(t, err)
		require.Nil(t, pa.Epoch, "expandable %v: a pending free", expandable)
		require.False(t, pa.Unchanged())
		fb.finish(0x2000)
		require.NoError(t, p.Free(0, 0, a, 9<<20))
		b, pb, err := p.Alloc(0, 0, 9<<20) // the pending block joins the bins here
		require.NoError(t, err)
		require.True(t, pb.Unchanged(), "expandable %v: nothing pending any more", expandable)
		require.NoError(t, p.Free(0, 0, b, 9<<20))
		require.NoError(t, p.CheckInvariants())
	}
}

// Private pools keep no epoch: no front cache serves them.
func TestPlacementOfPrivatePools(t *testing.T) {
	p, err := New(NewVirtual(1, 0), Config{})
	require.NoError(t, err)
	id := PoolID{First: 7}
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	ptr, _, err := p.AllocIn(0, 0, 4<<20, id)
	require.NoError(t, err)
	s := p.devs[0].privs[id].shards[0]
	require.NotNil(t, s)
	require.Nil(t, s.epoch)
	small, pl, err := s.alloc(1<<20, nil)
	require.NoError(t, err)
	require.Nil(t, pl.Epoch)
	require.False(t, pl.Unchanged())
	require.NoError(t, p.Free(0, 0, ptr, 4<<20))
	require.NoError(t, p.Free(0, 0, small, 1<<20))
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.ReleasePool(0, id, false))
}
