package symmetric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// The workspace's size and its limit agree: a workspace of
// PushWorkspaceSize(world, n) bytes takes n bytes (rounded up to 8).
func TestPushWorkspaceSize(t *testing.T) {
	for _, c := range []struct {
		world int
		max   uint64
		want  uint64
	}{{1, 1, 32}, {2, 8, 64}, {2, 9, 128}, {4, 1 << 20, 16 << 20}, {8, 512 << 10, 16 << 20}} {
		got, err := PushWorkspaceSize(c.world, c.max)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%d ranks, %d bytes", c.world, c.max)
		require.Equal(t, (c.max+7)/8*8, 8*pushSlotLines(got, c.world))
	}
	for _, c := range [][2]uint64{{0, 8}, {2, 0}, {2, math.MaxUint64}} {
		_, err := PushWorkspaceSize(int(c[0]), c[1])
		require.ErrorIs(t, err, ErrInvalid, "%v", c)
	}
}

// pushInput is rank r's element i of call k: small multiples of 1/8 of
// mixed signs, exact in every dtype, so that sums in any order agree.
func pushInput(d kernels.Dtype, r, k, i int) float32 {
	return float32((r*7919+k*104729+i*31)%61-30) / 8
}

// pushBytes encodes vals as dtype d.
func pushBytes(d kernels.Dtype, vals []float32) []byte {
	out := make([]byte, len(vals)*d.Size())
	for i, v := range vals {
		switch d {
		case kernels.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case kernels.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], ToBF16(v))
		default:
			binary.LittleEndian.PutUint16(out[2*i:], ToF16(v))
		}
	}
	return out
}

// pushWant is the sum of call k over world ranks, as every rank computes it.
func pushWant(d kernels.Dtype, world, k, n int) []byte {
	vals := make([]float32, n)
	for i := range vals {
		var acc float32
		for r := 0; r < world; r++ {
			acc += pushInput(d, r, k, i)
		}
		vals[i] = acc
	}
	return pushBytes(d, vals)
}

// pushRank joins a workspace for maxBytes as rank of world (group name).
func pushRank(m *Manager, st store.Store, name string, rank, world int, maxBytes uint64) (*Handle, error) {
	size, err := PushWorkspaceSize(world, maxBytes)
	if err != nil {
		return nil, err
	}
	b, err := m.Alloc(0, size)
	if err != nil {
		return nil, err
	}
	return m.Rendezvous(b.Ptr(), Group{Name: name, Rank: rank, World: world, Store: st})
}

// pushCall runs call k of count elements of d on h, the input and output at
// the given element offsets into buffers of their own (or in place), and
// checks the sum.
func pushCall(h *Handle, d kernels.Dtype, k, count, inOff, outOff int, inPlace bool) error {
	es := d.Size()
	vals := make([]float32, count)
	for i := range vals {
		vals[i] = pushInput(d, h.Rank(), k, i)
	}
	inBuf := make([]byte, (count+inOff+1)*es+8)
	copy(inBuf[inOff*es:], pushBytes(d, vals))
	outBuf := inBuf
	if !inPlace {
		outBuf = make([]byte, (count+outOff+1)*es+8)
	} else {
		outOff = inOff
	}
	// The call reaches the buffers through uintptrs, which neither keep
	// them alive nor follow them: pinned, they stay on the heap where they
	// are (a small slice that does not escape may live on the stack, which
	// moves when it grows) until the call has returned.
	var pin runtime.Pinner
	pin.Pin(&inBuf[0])
	pin.Pin(&outBuf[0])
	defer pin.Unpin()
	in, out := uintptrOfBytes(inBuf)+uintptr(inOff*es), uintptrOfBytes(outBuf)+uintptr(outOff*es)
	if err := h.PushAllReduce(PushAllReduce{In: in, Out: out, Count: uint64(count), Dtype: d, Op: "sum", Timeout: 5 * time.Second}); err != nil {
		return fmt.Errorf("call %d (%d %s): %w", k, count, d, err)
	}
	got := outBuf[outOff*es : (outOff+count)*es]
	if want := pushWant(d, h.World(), k, count); string(got) != string(want) {
		for i := range got {
			if got[i] != want[i] {
				return fmt.Errorf("call %d (%d %s, in place %v): byte %d of %d is %#x, want %#x", k, count, d, inPlace, i, len(got), got[i], want[i])
			}
		}
	}
	if string(outBuf[(outOff+count)*es:]) != string(make([]byte, len(outBuf)-(outOff+count)*es)) && !inPlace {
		return fmt.Errorf("call %d: bytes past the output were written", k)
	}
	return nil
}

