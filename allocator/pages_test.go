package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func reservedNow(t *testing.T, p *Pool) int64 {
	t.Helper()
	m, err := p.StatsMap(0)
	require.NoError(t, err)
	return m["reserved_bytes.all.current"]
}

// With UnmapFreePages, a hole between live blocks gives its chunks back
// when the segment grows, gets them mapped again under the blocks handed
// out over it, and gives the rest back at EmptyCache. The fake backend
// panics on a touch of an unmapped chunk; the invariants check that only
// chunks wholly inside free blocks are unmapped.
func TestUnmapFreePages(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	alloc := func(n uint64) uintptr {
		ptr, err := p.Alloc(0, 0, n)
		require.NoError(t, err)
		m := fb.mem(ptr, n) // every byte of it is mapped
		m[0], m[n-1] = 1, 1
		require.NoError(t, p.CheckInvariants())
		return ptr
	}
	a := alloc(4 << 20)
	b := alloc(6 << 20)
	c := alloc(4 << 20)
	require.Equal(t, int64(14<<20), reservedNow(t, p))
	require.NoError(t, p.Free(0, 0, b, 6<<20)) // a 6 MiB hole between two live blocks
	require.Equal(t, int64(14<<20), reservedNow(t, p), "a free maps and unmaps nothing")

	d := alloc(8 << 20) // no fit: the segment grows by 8 MiB, the hole's 3 chunks go back first
	require.Equal(t, int64(16<<20), reservedNow(t, p), "14 - 6 + 8 MiB")
	require.Equal(t, uint64(16<<20), fb.used[0])

	e := alloc(2 << 20) // the best fit is the hole: one chunk mapped again under it
	require.GreaterOrEqual(t, e, b)
	require.Less(t, e, b+6<<20)
	require.Equal(t, int64(18<<20), reservedNow(t, p))

	// A mapping the limit refuses is an ordinary out of memory; nothing changes.
	require.NoError(t, p.SetLimit(0, 18<<20))
	_, err = p.Alloc(0, 0, 2<<20)
	require.True(t, IsOutOfMemory(err), "%v", err)
	require.Equal(t, int64(18<<20), reservedNow(t, p))
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.SetLimit(0, 0))
	f := alloc(2 << 20)
	require.Equal(t, int64(20<<20), reservedNow(t, p))

	// Release gives back every free page (the 2 MiB left of the hole) and the
	// free tail; the live blocks keep theirs.
	for _, x := range []struct {
		p uintptr
		n uint64
	}{{e, 2 << 20}, {f, 2 << 20}} {
		require.NoError(t, p.Free(0, 0, x.p, x.n))
	}
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
	require.Equal(t, int64(16<<20), reservedNow(t, p), "a, c and d: 4 + 4 + 8 MiB")
	require.Equal(t, uint64(16<<20), fb.used[0])
	for _, x := range []struct {
		p uintptr
		n uint64
	}{{a, 4 << 20}, {c, 4 << 20}, {d, 8 << 20}} {
		require.NoError(t, p.Free(0, 0, x.p, x.n))
	}
	require.NoError(t, p.EmptyCache())
	require.Equal(t, int64(0), reservedNow(t, p))
	require.Equal(t, uint64(0), fb.used[0])
	require.NoError(t, p.CheckInvariants())
}

// Off (the default), a hole keeps its chunks: the segment grows by the
// whole request.
func TestFreePagesStayMappedByDefault(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 << 20
	p, err := New(fb, Config{Expandable: true})
	require.NoError(t, err)
	a, _ := p.Alloc(0, 0, 4<<20)
	b, _ := p.Alloc(0, 0, 6<<20)
	c, _ := p.Alloc(0, 0, 4<<20)
	require.NoError(t, p.Free(0, 0, b, 6<<20))
	d, err := p.Alloc(0, 0, 8<<20)
	require.NoError(t, err)
	require.Equal(t, int64(22<<20), reservedNow(t, p))
	for _, x := range []uintptr{a, c} {
		require.NoError(t, p.Free(0, 0, x, 4<<20))
	}
	require.NoError(t, p.Free(0, 0, d, 8<<20))
	require.NoError(t, p.CheckInvariants())
}

