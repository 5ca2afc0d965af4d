package allocator

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeSegs is a SegmentAllocator over addresses of its own.
type fakeSegs struct {
	next   uintptr
	live   map[uintptr]uint64
	closed int
}

func (f *fakeSegs) Alloc(_ int, size uint64) (uintptr, error) {
	if f.live == nil {
		f.next, f.live = 0x7000_0000_0000, map[uintptr]uint64{}
	}
	p := f.next
	f.next += uintptr(size)
	f.live[p] = size
	return p, nil
}

func (f *fakeSegs) Free(_ int, ptr uintptr, size uint64) error {
	if f.live[ptr] != size {
		return fmt.Errorf("free of %#x (%d bytes): not a live segment", ptr, size)
	}
	delete(f.live, ptr)
	return nil
}

func (f *fakeSegs) Close() { f.closed++ }

// A MemPool over another allocator: its segments come from it, are cut and
// cached as the backend's are, and go back through it when the pool dies.
// Its use count is PyTorch's.
func TestMemPoolOverAllocator(t *testing.T) {
	f := newFake(1)
	p, err := New(f, Config{})
	require.NoError(t, err)
	id := PoolID{Second: 4}
	segs := &fakeSegs{}
	require.NoError(t, p.CreateOrIncrefPool(0, id, segs))
	n, err := p.UseCount(0, id)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, p.CreateOrIncrefPool(0, id, &fakeSegs{}), ErrInvalid, "an existing pool takes no allocator")

	require.NoError(t, p.BeginAllocateToPool(0, id, StreamRoute(1)))
	n, _ = p.UseCount(0, id)
	require.Equal(t, 2, n, "use_mem_pool takes a use")
	got, ok, err := p.RouteOf(0, 1)
	require.NoError(t, err)
	require.True(t, ok)
	a, _, err := p.AllocIn(0, 1, 1000, got)
	require.NoError(t, err)
	b, _, err := p.AllocIn(0, 1, 3000, got)
	require.NoError(t, err)
	require.Len(t, segs.live, 1, "one 2 MiB small segment from the allocator, split")
	require.Contains(t, segs.live, a)
	require.Equal(t, a+1024, b)
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.ReleasePool(0, id, false)) // use_mem_pool's exit
	n, _ = p.UseCount(0, id)
	require.Equal(t, 1, n)
	require.NoError(t, p.Free(0, 1, a, 1000))
	require.NoError(t, p.Free(0, 1, b, 3000))
	require.NoError(t, p.EmptyPool(id))
	require.Len(t, segs.live, 1, "a live pool keeps its cache")

	// The MemPool dies: release, then emptyCache(its id).
	require.NoError(t, p.ReleasePool(0, id, false))
	require.NoError(t, p.EmptyPool(id))
	require.Empty(t, segs.live, "its segment went back through its allocator")
	require.Equal(t, 1, segs.closed)
	_, err = p.UseCount(0, id)
	require.ErrorContains(t, err, "no such pool")
	require.NoError(t, p.CheckInvariants())
}

// no_split hands blocks out whole; use_on_oom lends a pool's free blocks to
// the default pool when it is out of memory.
func TestMemPoolNoSplitUseOnOOM(t *testing.T) {
	f := newFake(1)
	f.capacity = 24 * mib
	p, err := New(f, Config{})
	require.NoError(t, err)
	id := PoolID{Second: 5}
	require.NoError(t, p.CreateOrIncrefPool(0, id, nil))
	require.NoError(t, p.SetNoSplit(0, id))
	require.NoError(t, p.SetUseOnOOM(0, id, true))
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	x, bsize, err := p.AllocIn(0, 0, 1000, id)
	require.NoError(t, err)
	require.EqualValues(t, 2*mib, bsize, "no_split: the whole small segment")
	big, _, err := p.AllocIn(0, 0, 12*mib, id)
	require.NoError(t, err)
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.ReleasePool(0, id, false)) // use_mem_pool's exit
	require.NoError(t, p.Free(0, 0, big, 12*mib))

	// The default pool cannot get 12 MiB more from the device: the pool's
	// free block serves it.
	_, _, err = p.Alloc(0, 0, 12*mib)
	require.True(t, IsOutOfMemory(err), "%v", err)
	y, _, ok := p.AllocOnOOM(0, 0, 12*mib)
	require.True(t, ok)
	require.Equal(t, big, y)
	_, _, ok = p.AllocOnOOM(0, 7, 1000)
	require.False(t, ok, "another stream: none of its blocks")
	require.NoError(t, p.SetUseOnOOM(0, id, false))
	require.NoError(t, p.Free(0, 0, y, 12*mib))
	_, _, ok = p.AllocOnOOM(0, 0, 12*mib)
	require.False(t, ok, "use_on_oom off")
	require.NoError(t, p.Free(0, 0, x, 1000))
	require.NoError(t, p.ReleasePool(0, id, true))
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
	_, err = p.UseCount(0, id)
	require.ErrorContains(t, err, "no such pool")
}
