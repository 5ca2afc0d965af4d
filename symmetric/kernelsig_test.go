package symmetric

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// Every kernel has its own index and a name the source defines.
func TestKernelIndexes(t *testing.T) {
	seen := map[string]bool{}
	for id, n := range kernelNames {
		require.NotEmpty(t, n, "kernel %d has no name", id)
		require.False(t, seen[n], "%s twice", n)
		seen[n] = true
	}
	require.Equal(t, kernels.AllReduceKernel(kernels.BFloat16, 1, 5), kernelNames[allReduceIndex(kernels.BFloat16, 1, 5)])
	require.Equal(t, kernels.AllReduceKernel(kernels.Float32, 4, 8), kernelNames[allReduceIndex(kernels.Float32, 4, 8)])
	require.Equal(t, kernels.TwoShotAllReduceKernel(kernels.BFloat16, 4, 4), kernelNames[twoShotIndex(kernels.BFloat16, 4, 4)])
	require.Equal(t, kernels.TwoShotAllReduceKernel(kernels.Float32, 1, 3), kernelNames[twoShotIndex(kernels.Float32, 1, 3)])
	require.Equal(t, kernels.ReduceScatterKernel(kernels.BFloat16, 1, 8), kernelNames[reduceScatterIndex(kernels.BFloat16, 1, 8)])
	require.Equal(t, kernels.ReduceScatterKernel(kernels.Float32, 4, 3), kernelNames[reduceScatterIndex(kernels.Float32, 4, 3)])
	require.Equal(t, "symm_ag_v4", kernelNames[allGatherIndex(4)])
	require.Equal(t, "symm_ag_v1", kernelNames[allGatherIndex(1)])
}

// The host backend has no device kernels: signals stay what they were, the
// all-reduce runs in the calling thread, KernelsReady says why, and
// SYMM_SIGNALS=kernel changes nothing there (it is about GPUs).
func TestHostHasNoKernels(t *testing.T) {
	m := NewManager(NewHostProvider(), Config{Timeout: time.Second, Signals: SignalsKernel})
	err := m.KernelsReady(0)
	require.ErrorIs(t, err, ErrNoKernels)
	require.ErrorContains(t, err, "the host backend has no device kernels")
	st := store.NewMemory()
	defer st.Close()
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "solo", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	require.NoError(t, h.PutSignal(0, 1, 0, 0))
	require.NoError(t, h.WaitSignal(0, 1, 0, time.Second))
	require.NoError(t, h.Barrier(0, 0, 0))
	in := hostWords(b.Ptr(), 4)
	copy(in, []uint32{0x3f800000, 0xc0000000, 0x7fc00000, 0})
	out := make([]uint32, 4)
	require.NoError(t, h.OneShotAllReduce(AllReduce{Count: 4, Dtype: kernels.Float32, Op: "sum", Out: uintptrOf(out)}))
	require.Equal(t, []uint32{0x3f800000, 0xc0000000, 0x7fc00000, 0}, out, "a world of one sums to its input")
	require.NoError(t, m.Free(b.Ptr()))
}