// When the pool maps memory below its peak it never waits for the stream:
// pages freed after the last quiet event it has seen complete stay mapped
// (the pool maps new memory instead), and go at a later mapping once the
// stream has passed their free. A Sync would be a wait: the test fails on
// one. A mapping that would raise the peak waits once, so that a hole
// freed moments ago lowers the peak instead of adding to it.
func TestFreePagesWaitOnlyToHoldThePeak(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 96 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	alloc := func(n uint64) uintptr {
		ptr, err := p.Alloc(0, 0, n)
		require.NoError(t, err)
		require.NoError(t, p.CheckInvariants())
		return ptr
	}
	x := alloc(24 << 20) // sets the peak, then goes
	require.NoError(t, p.Free(0, 0, x, 24<<20))
	require.NoError(t, p.EmptyCache())
	require.Zero(t, reservedNow(t, p))

	a, b, c := alloc(4<<20), alloc(6<<20), alloc(4<<20)
	fb.launch(0) // work on the stream that may still use b
	require.NoError(t, p.Free(0, 0, b, 6<<20))
	fb.onSync = func() { t.Fatal("a mapping below the peak waited for the stream") }
	d := alloc(8 << 20) // grows to 22 MiB, below the peak of 24: b's hole is not known to be quiet and stays mapped
	require.Equal(t, int64(22<<20), reservedNow(t, p))

	fb.finish(0)        // the stream passes b's free
	e := alloc(8 << 20) // grows again (no hole fits): the hole's chunks go first, no wait needed
	require.Equal(t, int64(24<<20), reservedNow(t, p), "22 - 6 + 8 MiB")

	fb.launch(0)
	require.NoError(t, p.Free(0, 0, d, 8<<20)) // an 8 MiB hole the stream may still use
	syncs := 0
	fb.onSync = func() { syncs++ }
	f := alloc(10 << 20) // 24 + 10 would pass the peak: wait, then the hole's chunks go
	require.Equal(t, 1, syncs, "one wait for the stream")
	m, err := p.StatsMap(0)
	require.NoError(t, err)
	require.EqualValues(t, 1, m["num_free_page_waits"])
	require.Equal(t, int64(26<<20), reservedNow(t, p), "24 - 8 + 10 MiB")
	require.EqualValues(t, 26<<20, m["reserved_bytes.all.peak"])
	fb.onSync = nil
	for _, x := range []struct {
		p uintptr
		n uint64
	}{{a, 4 << 20}, {c, 4 << 20}, {e, 8 << 20}, {f, 10 << 20}} {
		require.NoError(t, p.Free(0, 0, x.p, x.n))
	}
	require.NoError(t, p.EmptyCache())
	require.Equal(t, int64(0), reservedNow(t, p))
	require.NoError(t, p.CheckInvariants())
}

// A block over two unmapped runs whose second the limit refuses: the first
// is unmapped again and its bytes no longer count against the limit, so
// what fits under it still does.
func TestFreePagesFailedMappingGivesBackItsReservation(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	var blocks []uintptr
	for i := 0; i < 5; i++ { // five chunks, one block each
		b, err := p.Alloc(0, 0, 2<<20)
		require.NoError(t, err)
		blocks = append(blocks, b)
	}
	require.NoError(t, p.Free(0, 0, blocks[1], 2<<20))
	require.NoError(t, p.Free(0, 0, blocks[3], 2<<20))
	g, err := p.Alloc(0, 0, 4<<20) // grows: chunks 1 and 3 are unmapped first
	require.NoError(t, err)
	require.NoError(t, p.Free(0, 0, blocks[2], 2<<20)) // one hole, chunks 1-3: unmapped, mapped, unmapped
	res := reservedNow(t, p)
	require.NoError(t, p.SetLimit(0, uint64(res)+2<<20))
	_, err = p.Alloc(0, 0, 6<<20) // chunk 1 maps, chunk 3 is over the limit
	require.True(t, IsOutOfMemory(err), "%v", err)
	require.Equal(t, res, reservedNow(t, p))
	require.Equal(t, uint64(res), p.devs[0].committed, "the undone mapping counts against the limit no more")
	require.NoError(t, p.CheckInvariants())
	x, err := p.Alloc(0, 0, 2<<20) // one chunk fits under the limit
	require.NoError(t, err)
	for _, b := range []uintptr{blocks[0], blocks[4], x} {
		require.NoError(t, p.Free(0, 0, b, 2<<20))
	}
	require.NoError(t, p.Free(0, 0, g, 4<<20))
	require.NoError(t, p.CheckInvariants())
}

