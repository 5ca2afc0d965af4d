package symmetric

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// kernelHost is the host provider posing as one whose devices run kernels:
// the choice of a signaler then depends on NVRTC (which fails here).
type kernelHost struct{ Provider }

func (kernelHost) kernelDevice() {}

// soloHandle is a world-of-one handle over prov with cfg. A simulated
// device (a kernelRunner) runs the kernels itself: its manager has no NVRTC
// to open, and its kernels are ready from the start (the rendezvous asks,
// Manager.kernelsForReset).
func soloHandle(t *testing.T, prov Provider, cfg Config) *Handle {
	m := NewManager(prov, cfg)
	if _, ok := prov.(kernelRunner); ok {
		m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} })
	}
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "solo", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Free(b.Ptr())) })
	return h
}

// The signaler is chosen on the first signal and kept, as SYMM_SIGNALS
// says: stream memory operations without device kernels or with "memop",
// and with "auto" where the kernels cannot run; "kernel" where they cannot
// run is an error, kept by no handle (every call fails alike). A failed
// handle refuses a barrier before any choice.
func TestSignalerChoice(t *testing.T) {
	noNVRTC := func() (*kernels.NVRTC, error) { return nil, errors.New("no NVRTC here") }
	for _, c := range []struct {
		name    string
		prov    Provider
		signals string
		memop   bool
	}{
		{"host, kernel", NewHostProvider(), SignalsKernel, true},
		{"kernels, auto", kernelHost{NewHostProvider()}, SignalsAuto, true},
		{"kernels, default", kernelHost{NewHostProvider()}, "", true},
		{"kernels, memop", kernelHost{NewHostProvider()}, SignalsMemop, true},
		{"kernels, kernel", kernelHost{NewHostProvider()}, SignalsKernel, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := soloHandle(t, c.prov, Config{Timeout: time.Second, Signals: c.signals, OpenNVRTC: noNVRTC})
			require.Nil(t, h.sig.Load(), "nothing is chosen before the first signal")
			err := h.PutSignal(0, 1, 0, 0)
			if !c.memop {
				require.ErrorIs(t, err, ErrNoKernels)
				require.EqualError(t, err, "SYMM_SIGNALS=kernel: kernels cannot run: no NVRTC here")
				require.Nil(t, h.sig.Load(), "a failed choice is not kept")
				require.EqualError(t, h.WaitSignal(0, 1, 0, 0), err.Error())
				require.EqualError(t, h.Barrier(0, 0, 0), err.Error())
				return
			}
			require.NoError(t, err)
			s := h.sig.Load()
			require.NotNil(t, s)
			require.IsType(t, memopSignals{}, *s)
			require.NoError(t, h.WaitSignal(0, 1, 0, 0))
			require.Same(t, s, h.sig.Load(), "the choice is kept")
		})
	}
	h := soloHandle(t, kernelHost{NewHostProvider()}, Config{Timeout: time.Second, Signals: SignalsKernel, OpenNVRTC: noNVRTC})
	h.fail(errors.New("lost peer"))
	require.EqualError(t, h.Barrier(0, 0, 0), "barrier: lost peer")
	require.Nil(t, h.sig.Load())
}

// stubSignaler counts the calls it gets.
type stubSignaler struct{ calls *int }

func (s stubSignaler) put(int, int, uintptr, time.Duration) error  { *s.calls++; return nil }
func (s stubSignaler) wait(int, int, uintptr, time.Duration) error { *s.calls++; return nil }
func (s stubSignaler) barrier(int, uintptr, time.Duration) error   { *s.calls++; return nil }

// Once chosen, handing a call to the handle's signaler (the hold on the
// block, the choice kept in the handle, the interface call) makes no Go
// heap allocation: with kernels, nothing on the hot path does
// (TestKernelSignalsAllocateNothing checks it on a GPU).
func TestSignalDispatchAllocatesNothing(t *testing.T) {
	h := soloHandle(t, NewHostProvider(), Config{Timeout: time.Second})
	calls := 0
	var s signaler = stubSignaler{&calls}
	h.sig.Store(&s)
	allocs := testing.AllocsPerRun(200, func() {
		if err := h.PutSignal(0, 2, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := h.WaitSignal(0, 2, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := h.Barrier(2, 0, 0); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	require.Equal(t, 3*201, calls)
}
