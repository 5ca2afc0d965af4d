package symmetric

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// Real ranks over host memory: reduce_scatter gives rank r the rank-order
// float32 sum of share r (the same bits as the two-shot's sum of those
// words), all_gather gives every rank every rank's share; in place and out
// of place, with local_input (NCCL's in-place layout too), at an offset,
// for odd sizes; nothing outside the message is written.
func TestReduceScatterAllGatherHostRanks(t *testing.T) {
	for _, world := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ranks(t, world, func(rank int, m *Manager, st store.Store) error {
				b, err := m.Alloc(0, 64<<10)
				if err != nil {
					return err
				}
				h, err := m.Rendezvous(b.Ptr(), Group{Name: "rsag", Rank: rank, World: world, Store: st})
				if err != nil {
					return err
				}
				k := 0
				for _, d := range []kernels.Dtype{kernels.Float32, kernels.BFloat16, kernels.Float16} {
					for _, n := range []int{1, 3, 4, 17, 1001} { // words per rank
						for _, off := range []int{0, 1, 4} { // words
							for _, mode := range []string{"in place", "out", "local", "local in place"} {
								if err := rsagCall(h, rank, world, d, n, off, mode, k); err != nil {
									return fmt.Errorf("call %d (%s, %d words per rank at word %d, %s): %w", k, d, n, off, mode, err)
								}
								k++
							}
						}
					}
				}
				return m.Free(b.Ptr())
			})
		})
	}
}

func rsagCall(h *Handle, rank, world int, d kernels.Dtype, n, off int, mode string, k int) error {
	buf := hostWords(h.BufferPtr(rank), 16<<10)
	for i := range buf {
		buf[i] = 0xdeadbeef
	}
	msg := buf[off : off+world*n]
	base := h.BufferPtr(rank) + uintptr(4*off)
	count := uint64(n * 4 / d.Size())
	// All-gather (any dtype, a copy); then reduce-scatter.
	in := make([]uint32, n)
	for i := range in {
		in[i] = twoShotInput(kernels.Float32, rank, k, i)
	}
	user := make([]uint32, world*n+1)
	user[world*n] = 0xfeedface
	a := AllReduce{Offset: uint64(4 * off), Count: count, Dtype: d, Timeout: 5 * time.Second}
	result := msg
	var local []uint32 // a local input, kept alive across the call below
	switch mode {
	case "in place":
		copy(msg[rank*n:], in)
		a.Out = base
	case "out":
		copy(msg[rank*n:], in)
		a.Out, result = uintptrOf(user), user[:world*n]
	case "local":
		local = slices.Clone(in)
		a.Out, a.Local, result = uintptrOf(user), uintptrOf(local), user[:world*n]
	case "local in place": // NCCL's: the input at the output's share r
		copy(user[rank*n:], in)
		a.Out, a.Local, result = uintptrOf(user), uintptrOf(user)+uintptr(4*rank*n), user[:world*n]
	}
	err := h.AllGather(a)
	runtime.KeepAlive(local) // reached only through a.Local: the GC must not free it first
	if err != nil {
		return fmt.Errorf("all_gather: %w", err)
	}
	for s := 0; s < world; s++ {
		for i := 0; i < n; i++ {
			if want := twoShotInput(kernels.Float32, s, k, i); result[s*n+i] != want {
				return fmt.Errorf("all_gather: word %d of share %d is %#x, want %#x", i, s, result[s*n+i], want)
			}
		}
	}
	if user[world*n] != 0xfeedface || (off > 0 && buf[off-1] != 0xdeadbeef) || buf[off+world*n] != 0xdeadbeef {
		return fmt.Errorf("all_gather wrote outside the message")
	}
	// Reduce-scatter: rank r's share of the two-shot's sum of world × n words.
	all := make([]uint32, world*n)
	for i := range all {
		all[i] = twoShotInput(d, rank, k, i)
	}
	want := twoShotWant(d, world, k, world*n)[rank*n : rank*n+n]
	a.Op, a.Local = "sum", 0
	switch mode {
	case "in place":
		copy(msg, all)
		a.Out, result = base+uintptr(4*rank*n), msg[rank*n:rank*n+n]
	case "out":
		copy(msg, all)
		a.Out, result = uintptrOf(user), user[:n]
	case "local":
		local = slices.Clone(all)
		a.Out, a.Local, result = uintptrOf(user), uintptrOf(local), user[:n]
	case "local in place": // NCCL's: the output at the input's share r
		copy(user, all)
		a.Local, a.Out, result = uintptrOf(user), uintptrOf(user)+uintptr(4*rank*n), user[rank*n:rank*n+n]
	}
	err = h.ReduceScatter(a)
	runtime.KeepAlive(local)
	if err != nil {
		return fmt.Errorf("reduce_scatter: %w", err)
	}
	if fmt.Sprint(result) != fmt.Sprint(want) {
		return fmt.Errorf("reduce_scatter: %x, want %x", result, want)
	}
	if user[world*n] != 0xfeedface || (off > 0 && buf[off-1] != 0xdeadbeef) || buf[off+world*n] != 0xdeadbeef {
		return fmt.Errorf("reduce_scatter wrote outside the message")
	}
	return nil
}