// Real ranks (goroutines with managers of their own over host memory) sum
// every dtype, odd sizes included, out of place, in place and at offsets
// of one element, call after call (the halves alternate, sizes grow and
// shrink), with the workspace's largest message last.
func TestPushAllReduceHostRanks(t *testing.T) {
	const maxBytes = 16 << 10
	for _, world := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks(t, world, func(rank int, m *Manager, st store.Store) error {
				h, err := pushRank(m, st, "push", rank, world, maxBytes)
				if err != nil {
					return err
				}
				if h.PushMaxBytes() != maxBytes {
					return fmt.Errorf("limit %d, want %d", h.PushMaxBytes(), maxBytes)
				}
				k := 0
				for _, d := range []kernels.Dtype{kernels.Float32, kernels.BFloat16, kernels.Float16} {
					for _, n := range []int{1, 3, 4, 7, 1000, 1001, 3000, 17, maxBytes / d.Size()} {
						for _, c := range []struct {
							inOff, outOff int
							inPlace       bool
						}{{0, 0, false}, {1, 0, false}, {0, 3, false}, {1, 0, true}} {
							if err := pushCall(h, d, k, n, c.inOff, c.outOff, c.inPlace); err != nil {
								return fmt.Errorf("rank %d: %w", rank, err)
							}
							k++
						}
					}
				}
				return nil
			})
		})
	}
}

