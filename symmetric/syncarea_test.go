package symmetric

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// The first group rendezvoused on a block owns its sync area on every rank;
// a second group of the same blocks meets through the signal pad; a group
// in which one rank's block is owned already by another group meets through
// the signal pad on every rank (all ranks decide from the same metadata).
func TestSyncAreaOwnership(t *testing.T) {
	ranks(t, 2, func(rank int, m *Manager, st store.Store) error {
		expect := func(h *Handle, owns bool, what string) error {
			if (h.epochsArg() != 0) != owns || h.epochSync != owns {
				return fmt.Errorf("%s: owns the sync area %v, want %v", what, h.epochSync, owns)
			}
			return nil
		}
		a, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		first, err := m.Rendezvous(a.Ptr(), Group{Name: "first", Rank: rank, World: 2, Store: st})
		if err != nil {
			return err
		}
		second, err := m.Rendezvous(a.Ptr(), Group{Name: "second", Rank: rank, World: 2, Store: st})
		if err != nil {
			return err
		}
		if err := expect(first, true, "the first group"); err != nil {
			return err
		}
		if err := expect(second, false, "the second group"); err != nil {
			return err
		}
		if again, err := m.Rendezvous(a.Ptr(), Group{Name: "first", Rank: rank, World: 2, Store: st}); err != nil || again != first {
			return fmt.Errorf("the same group again: %v (%p, want %p)", err, again, first)
		}

		// Rank 0's block is taken by a group of its own first.
		b, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		if rank == 0 {
			solo, err := m.Rendezvous(b.Ptr(), Group{Name: "solo", Rank: 0, World: 1, Store: st})
			if err != nil {
				return err
			}
			if err := expect(solo, true, "rank 0's own group"); err != nil {
				return err
			}
		}
		pair, err := m.Rendezvous(b.Ptr(), Group{Name: "pair", Rank: rank, World: 2, Store: st})
		if err != nil {
			return err
		}
		if err := expect(pair, false, "a group where rank 0's area is taken"); err != nil {
			return err
		}
		// The host backend's barrier works for both kinds of handle.
		for _, h := range []*Handle{first, second, pair} {
			if err := h.Barrier(0, 0, 0); err != nil {
				return fmt.Errorf("barrier of group %q: %w", h.group, err)
			}
		}
		return errors.Join(m.Free(a.Ptr()), m.Free(b.Ptr()))
	})
}

// The block's layout leaves room for the sync area after the signal pad.
func TestBlockHasRoomForTheSyncArea(t *testing.T) {
	m := NewManager(NewHostProvider(), Config{})
	g, err := m.Provider().Granularity(0)
	require.NoError(t, err)
	for _, size := range []uint64{1, 4096, g - SignalPadSize - 16, g - SignalPadSize, g - 16, g} {
		b, err := m.Alloc(0, size)
		require.NoError(t, err, "size %d", size)
		require.GreaterOrEqual(t, b.mem.Size, b.padOff+SignalPadSize+SyncAreaSize, "size %d", size)
		require.NoError(t, m.Free(b.Ptr()))
	}
}

// A group launches the smallest block cap of its ranks, whatever each asked
// for, and never more blocks than channels.
func TestCollectiveBlocksAgreed(t *testing.T) {
	caps := []int{120, 0, 200}
	errs := runRanks(3, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			m.cfg.CollectiveBlocks = caps[rank]
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			h, err := m.Rendezvous(b.Ptr(), Group{Name: "caps", Rank: rank, World: 3, Store: st})
			if err != nil {
				return err
			}
			if h.maxBlocks != kernels.DefaultCollectiveBlocks {
				return fmt.Errorf("rank %d: cap %d, want the smallest, %d (the default of rank 1)", rank, h.maxBlocks, kernels.DefaultCollectiveBlocks)
			}
			return m.Free(b.Ptr())
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	errs = runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second, CollectiveBlocks: 512},
		func(rank int, m *Manager, st store.Store) error {
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			h, err := m.Rendezvous(b.Ptr(), Group{Name: "wide", Rank: rank, World: 2, Store: st})
			if err != nil {
				return err
			}
			if h.maxBlocks != SignalPadSize/4/2 {
				return fmt.Errorf("rank %d: cap %d, want the channels of a world of 2, %d", rank, h.maxBlocks, SignalPadSize/4/2)
			}
			return m.Free(b.Ptr())
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}
