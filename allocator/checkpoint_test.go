package allocator

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCacheInfo(t *testing.T) {
	p, _ := newPool(t, Config{})
	_, err := p.CacheInfo(2)
	require.ErrorIs(t, err, ErrInvalid)
	largest := func() uint64 {
		n, err := p.CacheInfo(0)
		require.NoError(t, err)
		return n
	}
	require.Zero(t, largest(), "nothing cached yet")

	a := mustAlloc(t, p, 0, sA, 1000) // a 2 MiB small segment, 1024 bytes used
	require.Equal(t, uint64(2<<20-1024), largest())
	b := mustAlloc(t, p, 0, sB, 5<<20) // another stream: a 20 MiB large segment
	require.Equal(t, uint64(15<<20), largest(), "every stream's blocks count")
	require.NoError(t, p.Free(0, sB, b, 5<<20))
	require.Equal(t, uint64(20<<20), largest(), "a wholly free segment is one block")

	// A private pool's free blocks serve no allocation outside it: left out.
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	g, _, err := p.AllocIn(0, sA, 30<<20, graphPool)
	require.NoError(t, err)
	require.NoError(t, p.Free(0, sA, g, 30<<20))
	require.NoError(t, p.EndAllocateToPool(0, graphPool))
	require.Equal(t, uint64(20<<20), largest())

	require.NoError(t, p.Free(0, sA, a, 1000))
	require.NoError(t, p.EmptyCache())
	require.Zero(t, largest())
	n, err := p.CacheInfo(1)
	require.NoError(t, err)
	require.Zero(t, n, "devices are separate")
}

// The largest block is found in the highest non-empty bin whatever the bin's order.
func TestBinsLargest(t *testing.T) {
	var bs bins
	require.Zero(t, bs.largest())
	blocks := []*block{{size: 3 << 20}, {size: 3<<20 + 512}, {size: 512}, {size: 3<<20 + 1024}, {size: 1 << 40}}
	for i, b := range blocks[:4] {
		bs.insert(b)
		require.Equal(t, []uint64{3 << 20, 3<<20 + 512, 3<<20 + 512, 3<<20 + 1024}[i], bs.largest())
	}
	bs.insert(blocks[4])
	require.Equal(t, uint64(1<<40), bs.largest())
}

func TestResetAccumulated(t *testing.T) {
	for _, streams := range [][]uintptr{{sA}, {sA, sB}} { // one stream, and device-wide counters
		p, f := newPool(t, Config{MaxSplit: 30 << 20})
		require.ErrorIs(t, p.ResetAccumulated(2), ErrInvalid)
		var live []uintptr
		for i, n := range []uint64{1000, 3 << 20, 40 << 20, 5000} {
			live = append(live, mustAlloc(t, p, 0, streams[i%len(streams)], n))
		}
		require.NoError(t, p.Free(0, streams[0], live[0], 1000))
		// A pending block: active but not allocated.
		require.NoError(t, p.RecordStream(live[1], sC))
		f.launch(sC)
		require.NoError(t, p.Free(0, streams[1%len(streams)], live[1], 3<<20))
		f.capacity = 1 << 30
		_, _, err := p.Alloc(0, sA, 2<<30) // an out-of-memory answer counts retries and OOMs
		require.ErrorIs(t, err, ErrOutOfMemory)

		before, err := p.StatsMap(0)
		require.NoError(t, err)
		require.NotZero(t, before["allocation.all.allocated"])
		require.NotZero(t, before["num_ooms"])
		require.NoError(t, p.ResetAccumulated(0))
		after, err := p.StatsMap(0)
		require.NoError(t, err)
		for _, name := range StatNames() {
			switch {
			case strings.HasSuffix(name, ".allocated"), strings.HasSuffix(name, ".freed"),
				name == "num_alloc_retries", name == "num_ooms", name == "num_sync_all_streams",
				name == "num_device_alloc", name == "num_device_free", name == "num_front_cache_hits":
				require.Zero(t, after[name], "%s after the reset (streams %v)", name, streams)
			default:
				require.Equal(t, before[name], after[name], "%s is not accumulated: unchanged (streams %v)", name, streams)
			}
		}

		// From here, current = current at the reset + allocated − freed, for
		// every family, through frees, pending frees completing, new segments
		// and their release.
		f.finish(sC)
		live = append(live, mustAlloc(t, p, 0, sA, 7<<20), mustAlloc(t, p, 0, streams[len(streams)-1], 100<<10))
		require.NoError(t, p.Free(0, streams[0], live[4], 7<<20))
		require.NoError(t, p.Free(0, streams[0], live[3], 5000))
		require.NoError(t, p.EmptyCache())
		now, err := p.StatsMap(0)
		require.NoError(t, err)
		for _, fam := range familyNames {
			for _, ty := range typeNames {
				k := fam + "." + ty + "."
				require.Equal(t, after[k+"current"]+now[k+"allocated"]-now[k+"freed"], now[k+"current"], "%s (streams %v)", k, streams)
			}
		}
		require.Equal(t, int64(1), now["num_sync_all_streams"])
		check(t, p)
	}
}

