package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeVM is a driver for expandable segments without a GPU: handles with
// reference counts, a map of mapped chunks, and failures on demand. It lets
// the failure paths of expand.go run in CI.
type fakeVM struct {
	next     uint64
	refs     map[uint64]int     // handle -> references (creation/retain, mapping)
	at       map[uintptr]uint64 // mapped chunk -> handle
	failUnmp map[uintptr]bool   // chunks whose cuMemUnmap fails
	failRel  int                // cuMemRelease calls that fail, from now on
	created  []uint64           // the size of every cuMemCreate, in order
}

const fakeG = 2 << 20

func newFakeVM() *fakeVM {
	return &fakeVM{next: 1, refs: map[uint64]int{}, at: map[uintptr]uint64{}, failUnmp: map[uintptr]bool{}}
}

var errFake = errors.New("CUDA_ERROR_UNKNOWN (injected)")

func (f *fakeVM) granularity(int) (uint64, uint64, error) { return fakeG, fakeG, nil }
func (f *fakeVM) memCreate(_ int, size uint64) (uint64, error) {
	f.created = append(f.created, size)
	h := f.next
	f.next++
	f.refs[h] = 1
	return h, nil
}
func (f *fakeVM) memRelease(_ int, h uint64) error {
	if f.failRel > 0 {
		f.failRel--
		return errFake
	}
	if f.refs[h] == 0 {
		return fmt.Errorf("release of dead handle %d", h)
	}
	if f.refs[h]--; f.refs[h] == 0 {
		delete(f.refs, h)
	}
	return nil
}
func (f *fakeVM) memMap(_ int, ptr uintptr, _ uint64, h uint64) error {
	if _, ok := f.at[ptr]; ok {
		return fmt.Errorf("map over mapped chunk %#x", ptr)
	}
	f.at[ptr] = h
	f.refs[h]++
	return nil
}
func (f *fakeVM) memUnmap(_ int, ptr uintptr, _ uint64) error {
	if f.failUnmp[ptr] {
		return errFake
	}
	h, ok := f.at[ptr]
	if !ok {
		return fmt.Errorf("unmap of unmapped chunk %#x", ptr)
	}
	delete(f.at, ptr)
	if f.refs[h]--; f.refs[h] == 0 {
		delete(f.refs, h)
	}
	return nil
}
func (f *fakeVM) setAccess(int, uintptr, uint64, []int) error { return nil }
func (f *fakeVM) retainAllocationHandle(_ int, ptr uintptr) (uint64, error) {
	h, ok := f.at[ptr]
	if !ok {
		return 0, fmt.Errorf("retain of unmapped %#x", ptr)
	}
	f.refs[h]++
	return h, nil
}

func fakeBackend(vm *fakeVM) *Backend {
	return &Backend{vm: vm, spare: map[int][]spareChunk{}, mapped: map[int]uint64{}, unreleased: map[int][]uint64{}}
}

// An unmap that fails at a chunk stops there and says how much went: the
// chunks before it are unmapped, it and those after are still mapped and
// counted, so the pool can book exactly what the driver holds.
func TestUnmapChunksReportsThePrefixUnmapped(t *testing.T) {
	vm := newFakeVM()
	b := fakeBackend(vm)
	const base = uintptr(1 << 40)
	require.NoError(t, b.MapChunks(0, base, 4*fakeG, fakeG))
	vm.failUnmp[base+2*fakeG] = true
	n, err := b.UnmapChunks(0, base, 4*fakeG, fakeG)
	require.ErrorIs(t, err, errFake)
	require.EqualValues(t, 2*fakeG, n)
	require.Len(t, vm.at, 2, "chunks 2 and 3 stay mapped")
	mapped, _ := b.Chunks(0)
	require.EqualValues(t, 2*fakeG, mapped)
	delete(vm.failUnmp, base+2*fakeG)
	n, err = b.UnmapChunks(0, base+2*fakeG, 2*fakeG, fakeG)
	require.NoError(t, err)
	require.EqualValues(t, 2*fakeG, n)
	require.Empty(t, vm.at)
	require.Empty(t, vm.refs, "every chunk's memory is gone")
}

// MapKept whose references cannot be dropped once mapped: the mapping is
// made and reported as made (an error would tell the pool nothing is
// mapped), and the references are dropped by the next ReleaseKept, which
// reports them if it cannot.
func TestMapKeptKeepsItsMappingWhenAReleaseFails(t *testing.T) {
	vm := newFakeVM()
	b := fakeBackend(vm)
	const base = uintptr(1 << 40)
	require.NoError(t, b.MapChunks(0, base, 3*fakeG, fakeG))
	kept, err := b.KeepChunks(0, base, 3*fakeG, fakeG)
	require.NoError(t, err)
	require.EqualValues(t, 3*fakeG, kept)
	_, spare := b.Chunks(0)
	require.EqualValues(t, 3*fakeG, spare)

	vm.failRel = 1
	require.NoError(t, b.MapKept(0, base, 3*fakeG, fakeG), "mapped, whatever the release said")
	mapped, spare := b.Chunks(0)
	require.EqualValues(t, 3*fakeG, mapped)
	require.Zero(t, spare)
	require.Len(t, vm.at, 3)

	vm.failRel = 1
	require.ErrorIs(t, b.ReleaseKept(0, 0, fakeG), errFake, "a reference still held is reported")
	require.NoError(t, b.ReleaseKept(0, 0, fakeG))
	n, err := b.UnmapChunks(0, base, 3*fakeG, fakeG)
	require.NoError(t, err)
	require.EqualValues(t, 3*fakeG, n)
	require.Empty(t, vm.refs, "no chunk outlives its unmap")
}

