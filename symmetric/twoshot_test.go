package symmetric

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// twoShotInput is word i of rank r's input for call k: multiples of 0.75
// (two bfloat16 or float16 elements, or a float32 plus a thousandth per
// rank; float16 gets a hundredth per rank too, so that its sums round).
func twoShotInput(d kernels.Dtype, r, k, i int) uint32 {
	f := func(j int) float32 { return float32((r*7+k*3+j)%23-11) * 0.75 }
	switch d {
	case kernels.BFloat16:
		return uint32(ToBF16(f(2*i))) | uint32(ToBF16(f(2*i+1)))<<16
	case kernels.Float16:
		e := 0.01 * float32(r)
		return uint32(ToF16(f(2*i)+e)) | uint32(ToF16(f(2*i+1)+e))<<16
	}
	return math.Float32bits(f(i) + 1e-3*float32(r))
}

// twoShotWant is the rank-order float32 sum of n words over world ranks.
func twoShotWant(d kernels.Dtype, world, k, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		var a, b float32
		for r := 0; r < world; r++ {
			w := twoShotInput(d, r, k, i)
			switch d {
			case kernels.BFloat16:
				a += math.Float32frombits(w << 16)
				b += math.Float32frombits(w & 0xffff0000)
			case kernels.Float16:
				a += F16ToF32(uint16(w))
				b += F16ToF32(uint16(w >> 16))
			default:
				a += math.Float32frombits(w)
			}
		}
		switch d {
		case kernels.BFloat16:
			out[i] = uint32(ToBF16(a)) | uint32(ToBF16(b))<<16
		case kernels.Float16:
			out[i] = uint32(ToF16(a)) | uint32(ToF16(b))<<16
		default:
			out[i] = math.Float32bits(a)
		}
	}
	return out
}

// Real ranks over host memory: the two-shot all-reduce sums every rank's
// buffer into every rank's buffer (in place) and into out (out of place),
// with and without local_input, at an offset, for sizes that split into
// world shares evenly, unevenly, and smaller than world (one rank sums it
// all); the bytes past the message are left alone.
func TestTwoShotAllReduceHostRanks(t *testing.T) {
	for _, world := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks(t, world, func(rank int, m *Manager, st store.Store) error {
				b, err := m.Alloc(0, 64<<10)
				if err != nil {
					return err
				}
				h, err := m.Rendezvous(b.Ptr(), Group{Name: "two", Rank: rank, World: world, Store: st})
				if err != nil {
					return err
				}
				k := 0
				for _, d := range []kernels.Dtype{kernels.Float32, kernels.BFloat16, kernels.Float16} {
					for _, n := range []int{1, 2, 3, 4, 5, 16, 17, 1000, 1003, 4096} {
						for _, mode := range []string{"in place", "out", "local in place", "local out", "local to buffer"} {
							const offWords = 4
							buf := hostWords(h.BufferPtr(rank), 16<<10)
							for i := range buf {
								buf[i] = 0xdeadbeef
							}
							input := make([]uint32, n)
							for i := range input {
								input[i] = twoShotInput(d, rank, k, i)
							}
							in := h.BufferPtr(rank) + 4*offWords
							user := make([]uint32, n+1)
							user[n] = 0xfeedface
							a := AllReduce{Offset: 4 * offWords, Count: uint64(n * 4 / d.Size()), Dtype: d, Op: "sum", Timeout: 5 * time.Second}
							result := buf[offWords : offWords+n]
							var local []uint32 // reached only through a.Local: kept alive across the call
							switch mode {
							case "in place":
								copy(result, input)
								a.Out = in
							case "out":
								copy(result, input)
								a.Out = uintptrOf(user)
							case "local in place":
								copy(user, input)
								a.Out, a.Local = uintptrOf(user), uintptrOf(user)
							case "local out":
								local = slices.Clone(input)
								a.Out, a.Local = uintptrOf(user), uintptrOf(local)
							case "local to buffer":
								local = slices.Clone(input)
								a.Out, a.Local = in, uintptrOf(local)
							}
							err := h.TwoShotAllReduce(a)
							runtime.KeepAlive(local)
							if err != nil {
								return fmt.Errorf("call %d (%d words of %s, %s): %w", k, n, d, mode, err)
							}
							want := twoShotWant(d, world, k, n)
							if mode != "in place" && mode != "local to buffer" {
								if fmt.Sprint(user[:n]) != fmt.Sprint(want) || user[n] != 0xfeedface {
									return fmt.Errorf("call %d (%d words of %s, %s): out %x, want %x", k, n, d, mode, user, want)
								}
							}
							if fmt.Sprint(result) != fmt.Sprint(want) {
								return fmt.Errorf("call %d (%d words of %s, %s): buffer %x, want %x", k, n, d, mode, result, want)
							}
							if buf[offWords-1] != 0xdeadbeef || buf[offWords+n] != 0xdeadbeef {
								return fmt.Errorf("call %d (%d words, %s): the buffer was written outside the message", k, n, mode)
							}
							k++
						}
					}
				}
				return m.Free(b.Ptr())
			})
		})
	}
}

