package cuda

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
)

// Expandable segments on the real driver: blocks in one range grow in
// place, keep their bytes through growth and trimming, and every chunk goes
// back to the device at the end.
func TestGPUExpandablePool(t *testing.T) {
	b, _ := gpu(t)
	const mib = 1 << 20
	g, err := b.Granularity(0)
	require.NoError(t, err)
	require.Zero(t, g%(2*mib), "granularity %d", g)
	free0, total, err := b.MemInfo(0)
	require.NoError(t, err)
	p, err := allocator.New(b, allocator.Config{Expandable: true})
	require.NoError(t, err)

	fill := func(ptr uintptr, n uint64, v byte) {
		require.NoError(t, Memset(0, ptr, v, n))
	}
	check := func(ptr uintptr, n uint64, v byte) {
		got := make([]byte, n)
		require.NoError(t, MemcpyDtoH(0, got, ptr))
		require.True(t, bytes.Equal(got, bytes.Repeat([]byte{v}, int(n))), "block %#x lost its bytes", ptr)
	}
	var ptrs []uintptr
	for i := 0; i < 5; i++ {
		ptr, _, err := p.Alloc(0, 0, 3*mib)
		require.NoError(t, err)
		if i > 0 {
			require.Equal(t, ptrs[i-1]+3*mib, ptr)
		}
		fill(ptr, 3*mib, byte(i+1))
		ptrs = append(ptrs, ptr)
	}
	m, err := p.StatsMap(0)
	require.NoError(t, err)
	require.EqualValues(t, 16*mib, m["reserved_bytes.all.current"])

	// Free the last two, trim, then grow one block across the freed space.
	require.NoError(t, p.Free(0, 0, ptrs[4], 3*mib))
	require.NoError(t, p.Free(0, 0, ptrs[3], 3*mib))
	require.NoError(t, p.EmptyCache())
	m, _ = p.StatsMap(0)
	require.EqualValues(t, 10*mib, m["reserved_bytes.all.current"], "9 MiB live keep 5 chunks")
	big, _, err := p.Alloc(0, 0, 40*mib)
	require.NoError(t, err)
	require.Equal(t, ptrs[3], big, "the free end grew into new chunks")
	fill(big, 40*mib, 0xab)
	for i := 0; i < 3; i++ {
		check(ptrs[i], 3*mib, byte(i+1))
	}
	check(big, 40*mib, 0xab)

	// More than the device has: an ordinary out-of-memory error.
	_, _, err = p.Alloc(0, 0, total+mib)
	require.ErrorIs(t, err, allocator.ErrOutOfMemory)

	for i := 0; i < 3; i++ {
		require.NoError(t, p.Free(0, 0, ptrs[i], 3*mib))
	}
	require.NoError(t, p.Free(0, 0, big, 40*mib))
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
	free1, _, err := b.MemInfo(0)
	require.NoError(t, err)
	require.InDelta(t, float64(free0), float64(free1), 4*mib, "device memory back after empty_cache")
}

// Release waits only for the stream of what it unmaps: another stream that
// never finishes (a wait for a lost peer) does not hold up the out-of-memory
// retry or empty_cache, as a device-wide synchronize would.
func TestGPUReleaseIgnoresABlockedStream(t *testing.T) {
	b, _ := gpu(t)
	const mib = 1 << 20
	p, err := allocator.New(b, allocator.Config{Expandable: true})
	require.NoError(t, err)
	host, dev, err := HostAllocMapped(0, 4096)
	require.NoError(t, err)
	flag := (*atomic.Uint32)(*(*unsafe.Pointer)(unsafe.Pointer(&host)))
	flag.Store(0)
	blocked, err := StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, StreamWaitValue32(0, blocked, dev, 1, WaitValueGEQ))
	defer func() {
		flag.Store(1) // let the blocked stream go, whatever happened
		require.NoError(t, StreamSynchronize(0, blocked))
		require.NoError(t, StreamDestroy(0, blocked))
		require.NoError(t, HostFree(0, host))
	}()
	done, _ := StreamQuery(0, blocked)
	require.False(t, done, "the stream waits for the flag")

	mine, err := StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, StreamDestroy(0, mine)) }()
	result := make(chan error, 1)
	go func() {
		var ptrs []uintptr
		for i := 0; i < 4; i++ {
			ptr, _, err := p.Alloc(0, mine, 8*mib)
			if err != nil {
				result <- err
				return
			}
			ptrs = append(ptrs, ptr)
		}
		for _, ptr := range ptrs[1:] {
			if err := p.Free(0, mine, ptr, 8*mib); err != nil {
				result <- err
				return
			}
		}
		if err := p.EmptyCache(); err != nil {
			result <- err
			return
		}
		result <- p.Free(0, mine, ptrs[0], 8*mib)
	}()
	select {
	case err := <-result:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("allocation or empty_cache waited for a stream it never used")
	}
	m, err := p.StatsMap(0)
	require.NoError(t, err)
	require.EqualValues(t, 8*mib, m["reserved_bytes.all.current"], "the free tail was unmapped")
	done, _ = StreamQuery(0, blocked)
	require.False(t, done, "still blocked: nothing waited for it")
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
}

