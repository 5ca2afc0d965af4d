package allocator

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	fb, p, alloc := newFreePagesPool(t)
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
	_, _, err := p.Alloc(0, 0, 2<<20)
	require.True(t, IsOutOfMemory(err), "%v", err)
	require.Equal(t, int64(18<<20), reservedNow(t, p))
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.SetLimit(0, 0))
	f := alloc(2 << 20)
	require.Equal(t, int64(20<<20), reservedNow(t, p))

	// Release gives back every free page (the 2 MiB left of the hole) and the
	// free tail; the live blocks keep theirs.
	freeAll(t, p, sized{e, 2 << 20}, sized{f, 2 << 20})
	require.NoError(t, p.EmptyCache())
	require.NoError(t, p.CheckInvariants())
	require.Equal(t, int64(16<<20), reservedNow(t, p), "a, c and d: 4 + 4 + 8 MiB")
	require.Equal(t, uint64(16<<20), fb.used[0])
	freeAll(t, p, sized{a, 4 << 20}, sized{c, 4 << 20}, sized{d, 8 << 20})
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
	a, _, _ := p.Alloc(0, 0, 4<<20)
	b, _, _ := p.Alloc(0, 0, 6<<20)
	c, _, _ := p.Alloc(0, 0, 4<<20)
	require.NoError(t, p.Free(0, 0, b, 6<<20))
	d, _, err := p.Alloc(0, 0, 8<<20)
	require.NoError(t, err)
	require.Equal(t, int64(22<<20), reservedNow(t, p))
	for _, x := range []uintptr{a, c} {
		require.NoError(t, p.Free(0, 0, x, 4<<20))
	}
	require.NoError(t, p.Free(0, 0, d, 8<<20))
	require.NoError(t, p.CheckInvariants())
}

