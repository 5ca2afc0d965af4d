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