// An output that overlaps local_input at a shift would let one block of
// the kernel overwrite input another has not copied in yet: refused, naming
// both and the shift, before anything is copied or signalled. The same
// address (in place) and disjoint neighbours are fine.
func TestAllReduceRefusesOutShiftedAgainstLocalInput(t *testing.T) {
	h := soloHandle(t, NewHostProvider(), Config{Timeout: time.Second})
	const n = 16
	mine := hostWords(h.BufferPtr(0), n)
	for i := range mine {
		mine[i] = 0x40000000 // 2.0
	}
	buf := make([]uint32, 3*n)
	for i := range buf {
		buf[i] = math.Float32bits(float32(i))
	}
	at := func(i int) uintptr { return uintptrOf(buf) + uintptr(4*i) }
	ar := func(out, local uintptr) error {
		return h.OneShotAllReduce(AllReduce{Count: n, Dtype: kernels.Float32, Op: "sum", Out: out, Local: local})
	}
	want := slices.Clone(buf)
	for _, c := range []struct {
		out, local int // word indexes into buf
		shift      string
	}{{n + 1, n, "+4"}, {n - 1, n, "-4"}, {2*n - 1, n, "+60"}, {1, n, "-60"}, {n, n + 1, "-4"}} {
		err := ar(at(c.out), at(c.local))
		require.ErrorIs(t, err, ErrInvalid, "%+v", c)
		require.ErrorContains(t, err, fmt.Sprintf("the output %#x overlaps local_input %#x (64 bytes each) at a shift of %s bytes", at(c.out), at(c.local), c.shift))
		require.Equal(t, want, buf, "nothing written")
		require.Equal(t, uint32(0x40000000), mine[0], "nothing copied in")
	}
	// The bfloat16 size counts too: 16 elements are 32 bytes.
	err := h.OneShotAllReduce(AllReduce{Count: n, Dtype: kernels.BFloat16, Op: "sum", Out: at(n + 7), Local: at(n)})
	require.ErrorContains(t, err, "(32 bytes each) at a shift of +28 bytes")
	require.NoError(t, h.OneShotAllReduce(AllReduce{Count: n, Dtype: kernels.BFloat16, Op: "sum", Out: at(n + 8), Local: at(n)}))
	require.Equal(t, want[n:n+8], buf[n+8:2*n], "a world of one sums to its local input")
	copy(buf, want)

	require.NoError(t, ar(at(n), at(n)), "in place")
	require.Equal(t, want, buf, "in place, a world of one sums to its local input")
	require.Equal(t, want[n:2*n], mine, "local_input copied in")
	require.NoError(t, ar(at(2*n), at(n)), "disjoint neighbours")
	require.Equal(t, want[n:2*n], buf[2*n:])
	require.NoError(t, ar(at(0), at(n)), "disjoint neighbours")
	require.Equal(t, want[n:2*n], buf[:n])
}

func TestToBF16(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{{1, 0x3f80}, {-2, 0xc000}, {1.00390625, 0x3f80}, {1.01171875, 0x3f82}, {3.0e38, 0x7f62}} {
		require.Equal(t, c.want, ToBF16(c.f), "%g", c.f)
	}
}

// cudaKernelHandle is a world-of-one handle on GPU 0 whose signals are
// kernels (SYMM_TEST_DEVICE=cuda and NVRTC found: SYMM_NVRTC_LIB).
func cudaKernelHandle(t *testing.T, timeout time.Duration) (*Manager, *Handle) {
	if os.Getenv("SYMM_TEST_DEVICE") != "cuda" {
		t.Skip("needs a GPU: SYMM_TEST_DEVICE=cuda")
	}
	prov, err := NewCUDAProvider()
	require.NoError(t, err)
	m := NewManager(prov, Config{Timeout: timeout, Signals: SignalsKernel})
	require.NoError(t, m.KernelsReady(0), "kernels must run on the GPU machine (SYMM_NVRTC_LIB)")
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	b, err := m.Alloc(0, 1<<20)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "kern", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, cuda.StreamSynchronize(0, 0))
		require.NoError(t, m.Free(b.Ptr()))
	})
	return m, h
}