// When the pool maps memory it never waits for the stream, not even when
// the mapping raises the peak of reserved bytes (PyTorch's malloc never
// waits for GPU progress, and a stream held by a kernel waiting for a peer
// would stall it): pages freed after the last quiet event it has seen
// complete stay mapped (the pool maps new memory instead), and go at a
// later mapping once the stream has passed their free. A Sync would be a
// wait: the test fails on one.
func TestFreePagesMappingNeverWaits(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 96 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	alloc := func(n uint64) uintptr {
		ptr, _, err := p.Alloc(0, 0, n)
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
	fb.onSync = func() { t.Fatal("a mapping waited for the stream") }
	d := alloc(8 << 20) // grows to 22 MiB: b's hole is not known to be quiet and stays mapped
	require.Equal(t, int64(22<<20), reservedNow(t, p))

	fb.finish(0)        // the stream passes b's free
	e := alloc(8 << 20) // grows again (no hole fits): the hole's chunks go first, no wait needed
	require.Equal(t, int64(24<<20), reservedNow(t, p), "22 - 6 + 8 MiB")

	fb.launch(0)
	require.NoError(t, p.Free(0, 0, d, 8<<20)) // an 8 MiB hole the stream may still use
	f := alloc(10 << 20)                       // passes the peak of 24 rather than wait
	require.Equal(t, int64(34<<20), reservedNow(t, p), "24 + 10 MiB")
	fb.finish(0)
	g := alloc(6 << 20) // grows again: d's hole is known to be passed now and goes first
	require.Equal(t, int64(34<<20), reservedNow(t, p), "34 - 6 + 6 MiB")
	fb.onSync = nil
	freeAll(t, p, sized{a, 4 << 20}, sized{c, 4 << 20}, sized{e, 8 << 20}, sized{f, 10 << 20}, sized{g, 6 << 20})
	require.NoError(t, p.EmptyCache())
	require.Equal(t, int64(0), reservedNow(t, p))
	require.NoError(t, p.CheckInvariants())
}

// A block over two unmapped runs whose second the limit refuses: the first
// stays mapped, booked as reserved and against the limit (nothing has to be
// undone, so no undo can fail), the block stays free, and what fits under
// the limit still does.
func TestFreePagesFailedMappingKeepsWhatItMapped(t *testing.T) {
	fb := newFake(1)
	fb.capacity = 64 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	var blocks []uintptr
	for i := 0; i < 5; i++ { // five chunks, one block each
		b, _, err := p.Alloc(0, 0, 2<<20)
		require.NoError(t, err)
		blocks = append(blocks, b)
	}
	require.NoError(t, p.Free(0, 0, blocks[1], 2<<20))
	require.NoError(t, p.Free(0, 0, blocks[3], 2<<20))
	g, _, err := p.Alloc(0, 0, 4<<20) // grows: chunks 1 and 3 are unmapped first
	require.NoError(t, err)
	require.NoError(t, p.Free(0, 0, blocks[2], 2<<20)) // one hole, chunks 1-3: unmapped, mapped, unmapped
	res := reservedNow(t, p)
	require.NoError(t, p.SetLimit(0, uint64(res)+2<<20))
	_, _, err = p.Alloc(0, 0, 6<<20) // chunk 1 maps, chunk 3 is over the limit
	require.True(t, IsOutOfMemory(err), "%v", err)
	require.Equal(t, res+2<<20, reservedNow(t, p), "chunk 1 stays mapped")
	require.Equal(t, uint64(res+2<<20), p.devs[0].budget.committed)
	require.NoError(t, p.CheckInvariants())
	x, _, err := p.Alloc(0, 0, 2<<20) // one chunk fits under the limit
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
		ptr, _, err := p.Alloc(0, 0, n)
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
	g, _, err := p.Alloc(0, 0, 40<<20) // grows: the first hole's chunks go spare, their mapping fails
	require.NoError(t, err)
	require.EqualValues(t, 1, stat("num_alloc_retries"), "served by the retry after release")
	check()
	m, _ := fb.Chunks(0)
	require.Equal(t, uint64(reservedNow(t, p)), m, "what is mapped is what the pool counts")
	require.NoError(t, p.Free(0, 0, g, 40<<20))

	freeAll(t, p, sized{c, 4 << 20}, sized{f, 2 << 20})
	require.NoError(t, p.EmptyCache())
	check()
	require.Zero(t, fb.chunkHandles[0])
	require.Zero(t, fb.used[0])
}

// An unmap that fails partway through release (trimming a free tail, or
// giving back a wholly free segment over several mapped runs with holes
// between them) leaves the pool's books equal to what the backend has
// mapped: the chunks that went are holes, uncounted, and a block handed
// out over them later gets them mapped again. CheckInvariants proves it
// chunk by chunk (ChunkAuditor); f.mem panics on a touch of an unmapped
// chunk.
func TestFailedUnmapLeavesTheBooksRight(t *testing.T) {
	errUnmap := errors.New("FAKE_ERROR_UNMAP")
	for _, c := range []struct {
		name          string
		cfg           Config
		call, after   int
		wantFailures  int64
		wantReserved0 int64
	}{
		{"tail, first run, after a chunk", Config{Expandable: true}, 1, 1, 1, 4 * mib},
		{"tail, first run, at once", Config{Expandable: true}, 1, 0, 1, 4 * mib},
		{"segment over runs, second run", Config{Expandable: true, UnmapFreePages: true}, 2, 1, 1, 0},
		{"segment over runs, first run", Config{Expandable: true, UnmapFreePages: true}, 1, 2, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(1)
			f.capacity = 256 * mib
			p, err := New(f, c.cfg)
			require.NoError(t, err)
			alloc := func(n uint64) uintptr {
				ptr, _, err := p.Alloc(0, 0, n)
				require.NoError(t, err)
				f.mem(ptr, n)[0] = 1
				return ptr
			}
			a := alloc(4 * mib)
			var holes []uintptr
			if c.cfg.UnmapFreePages {
				// Holes between live blocks, unmapped when the pool maps
				// more: the segment's mapped chunks come in several runs.
				x, y, z := alloc(6*mib), alloc(4*mib), alloc(6*mib)
				require.NoError(t, p.Free(0, 0, x, 6*mib))
				require.NoError(t, p.Free(0, 0, z, 6*mib))
				w := alloc(12 * mib) // grows: x's and z's pages go first
				holes = append(holes, y, w)
			}
			b := alloc(20 * mib)
			require.NoError(t, p.Free(0, 0, b, 20*mib))
			for _, h := range holes {
				require.NoError(t, p.Free(0, 0, h, 0))
			}
			if c.wantReserved0 == 0 {
				require.NoError(t, p.Free(0, 0, a, 4*mib))
			}
			require.NoError(t, p.CheckInvariants())
			f.failUnmap, f.failUnmapCall, f.failUnmapAfter = errUnmap, c.call, c.after
			err = p.EmptyCache()
			require.ErrorIs(t, err, errUnmap)
			require.NoError(t, p.CheckInvariants(), "the books follow the backend")
			m, err := p.StatsMap(0)
			require.NoError(t, err)
			require.Equal(t, c.wantFailures, m["num_release_failures"])
			// Whatever is handed out now is mapped.
			big := alloc(30 * mib)
			f.mem(big, 30*mib)
			require.NoError(t, p.CheckInvariants())
			require.NoError(t, p.Free(0, 0, big, 30*mib))
			require.NoError(t, p.EmptyCache())
			require.Equal(t, c.wantReserved0, reservedNow(t, p))
			require.NoError(t, p.CheckInvariants())
		})
	}
}