// graphRig drives one private pool of device 0 for the checkpoint tests,
// keeping the requested size of every live block of it.
type graphRig struct {
	t    *testing.T
	p    *Pool
	f    *fakeBackend
	live map[uintptr]uint64
	st   map[uintptr]uintptr
}

func newGraphRig(t *testing.T, cfg Config) *graphRig {
	f := newFake(2)
	f.capacity = 64 << 20 // the fake backs an expandable range of this size with Go memory
	p, err := New(f, cfg)
	require.NoError(t, err)
	require.NoError(t, p.BeginAllocateToPool(0, graphPool, nil))
	return &graphRig{t: t, p: p, f: f, live: map[uintptr]uint64{}, st: map[uintptr]uintptr{}}
}

func (r *graphRig) alloc(st uintptr, n uint64) uintptr {
	r.t.Helper()
	ptr, _, err := r.p.AllocIn(0, st, n, graphPool)
	require.NoError(r.t, err)
	r.live[ptr], r.st[ptr] = n, st
	return ptr
}

func (r *graphRig) free(ptr uintptr) {
	r.t.Helper()
	require.NoError(r.t, r.p.Free(0, r.st[ptr], ptr, r.live[ptr]))
	delete(r.live, ptr)
}

func (r *graphRig) blocks() []BlockInfo {
	r.t.Helper()
	bl, err := r.p.PoolBlocks(0, graphPool)
	require.NoError(r.t, err)
	return bl
}

// normalized is a listing as a restore makes it: allocated blocks as they
// are, and each run of other blocks of a segment as one free block.
func normalized(bl []BlockInfo) []BlockInfo {
	var out []BlockInfo
	for _, b := range bl {
		if b.Status != StatusAllocated {
			b.Status, b.Requested = StatusFree, 0
			if n := len(out); n > 0 && out[n-1].Status == StatusFree && out[n-1].Segment == b.Segment && out[n-1].end() == b.Addr {
				out[n-1].Size += b.Size
				continue
			}
		}
		out = append(out, b)
	}
	return out
}

func allocatedIn(bl []BlockInfo) map[uintptr]uint64 {
	m := map[uintptr]uint64{}
	for _, b := range bl {
		if b.Status == StatusAllocated {
			m[b.Addr] = b.Requested
		}
	}
	return m
}

func TestPoolBlocks(t *testing.T) {
	r := newGraphRig(t, Config{})
	_, err := r.p.PoolBlocks(3, graphPool)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = r.p.PoolBlocks(0, PoolID{First: 99})
	require.ErrorContains(t, err, "listing of pool (99, 0) on device 0: no such pool")
	require.Empty(t, r.blocks(), "a pool with no segment yet")

	a := r.alloc(sA, 1000)
	c := r.alloc(sA, 1000)
	b := r.alloc(sB, 3<<20)
	d := mustAlloc(t, r.p, 0, sA, 4096) // the default pool
	require.NoError(t, r.p.EndAllocateToPool(0, graphPool))
	r.free(a)
	require.NoError(t, r.p.RecordStream(c, sC))
	r.f.launch(sC)
	r.free(c) // pending on sC

	small, large := a, b
	want := []BlockInfo{
		{Addr: a, Size: 1024, Stream: sA, Segment: small, Status: StatusFree},
		{Addr: c, Size: 1024, Requested: 1000, Stream: sA, Segment: small, Status: StatusPending},
		{Addr: c + 1024, Size: 2<<20 - 2048, Stream: sA, Segment: small, Status: StatusFree},
		{Addr: b, Size: 3 << 20, Requested: 3 << 20, Stream: sB, Segment: large, Status: StatusAllocated},
		{Addr: b + 3<<20, Size: 17 << 20, Stream: sB, Segment: large, Status: StatusFree},
	}
	if large < small {
		want = append(want[3:], want[:3]...)
	}
	require.Equal(t, want, r.blocks())

	def, err := r.p.PoolBlocks(0, PoolID{})
	require.NoError(t, err)
	require.Equal(t, []BlockInfo{
		{Addr: d, Size: 4096, Requested: 4096, Stream: sA, Segment: d, Status: StatusAllocated},
		{Addr: d + 4096, Size: 2<<20 - 4096, Stream: sA, Segment: d, Status: StatusFree},
	}, def, "(0, 0): the default pool, and only it")
	def, err = r.p.PoolBlocks(1, PoolID{})
	require.NoError(t, err)
	require.Empty(t, def)
	check(t, r.p)
}

