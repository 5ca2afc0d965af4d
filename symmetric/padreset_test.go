package symmetric

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/store"
)

// bytesAt views n bytes of a live mapping at addr.
func bytesAt(addr uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n)
}

func allZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

// A pad left dirty by its last user (a put nobody took, stale meetings in
// the sync area and the epoch counts) is zero on every rank once
// ResetSignalPad returns anywhere, and the group's signals work again.
func TestResetSignalPadZeroesEveryRank(t *testing.T) {
	const world = 3
	ranks(t, world, func(r int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		defer m.Free(b.Ptr())
		h, err := m.Rendezvous(b.Ptr(), Group{Name: "reset", Rank: r, World: world, Store: st})
		if err != nil {
			return err
		}
		if !h.epochSync {
			return fmt.Errorf("the block's first group owns its sync area")
		}
		if err := h.PutSignal((r+1)%world, 3, 0, time.Second); err != nil { // nobody takes it
			return err
		}
		pad, sync := bytesAt(b.PadPtr(), SignalPadSize), bytesAt(b.PadPtr()+SignalPadSize, SyncAreaSize)
		epochs := bytesAt(h.epochsArg(), 8*epochWords)
		for i := range sync {
			sync[i] = 7
		}
		epochs[0] = 5
		if err := h.ResetSignalPad(0); err != nil {
			return err
		}
		if !allZero(pad) || !allZero(sync) || !allZero(epochs) {
			return fmt.Errorf("rank %d: not zero after the reset: pad %v, sync area %v, epoch counts %v",
				r, allZero(pad), allZero(sync), allZero(epochs))
		}
		// Nobody signals before everyone has looked.
		if _, err := store.AllGather(st, "looked/", r, world, []byte{1}, 5*time.Second); err != nil {
			return err
		}
		return h.Barrier(3, 0, 5*time.Second)
	})
}

// A rank that does not come makes the others fail at the timeout, naming
// it; one that fails makes every rank fail at once, with its cause.
func TestResetSignalPadFailures(t *testing.T) {
	t.Run("absent", func(t *testing.T) {
		errs := runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
			func(r int, m *Manager, st store.Store) error {
				b, err := m.Alloc(0, 4096)
				if err != nil {
					return err
				}
				defer m.Free(b.Ptr())
				h, err := m.Rendezvous(b.Ptr(), Group{Name: "absent", Rank: r, World: 2, Store: st})
				if err != nil || r == 1 {
					// Rank 1 stays (its link open) but never comes: rank 0
					// waits for it until the timeout. (A rank that has gone
					// fails the others at once: TestLink*, faults_test.go.)
					time.Sleep(time.Second)
					return err
				}
				start := time.Now()
				err = h.ResetSignalPad(200 * time.Millisecond)
				if took := time.Since(start); took > 2*time.Second {
					return fmt.Errorf("waited %v, not the call's timeout", took)
				}
				return err
			})
		require.NoError(t, errs[1])
		require.ErrorIs(t, errs[0], os.ErrDeadlineExceeded) // SYMM_ERR_TIMEOUT
		require.ErrorContains(t, errs[0], "rank 1")
		require.ErrorContains(t, errs[0], `resetting the signal pad of group "absent" (rank 0 of 2)`)
	})
	t.Run("failing", func(t *testing.T) {
		errs := runRanks(3, func(r int) Provider {
			if r == 1 {
				return quiesceFails{Provider: NewHostProvider()}
			}
			return NewHostProvider()
		}, Config{Timeout: 10 * time.Second}, func(r int, m *Manager, st store.Store) error {
			b, err := m.Alloc(0, 4096)
			if err != nil {
				return err
			}
			defer m.Free(b.Ptr())
			h, err := m.Rendezvous(b.Ptr(), Group{Name: "failing", Rank: r, World: 3, Store: st})
			if err != nil {
				return err
			}
			start := time.Now()
			err = h.ResetSignalPad(0)
			if took := time.Since(start); took > 5*time.Second {
				return fmt.Errorf("waited %v for a failure", took)
			}
			return err
		})
		for r, err := range errs {
			require.ErrorContains(t, err, "device stuck", "rank %d", r)
			if r != 1 {
				require.ErrorIs(t, err, ErrPeerFailed, "rank %d", r)
				require.ErrorContains(t, err, "rank 1 (pid", "rank %d names it", r)
			}
		}
	})
	t.Run("freed", func(t *testing.T) {
		m := NewManager(NewHostProvider(), Config{})
		b, err := m.Alloc(0, 4096)
		require.NoError(t, err)
		h, err := m.Rendezvous(b.Ptr(), Group{Name: "solo", Rank: 0, World: 1, Store: store.NewMemory()})
		require.NoError(t, err)
		require.NoError(t, h.ResetSignalPad(time.Second), "a world of one agrees with itself")
		require.NoError(t, m.Free(b.Ptr()))
		require.ErrorIs(t, h.ResetSignalPad(time.Second), ErrUnknownPointer)
	})
}

// quiesceFails is a host provider whose device cannot be waited for.
type quiesceFails struct {
	Provider
	hostLabels
}

func (quiesceFails) Quiesce(int) error { return errors.New("device stuck") }

