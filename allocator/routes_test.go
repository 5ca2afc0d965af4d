package allocator

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// countedRoute is a Route that records its closes.
type countedRoute struct {
	takes  uintptr
	err    error
	closed *int
}

func (r countedRoute) Takes(s uintptr) (bool, error) { return s == r.takes, r.err }
func (r countedRoute) Close()                        { *r.closed++ }

// The pool is the one record of open routings: RouteOf asks the newest
// first, OpenRoutes counts them over all devices, and every Route is closed
// once, by its end or by its pool's last release.
func TestRoutesOneRecord(t *testing.T) {
	f := newFake(2)
	p, err := New(f, Config{})
	require.NoError(t, err)
	a, b := PoolID{First: 1}, PoolID{First: 2}
	var closedA, closedB, closedC int
	require.NoError(t, p.BeginAllocateToPool(0, a, countedRoute{takes: 5, closed: &closedA}))
	require.NoError(t, p.BeginAllocateToPool(0, b, countedRoute{takes: 5, closed: &closedB}))
	require.NoError(t, p.BeginAllocateToPool(1, a, countedRoute{takes: 6, closed: &closedC}))
	require.EqualValues(t, 3, p.OpenRoutes().Load())

	id, ok, err := p.RouteOf(0, 5)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, b, id, "the newest routing that takes the stream")
	_, ok, _ = p.RouteOf(0, 6)
	require.False(t, ok, "device 1's routing is not device 0's")
	id, ok, _ = p.RouteOf(1, 6)
	require.True(t, ok)
	require.Equal(t, a, id)
	_, ok, _ = p.RouteOf(7, 6)
	require.False(t, ok, "not a device: not routed (the allocation reports it)")

	require.NoError(t, p.EndAllocateToPool(0, b))
	require.Equal(t, 1, closedB)
	id, _, _ = p.RouteOf(0, 5)
	require.Equal(t, a, id)
	// The last release of a pool still routing ends its routing.
	require.NoError(t, p.ReleasePool(0, a, false))
	require.Equal(t, 1, closedA)
	require.False(t, p.Routing(0, a))
	require.EqualValues(t, 1, p.OpenRoutes().Load())
	require.NoError(t, p.EndAllocateToPool(1, a))
	require.EqualValues(t, 0, p.OpenRoutes().Load())
	require.Equal(t, []int{1, 1, 1}, []int{closedA, closedB, closedC})
	require.ErrorContains(t, p.EndAllocateToPool(1, a), "no allocation to it was begun")

	// A refused begin closes its route all the same; a failing route fails
	// the allocation it was asked about.
	var closedD int
	require.ErrorIs(t, p.BeginAllocateToPool(0, PoolID{}, countedRoute{closed: &closedD}), ErrInvalid)
	require.Equal(t, 1, closedD)
	require.NoError(t, p.BeginAllocateToPool(0, b, countedRoute{takes: 5, err: errors.New("boom"), closed: &closedD}))
	_, _, err = p.RouteOf(0, 5)
	require.ErrorContains(t, err, "boom")
	require.NoError(t, p.EndAllocateToPool(0, b))
	require.NoError(t, p.ReleasePool(0, b, true))
	require.NoError(t, p.ReleasePool(1, a, true))
	require.NoError(t, p.CheckInvariants())
}