func TestRestoreBlocks(t *testing.T) {
	type step func(r *graphRig, ptrs []uintptr) []uintptr
	cases := []struct {
		name string
		// before builds the pool up to the checkpoint; after changes it.
		before, after         step
		freed, allocated      int
		segmentsAfterRestore  int
		freedBeforeCheckpoint bool
	}{
		{
			name:   "nothing changed",
			before: func(r *graphRig, _ []uintptr) []uintptr { return []uintptr{r.alloc(sA, 1000), r.alloc(sA, 3<<20)} },
			after:  func(r *graphRig, ptrs []uintptr) []uintptr { return ptrs },
		},
		{
			name:   "blocks allocated since are freed",
			before: func(r *graphRig, _ []uintptr) []uintptr { return []uintptr{r.alloc(sA, 1000)} },
			after: func(r *graphRig, ptrs []uintptr) []uintptr {
				return append(ptrs, r.alloc(sA, 4096), r.alloc(sA, 2<<20), r.alloc(sB, 512))
			},
			freed: 3,
		},
		{
			name: "blocks freed since are allocated again at their address",
			before: func(r *graphRig, _ []uintptr) []uintptr {
				return []uintptr{r.alloc(sA, 1000), r.alloc(sA, 5000), r.alloc(sA, 700)}
			},
			after: func(r *graphRig, ptrs []uintptr) []uintptr {
				r.free(ptrs[1])
				r.free(ptrs[2])
				return ptrs[:1]
			},
			allocated: 2,
		},
		{
			name: "space merged and split differently since",
			before: func(r *graphRig, _ []uintptr) []uintptr {
				return []uintptr{r.alloc(sA, 2<<20), r.alloc(sA, 3<<20), r.alloc(sA, 2<<20+512)}
			},
			after: func(r *graphRig, ptrs []uintptr) []uintptr {
				for _, x := range ptrs {
					r.free(x)
				}
				y := r.alloc(sA, 4<<20) // over the first two
				z := r.alloc(sA, 3<<20) // over the third and beyond
				return []uintptr{y, z}
			},
			freed: 2, allocated: 3,
		},
		{
			name:   "a segment taken since keeps nothing allocated",
			before: func(r *graphRig, _ []uintptr) []uintptr { return []uintptr{r.alloc(sA, 1000)} },
			after: func(r *graphRig, ptrs []uintptr) []uintptr {
				return append(ptrs, r.alloc(sA, 30<<20), r.alloc(sB, 1000))
			},
			freed: 2, segmentsAfterRestore: 3,
		},
		{
			name:   "another requested size at the same block: freed and allocated",
			before: func(r *graphRig, _ []uintptr) []uintptr { return []uintptr{r.alloc(sA, 1000)} },
			after: func(r *graphRig, ptrs []uintptr) []uintptr {
				r.free(ptrs[0])
				return []uintptr{r.alloc(sA, 800)}
			},
			freed: 1, allocated: 1,
		},
		{
			name: "two streams, blocks freed before the checkpoint",
			before: func(r *graphRig, _ []uintptr) []uintptr {
				a, b, c := r.alloc(sA, 1<<20), r.alloc(sB, 6<<20), r.alloc(sB, 6<<20)
				r.free(b)
				return []uintptr{a, c}
			},
			after: func(r *graphRig, ptrs []uintptr) []uintptr {
				r.free(ptrs[1])
				return []uintptr{ptrs[0], r.alloc(sB, 13<<20), r.alloc(sA, 512)}
			},
			freed: 2, allocated: 1,
		},
	}
	for _, tc := range cases {
		for _, exp := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/expandable=%v", tc.name, exp), func(t *testing.T) {
				r := newGraphRig(t, Config{Expandable: exp})
				noise := mustAlloc(t, r.p, 0, sC, 3<<20) // the default pool is left alone
				ptrs := tc.before(r, nil)
				ckpt := r.blocks()
				ckLive := map[uintptr]uint64{}
				for k, v := range r.live {
					ckLive[k] = v
				}
				tc.after(r, ptrs)
				nowLive := allocatedIn(r.blocks())

				res, err := r.p.RestoreBlocks(0, graphPool, ckpt)
				require.NoError(t, err)
				require.Len(t, res.Freed, tc.freed, "freed %#x", res.Freed)
				require.Len(t, res.Allocated, tc.allocated, "allocated %#x", res.Allocated)
				for _, x := range res.Freed {
					_, was := nowLive[x]
					require.True(t, was, "%#x was allocated before the restore", x)
				}
				for _, x := range res.Allocated {
					_, is := ckLive[x]
					require.True(t, is, "%#x was allocated at the checkpoint", x)
				}
				require.IsIncreasing(t, res.Freed)
				require.IsIncreasing(t, res.Allocated)
				check(t, r.p)

				// The checkpoint's segments hold exactly its blocks; newer ones
				// nothing allocated.
				got := r.blocks()
				ckSegs := map[uintptr]bool{}
				for _, b := range ckpt {
					ckSegs[b.Segment] = true
				}
				var inCkpt []BlockInfo
				newSegs := map[uintptr]bool{}
				for _, b := range got {
					if ckSegs[b.Segment] {
						inCkpt = append(inCkpt, b)
						continue
					}
					newSegs[b.Segment] = true
					require.NotEqual(t, StatusAllocated, b.Status, "block %#x of a newer segment", b.Addr)
				}
				require.Equal(t, normalized(ckpt), normalized(inCkpt))
				if tc.segmentsAfterRestore > 0 {
					require.Equal(t, tc.segmentsAfterRestore, len(ckSegs)+len(newSegs))
				}

				// Statistics: exactly the checkpoint's blocks and the noise.
				var n, bytes, req int64
				for _, b := range ckpt {
					if b.Status == StatusAllocated {
						n, bytes, req = n+1, bytes+int64(b.Size), req+int64(b.Requested)
					}
				}
				require.Equal(t, n+1, stat(t, r.p, 0, "allocation.all.current"))
				require.Equal(t, bytes+3<<20, stat(t, r.p, 0, "allocated_bytes.all.current"))
				require.Equal(t, req+3<<20, stat(t, r.p, 0, "requested_bytes.all.current"))
				require.Equal(t, n+1, stat(t, r.p, 0, "active.all.current"))

				// The restored blocks are the caller's: they free as allocated.
				for x, sz := range ckLive {
					require.NoError(t, r.p.Free(0, r.stOf(ckpt, x), x, sz))
				}
				require.NoError(t, r.p.Free(0, sC, noise, 3<<20))
				require.Zero(t, stat(t, r.p, 0, "allocation.all.current"))
				require.NoError(t, r.p.ReleasePool(0, graphPool, true))
				require.NoError(t, r.p.EmptyCache())
				require.Zero(t, stat(t, r.p, 0, "reserved_bytes.all.current"))
				check(t, r.p)
			})
		}
	}
}