// Free pages on the real driver (Config.UnmapFreePages): a hole between
// live blocks gives its chunks to the segment's growth as spare handles
// (cuMemRetainAllocationHandle, cuMemUnmap, cuMemMap: no cuMemCreate), the
// blocks around it keep their bytes, a block handed out over the hole gets
// memory mapped under it again, and every chunk goes back to the device at
// empty_cache. The pool's invariants (mapped and spare chunks as the
// backend counts them) hold after every step.
//
// Run with the granularity's chunks and with 20 MiB ones (one physical
// allocation per chunk), every size scaled by the chunk.
func TestGPUFreePagesSpareChunks(t *testing.T) {
	b, _ := gpu(t)
	for _, chunk := range []uint64{2 << 20, 20 << 20} {
		t.Run(fmt.Sprintf("chunk=%dMiB", chunk>>20), func(t *testing.T) { freePagesSpareChunks(t, b, chunk) })
	}
}

func freePagesSpareChunks(t *testing.T, b *Backend, chunk uint64) {
	// u is half a chunk: 1 MiB with the 2 MiB chunks the sizes were written for.
	u := chunk / 2
	free0, _, err := b.MemInfo(0)
	require.NoError(t, err)
	p, err := allocator.New(b, allocator.Config{Expandable: true, UnmapFreePages: true, ExpandableChunk: chunk})
	require.NoError(t, err)
	fill := func(ptr uintptr, n uint64, v byte) { require.NoError(t, Memset(0, ptr, v, n)) }
	check := func(ptr uintptr, n uint64, v byte) {
		got := make([]byte, n)
		require.NoError(t, MemcpyDtoH(0, got, ptr))
		require.True(t, bytes.Equal(got, bytes.Repeat([]byte{v}, int(n))), "block %#x lost its bytes", ptr)
	}
	stat := func(name string) int64 {
		m, err := p.StatsMap(0)
		require.NoError(t, err)
		return m[name]
	}
	alloc := func(n uint64, v byte) uintptr {
		ptr, _, err := p.Alloc(0, 0, n)
		require.NoError(t, err)
		fill(ptr, n, v)
		require.NoError(t, p.CheckInvariants())
		return ptr
	}
	a := alloc(4*u, 1)
	hole := alloc(16*u, 2)
	c := alloc(4*u, 3)
	require.NoError(t, p.Free(0, 0, hole, 16*u))
	// The pool unmaps a free page only once the stream has passed its free,
	// asked of an event without waiting: give the first one time. Each try
	// grows the segment's free end by 2 MiB (more than the hole holds).
	end := 18 * u
	for try := 0; try < 50 && stat("num_spare_chunks_reused") == 0; try++ {
		end += 2 * u
		x := alloc(end, 4)
		require.NoError(t, p.Free(0, 0, x, end))
		time.Sleep(20 * time.Millisecond)
	}
	require.Positive(t, stat("num_spare_chunks_reused"), "growth took the hole's chunks")
	require.Less(t, stat("reserved_bytes.all.current"), int64(24*u+end), "the hole's chunks are no longer counted")
	mapped, spare := b.Chunks(0)
	require.Zero(t, spare, "nothing stays spare between operations")
	require.EqualValues(t, stat("reserved_bytes.all.current"), mapped)
	d := alloc(12*u, 5) // the best fit is the hole: mapped again under it
	require.GreaterOrEqual(t, d, hole)
	require.Less(t, d, hole+uintptr(16*u))
	check(a, 4*u, 1)
	check(c, 4*u, 3)
	check(d, 12*u, 5)
	require.Positive(t, stat("num_chunk_maps"))
	require.Positive(t, stat("num_chunk_unmaps"))
	t.Logf("chunk maps %d (%d µs), unmaps %d (%d µs), spare chunks reused %d",
		stat("num_chunk_maps"), stat("chunk_map_us"), stat("num_chunk_unmaps"), stat("chunk_unmap_us"), stat("num_spare_chunks_reused"))
	for _, x := range []struct {
		p uintptr
		n uint64
	}{{a, 4 * u}, {c, 4 * u}, {d, 12 * u}} {
		require.NoError(t, p.Free(0, 0, x.p, x.n))
	}
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
	mapped, spare = b.Chunks(0)
	require.Zero(t, mapped)
	require.Zero(t, spare)
	free1, _, err := b.MemInfo(0)
	require.NoError(t, err)
	require.InDelta(t, float64(free0), float64(free1), float64(4*u), "device memory back after empty_cache")
}