// On a GPU, a group that owns its block's sync area resets its pad with one
// kernel (meet, zero, meet) and no store traffic: a slot left set by a put nobody
// waited for is zero afterwards, the barriers' meeting counts go on, and the
// signals work again (GPU: SYMM_TEST_DEVICE=cuda).
func TestResetSignalPadOnGPU(t *testing.T) {
	_, h := cudaKernelHandle(t, 10*time.Second)
	require.True(t, h.epochSync, "the handle's group owns the block's sync area")
	require.NoError(t, h.PutSignal(0, 3, 0, 0)) // left set: nobody waits for it
	require.NoError(t, cuda.StreamSynchronize(0, 0))
	slot := make([]byte, 4)
	addr := h.PadPtr(0) + uintptr(4*3)
	require.NoError(t, cuda.MemcpyDtoH(0, slot, addr))
	require.Equal(t, []byte{1, 0, 0, 0}, slot, "the put set our own slot of channel 3")
	counted := store.Count(h.store)
	h.store = counted
	start := time.Now()
	require.NoError(t, h.ResetSignalPad(0))
	t.Logf("reset on the GPU: %v", time.Since(start))
	require.Equal(t, store.Traffic{}, counted.Traffic(), "the store is not used")
	require.NoError(t, cuda.MemcpyDtoH(0, slot, addr))
	require.Equal(t, []byte{0, 0, 0, 0}, slot, "the slot is zero after the reset")
	require.NoError(t, h.PutSignal(0, 3, 0, 0))
	require.NoError(t, h.WaitSignal(0, 3, 0, 2*time.Second), "signals work again")
	require.NoError(t, h.Barrier(0, 0, 2*time.Second))
	require.NoError(t, h.failed())
}

// The reset's way is agreed at the rendezvous: kernel barriers only where
// the kernels run on every rank's device. Here (two simulated devices) they
// load on rank 0's and not on rank 1's: both ranks take the store's way and
// meet there. (When each rank chose from its own KernelsReady, rank 0 ran
// its barriers alone and returned, and rank 1 waited in the store for it
// until the timeout.) Where they load on both, both take the kernels' way.
func TestResetSignalPadPathAgreed(t *testing.T) {
	for _, c := range []struct {
		name  string
		ready [2]bool
	}{{"kernels on rank 0 only", [2]bool{true, false}}, {"kernels on both", [2]bool{true, true}}} {
		t.Run(c.name, func(t *testing.T) {
			gpus := [2]*simGPU{newSimGPU(t), newSimGPU(t)}
			errs := runRanks(2, func(r int) Provider { return gpus[r] }, Config{Timeout: 5 * time.Second, AllowOverlappingDevices: true},
				func(r int, m *Manager, st store.Store) error {
					var why error
					if !c.ready[r] {
						why = errors.New("the module did not load")
					}
					m.kern.once.Do(func() { m.kern.ready = map[int]error{0: why} })
					b, err := m.Alloc(0, 4096)
					if err != nil {
						return err
					}
					defer m.Free(b.Ptr())
					h, err := m.Rendezvous(b.Ptr(), Group{Name: "agreed", Rank: r, World: 2, Store: st})
					if err != nil {
						return err
					}
					for id := range h.kstat.fns {
						h.kstat.fns[id].Store(uintptr(id + 1))
					}
					if want := c.ready[0] && c.ready[1]; h.resetOnGPU != want {
						return fmt.Errorf("rank %d: reset by kernel barriers %v, want %v", r, h.resetOnGPU, want)
					}
					return h.ResetSignalPad(time.Second)
				})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			want := 0
			if c.ready[1] {
				want = 1 // one kernel: meet, zero, meet
			}
			require.Equal(t, want, gpus[0].launches, "rank 0's reset as a kernel")
		})
	}
}

// A reset that only rank 1 wants (its tensors on the block are gone; rank
// 0's still live, in a reference cycle) is agreed: every rank resets, every
// pad is clean, and the group's barrier works after it. When no rank wants
// one, none resets: a put left in the pad stays.
func TestResetSignalPadIfAnyIsAgreed(t *testing.T) {
	const world = 3
	ranks(t, world, func(r int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		defer m.Free(b.Ptr())
		h, err := m.Rendezvous(b.Ptr(), Group{Name: "agreed", Rank: r, World: world, Store: st})
		if err != nil {
			return err
		}
		pad := bytesAt(b.PadPtr(), SignalPadSize)
		pad[4*(7*world+r)] = 1 // a signal nobody took, in every rank's pad
		reset, err := h.ResetSignalPadIfAny(false, 0)
		switch {
		case err != nil:
			return err
		case reset || allZero(pad):
			return fmt.Errorf("nobody wanted a reset, yet reset %v and pad clean %v", reset, allZero(pad))
		}
		reset, err = h.ResetSignalPadIfAny(r == 1, 0)
		switch {
		case err != nil:
			return err
		case !reset || !allZero(pad):
			return fmt.Errorf("rank 1 wanted a reset: reset %v, pad clean %v", reset, allZero(pad))
		}
		return h.Barrier(0, 0, 5*time.Second)
	})
}