func (r *graphRig) stOf(bl []BlockInfo, ptr uintptr) uintptr {
	for _, b := range bl {
		if b.Addr == ptr {
			return b.Stream
		}
	}
	r.t.Fatalf("%#x not listed", ptr)
	return 0
}

// Pending blocks: out of the way they stay pending; in the way they are
// waited for when no capture can be under way, else the restore is busy.
func TestRestoreBlocksPending(t *testing.T) {
	r := newGraphRig(t, Config{})
	a := r.alloc(sA, 1000)
	b := r.alloc(sA, 1000)
	ckpt := r.blocks() // a and b allocated
	require.NoError(t, r.p.RecordStream(b, sC))
	require.NoError(t, r.p.EndAllocateToPool(0, graphPool))
	r.f.launch(sC)
	r.free(b) // pending on sC, where the checkpoint has b allocated

	// While a capture may be under way (a route is open), no event may be
	// waited for: busy, nothing changed.
	require.NoError(t, r.p.BeginAllocateToPool(0, PoolID{First: 8}, nil))
	before := r.blocks()
	_, err := r.p.RestoreBlocks(0, graphPool, ckpt)
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "waiting for record_stream events")
	require.Equal(t, before, r.blocks())
	require.NoError(t, r.p.EndAllocateToPool(0, PoolID{First: 8}))

	// With no route open the restore waits for b's event, then allocates it.
	res, err := r.p.RestoreBlocks(0, graphPool, ckpt)
	require.NoError(t, err)
	require.Equal(t, Restored{Freed: []uintptr{}, Allocated: []uintptr{b}}, res)
	require.Equal(t, ckpt, r.blocks())
	check(t, r.p)

	// A pending block where the checkpoint has free space stays pending.
	require.NoError(t, r.p.Free(0, sA, b, 1000))
	ckpt2 := r.blocks() // a allocated, the rest free
	require.NoError(t, r.p.BeginAllocateToPool(0, graphPool, nil))
	c := r.alloc(sA, 1000)
	require.Equal(t, b, c)
	require.NoError(t, r.p.RecordStream(c, sC))
	r.f.launch(sC)
	r.free(c)
	res, err = r.p.RestoreBlocks(0, graphPool, ckpt2)
	require.NoError(t, err, "the route is open, but nothing needs to wait")
	require.Equal(t, Restored{Freed: []uintptr{}, Allocated: []uintptr{}}, res)
	require.Equal(t, StatusPending, r.blocks()[1].Status)
	require.Equal(t, normalized(ckpt2), normalized(r.blocks()))

	// An allocated block that record_stream streams hold cannot make room.
	d := r.alloc(sA, 1000) // the first free block after the pending one
	require.NoError(t, r.p.RecordStream(d, sB))
	ckpt3 := r.blocks()
	ckpt3[2].Size += 512 // d's place, claimed by a larger block in the "checkpoint"
	ckpt3[2].Requested = ckpt3[2].Size
	ckpt3[3].Addr += 512
	ckpt3[3].Size -= 512
	before = r.blocks()
	_, err = r.p.RestoreBlocks(0, graphPool, ckpt3)
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "record_stream streams still hold it")
	require.Equal(t, before, r.blocks())
	_ = a
	check(t, r.p)
}