// Flags are 32 bits: across a multiple of 2^32 calls each half is cleared
// once it has been read (to a flag of the other parity), so a line left
// 2^32 calls ago cannot pass for the peer's data. A line planted in rank
// 0's half 0 with the flag of call 2^32, beyond the message of call 2^32-2,
// is cleared by that call and is not taken for rank 1's data at call 2^32
// (a larger message), though rank 1 comes late.
func TestPushAllReduceAcrossFlagWrap(t *testing.T) {
	const first = 1<<32 - 4
	var planted sync.WaitGroup
	planted.Add(1)
	errs := runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second, PushFirstCall: first},
		func(rank int, m *Manager, st store.Store) error {
			h, err := pushRank(m, st, "wrap", rank, 2, 4096)
			if err != nil {
				return err
			}
			lines := pushSlotLines(h.b.bufSize, 2)
			fake := h.pushLineAddr(h.BufferPtr(0), lines, 0, 1, 100) // rank 0's half 0, rank 1's slot, line 100
			for k := 0; k < 10; k++ {
				e := uint64(first + k)
				n := 8 // elements of float32: lines 0..3
				if e == 1<<32 {
					n = 1024 // lines 0..511
					if rank == 1 {
						planted.Wait()
						time.Sleep(50 * time.Millisecond) // rank 0 reaches line 100 first
					}
				}
				if rank == 0 && e == 1<<32-2 {
					word(fake).Store(0xdead)
					word(fake + 8).Store(0xbeef)
					planted.Done()
				}
				if err := pushCall(h, kernels.Float32, k, n, 0, 0, false); err != nil {
					return fmt.Errorf("rank %d: %w", rank, err)
				}
				if rank == 0 && e == 1<<32-2 && (word(fake).Load() != 1<<32 || word(fake+8).Load() != 1<<32) {
					return fmt.Errorf("the planted line is %#x %#x after call %d, want it cleared to flag 1", word(fake).Load(), word(fake+8).Load(), e)
				}
			}
			if got := word(h.pushStateHost()).Load(); got != first+10 {
				return fmt.Errorf("rank %d: next call %d, want %d", rank, got, uint64(first+10))
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// Each bad argument gets ErrInvalid naming it, before anything is written;
// a count of 0 does nothing; a world of one sums to its input.
func TestPushAllReduceRefusesBadArguments(t *testing.T) {
	h := soloHandle(t, NewHostProvider(), Config{Timeout: time.Second})
	require.Equal(t, uint64(1024), h.PushMaxBytes(), "4096 bytes for one rank")
	buf := make([]uint32, 1024)
	defer runtime.KeepAlive(buf) // reached through uintptrs only
	p := uintptrOf(buf)
	ws := h.BufferPtr(0)
	f := func(in, out uintptr, count uint64, d kernels.Dtype, op string, timeout time.Duration) error {
		return h.PushAllReduce(PushAllReduce{In: in, Out: out, Count: count, Dtype: d, Op: op, Timeout: timeout})
	}
	for _, c := range []struct {
		err  error
		says string
	}{
		{f(p, p+2048, 16, 3, "sum", 0), "dtype 3 is not float32 (0), bfloat16 (1) or float16 (2)"},
		{f(p, p+2048, 16, kernels.Float32, "max", 0), `op "max": only sum is supported`},
		{f(p, p+2048, 16, kernels.Float32, "sum", -time.Millisecond), "negative"},
		{f(p, p+2048, math.MaxUint64/2, kernels.Float32, "sum", 0), "overflow"},
		{f(p, p+2048, 257, kernels.Float32, "sum", 0), "1028 bytes (257 float32) exceed the workspace's limit of 1024 bytes per call " +
			"(a 4096-byte buffer for 1 ranks); a workspace of 4128 bytes takes them"},
		{f(0, p+2048, 16, kernels.Float32, "sum", 0), "is NULL"},
		{f(p, 0, 16, kernels.Float32, "sum", 0), "is NULL"},
		{f(p+2, p+2048, 16, kernels.Float32, "sum", 0), "aligned to the 4-byte float32 element"},
		{f(p, p+2049, 16, kernels.BFloat16, "sum", 0), "aligned to the 2-byte bfloat16 element"},
		{f(p, p+4, 16, kernels.Float32, "sum", 0), "overlaps the input"},
		{f(p+30, p, 16, kernels.Float16, "sum", 0), "at a shift of -30 bytes"},
		{f(ws+64, p, 16, kernels.Float32, "sum", 0), "lies in the workspace's own buffer"},
		{f(p, ws+4032, 16, kernels.Float32, "sum", 0), "lies in the workspace's own buffer"},
	} {
		require.ErrorIs(t, c.err, ErrInvalid, c.says)
		require.ErrorContains(t, c.err, c.says)
	}
	require.Zero(t, word(h.pushStateHost()).Load(), "nothing ran: the workspace is not set up")
	require.NoError(t, f(0, 0, 0, kernels.Float32, "sum", 0), "count 0 does nothing")
	for i := range buf {
		buf[i] = math.Float32bits(float32(i) - 100)
	}
	require.NoError(t, f(p, p, 256, kernels.Float32, "sum", 0), "in place, the largest message")
	for i := 0; i < 256; i++ {
		require.Equal(t, float32(i)-100, math.Float32frombits(buf[i]))
	}
	require.NoError(t, f(p, p+4096-2, 1, kernels.BFloat16, "sum", 0), "the output ends at the buffer's end")
}

// A workspace serves one group: its block joined with a second group is
// refused at the first call.
func TestPushWorkspaceOfOneGroup(t *testing.T) {
	h := soloHandle(t, NewHostProvider(), Config{Timeout: time.Second})
	st := store.NewMemory()
	defer st.Close()
	_, err := h.m.Rendezvous(h.b.Ptr(), Group{Name: "other", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	buf := make([]uint32, 4)
	defer runtime.KeepAlive(buf) // reached through uintptrs only
	err = h.PushAllReduce(PushAllReduce{In: uintptrOf(buf), Out: uintptrOf(buf), Count: 4, Dtype: kernels.Float32, Op: "sum"})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "is joined with 2 groups; a workspace serves one group")
}

// A rank that stays away: the others time out naming it and their handles
// fail (its data could arrive during a later call); at the first call, the
// set-up says it was waiting for the peer.
func TestPushAllReduceLatePeer(t *testing.T) {
	errs := runRanks(2, func(int) Provider { return NewHostProvider() }, Config{Timeout: 5 * time.Second},
		func(rank int, m *Manager, st store.Store) error {
			h, err := pushRank(m, st, "late", rank, 2, 4096)
			if err != nil {
				return err
			}
			if err := pushCall(h, kernels.BFloat16, 0, 100, 0, 0, false); err != nil {
				return err
			}
			h2, err := pushRank(m, st, "absent", rank, 2, 4096)
			if err != nil {
				return err
			}
			if rank == 1 {
				return nil
			}
			buf := make([]uint32, 64)
			defer runtime.KeepAlive(buf) // reached through uintptrs only
			a := PushAllReduce{In: uintptrOf(buf), Out: uintptrOf(buf), Count: 64, Dtype: kernels.Float32, Op: "sum", Timeout: 200 * time.Millisecond}
			start := time.Now()
			err = h.PushAllReduce(a)
			if !errors.Is(err, ErrSignalTimeout) || !errContains(err, "rank 1's data for push all-reduce call 2 did not come within 200ms") {
				return fmt.Errorf("want a timeout naming rank 1, got %v", err)
			}
			if took := time.Since(start); took < 150*time.Millisecond || took > 3*time.Second {
				return fmt.Errorf("gave up after %v", took)
			}
			if err := h.PushAllReduce(a); !errors.Is(err, ErrSignalTimeout) || !errContains(err, "rank 1's data") {
				return fmt.Errorf("the handle should have failed: %v", err)
			}
			err = h2.PushAllReduce(a)
			if !errors.Is(err, ErrSignalTimeout) || !errContains(err, "push_all_reduce's workspace set-up") || !errContains(err, "rank 1") {
				return fmt.Errorf("want the set-up to time out naming rank 1, got %v", err)
			}
			return nil
		})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

func errContains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// The workspace's set-up counts only once it has run: a first call captured
// in a CUDA graph (its set-up captured, not run) leaves it pending, and the
// eager call that follows, before any replay, queues the set-up again
// before its own kernel; once a set-up has run, calls queue only theirs.
// (When the set-up counted as soon as it was queued, the eager call
// launched the push alone, which read a workspace never cleared.) A call
// that still finds no set-up on the device fails, naming it.
func TestPushSetUpCountsOnceItHasRun(t *testing.T) {
	g := &pushGPU{simGPU: newSimGPU(t)}
	h := soloHandle(t, g, Config{Timeout: time.Second, Signals: SignalsKernel})
	m := h.m
	m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} })
	for id := range h.kstat.fns {
		h.kstat.fns[id].Store(uintptr(id + 1))
	}
	a := PushAllReduce{In: 0x10000, Out: 0x10000, Count: 8, Dtype: kernels.Float32, Op: "sum", Stream: simStream}
	ids := func() (ids []int) {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, l := range g.launched {
			ids = append(ids, l.id)
		}
		g.launched = nil
		return ids
	}
	g.capturing = true
	require.NoError(t, h.PushAllReduce(a))
	require.Equal(t, []int{kPushInit, kPush}, ids(), "the captured first call")
	g.capturing = false
	require.NoError(t, h.PushAllReduce(a))
	require.Equal(t, []int{kPushInit, kPush}, ids(), "the eager call before the replay sets the workspace up again")
	require.NoError(t, h.PushAllReduce(a))
	require.Equal(t, []int{kPush}, ids(), "the set-up has run")

	g.report = 1<<63 | uint64(kernels.OpPushUnset)<<56
	a.Timeout = 100 * time.Millisecond
	err := h.PushAllReduce(a)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "the workspace was not set up before the call")
}