// Release waits once per stream, without any lock another thread needs:
// the tails and the free pages of a stream go after one event on it, waited
// for with neither its shard's lock nor privMu held; a pending
// record_stream free is waited for the same way. So while EmptyCache (or
// the out-of-memory retry) waits for a stream, the stream's allocations and
// other threads' pool calls go on.
func TestReleaseWaitsOnceWithoutLocks(t *testing.T) {
	f := newFake(1)
	f.capacity = 256 * mib
	p, err := New(f, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	const stream, side = 7, 9
	alloc := func(st uintptr, n uint64) uintptr {
		ptr, _, err := p.Alloc(0, st, n)
		require.NoError(t, err)
		f.use(st, ptr, n)
		return ptr
	}
	keep, hole, mid, tail := alloc(stream, 4*mib), alloc(stream, 6*mib), alloc(stream, 4*mib), alloc(stream, 30*mib)
	require.NoError(t, p.RecordStream(mid, side))
	f.launch(side)
	require.NoError(t, p.Free(0, stream, hole, 6*mib))
	require.NoError(t, p.Free(0, stream, tail, 30*mib))
	require.NoError(t, p.Free(0, stream, mid, 4*mib)) // pending on side's event
	id := PoolID{First: 5}
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	require.NoError(t, p.EndAllocateToPool(0, id))

	d := p.devs[0]
	var syncs, locked int
	f.onSync = func() {
		syncs++
		for _, mu := range []*sync.Mutex{&shardOf(t, p, stream).mu, &d.privMu} {
			if !mu.TryLock() {
				locked++
				continue
			}
			mu.Unlock()
		}
	}
	require.NoError(t, p.EmptyCache(), "the fake refuses an unmap before the stream's work completed")
	require.Equal(t, 2, syncs, "one wait for the pending free's stream, one for the segment's")
	require.Zero(t, locked, "no lock another thread needs held while waiting")
	require.EqualValues(t, 4*mib, reservedNow(t, p), "the hole, the pending block and the tail all went")
	f.mem(keep, 4*mib)
	require.NoError(t, p.CheckInvariants())
	f.onSync = nil
	require.NoError(t, p.ReleasePool(0, id, false))
	require.NoError(t, p.Free(0, stream, keep, 4*mib))
}

// Making room for a mapping is optional: when unmapping free pages fails,
// the allocation maps new memory and succeeds, the failure is counted, and
// the books follow what was unmapped.
func TestFreePagesFailureDoesNotFailTheAllocation(t *testing.T) {
	for _, after := range []int{0, 1} {
		f := newFake(1)
		f.capacity = 256 * mib
		p, err := New(f, Config{Expandable: true, UnmapFreePages: true})
		require.NoError(t, err)
		a, _, err := p.Alloc(0, 0, 4*mib)
		require.NoError(t, err)
		b, _, err := p.Alloc(0, 0, 6*mib)
		require.NoError(t, err)
		c, _, err := p.Alloc(0, 0, 4*mib)
		require.NoError(t, err)
		require.NoError(t, p.Free(0, 0, b, 6*mib))
		f.failUnmap, f.failUnmapCall, f.failUnmapAfter = errors.New("FAKE_ERROR_UNMAP"), 1, after
		x, _, err := p.Alloc(0, 0, 8*mib) // grows; the hole's pages go first, and that fails
		require.NoError(t, err, "the allocation does not depend on the optional step")
		f.mem(x, 8*mib)
		require.Equal(t, int64(1), stat(t, p, 0, "num_release_failures"))
		require.NoError(t, p.CheckInvariants())
		for _, y := range []uintptr{a, c, x} {
			require.NoError(t, p.Free(0, 0, y, 0))
		}
		require.NoError(t, p.EmptyCache())
		require.Zero(t, reservedNow(t, p))
	}
}

// The snapshot of a segment with unmapped free pages describes, as
// PyTorch's does for expandable segments, one segment per contiguous mapped
// range: total_size adds up to reserved_bytes, and each segment's blocks
// tile it.
func TestSnapshotOfFreePagesAddsUpToReserved(t *testing.T) {
	f := newFake(1)
	f.capacity = 256 * mib
	p, err := New(f, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	var ptrs []uintptr
	for _, n := range []uint64{3 * mib, 9 * mib, 1 * mib, 7 * mib, 2 * mib} {
		x, _, err := p.Alloc(0, 0, n)
		require.NoError(t, err)
		ptrs = append(ptrs, x)
	}
	require.NoError(t, p.Free(0, 0, ptrs[1], 9*mib))
	require.NoError(t, p.Free(0, 0, ptrs[3], 7*mib))
	_, _, err = p.Alloc(0, 0, 16*mib) // grows: the two holes' whole chunks are unmapped first
	require.NoError(t, err)
	require.Positive(t, p.devs[0].shardList()[0].segs.holes.n, "some pages are unmapped")
	snap := p.Snapshot()
	var total uint64
	for _, sg := range snap.Segments {
		total += sg.TotalSize
		at, sum := sg.Address, uint64(0)
		for _, b := range sg.Blocks {
			require.Equal(t, at, b.Address, "blocks tile the segment")
			at += uintptr(b.Size)
			sum += b.Size
		}
		require.Equal(t, sg.TotalSize, sum)
	}
	require.Greater(t, len(snap.Segments), 1, "the holes split the segment")
	require.EqualValues(t, reservedNow(t, p), total, "total_size adds up to reserved_bytes")
}

// A mapping takes the free pages of the longest free run first: a short
// hole between live blocks is the one soon handed out (and mapped) again.
func TestFreePagesLongestRunFirst(t *testing.T) {
	fb, p, alloc := newFreePagesPool(t)
	base := alloc(2 << 20) // the segment's reserved range starts here
	short := alloc(4 << 20)
	alloc(2 << 20)
	long := alloc(6 << 20)
	alloc(2 << 20)
	require.NoError(t, p.Free(0, 0, short, 4<<20))
	require.NoError(t, p.Free(0, 0, long, 6<<20))
	// Fits in neither hole: the segment grows by 8 MiB, and 8 MiB of free
	// pages go first: all 6 of the long run, then 2 of the short one's 4.
	alloc(7 << 20)
	require.NoError(t, p.CheckInvariants())
	chunks, _, err := fb.MappedChunks(0, base, 32<<20)
	require.NoError(t, err)
	mapped := func(ptr uintptr, n uint64) (m int) {
		for i := uint64(ptr-base) / fakeGranularity; i < uint64(ptr-base+uintptr(n))/fakeGranularity; i++ {
			if chunks[i] {
				m++
			}
		}
		return m
	}
	require.Equal(t, 0, mapped(long, 6<<20), "the long run is unmapped whole")
	require.Equal(t, 1, mapped(short, 4<<20), "one chunk of the short hole is left")
}

// newFreePagesPool is a pool with expandable segments that unmaps free
// pages, over a fake device of 64 MiB, and an alloc that fails the test on
// an error, touches the first and last byte of what it got (the fake panics
// on an unmapped chunk) and checks the pool's invariants.
func newFreePagesPool(t *testing.T) (*fakeBackend, *Pool, func(uint64) uintptr) {
	fb := newFake(1)
	fb.capacity = 64 << 20
	p, err := New(fb, Config{Expandable: true, UnmapFreePages: true})
	require.NoError(t, err)
	return fb, p, func(n uint64) uintptr {
		ptr, _, err := p.Alloc(0, 0, n)
		require.NoError(t, err)
		m := fb.mem(ptr, n) // every byte of it is mapped
		m[0], m[n-1] = 1, 1
		require.NoError(t, p.CheckInvariants())
		return ptr
	}
}

// With Config.FreePagesWait, a growth past the device's peak waits (without
// the shard's lock, bounded) for its stream to pass the free pages that
// would cover it, and maps only what they do not: here the stream catches
// up during the wait (the GPU draining what the host queued ahead of it).
// A stream that never catches up costs one bounded wait per count of
// frees, then the pool maps new memory as without the wait.
func TestFreePagesWaitAtThePeak(t *testing.T) {
	for _, catchUp := range []bool{true, false} {
		t.Run(fmt.Sprintf("catch up %v", catchUp), func(t *testing.T) {
			fb := newFake(1)
			fb.capacity = 96 << 20
			p, err := New(fb, Config{Expandable: true, UnmapFreePages: true, FreePagesWait: 50 * time.Millisecond})
			require.NoError(t, err)
			alloc := func(n uint64) uintptr {
				ptr, _, err := p.Alloc(0, 0, n)
				require.NoError(t, err)
				require.NoError(t, p.CheckInvariants())
				return ptr
			}
			a, b, c := alloc(4<<20), alloc(8<<20), alloc(4<<20)
			require.Equal(t, int64(16<<20), reservedNow(t, p))
			fb.launch(0) // work queued on the stream that may still use b
			require.NoError(t, p.Free(0, 0, b, 8<<20))
			var queries atomic.Int32
			fb.onEvent = func(op string) {
				if op == "query" && queries.Add(1) == 2 && catchUp {
					fb.finish(0)
				}
			}
			fb.onSync = func() { t.Fatal("a mapping blocked in Sync") }
			t0 := time.Now()
			d := alloc(10 << 20) // past the peak of 16 MiB, with b's 8 unpassed
			took := time.Since(t0)
			if catchUp {
				require.Equal(t, int64(18<<20), reservedNow(t, p), "16 - 8 + 10 MiB: b's chunks moved")
			} else {
				require.Equal(t, int64(26<<20), reservedNow(t, p), "16 + 10 MiB after the wait gave up")
				require.GreaterOrEqual(t, took, 50*time.Millisecond)
				fb.launch(0)
				t0 = time.Now()
				e := alloc(10 << 20) // no new frees: no second wait
				require.Less(t, time.Since(t0), 50*time.Millisecond)
				require.NoError(t, p.Free(0, 0, e, 10<<20))
			}
			fb.onEvent, fb.onSync = nil, nil
			fb.finish(0)
			freeAll(t, p, sized{a, 4 << 20}, sized{c, 4 << 20}, sized{d, 10 << 20})
			require.NoError(t, p.EmptyCache())
			require.Zero(t, reservedNow(t, p))
			require.NoError(t, p.CheckInvariants())
		})
	}
}

// sized is a block to free: its pointer and the size it was asked with.
type sized struct {
	p uintptr
	n uint64
}

// freeAll frees each block on device 0, stream 0.
func freeAll(t *testing.T, p *Pool, blocks ...sized) {
	t.Helper()
	for _, b := range blocks {
		require.NoError(t, p.Free(0, 0, b.p, b.n))
	}
}