// A put and a wait as kernels, queued without a timeout: no Go allocation.
func TestKernelSignalsAllocateNothing(t *testing.T) {
	_, h := cudaKernelHandle(t, 10*time.Second)
	require.NoError(t, h.PutSignal(0, 2, 0, 0)) // first use: status word, function handles
	require.NoError(t, h.WaitSignal(0, 2, 0, 0))
	allocs := testing.AllocsPerRun(200, func() {
		if err := h.PutSignal(0, 2, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := h.WaitSignal(0, 2, 0, 0); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	require.NoError(t, cuda.StreamSynchronize(0, 0))
}

// A wait that nobody answers, without a timeout: the kernel gives up at the
// manager's timeout, the stream goes on, and the watchdog fails the handle
// with the kernel's report.
func TestKernelWaitTimesOutThroughTheWatchdog(t *testing.T) {
	_, h := cudaKernelHandle(t, 300*time.Millisecond)
	start := time.Now()
	require.NoError(t, h.WaitSignal(0, 5, 0, 0))
	require.NoError(t, cuda.StreamSynchronize(0, 0), "the stream goes on")
	took := time.Since(start)
	require.Greater(t, took, 250*time.Millisecond)
	require.Less(t, took, 5*time.Second)
	var err error
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(pollEvery) {
		if err = h.failed(); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "rank 0's signal on channel 5 did not come within 300ms")
	require.ErrorIs(t, h.Barrier(0, 0, 0), ErrSignalTimeout, "the handle has failed")
}

// With a timeout the caller gets the report itself, and the handle fails:
// a wait that gave up may leave a late signal in the pad, which the next
// wait would take as its own.
func TestKernelWaitTimeoutFailsTheHandle(t *testing.T) {
	_, h := cudaKernelHandle(t, 10*time.Second)
	err := h.WaitSignal(0, 6, 0, 100*time.Millisecond)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "wait_signal from rank 0 on channel 6")
	require.ErrorIs(t, h.failed(), ErrSignalTimeout)
	require.ErrorIs(t, h.PutSignal(0, 6, 0, 0), ErrSignalTimeout, "the handle has failed")
	require.ErrorIs(t, h.WaitSignal(0, 6, 0, time.Second), ErrSignalTimeout)
}

// Timed calls on different streams each read their own report: a wait that
// times out is never answered with nil because a concurrent call took its
// report, and a call whose kernel completed never returns another's report.
func TestKernelTimedCallsOwnTheirReports(t *testing.T) {
	_, h := cudaKernelHandle(t, 10*time.Second)
	other, err := cuda.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, cuda.StreamDestroy(0, other)) }()
	// The pair below runs on channel 9 until the wait on channel 8 (on the
	// default stream) has timed out and failed the handle.
	done := make(chan error, 1)
	go func() { done <- h.WaitSignal(0, 8, 0, 300*time.Millisecond) }()
	var pairErrs []error
	for len(done) == 0 {
		if err := h.PutSignal(0, 9, other, 2*time.Second); err != nil {
			pairErrs = append(pairErrs, err)
			break
		}
		if err := h.WaitSignal(0, 9, other, 2*time.Second); err != nil {
			pairErrs = append(pairErrs, err)
			break
		}
	}
	err = <-done
	require.ErrorIs(t, err, ErrSignalTimeout, "the timed-out wait gets its own report")
	require.ErrorContains(t, err, "wait_signal from rank 0 on channel 8")
	for _, e := range pairErrs {
		// Only the handle's failure, never a report of channel 9's kernels.
		require.NotContains(t, e.Error(), "channel 9 did not come")
	}
	require.NoError(t, cuda.StreamSynchronize(0, other))
}