// The shares: world contiguous runs of a multiple of v words, the last one
// taking the rest (all of it when the message is smaller than world × v).
func TestTwoShotShare(t *testing.T) {
	for _, c := range []struct{ n, v, s, world, lo, hi int }{
		{16, 4, 0, 2, 0, 8}, {16, 4, 1, 2, 8, 16}, {20, 4, 2, 3, 8, 20}, {20, 4, 0, 3, 0, 4},
		{7, 1, 2, 3, 4, 7}, {4, 4, 0, 2, 0, 0}, {4, 4, 1, 2, 0, 4}, {1, 1, 0, 1, 0, 1},
	} {
		lo, hi := twoShotShare(c.n, c.v, c.s, c.world)
		require.Equal(t, [2]int{c.lo, c.hi}, [2]int{lo, hi}, "%+v", c)
	}
}

// The output and local_input may be the buffer itself or disjoint from it;
// any other overlap with the buffer is refused naming both and the shift,
// as is an output shifted against local_input, before anything is copied
// or signalled.
func TestTwoShotAllReduceRefusesOverlaps(t *testing.T) {
	h := soloHandle(t, NewHostProvider(), Config{Timeout: time.Second})
	const n = 16
	want := make([]uint32, 3*n)
	for i := range want {
		want[i] = math.Float32bits(float32(i))
	}
	buf := hostWords(h.BufferPtr(0), 3*n)
	copy(buf, want)
	in := h.BufferPtr(0) + 4*n
	ar := func(out, local uintptr) error {
		return h.TwoShotAllReduce(AllReduce{Offset: 4 * n, Count: n, Dtype: kernels.Float32, Op: "sum", Out: out, Local: local})
	}
	err := ar(in+4, 0)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, fmt.Sprintf("two_shot_all_reduce: the output %#x overlaps this rank's buffer %#x (64 bytes) at a shift of +4 bytes", in+4, in))
	err = ar(in-60, 0)
	require.ErrorContains(t, err, "at a shift of -60 bytes")
	other := make([]uint32, n)
	err = ar(uintptrOf(other), in+8)
	require.ErrorContains(t, err, fmt.Sprintf("two_shot_all_reduce: local_input %#x overlaps this rank's buffer %#x (64 bytes) at a shift of +8 bytes", in+8, in))
	user := make([]uint32, 2*n)
	err = ar(uintptrOf(user)+4, uintptrOf(user))
	require.ErrorContains(t, err, "two_shot_all_reduce: the output")
	require.ErrorContains(t, err, "overlaps local_input")
	require.Equal(t, want, buf, "nothing written")

	require.NoError(t, ar(in, 0), "in place")
	require.Equal(t, want, buf, "a world of one sums to its input")
	require.NoError(t, ar(in, in), "in place, local_input the buffer itself")
	require.NoError(t, ar(in-4*n, 0), "a disjoint neighbour")
	require.Equal(t, want[n:2*n], buf[:n])
	require.NoError(t, ar(in+4*n, 0), "a disjoint neighbour")
	require.Equal(t, want[n:2*n], buf[2*n:])
	err = h.TwoShotAllReduce(AllReduce{Count: 4, Dtype: kernels.Dtype(7), Op: "sum", Out: in})
	require.ErrorContains(t, err, "two_shot_all_reduce: dtype 7 is not float32 (0), bfloat16 (1) or float16 (2)")
	require.NoError(t, h.TwoShotAllReduce(AllReduce{Dtype: kernels.Float32, Op: "sum"}), "count 0 does nothing")
}

