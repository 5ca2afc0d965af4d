package host

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/mem"
)

var _ allocator.Backend = (*Backend)(nil)

var bytesAt = mem.Bytes

func TestAllocWriteFree(t *testing.T) {
	h, err := New(2, 64<<20)
	require.NoError(t, err)
	ptr, err := h.Alloc(1, 2<<20)
	require.NoError(t, err)
	require.Zero(t, ptr%4096)
	m := bytesAt(ptr, 2<<20)
	m[0], m[len(m)-1] = 7, 9
	require.Equal(t, byte(9), bytesAt(ptr+2<<20-1, 1)[0])
	free, total, err := h.MemInfo(1)
	require.NoError(t, err)
	require.EqualValues(t, 62<<20, free)
	require.EqualValues(t, 64<<20, total)
	require.Equal(t, 1, h.Segments())
	require.NoError(t, h.Free(1, ptr, 2<<20))
	require.Equal(t, 0, h.Segments())
}

func TestOutOfMemoryAndBadInput(t *testing.T) {
	h, err := New(1, 8<<20)
	require.NoError(t, err)
	_, err = h.Alloc(0, 16<<20)
	require.Error(t, err)
	require.True(t, allocator.IsOutOfMemory(err))
	require.Contains(t, err.Error(), "16777216 bytes on device 0")

	_, err = h.Alloc(3, 4096)
	require.ErrorContains(t, err, "device 3 out of range")
	require.ErrorContains(t, h.Free(0, 0x1000, 4096), "not a segment")
	_, err = New(0, 0)
	require.Error(t, err)
}

func TestPoolOnHost(t *testing.T) {
	h, err := New(1, 0)
	require.NoError(t, err)
	p, err := allocator.New(h, allocator.Config{})
	require.NoError(t, err)
	ptr, _, err := p.Alloc(0, 0, 1000)
	require.NoError(t, err)
	copy(bytesAt(ptr, 5), "hello")
	require.Equal(t, "hello", string(bytesAt(ptr, 5)))
	require.NoError(t, p.Free(0, 0, ptr, 1000))
	require.NoError(t, p.EmptyCache())
	require.Equal(t, 0, h.Segments())
	require.NoError(t, p.CheckInvariants())
}