// pushGPU records the kernels a simulated device is asked to launch. A
// set-up kernel launched while capturing is false runs: it writes its
// ready word, as symm_push_init does; one launched while capturing is
// captured into a graph that is never replayed, and does not run.
type pushGPU struct {
	*simGPU
	mu        sync.Mutex
	launched  []pushLaunch
	capturing bool
}

type pushLaunch struct {
	id          int
	grid, block uint32
	words       []uint64
	stream      uintptr
}

func (g *pushGPU) LaunchKernel(dev int, f uintptr, grid, block uint32, stream uintptr, words []uint64) error {
	g.mu.Lock()
	g.launched = append(g.launched, pushLaunch{id: int(f) - 1, grid: grid, block: block, words: words, stream: stream})
	run := int(f)-1 == kPushInit && !g.capturing
	g.mu.Unlock()
	if run {
		word(uintptr(words[7])).Store(1) // device address = host address
	}
	return g.simGPU.LaunchKernel(dev, f, grid, block, stream, words)
}

// On a device the first call queues the set-up kernel, then the call's;
// later calls only theirs, with the workspace's arrays, the handle's state,
// the caller's pointers and the message size. A report of a late peer
// names it and the call, and fails the handle.
func TestPushAllReduceKernelLaunches(t *testing.T) {
	g := &pushGPU{simGPU: newSimGPU(t)}
	h := soloHandle(t, g, Config{Timeout: time.Second, Signals: SignalsKernel, PushFirstCall: 7})
	m := h.m
	m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} })
	for id := range h.kstat.fns {
		h.kstat.fns[id].Store(uintptr(id + 1))
	}
	in, out := uintptr(0x10000), uintptr(0x20002)
	a := PushAllReduce{In: in, Out: out, Count: 3, Dtype: kernels.Float16, Op: "sum", Stream: simStream}
	require.NoError(t, h.PushAllReduce(a))
	require.NoError(t, h.PushAllReduce(a))
	lines := uint64(4096 / 32)
	ib, it := kernels.PushInitLaunch(lines)
	g.mu.Lock()
	require.Len(t, g.launched, 3)
	init, call := g.launched[0], g.launched[1]
	g.mu.Unlock()
	require.Equal(t, kPushInit, init.id)
	require.Equal(t, [2]uint32{ib, it}, [2]uint32{init.grid, init.block})
	require.Equal(t, []uint64{uint64(h.BufferPtrsDev()), uint64(h.pushStateDev()), lines, uint64(h.PadPtrsDev()), 0, 1, 7,
		uint64(h.kstat.dev + 8), uint64(time.Second), init.words[9]}, init.words)
	require.Equal(t, kPush+int(kernels.Float16), call.id)
	require.Equal(t, [2]uint32{1, 32}, [2]uint32{call.grid, call.block})
	require.Equal(t, []uint64{uint64(h.BufferPtrsDev()), uint64(h.pushStateDev()), uint64(in), uint64(out), 6, lines, 0, 1,
		uint64(time.Second), call.words[9]}, call.words)
	require.Equal(t, kPush+int(kernels.Float16), g.launched[2].id, "the set-up runs once")

	g.report = 1<<63 | uint64(kernels.OpPush)<<56 | 3<<32 | 9
	a.Timeout = 100 * time.Millisecond
	err := h.PushAllReduce(a)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "push_all_reduce of 3 float16 on group \"solo\" (rank 0)")
	require.ErrorContains(t, err, "rank 3's data for push all-reduce call 9 (mod 2^32) did not come within 100ms")
	err = h.PushAllReduce(a)
	require.ErrorIs(t, err, ErrSignalTimeout, "the handle failed")
	require.ErrorContains(t, err, "rank 3's data")
}

