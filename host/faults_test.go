package host

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
)

func TestParseFaults(t *testing.T) {
	for v, want := range map[string]struct {
		rate float64
		seed uint64
	}{"0": {0, 0}, "1": {1, 0}, "0.05": {0.05, 0}, "0.2:42": {0.2, 42}, " 0.5:7 ": {0.5, 7}} {
		rate, seed, err := ParseFaults(v)
		require.NoError(t, err, v)
		require.Equal(t, want.rate, rate, v)
		require.Equal(t, want.seed, seed, v)
	}
	for _, v := range []string{"x", "-0.1", "1.5", "NaN", "0.1:", "0.1:-3", "0.1:x", ":3", "0.1:2:3"} {
		_, _, err := ParseFaults(v)
		require.Error(t, err, v)
		require.ErrorIs(t, err, allocator.ErrInvalid, v)
		require.Contains(t, err.Error(), "SYMM_HOST_FAULTS", "names the variable")
	}
	_, err := NewFaults(1.01, 0)
	require.ErrorIs(t, err, allocator.ErrInvalid)
}

func TestFaultsAreDeterministic(t *testing.T) {
	draw := func(seed uint64) []int {
		f, err := NewFaults(0.3, seed)
		require.NoError(t, err)
		out := make([]int, 1000)
		for i := range out {
			out[i] = f.Pick(3)
		}
		return out
	}
	a, b, c := draw(7), draw(7), draw(8)
	require.Equal(t, a, b, "same seed, same faults")
	require.NotEqual(t, a, c)
	hits := 0
	for _, x := range a {
		if x >= 0 {
			hits++
		}
	}
	require.InDelta(t, 300, hits, 60, "about rate × draws")

	var none *Faults
	require.NoError(t, none.Fail("x"), "nil never fails")
	zero, _ := NewFaults(0, 1)
	one, _ := NewFaults(1, 1)
	for i := 0; i < 100; i++ {
		require.NoError(t, zero.Fail("x"))
		err := one.Fail("op")
		require.ErrorIs(t, err, ErrInjectedFault)
		require.EqualError(t, err, "host: injected fault (SYMM_HOST_FAULTS): op")
	}
	require.EqualValues(t, 100, one.Injected())
}

// memfdMaps counts this process's mappings of memfds named name.
func memfdMaps(t testing.TB, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Count(string(b), "memfd:"+name)
}

func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// Every step of a failed Alloc is undone: no segment, no bytes counted, no
// mapping, no descriptor.
func TestInjectedAllocFaultsLeaveNothing(t *testing.T) {
	h, err := New(2, 1<<30)
	require.NoError(t, err)
	require.NoError(t, h.WithFaults(0.5, 3, FaultAlloc|FaultEvents))
	fds, maps := openFDs(t), memfdMaps(t, "symm-pool")
	type seg struct {
		dev  int
		ptr  uintptr
		size uint64
	}
	var segs []seg
	failed, evFailed := 0, 0
	for i := 0; i < 300; i++ {
		dev, size := i%2, uint64(4096*(1+i%7))
		ptr, err := h.Alloc(dev, size)
		if err != nil {
			require.ErrorIs(t, err, ErrInjectedFault)
			require.False(t, allocator.IsOutOfMemory(err))
			require.Contains(t, err.Error(), "host: injected fault (SYMM_HOST_FAULTS): alloc of")
			failed++
		} else {
			segs = append(segs, seg{dev, ptr, size})
		}
		if _, err := h.NewEvent(dev); err != nil {
			require.ErrorIs(t, err, ErrInjectedFault)
			evFailed++
		}
		require.Equal(t, len(segs), h.Segments())
		require.Equal(t, len(segs), memfdMaps(t, "symm-pool")-maps, "a failed alloc leaves no mapping")
		require.Equal(t, fds, openFDs(t), "nor a descriptor")
	}
	require.Greater(t, failed, 100)
	require.Greater(t, evFailed, 100)
	require.EqualValues(t, failed+evFailed, h.Faults().Injected())
	for _, s := range segs {
		require.NoError(t, h.Free(s.dev, s.ptr, s.size))
	}
	require.Zero(t, h.Segments())
	require.Equal(t, maps, memfdMaps(t, "symm-pool"))
	for dev := 0; dev < 2; dev++ {
		free, total, err := h.MemInfo(dev)
		require.NoError(t, err)
		require.Equal(t, total, free, "every byte is back")
	}
	require.True(t, errors.Is(h.WithFaults(2, 0, FaultAlloc), allocator.ErrInvalid))
}
