package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// testFront is a Front made of functions; a nil one answers "nothing
// held", does nothing, or counts nothing served.
type testFront struct {
	holds  func(dev int) bool
	ret    func(dev int)
	served func(dev int) FrontCounts
}

func (f *testFront) Holds(dev int) bool {
	return f.holds != nil && f.holds(dev)
}

func (f *testFront) Return(dev int) {
	if f.ret != nil {
		f.ret(dev)
	}
}

func (f *testFront) Served(dev int) FrontCounts {
	if f.served == nil {
		return FrontCounts{}
	}
	return f.served(dev)
}

// A block parked in front of the pool was freed by its caller: everything
// that reads the pool as its callers see it gets it back first, so that
// the block reads as free; the pool alone then judges a second free.
func TestObserveReturnsParkedBlocks(t *testing.T) {
	var p *Pool
	var parked []uintptr
	var returns []int
	p, _ = newPool(t, Config{Front: &testFront{
		holds: func(dev int) bool { return len(parked) > 0 },
		ret: func(dev int) {
			returns = append(returns, dev)
			for _, ptr := range parked {
				require.NoError(t, p.Free(0, sA, ptr, 0))
			}
			parked = nil
		},
	}})
	park := func() { parked = append(parked, mustAlloc(t, p, 0, sA, 4096)) }
	for _, c := range []struct {
		name string
		dev  int // the device Return is asked for
		read func() error
	}{
		{"Stats", 0, func() error { _, err := p.Stats(0); return err }},
		{"ResetPeak", 0, func() error { return p.ResetPeak(0) }},
		{"ResetAccumulated", 0, func() error { return p.ResetAccumulated(0) }},
		{"CacheInfo", 0, func() error { _, err := p.CacheInfo(0); return err }},
		{"PoolBlocks", 0, func() error { _, err := p.PoolBlocks(0, PoolID{}); return err }},
		{"StreamUsage", 0, func() error { _, err := p.StreamUsage(0); return err }},
		{"Snapshot", -1, func() error { p.Snapshot(); return nil }},
		{"EmptyCache", -1, func() error { return p.EmptyCache() }},
	} {
		park()
		returns = nil
		require.NoError(t, c.read(), c.name)
		require.Equal(t, []int{c.dev}, returns, c.name)
		require.Empty(t, parked, c.name)
		require.EqualValues(t, 0, stat(t, p, 0, "allocated_bytes.all.current"), c.name)
	}
	// A bad device returns nothing and reports the device.
	park()
	returns = nil
	_, err := p.Stats(7)
	require.ErrorIs(t, err, ErrInvalid)
	require.Empty(t, returns)
	// record_stream of a parked block: back first, then unknown.
	ptr := parked[0]
	_, err = p.RecordStreamBlock(ptr, sB)
	require.ErrorIs(t, err, ErrUnknownPointer)
	require.ErrorIs(t, p.Free(0, sA, ptr, 0), ErrUnknownPointer, "a double free is the pool's to judge")
	check(t, p)
}

// A front cache's miss gives back only the parked blocks of the bins it
// reads (its stream and pool); the others stay parked, until the pool
// must take memory or could pass a peak, when all of them go back.
func TestAllocAroundGivesBackTheBinsItReads(t *testing.T) {
	p, _ := newPool(t, Config{})
	// Blocks of each pool and stream set the peaks far above what follows
	// (each shard's and pool's peaks are checked).
	for _, st := range []uintptr{sA, sB} {
		s, l := mustAlloc(t, p, 0, st, 512<<10), mustAlloc(t, p, 0, st, 64<<20)
		require.NoError(t, p.Free(0, st, s, 0))
		require.NoError(t, p.Free(0, st, l, 0))
	}
	small := mustAlloc(t, p, 0, sA, 4096)
	large := mustAlloc(t, p, 0, sA, 4<<20)
	other := mustAlloc(t, p, 0, sB, 4096)
	park := func() []Parked {
		return []Parked{
			{Ptr: small, Req: 4096, Stream: sA, Type: 1},
			{Ptr: large, Req: 4 << 20, Stream: sA, Type: 2},
			{Ptr: other, Req: 4096, Stream: sB, Type: 1},
		}
	}
	ps := park()
	a, _, err := p.AllocAround(0, sA, 8192, ps)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, false}, []bool{ps[0].Back, ps[1].Back, ps[2].Back}, "only stream A's small block")
	// A large request of stream A: its large block goes back; its best
	// fit may then take that very block.
	l, _, err := p.AllocAround(0, sA, 4<<20, ps)
	require.NoError(t, err)
	require.True(t, ps[1].Back)
	require.False(t, ps[2].Back, "another stream's bins")
	require.Equal(t, large, l, "the best fit of the pool alone")
	// Stream B's small pool has room: its own block goes back, and the
	// request is placed where the pool alone would place it.
	b, _, err := p.AllocAround(0, sB, 4096, ps)
	require.NoError(t, err)
	require.True(t, ps[2].Back)
	require.Equal(t, other, b)
	for _, x := range []uintptr{a, l, b} {
		require.NoError(t, p.Free(0, 0, x, 0))
	}
	check(t, p)
}

// Every parked block goes back before the pool takes new memory, and
// before a request that could pass a peak, whatever its stream or pool.
func TestAllocAroundGivesAllBackBeforeGrowthOrPeak(t *testing.T) {
	p, _ := newPool(t, Config{})
	big := mustAlloc(t, p, 0, sA, 64<<20)
	require.NoError(t, p.Free(0, sA, big, 0))
	small := mustAlloc(t, p, 0, sA, 4096)
	ps := []Parked{{Ptr: small, Req: 4096, Stream: sA, Type: 1}}
	// Stream B has no segment: it must steal or take memory.
	b, _, err := p.AllocAround(0, sB, 1<<20, ps)
	require.NoError(t, err)
	require.True(t, ps[0].Back, "before a steal or new memory, all go back")
	require.NoError(t, p.Free(0, sB, b, 0))

	// The peak is 64 MiB: a 60 MiB request with 8 MiB parked could pass it.
	parkedBig := mustAlloc(t, p, 0, sA, 8<<20)
	ps = []Parked{{Ptr: parkedBig, Req: 8 << 20, Stream: sA, Type: 2}}
	x, _, err := p.AllocAround(0, sB, 60<<20, ps)
	require.NoError(t, err)
	require.True(t, ps[0].Back)
	require.EqualValues(t, 64<<20, stat(t, p, 0, "allocated_bytes.all.peak"), "the peak is the pool's own")
	require.NoError(t, p.Free(0, sB, x, 0))
	check(t, p)
}