// On a device: one kernel, the two-shot one for the dtype, vector width and
// world, with the one-shot's launch shape and parameters; a report names
// the call.
func TestTwoShotAllReduceKernelLaunches(t *testing.T) {
	g := &pushGPU{simGPU: newSimGPU(t)}
	h := soloHandle(t, g, Config{Timeout: time.Second, Signals: SignalsKernel})
	m := h.m
	m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} })
	for id := range h.kstat.fns {
		h.kstat.fns[id].Store(uintptr(id + 1))
	}
	out := make([]uint32, 1024)
	a := AllReduce{Offset: 16, Count: 1024, Dtype: kernels.BFloat16, Op: "sum", Out: uintptrOf(out), Stream: simStream}
	require.NoError(t, h.TwoShotAllReduce(a))
	a.Offset = 4
	require.NoError(t, h.TwoShotAllReduce(a))
	g.mu.Lock()
	require.Len(t, g.launched, 2)
	l4, l1 := g.launched[0], g.launched[1]
	g.mu.Unlock()
	require.Equal(t, twoShotIndex(kernels.BFloat16, 4, 1), l4.id)
	require.Equal(t, "symm_ts_bf16_v4_wany", kernelNames[l4.id])
	require.Equal(t, "symm_ts_bf16_v1_wany", kernelNames[l1.id])
	b, th := kernels.AllReduceLaunch(512, 4, kernels.DefaultCollectiveBlocks)
	require.Equal(t, [2]uint32{b, th}, [2]uint32{l4.grid, l4.block})
	require.NotZero(t, h.epochsArg(), "a handle whose group owns the sync area meets through it")
	require.Equal(t, []uint64{uint64(h.BufferPtrsDev()), 16, 512, uint64(uintptrOf(out)), 0, uint64(h.PadPtrsDev()),
		uint64(h.epochsArg()), 0, 1, uint64(time.Second), l4.words[10]}, l4.words)

	// The one-shot launches its own kernel with the same shape and words.
	a.Offset = 16
	other := make([]uint32, 1024)
	a.Out = uintptrOf(other)
	require.NoError(t, h.OneShotAllReduce(a))
	g.mu.Lock()
	one := g.launched[len(g.launched)-1]
	g.mu.Unlock()
	require.Equal(t, "symm_ar_bf16_v4_wany", kernelNames[one.id])
	require.Equal(t, [2]uint32{b, th}, [2]uint32{one.grid, one.block})
	require.Equal(t, []uint64{uint64(h.BufferPtrsDev()), 16, 512, uint64(uintptrOf(other)), 0, uint64(h.PadPtrsDev()),
		uint64(h.epochsArg()), 0, 1, uint64(time.Second), one.words[10]}, one.words)
	a.Out = uintptrOf(out)

	g.report = 1<<63 | uint64(kernels.OpReduceOut)<<56 | 2<<32 | 5
	a.Timeout = 100 * time.Millisecond
	err := h.TwoShotAllReduce(a)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "two_shot_all_reduce of 1024 bfloat16 on group \"solo\" (rank 0)")
	require.ErrorContains(t, err, "rank 2 did not finish its reads (channel 5)")
	require.ErrorIs(t, h.TwoShotAllReduce(a), ErrSignalTimeout, "the handle failed")
}

// On a GPU (SYMM_TEST_DEVICE=cuda): a world of one through the real
// kernels, both dtypes, aligned and not, in place and out of place, with
// and without local_input; queued without a Go allocation.
func TestTwoShotAllReduceOnGPU(t *testing.T) {
	m, h := cudaKernelHandle(t, 10*time.Second)
	b, err := m.Alloc(0, 1<<20)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Free(b.Ptr())) })
	io := b.Ptr()
	k := 0
	for _, d := range []kernels.Dtype{kernels.Float32, kernels.BFloat16} {
		for _, n := range []int{1, 3, 1001, 4096, 60001} {
			for _, c := range []struct {
				off        uint64
				out, local int // bytes into io; -1: the buffer itself / none
			}{{0, -1, -1}, {16, 4, -1}, {4, 8, 512 << 10}, {32, 256 << 10, 256 << 10}} {
				input := make([]uint32, n)
				for i := range input {
					input[i] = twoShotInput(d, 0, k, i)
				}
				bytes := make([]byte, 4*n)
				for i, w := range input {
					bytes[4*i], bytes[4*i+1], bytes[4*i+2], bytes[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
				}
				in := h.BufferPtr(0) + uintptr(c.off)
				a := AllReduce{Offset: c.off, Count: uint64(n * 4 / d.Size()), Dtype: d, Op: "sum", Out: in}
				if c.out >= 0 {
					a.Out = io + uintptr(c.out)
				}
				src := in
				if c.local >= 0 {
					a.Local = io + uintptr(c.local)
					src = a.Local
				}
				require.NoError(t, cuda.MemcpyHtoD(0, src, bytes))
				require.NoError(t, h.TwoShotAllReduce(a))
				got := make([]byte, 4*n)
				require.NoError(t, cuda.MemcpyDtoH(0, got, a.Out))
				require.Equal(t, bytes, got, "call %d: %d words of %s, %+v", k, n, d, c)
				k++
			}
		}
	}
	a := AllReduce{Count: 1024, Dtype: kernels.BFloat16, Op: "sum", Out: io}
	allocs := testing.AllocsPerRun(200, func() {
		if err := h.TwoShotAllReduce(a); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	require.NoError(t, cuda.StreamSynchronize(0, 0))
	require.NoError(t, h.failed())
}