// Bad arguments and overlaps are refused by name before anything is copied
// or signalled (a world of two where each rank's refusals never meet the
// peer); then one good call of each.
func TestReduceScatterAllGatherRefusals(t *testing.T) {
	ranks(t, 2, func(rank int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		h, err := m.Rendezvous(b.Ptr(), Group{Name: "bad", Rank: rank, World: 2, Store: st})
		if err != nil {
			return err
		}
		const n = 16 // float32 per rank
		buf := h.BufferPtr(rank)
		share := buf + uintptr(4*n*rank)
		user := make([]uint32, 4*n)
		u := uintptrOf(user)
		rs := func(out, local uintptr) error {
			return h.ReduceScatter(AllReduce{Count: n, Dtype: kernels.Float32, Op: "sum", Out: out, Local: local})
		}
		ag := func(out, local uintptr) error {
			return h.AllGather(AllReduce{Count: n, Dtype: kernels.Float32, Out: out, Local: local})
		}
		for _, c := range []struct {
			err  error
			want string
		}{
			{rs(share+4, 0), "reduce_scatter: the output"},
			{rs(buf+uintptr(4*n*(1-rank)), 0), "overlaps this rank's buffer"},
			{rs(u, buf+4), "reduce_scatter: local_input"},
			{rs(u+4, u), "reduce_scatter: the output"},
			{rs(u+uintptr(4*n*(1-rank)), u), "overlaps local_input"},
			{ag(buf+4, 0), "all_gather: the output"},
			{ag(u, share+4), "all_gather: local_input"},
			{ag(u, buf+uintptr(4*n*(1-rank))), "overlaps this rank's buffer"},
			{ag(u, u+uintptr(4*n*(1-rank))), "all_gather: the output"},
			{h.ReduceScatter(AllReduce{Count: n, Dtype: kernels.Dtype(7), Op: "sum", Out: u}), "reduce_scatter: dtype 7 is not float32 (0), bfloat16 (1) or float16 (2)"},
			{h.ReduceScatter(AllReduce{Count: n, Dtype: kernels.Float32, Op: "max", Out: u}), `op "max"`},
			{h.AllGather(AllReduce{Count: n, Dtype: 7, Out: u}), "all_gather: dtype 7"},
			{h.AllGather(AllReduce{Count: 3, Dtype: kernels.BFloat16, Out: u}), "size per rank 6 bytes (3 bfloat16) must be multiples of 4"},
			{h.AllGather(AllReduce{Offset: 2, Count: 4, Dtype: kernels.BFloat16, Out: u}), "offset 2"},
			{h.ReduceScatter(AllReduce{Count: 1024, Dtype: kernels.Float32, Op: "sum", Out: u}), "2 ranks × 4096 bytes at offset 0 do not fit"},
			{h.AllGather(AllReduce{Count: n, Dtype: kernels.Float32}), "all_gather: output is NULL"},
			{h.AllGather(AllReduce{Count: n, Dtype: kernels.Float32, Out: u, Timeout: -1}), "timeout -1ns is negative"},
		} {
			if c.err == nil || !errors.Is(c.err, ErrInvalid) || !strings.Contains(c.err.Error(), c.want) {
				return fmt.Errorf("want an ErrInvalid with %q, got %v", c.want, c.err)
			}
		}
		if err := h.AllGather(AllReduce{Dtype: kernels.Float32, Out: 0}); err != nil {
			return fmt.Errorf("count 0: %w", err)
		}
		if err := rs(share, buf); err != nil {
			return fmt.Errorf("reduce_scatter in place: %w", err)
		}
		return ag(buf, share)
	})
}

// On a device: one kernel per call, the right one, with the one-shot's
// launch shape over one share and the share's words.
func TestReduceScatterAllGatherKernelLaunches(t *testing.T) {
	g := &pushGPU{simGPU: newSimGPU(t)}
	h := soloHandle(t, g, Config{Timeout: time.Second, Signals: SignalsKernel})
	m := h.m
	m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} })
	for id := range h.kstat.fns {
		h.kstat.fns[id].Store(uintptr(id + 1))
	}
	out := make([]uint32, 1024)
	a := AllReduce{Offset: 16, Count: 1024, Dtype: kernels.BFloat16, Op: "sum", Out: uintptrOf(out), Stream: simStream}
	require.NoError(t, h.ReduceScatter(a))
	a.Offset = 4
	require.NoError(t, h.AllGather(a))
	g.mu.Lock()
	require.Len(t, g.launched, 2)
	rs, ag := g.launched[0], g.launched[1]
	g.mu.Unlock()
	require.Equal(t, "symm_rs_bf16_v4_wany", kernelNames[rs.id])
	require.Equal(t, "symm_ag_v1", kernelNames[ag.id])
	bl, th := kernels.AllReduceLaunch(512, 4, kernels.DefaultCollectiveBlocks)
	require.Equal(t, [2]uint32{bl, th}, [2]uint32{rs.grid, rs.block})
	require.Equal(t, []uint64{uint64(h.BufferPtrsDev()), 16, 512, uint64(uintptrOf(out)), 0, uint64(h.PadPtrsDev()),
		uint64(h.epochsArg()), 0, 1, uint64(time.Second), rs.words[10]}, rs.words)

	g.report = 1<<63 | uint64(kernels.OpReduceIn)<<56 | 2<<32 | 5
	a.Timeout = 100 * time.Millisecond
	err := h.AllGather(a)
	require.ErrorIs(t, err, ErrSignalTimeout)
	require.ErrorContains(t, err, "all_gather of 1024 bfloat16 per rank on group \"solo\" (rank 0)")
}