func TestRestoreBlocksErrors(t *testing.T) {
	r := newGraphRig(t, Config{})
	a := r.alloc(sA, 1000)
	r.alloc(sA, 3000)
	b := r.alloc(sB, 3<<20)
	ckpt := r.blocks()
	require.Len(t, ckpt, 5)
	small := 0
	if ckpt[0].Segment != a {
		small = 2
	}
	r.free(b)
	r.alloc(sA, 4096)
	edit := func(fn func(w []BlockInfo) []BlockInfo) []BlockInfo {
		return fn(append([]BlockInfo(nil), ckpt...))
	}
	released := PoolID{First: 5}
	require.NoError(t, r.p.BeginAllocateToPool(0, released, nil))
	x, _, err := r.p.AllocIn(0, sA, 512, released)
	require.NoError(t, err)
	require.NoError(t, r.p.ReleasePool(0, released, false))

	cases := []struct {
		name string
		dev  int
		id   PoolID
		want []BlockInfo
		msg  string
	}{
		{"bad device", 2, graphPool, ckpt, "device 2 out of range"},
		{"the default pool", 0, PoolID{}, nil, "the default pool is shared by every stream"},
		{"unknown pool", 0, PoolID{First: 99}, ckpt, "restore of pool (99, 0) on device 0: no such pool"},
		{"released pool", 0, released, nil, "the pool was released"},
		{"another pool's segment", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo {
			return append(w, BlockInfo{Addr: x, Size: 512, Stream: sA, Segment: x})
		}), "is not one of the pool's"},
		{"a segment unknown", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[0].Segment = 0xdead000; return w }),
			"segment 0xdead000 is not one of the pool's"},
		{"a block past its segment's end", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small+2].Size += 512; return w }),
			"crosses the boundary of its segment"},
		{"a block before its segment", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo {
			w[small].Addr -= 512
			w[small].Size += 512
			return w
		}), "crosses the boundary"},
		{"a gap", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { return append(w[:small+1], w[small+2:]...) }), "a gap at"},
		{"an overlap", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { return append(w, w[small+1]) }), "an overlap at"},
		{"a segment's end missing", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { return append(w[:small+2], w[small+3:]...) }),
			"its blocks end at offset"},
		{"misaligned", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small+1].Addr++; return w }), "not a multiple of 512"},
		{"size 0", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small+1].Size = 0; return w }), "is zero or not a multiple"},
		{"a range that wraps", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo {
			w[small+1].Addr = ^uintptr(0) &^ 511
			w[small+1].Size = 1024
			return w
		}), "is not an address range"},
		{"a huge size", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small+1].Size = 1 << 63; return w }), "is not an address range"},
		{"a bad state", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small+1].Status = 3; return w }), "state 3"},
		{"a negative state", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small+1].Status = -1; return w }), "state -1"},
		{"allocated, requested 0", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small].Requested = 0; return w }),
			"requested size 0"},
		{"allocated, requested over its size", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small].Requested = 1025; return w }),
			"requested size 1025: want 1 to its size 1024"},
		{"another stream", 0, graphPool, edit(func(w []BlockInfo) []BlockInfo { w[small].Stream = sB; return w }),
			"its segment is stream 0x1000's"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := r.blocks()
			stats, err := r.p.Stats(0)
			require.NoError(t, err)
			res, err := r.p.RestoreBlocks(tc.dev, tc.id, tc.want)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tc.msg)
			require.Equal(t, Restored{}, res)
			require.Equal(t, before, r.blocks(), "nothing changed")
			after, err := r.p.Stats(0)
			require.NoError(t, err)
			require.Equal(t, stats, after, "statistics unchanged")
			check(t, r.p)
		})
	}

	// Arrays too small: the counts needed, nothing changed, then a retry.
	before := r.blocks()
	_, err = r.p.RestoreBlocksCapped(0, graphPool, ckpt, 0, 0)
	var ce *RestoreCapacityError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, ErrInvalid)
	require.Equal(t, RestoreCapacityError{Freed: 1, Allocated: 1, MaxFreed: 0, MaxAllocated: 0}, *ce)
	require.Equal(t, before, r.blocks())
	res, err := r.p.RestoreBlocksCapped(0, graphPool, ckpt, ce.Freed, ce.Allocated)
	require.NoError(t, err)
	require.Equal(t, []uintptr{b}, res.Allocated)
	require.Equal(t, ckpt, r.blocks())
	check(t, r.p)
	require.True(t, errors.Is(&RestoreCapacityError{}, ErrInvalid))
}