// One segment maps chunks of two sizes on the real driver: a small request
// takes one chunk of the granularity, a 50 MiB one after it grows the
// segment by granules up to the first 20 MiB slot, one 20 MiB chunk, and
// granules after it; every block keeps its bytes, and release unmaps each
// chunk whole with its own size (cuMemUnmap refuses part of a mapping), so
// the device gets all of it back.
func TestGPUMixedChunks(t *testing.T) {
	b, _ := gpu(t)
	const mib = 1 << 20
	free0, _, err := b.MemInfo(0)
	require.NoError(t, err)
	p, err := allocator.New(b, allocator.Config{Expandable: true, ExpandableChunk: 20 * mib, UnmapFreePages: true})
	require.NoError(t, err)
	stat := func(name string) int64 {
		m, err := p.StatsMap(0)
		require.NoError(t, err)
		return m[name]
	}
	small, _, err := p.Alloc(0, 0, mib)
	require.NoError(t, err)
	require.EqualValues(t, 2*mib, stat("reserved_bytes.all.current"), "one chunk of the granularity, not 20 MiB")
	big, _, err := p.Alloc(0, 0, 50*mib)
	require.NoError(t, err)
	require.EqualValues(t, 52*mib, stat("reserved_bytes.all.current"))
	require.NoError(t, Memset(0, small, 0x11, mib))
	require.NoError(t, Memset(0, big, 0x22, 50*mib))
	for _, c := range []struct{ at, base, size uint64 }{
		{0, 0, 2 * mib}, {19 * mib, 18 * mib, 2 * mib}, {20 * mib, 20 * mib, 20 * mib}, {39 * mib, 20 * mib, 20 * mib}, {51 * mib, 50 * mib, 2 * mib},
	} {
		base, size, err := p.ChunkAt(big, small+uintptr(c.at))
		require.NoError(t, err)
		require.Equal(t, [2]uint64{c.base, c.size}, [2]uint64{uint64(base - small), size}, "the chunk at offset %d", c.at)
	}
	got := make([]byte, 50*mib)
	require.NoError(t, MemcpyDtoH(0, got, big))
	require.True(t, bytes.Equal(got, bytes.Repeat([]byte{0x22}, 50*mib)), "the block over both sizes keeps its bytes")
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.Free(0, 0, big, 50*mib))
	require.NoError(t, p.EmptyCache())
	require.EqualValues(t, 2*mib, stat("reserved_bytes.all.current"), "granules and the big chunk unmapped, each whole")
	require.NoError(t, p.Free(0, 0, small, mib))
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
	mapped, spare := b.Chunks(0)
	require.Zero(t, mapped+spare)
	free1, _, err := b.MemInfo(0)
	require.NoError(t, err)
	require.InDelta(t, float64(free0), float64(free1), 4*mib, "device memory back after empty_cache")
}

// The cost of mapping and unmapping expandable memory by chunk size: 400 MiB
// mapped (cuMemCreate, cuMemMap, cuMemRelease per chunk, one
// cuMemSetAccess) and unmapped again, per MiB. The driver's cost is mostly
// per allocation, which is why expandable segments grow by 20 MiB chunks.
//
//	go test -c -o build/device/cuda.test ./cuda && build/device/cuda.test -test.run '^$' -test.bench MapChunks
func BenchmarkGPUMapChunks(b *testing.B) {
	be, _ := gpu(b)
	const size = 400 << 20
	for _, chunk := range []uint64{2 << 20, 20 << 20} {
		b.Run(fmt.Sprintf("chunk=%dMiB", chunk>>20), func(b *testing.B) {
			ptr, err := be.ReserveRange(0, size)
			require.NoError(b, err)
			defer func() { require.NoError(b, be.FreeRange(0, ptr, size)) }()
			for b.Loop() {
				require.NoError(b, be.MapChunks(0, ptr, size, chunk))
				n, err := be.UnmapChunks(0, ptr, size, chunk)
				require.NoError(b, err)
				require.EqualValues(b, size, n)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/(size>>20), "µs/MiB")
		})
	}
}