// Half precision as the kernel's cvt.rn.f16.f32: exact values, rounding to
// nearest even (normal and subnormal), overflow to infinity.
func TestToF16(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65519, 0x7bff}, {65520, 0x7c00}, {1e9, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00}, {1 + 1.0/2048, 0x3c00}, {1 + 3.0/2048, 0x3c02}, {1.0 / 16384, 0x0400},
		{1.0 / (1 << 24), 0x0001}, {1.0 / (1 << 25), 0}, {1.5 / (1 << 24), 0x0002}, {2.5 / (1 << 24), 0x0002},
		{1023.0 / (1 << 24), 0x03ff}, {-1.0 / (1 << 24), 0x8001},
	} {
		require.Equal(t, c.want, ToF16(c.f), "%g", c.f)
	}
	require.True(t, math.IsNaN(float64(F16ToF32(ToF16(float32(math.NaN()))))))
	for h := 0; h < 0x10000; h++ {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue // NaN
		}
		require.Equal(t, uint16(h), ToF16(F16ToF32(uint16(h))), "%#x round trip", h)
	}
}

// On a GPU (SYMM_TEST_DEVICE=cuda): a world of one through the real
// kernels, every dtype, odd sizes and offsets, in place, many calls; the
// calls queue without a Go allocation.
func TestPushAllReduceOnGPU(t *testing.T) {
	m, h := cudaKernelHandle(t, 10*time.Second)
	b, err := m.Alloc(0, 1<<20)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Free(b.Ptr())) })
	io := b.Ptr()
	require.Equal(t, uint64(256<<10), h.PushMaxBytes())
	k := 0
	for _, d := range []kernels.Dtype{kernels.Float32, kernels.BFloat16, kernels.Float16} {
		// Sizes up to the limit less the largest offset below (256 KiB per call).
		for _, n := range []int{1, 3, 1001, 4096, 60001, (256<<10)/d.Size() - 5} {
			for _, off := range [][2]int{{0, 0}, {1, 3}, {5, 5}} {
				vals := make([]float32, n)
				for i := range vals {
					vals[i] = pushInput(d, 0, k, i)
				}
				in, out := io+uintptr(off[0]*d.Size()), io+uintptr(512<<10+off[1]*d.Size())
				if off[0] == 5 { // in place
					out = in
				}
				require.NoError(t, cuda.MemcpyHtoD(0, in, pushBytes(d, vals)))
				require.NoError(t, h.PushAllReduce(PushAllReduce{In: in, Out: out, Count: uint64(n), Dtype: d, Op: "sum"}))
				got := make([]byte, n*d.Size())
				require.NoError(t, cuda.MemcpyDtoH(0, got, out))
				require.Equal(t, pushWant(d, 1, k, n), got, "call %d: %d %s at %v", k, n, d, off)
				k++
			}
		}
	}
	a := PushAllReduce{In: io, Out: io, Count: 1024, Dtype: kernels.BFloat16, Op: "sum"}
	allocs := testing.AllocsPerRun(200, func() {
		if err := h.PushAllReduce(a); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	require.NoError(t, cuda.StreamSynchronize(0, 0))
	require.NoError(t, h.failed())
}

// SYMM_PUSH_MAX_BYTES: a positive number of bytes, rounded up to 8, else
// 1 MiB; anything else is refused naming the variable.
func TestPushMaxBytesFromEnv(t *testing.T) {
	for v, want := range map[string]uint64{"": 1 << 20, "65536": 65536, "100": 104, "1": 8, "8": 8} {
		got, err := PushMaxBytesFromEnv(envMap(map[string]string{"SYMM_PUSH_MAX_BYTES": v}))
		require.NoError(t, err, v)
		require.Equal(t, want, got, v)
	}
	for _, v := range []string{"0", "-1", "1M", "0x10", "abc", " 64", "18446744073709551615"} {
		_, err := PushMaxBytesFromEnv(envMap(map[string]string{"SYMM_PUSH_MAX_BYTES": v}))
		require.ErrorIs(t, err, ErrInvalid, v)
		require.ErrorContains(t, err, "SYMM_PUSH_MAX_BYTES", v)
	}
}