// KeepChunks failing at a chunk keeps the chunks before it and leaves the
// rest mapped.
func TestKeepChunksReportsThePrefixKept(t *testing.T) {
	vm := newFakeVM()
	b := fakeBackend(vm)
	const base = uintptr(1 << 40)
	require.NoError(t, b.MapChunks(0, base, 3*fakeG, fakeG))
	vm.failUnmp[base+fakeG] = true
	kept, err := b.KeepChunks(0, base, 3*fakeG, fakeG)
	require.ErrorIs(t, err, errFake)
	require.EqualValues(t, fakeG, kept)
	mapped, spare := b.Chunks(0)
	require.EqualValues(t, 2*fakeG, mapped)
	require.EqualValues(t, fakeG, spare)
	delete(vm.failUnmp, base+fakeG)
	require.NoError(t, b.ReleaseKept(0, fakeG, fakeG))
	n, err := b.UnmapChunks(0, base+fakeG, 2*fakeG, fakeG)
	require.NoError(t, err)
	require.EqualValues(t, 2*fakeG, n)
	require.Empty(t, vm.refs)
}

// A chunk larger than the granularity is one physical allocation: mapping
// 3 chunks of 2 granules creates 3 handles, not 6, and each unmaps whole.
// Spare chunks keep their size: a mapping of another chunk size cannot
// take them, and releasing them frees exactly their bytes.
func TestChunksLargerThanTheGranularity(t *testing.T) {
	vm := newFakeVM()
	b := fakeBackend(vm)
	const base = uintptr(1 << 40)
	const c = 2 * fakeG
	require.NoError(t, b.MapChunks(0, base, 3*c, c))
	require.Equal(t, []uint64{c, c, c}, vm.created)
	require.Len(t, vm.at, 3, "one mapping per chunk")

	kept, err := b.KeepChunks(0, base+c, c, c)
	require.NoError(t, err)
	require.EqualValues(t, c, kept)
	require.ErrorContains(t, b.MapKept(0, base+c, c, fakeG), "keeps 0 of them", "2 MiB chunks wanted, one 4 MiB kept")
	require.ErrorContains(t, b.MapKept(0, base+c, 2*c, c), "keeps 1 of them")
	require.ErrorContains(t, b.ReleaseKept(0, fakeG, c), "not whole", "half a spare chunk cannot be released")
	require.ErrorContains(t, b.ReleaseKept(0, fakeG, fakeG), "keeps 0 of them", "a spare chunk is released only as its own size")
	_, spare := b.Chunks(0)
	require.EqualValues(t, c, spare, "failed takes leave the spare as it was")
	require.NoError(t, b.MapKept(0, base+c, c, c))
	require.Len(t, vm.created, 3, "spare chunks are mapped again, not created")

	n, err := b.UnmapChunks(0, base, 3*c, c)
	require.NoError(t, err)
	require.EqualValues(t, 3*c, n)
	require.Empty(t, vm.at)
	require.Empty(t, vm.refs)
}

// Requests that are not whole chunks of a multiple of the granularity are
// refused before the driver is called.
func TestChunkRequestsNotWholeChunks(t *testing.T) {
	vm := newFakeVM()
	b := fakeBackend(vm)
	const base = uintptr(1 << 40)
	for _, tc := range []struct {
		ptr         uintptr
		size, chunk uint64
	}{
		{base, 0, fakeG},                // nothing
		{base, 3 * fakeG, 2 * fakeG},    // not whole chunks
		{base, 3 * fakeG, fakeG + 4096}, // chunk not granules
		{base, fakeG, 0},                // no chunk
		{base + 4096, fakeG, fakeG},     // unaligned
	} {
		require.ErrorContains(t, b.MapChunks(0, tc.ptr, tc.size, tc.chunk), "not whole")
		_, err := b.UnmapChunks(0, tc.ptr, tc.size, tc.chunk)
		require.ErrorContains(t, err, "not whole")
		_, err = b.KeepChunks(0, tc.ptr, tc.size, tc.chunk)
		require.ErrorContains(t, err, "not whole")
		require.ErrorContains(t, b.MapKept(0, tc.ptr, tc.size, tc.chunk), "not whole")
	}
	require.Empty(t, vm.created)
	require.Empty(t, vm.at)
}