// In an expandable pool, private pools keep fixed segments, so a restore is
// the same; the default pool's expandable segments are listed (their mapped
// part) but never restored.
func TestRestoreBlocksExpandable(t *testing.T) {
	r := newGraphRig(t, Config{Expandable: true})
	d1 := mustAlloc(t, r.p, 0, sA, 3<<20)
	d2 := mustAlloc(t, r.p, 0, sA, 100<<10)
	a := r.alloc(sA, 5<<20)
	ckpt := r.blocks()
	r.free(a)
	r.alloc(sA, 7<<20)
	res, err := r.p.RestoreBlocks(0, graphPool, ckpt)
	require.NoError(t, err)
	require.Len(t, res.Freed, 1)
	require.Equal(t, []uintptr{a}, res.Allocated)
	require.Equal(t, ckpt, r.blocks())

	def, err := r.p.PoolBlocks(0, PoolID{})
	require.NoError(t, err)
	require.Len(t, def, 3, "two blocks and the free rest of the mapped chunks")
	require.Equal(t, d1, def[0].Addr)
	var mapped uint64
	for _, b := range def {
		require.Equal(t, d1, b.Segment)
		mapped += b.Size
	}
	require.Equal(t, uint64(stat(t, r.p, 0, "reserved_bytes.all.current")-20<<20), mapped, "the mapped part, beside the pool's 20 MiB")
	_, err = r.p.RestoreBlocks(0, PoolID{}, def)
	require.ErrorIs(t, err, ErrInvalid)
	_ = d2
	check(t, r.p)
}

// FuzzRestoreBlocks drives random allocations, frees, record_stream and
// stream work in a private pool (two streams, its route opened and closed)
// beside default-pool traffic, takes checkpoints (PoolBlocks) at random
// points and restores them, some mutated. After every step the pool's
// invariants hold (CheckInvariants). After a restore that succeeds, the
// checkpoint's segments hold exactly its allocated blocks (the listings are
// equal up to how free space is cut), newer segments hold none, what was
// reported freed and allocated is what the model predicts, and blocks left
// alone kept their bytes. A restore that fails is ErrInvalid or ErrBusy
// (busy only with a pending or stream-held block in the pool), and changed
// no allocation or statistic of allocated blocks.
func FuzzRestoreBlocks(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 1, 1, 2, 8, 3, 0, 0, 0, 9, 0})
	f.Add([]byte("\x01\x00\x05\x00\x00\x02\x21\x00\x08\x03\x00\x04\x01\x09\x07\x00\x00\x40\x00\x09\x01"))
	f.Add([]byte("\x00\x00\x06\x00\x00\x00\x02\x00\x08\x05\x00\x00\x00\x03\x00\x07\x09\x04\x09\x00\x06\x00\x09\x00"))
	f.Add([]byte("\x00\x02\x01\x10\x02\x41\x00\x00\x08\x03\x00\x03\x00\x02\x03\x07\x07\x09\x00"))
	// Three blocks, a checkpoint, a free and a new block, restores.
	f.Add([]byte{0, 0, 0x00, 5, 0, 0x01, 9, 0, 0x04, 7, 8, 3, 1, 0, 0x01, 200, 9, 1, 3, 0, 9, 1, 0, 0x05, 3, 9, 1})
	// Expandable: a pending block in the way, waited for; then a mutation.
	f.Add([]byte{1, 0, 0x03, 2, 0, 0x13, 1, 8, 3, 0, 0, 0x03, 3, 5, 0, 7, 3, 0, 9, 1, 6, 1, 9, 1, 7, 9, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) { fuzzRestore(t, data) })
}

