package symmetric

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// A barrier on one rank that meets the other's all-reduce (as a pad reset
// decided by one rank alone did on GPUs) is an error on both ranks, naming
// both meetings; never a pass in which the all-reduce reads a peer's input
// before it is in. (Before meetings carried their kind, rank 1's all-reduce
// paired its first phase with rank 0's barrier and returned wrong sums with
// no error.)
func TestMismatchedMeetingIsAnError(t *testing.T) {
	const n = 16
	errs := runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(r int, m *Manager, st store.Store) error {
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(b.Ptr())
			h, err := m.Rendezvous(b.Ptr(), Group{Name: "mismatch", Rank: r, World: 2, Store: st})
			if err != nil {
				return err
			}
			in, out := make([]uint32, n), make([]uint32, n)
			for i := range in {
				in[i] = math.Float32bits(float32(r + 1))
			}
			if r == 0 {
				if err := h.Barrier(0, 0, time.Second); err != nil {
					return err
				}
			}
			err = h.OneShotAllReduce(AllReduce{Count: n, Dtype: kernels.Float32, Op: "sum", Out: uintptrOf(out),
				Local: uintptrOf(in), Timeout: time.Second})
			if err == nil {
				return fmt.Errorf("no error, sums %v (want 3 each)", math.Float32frombits(out[0]))
			}
			return err
		})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrMeetingMismatch, "rank %d", r)
		require.ErrorContains(t, err, "rank 0's barrier", "rank %d names rank 0's meeting", r)
		require.ErrorContains(t, err, "rank 1's one_shot_all_reduce (before the reads)", "rank %d names rank 1's meeting", r)
		require.ErrorContains(t, err, "channel 0", "rank %d", r)
	}
}

// Meetings of the same kinds in the same order pass, through every
// collective and the barrier, many times; a failed meeting fails the
// handle, and later meetings are refused rather than met shifted.
func TestMeetingsInStep(t *testing.T) {
	const n = 8
	ranks(t, 3, func(r int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		defer m.Free(b.Ptr())
		h, err := m.Rendezvous(b.Ptr(), Group{Name: "steps", Rank: r, World: 3, Store: st})
		if err != nil {
			return err
		}
		if !h.epochSync {
			return errors.New("the block's first group owns its sync area")
		}
		out := make([]uint32, 3*n)
		in := make([]uint32, 3*n)
		for k := 0; k < 20; k++ {
			for i := range in {
				in[i] = math.Float32bits(float32(r + k))
			}
			a := AllReduce{Count: n, Dtype: kernels.Float32, Op: "sum", Out: uintptrOf(out), Local: uintptrOf(in)}
			for _, call := range []func(AllReduce) error{h.OneShotAllReduce, h.TwoShotAllReduce, h.ReduceScatter} {
				if err := call(a); err != nil {
					return err
				}
				if got, want := math.Float32frombits(out[0]), float32(3+3*k); got != want {
					return fmt.Errorf("round %d: sum %v, want %v", k, got, want)
				}
			}
			a.Local = uintptrOf(in[:n])
			if err := h.AllGather(a); err != nil {
				return err
			}
			if err := h.Barrier(k%4, 0, 0); err != nil {
				return err
			}
		}
		return nil
	})
}