// A timed signal call on a stream held by earlier work for longer than the
// call's deadline (a stream wait on a host word, released later), while
// another thread queues more work behind it: the call waits for the earlier
// work, gives the peer its whole timeout from there, returns once its own
// kernel is done (not the stream) and the handle stays usable.
func TestKernelTimedCallBehindEarlierAndLaterWork(t *testing.T) {
	_, h := cudaKernelHandle(t, 10*time.Second)
	s, err := cuda.StreamCreate(0)
	require.NoError(t, err)
	gates, gatesDev, err := cuda.HostAllocMapped(0, 4096)
	require.NoError(t, err)
	earlier, later := word(gates), word(gates+8) // their low 32 bits are waited for
	t.Cleanup(func() {
		earlier.Store(1)
		later.Store(1)
		require.NoError(t, cuda.StreamSynchronize(0, s))
		require.NoError(t, cuda.StreamDestroy(0, s))
		require.NoError(t, cuda.HostFree(0, gates))
	})
	require.NoError(t, cuda.StreamWaitValue32(0, s, gatesDev, 1, cuda.WaitValueGEQ))
	require.NoError(t, h.PutSignal(0, 4, s, 0))
	const hold = 1500 * time.Millisecond // more than the call's 2 × 100ms + 1s
	queued := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the call is waiting by now
		queued <- cuda.StreamWaitValue32(0, s, gatesDev+8, 1, cuda.WaitValueGEQ)
		time.Sleep(hold - 100*time.Millisecond)
		earlier.Store(1)
	}()
	start := time.Now()
	err = h.WaitSignal(0, 4, s, 100*time.Millisecond)
	took := time.Since(start)
	require.NoError(t, err)
	require.NoError(t, <-queued)
	require.GreaterOrEqual(t, took, hold, "the call waited for the earlier work")
	require.NoError(t, h.failed())
	done, err := cuda.StreamQuery(0, s)
	require.NoError(t, err)
	require.False(t, done, "the later work still holds the stream: the call did not wait for it")
	later.Store(1)
	require.NoError(t, cuda.StreamSynchronize(0, s))
	require.NoError(t, h.PutSignal(0, 4, s, time.Second))
	require.NoError(t, h.WaitSignal(0, 4, s, time.Second))
}

// uintptrOf is the address of a Go slice's first element, for a call that
// reads or writes it synchronously (the host backend's all-reduce).
func uintptrOf(s []uint32) uintptr { return uintptr(unsafe.Pointer(&s[0])) }

// BenchmarkKernelPutWait is the host's cost of a put and a wait queued as
// kernels (GPU: SYMM_TEST_DEVICE=cuda).
func BenchmarkKernelPutWait(b *testing.B) {
	_, h := cudaKernelHandleB(b)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := h.PutSignal(0, 3, 0, 0); err != nil {
			b.Fatal(err)
		}
		if err := h.WaitSignal(0, 3, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := cuda.StreamSynchronize(0, 0); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkKernelBarrier is the host's cost of a barrier queued as a kernel
// (world 1: the launch path alone; GPU: SYMM_TEST_DEVICE=cuda).
func BenchmarkKernelBarrier(b *testing.B) {
	_, h := cudaKernelHandleB(b)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := h.Barrier(0, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := cuda.StreamSynchronize(0, 0); err != nil {
		b.Fatal(err)
	}
}

func cudaKernelHandleB(b *testing.B) (*Manager, *Handle) {
	if os.Getenv("SYMM_TEST_DEVICE") != "cuda" {
		b.Skip("needs a GPU: SYMM_TEST_DEVICE=cuda")
	}
	prov, err := NewCUDAProvider()
	require.NoError(b, err)
	m := NewManager(prov, Config{Timeout: 10 * time.Second, Signals: SignalsKernel})
	require.NoError(b, m.KernelsReady(0))
	st := store.NewMemory()
	blk, err := m.Alloc(0, 1<<20)
	require.NoError(b, err)
	h, err := m.Rendezvous(blk.Ptr(), Group{Name: "bench", Rank: 0, World: 1, Store: st})
	require.NoError(b, err)
	b.Cleanup(func() {
		cuda.StreamSynchronize(0, 0)
		m.Free(blk.Ptr())
		st.Close()
	})
	return m, h
}

// The all-reduce's launch shape comes from what every rank passes alike:
// 16-byte vectors only when the offset and size allow them, whatever this
// rank's pointers; never more blocks than channels.
func TestAllReduceShape(t *testing.T) {
	for _, c := range []struct {
		offset, nbytes uint64
		world, v       int
	}{{0, 32768, 2, 4}, {4, 32768, 2, 1}, {16, 32772, 2, 1}, {1 << 20, 4 << 20, 8, 4}, {0, 64, 3, 4}} {
		v, blocks, threads := allReduceShape(c.offset, c.nbytes, c.world, 1000)
		require.Equal(t, c.v, v, "%+v", c)
		require.LessOrEqual(t, int(blocks), SignalPadSize/4/c.world)
		require.GreaterOrEqual(t, int(threads), c.world)
	}
}