func fuzzRestore(t *testing.T, data []byte) {
	next := func() uint64 {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return uint64(b)
	}
	fb := newFake(1)
	fb.capacity = 96 << 20
	p, err := New(fb, Config{MaxSplit: 40 << 20, Expandable: next()%2 == 1})
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		n      uint64
		stream uintptr
		tag    byte
		pool   bool
		held   bool // record_stream gave it another stream
	}
	live := map[uintptr]rec{}
	tag := byte(1)
	touch := func(ptr uintptr, n uint64) (head, tail []byte) {
		k := min(n, 64)
		return fb.mem(ptr, k), fb.mem(ptr+uintptr(n-k), k)
	}
	write := func(ptr uintptr, r rec) {
		h, tl := touch(ptr, r.n)
		for i := range h {
			h[i], tl[i] = r.tag, r.tag
		}
	}
	intact := func(ptr uintptr) {
		r := live[ptr]
		h, tl := touch(ptr, r.n)
		for i := range h {
			if h[i] != r.tag || tl[i] != r.tag {
				t.Fatalf("block %#x (%d bytes) lost its bytes", ptr, r.n)
			}
		}
	}
	overlapsLive := func(ptr uintptr, n uint64) bool {
		for q, r := range live {
			if ptr < q+uintptr(r.n) && q < ptr+uintptr(n) {
				return true
			}
		}
		return false
	}
	listing := func() []BlockInfo {
		bl, err := p.PoolBlocks(0, graphPool)
		if err != nil {
			t.Fatal(err)
		}
		return bl
	}
	allocStats := func() [3]int64 {
		m, err := p.StatsMap(0)
		if err != nil {
			t.Fatal(err)
		}
		return [3]int64{m["allocation.all.current"], m["allocated_bytes.all.current"], m["requested_bytes.all.current"]}
	}
	if err := p.BeginAllocateToPool(0, graphPool, nil); err != nil {
		t.Fatal(err)
	}
	routing, uses := true, 1 // every begin takes a use of the pool
	streams := []uintptr{sA, sB}
	var ckpt []BlockInfo
	for steps := 0; len(data) > 0 && steps < 300; steps++ {
		op := next() % 10
		switch op {
		case 0, 1, 2: // alloc
			sel := next()
			var n uint64
			switch sel % 4 {
			case 0:
				n = 1 + next()*16
			case 1:
				n = 1 + next()<<12
			case 2:
				n = 1 + next()<<16
			default:
				n = 2<<20 + next()<<17
			}
			st := streams[sel/4%2]
			inPool := routing && sel&0x10 == 0
			var ptr uintptr
			if inPool {
				ptr, _, err = p.AllocIn(0, st, n, graphPool)
			} else {
				ptr, _, err = p.Alloc(0, st+sC, n) // streams of their own for the default pool
				st += sC
			}
			if err != nil {
				if !IsOutOfMemory(err) {
					t.Fatalf("alloc %d: %v", n, err)
				}
				continue
			}
			if overlapsLive(ptr, n) {
				t.Fatalf("new block [%#x,+%d) overlaps a live one", ptr, n)
			}
			r := rec{n: n, stream: st, tag: tag, pool: inPool}
			tag++
			live[ptr] = r
			write(ptr, r)
		case 3, 4: // free
			ptrs := sortedKeys(live)
			if len(ptrs) == 0 {
				continue
			}
			ptr := ptrs[int(next())%len(ptrs)]
			intact(ptr)
			if err := p.Free(0, live[ptr].stream, ptr, live[ptr].n); err != nil {
				t.Fatal(err)
			}
			delete(live, ptr)
		case 5: // record_stream on sC (its free turns pending), or work on sC
			ptrs := sortedKeys(live)
			if k := next(); len(ptrs) > 0 && k%2 == 0 {
				ptr := ptrs[int(k/2)%len(ptrs)]
				if err := p.RecordStream(ptr, sC); err != nil {
					t.Fatal(err)
				}
				r := live[ptr]
				r.held = r.held || r.stream != sC
				live[ptr] = r
			} else {
				fb.launch(sC)
			}
		case 6:
			if next()%4 == 0 {
				if err := p.EmptyCache(); err != nil {
					t.Fatal(err)
				}
			} else {
				fb.finish(sC)
			}
		case 7: // the route: a capture ends, another begins
			if routing {
				err = p.EndAllocateToPool(0, graphPool)
			} else {
				err = p.BeginAllocateToPool(0, graphPool, nil)
				uses++
			}
			if err != nil {
				t.Fatal(err)
			}
			routing = !routing
		case 8: // a new checkpoint now and then: an old one sees more change
			if ckpt == nil || next()%4 == 0 {
				ckpt = listing()
			}
		case 9:
			if ckpt == nil {
				continue
			}
			want := append([]BlockInfo(nil), ckpt...)
			mutated := false
			if m := next(); m%3 == 0 && len(want) > 0 {
				mutated = true
				i := int(next()) % len(want)
				w := &want[i]
				switch m / 3 % 9 {
				case 0: // allocated <-> free
					if w.Status == StatusAllocated {
						w.Status, w.Requested = StatusFree, 0
					} else {
						w.Status, w.Requested = StatusAllocated, 1+next()*uint64(w.Size)/256
					}
				case 1:
					w.Addr += 512
				case 2:
					w.Size += 512
				case 3:
					want = append(want[:i], want[i+1:]...)
				case 4:
					want = append(want, *w)
				case 5:
					w.Stream ^= sA | sB
				case 6:
					w.Requested = w.Size + 1
				case 7:
					w.Segment = want[int(next())%len(want)].Segment
				default: // a free block cut in two: still a listing
					if w.Status != StatusAllocated && w.Size >= 1024 {
						cut := w.Size / 1024 * 512
						tail := *w
						tail.Addr, tail.Size = w.Addr+uintptr(cut), w.Size-cut
						w.Size = cut
						want = append(want, tail)
					}
				}
			}
			for ptr := range live {
				intact(ptr)
			}
			before, statsBefore := listing(), allocStats()
			res, err := p.RestoreBlocks(0, graphPool, want)
			if err != nil {
				if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrBusy) {
					t.Fatalf("restore: %v", err)
				}
				if !mutated && errors.Is(err, ErrInvalid) {
					t.Fatalf("restore of an unchanged checkpoint: %v", err)
				}
				if errors.Is(err, ErrBusy) {
					busy := false
					for _, b := range before {
						busy = busy || b.Status == StatusPending
					}
					for _, r := range live {
						busy = busy || (r.pool && r.held)
					}
					if !busy {
						t.Fatalf("busy with nothing pending or held: %v", err)
					}
				}
				if !equalBlocks(normalized(before), normalized(listing())) || allocStats() != statsBefore {
					t.Fatalf("a failed restore (%v) changed the pool", err)
				}
				break
			}
			// The model: the pool's live blocks become want's allocated ones.
			wantAlloc := map[uintptr]BlockInfo{}
			segs := map[uintptr]bool{}
			for _, w := range want {
				segs[w.Segment] = true
				if w.Status == StatusAllocated {
					wantAlloc[w.Addr] = w
				}
			}
			var freed, allocated []uintptr
			sizes := map[uintptr]uint64{}
			for _, b := range before {
				sizes[b.Addr] = b.Size
			}
			for _, ptr := range sortedKeys(live) {
				r := live[ptr]
				if !r.pool {
					continue
				}
				if w, ok := wantAlloc[ptr]; ok && w.Requested == r.n && w.Size == sizes[ptr] {
					continue // left alone
				}
				freed = append(freed, ptr)
				delete(live, ptr)
			}
			for _, ptr := range sortedKeys(wantAlloc) {
				if _, ok := live[ptr]; ok {
					continue
				}
				w := wantAlloc[ptr]
				allocated = append(allocated, ptr)
				if overlapsLive(ptr, w.Size) {
					t.Fatalf("restored block [%#x,+%d) overlaps a live one", ptr, w.Size)
				}
				r := rec{n: w.Requested, stream: w.Stream, tag: tag, pool: true}
				tag++
				live[ptr] = r
				write(ptr, r)
			}
			if !equalAddrs(freed, res.Freed) || !equalAddrs(allocated, res.Allocated) {
				t.Fatalf("restore reported freed %#x allocated %#x; the model says %#x and %#x", res.Freed, res.Allocated, freed, allocated)
			}
			var inWant []BlockInfo
			for _, b := range listing() {
				if segs[b.Segment] {
					inWant = append(inWant, b)
				} else if b.Status == StatusAllocated {
					t.Fatalf("block %#x of a segment newer than the checkpoint is allocated", b.Addr)
				}
			}
			sort.Slice(want, func(i, j int) bool { return want[i].Addr < want[j].Addr })
			if !equalBlocks(normalized(want), normalized(inWant)) {
				t.Fatalf("after the restore the pool holds %+v, want %+v", inWant, want)
			}
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatalf("step %d (op %d): %v", steps, op, err)
		}
	}
	fb.finish(sC)
	for _, ptr := range sortedKeys(live) {
		intact(ptr)
		if err := p.Free(0, live[ptr].stream, ptr, live[ptr].n); err != nil {
			t.Fatal(err)
		}
	}
	if routing {
		if err := p.EndAllocateToPool(0, graphPool); err != nil {
			t.Fatal(err)
		}
	}
	// Not strict: blocks freed with record_stream may still be pending;
	// EmptyCache waits for them, then releases the pool's segments.
	for ; uses > 0; uses-- {
		if err := p.ReleasePool(0, graphPool, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if r := p.devs[0].reserved[stAll].cur.Load(); r != 0 {
		t.Fatalf("%d bytes still reserved after freeing everything", r)
	}
}

func sortedKeys[V any](m map[uintptr]V) []uintptr {
	out := make([]uintptr, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func equalBlocks(a, b []BlockInfo) bool { return slices.Equal(a, b) }

func equalAddrs(a, b []uintptr) bool { return len(a) == len(b) && (len(a) == 0 || slices.Equal(a, b)) }