// Chunks unmapped to make room for a mapping are kept (ChunkKeeper) and
// mapped again by it: growth over a hole's pages creates no new chunk, the
// spare is empty after every operation, and every chunk the backend holds
// is mapped or spare. A failed mapping of spare chunks is an ordinary
// error, and they are released, not lost.
func TestSpareChunksReused(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	check := func() {
		t.Helper()
		require.NoError(t, p.CheckInvariants())
		require.NoError(t, fb.checkChunks())
		_, spare := fb.Chunks(0)
		require.Zero(t, spare, "nothing stays spare between operations")
	}
	stat := func(name string) int64 {
		m, err := p.StatsMap(0)
		require.NoError(t, err)
		return m[name]
	}
	alloc := func(n uint64) uintptr {
		ptr, err := p.Alloc(0, 0, n)
		require.NoError(t, err)
		m := fb.mem(ptr, n)
		m[0], m[n-1] = 1, 1
		check()
		return ptr
	}
	a := alloc(4 << 20)
	b := alloc(6 << 20)
	c := alloc(4 << 20)
	require.NoError(t, p.Free(0, 0, b, 6<<20))
	created := fb.chunkHandles[0]
	maps := fb.allocs
	d := alloc(8 << 20) // grows by 8 MiB: 6 from the hole's spare chunks, 2 new
	require.Equal(t, created+2<<20, fb.chunkHandles[0], "only the part the hole could not give is created")
	require.Equal(t, maps+1, fb.allocs, "one MapChunks call, for the 2 new MiB")
	require.EqualValues(t, 3, stat("num_spare_chunks_reused"))
	require.Equal(t, int64(16<<20), reservedNow(t, p))
	require.Positive(t, stat("num_chunk_maps"))
	require.Positive(t, stat("num_chunk_unmaps"))

	// A failure while mapping the spare chunks is an out of memory like any
	// other: nothing stays mapped or spare, and the retry after release
	// serves the request.
	require.NoError(t, p.Free(0, 0, d, 8<<20))
	e := alloc(8 << 20) // the hole of d serves it as it was
	require.Equal(t, d, e)
	require.NoError(t, p.Free(0, 0, e, 8<<20))
	f := alloc(2 << 20)                        // one chunk of the 8 MiB hole at the end...
	require.NoError(t, p.Free(0, 0, a, 4<<20)) // ...and a 4 MiB hole at the start
	fb.failAlloc = fakeOOM{}
	g, err := p.Alloc(0, 0, 40<<20) // grows: the first hole's chunks go spare, their mapping fails
	require.NoError(t, err)
	require.EqualValues(t, 1, stat("num_alloc_retries"), "served by the retry after release")
	check()
	m, _ := fb.Chunks(0)
	require.Equal(t, uint64(reservedNow(t, p)), m, "what is mapped is what the pool counts")
	require.NoError(t, p.Free(0, 0, g, 40<<20))

	for _, x := range []struct {
		p uintptr
		n uint64
	}{{c, 4 << 20}, {f, 2 << 20}} {
		require.NoError(t, p.Free(0, 0, x.p, x.n))
	}
	require.NoError(t, p.EmptyCache())
	check()
	require.Zero(t, fb.chunkHandles[0])
	require.Zero(t, fb.used[0])
}
