package allocator

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// FuzzPoolOps drives random sequences of alloc, free, record_stream, stream
// work, empty_cache, limit changes and PyTorch's settings changed at run time
// (expandable segments on and off among them) over three streams and two
// devices, and
// checks after every step that the pool's invariants hold (CheckInvariants:
// tiling, bins, live table, statistics equal the blocks' sums, no overlapping
// segments), that no two live blocks overlap, and that bytes written into a
// block are intact when it is freed.
func FuzzPoolOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x00\x10\x00\x00\x00\x01\x20\x00\x00\x01\x02\x00\x03\x01\x04\x05\x00\x00\x10\x00"))
	f.Add([]byte("\x00\xff\xff\x0f\x00\x00\xff\xff\x0f\x01\x06\x00\x00\x01\x00\x01\x00\x07"))
	f.Fuzz(func(t *testing.T, data []byte) { fuzzPoolOps(t, data, false) })
}

// FuzzPoolOpsExpandable is FuzzPoolOps with expandable segments: the same
// operations and checks, and bytes written into a block must survive the
// growth, trimming and release of its segment's chunks (the fake backend
// panics on a touch of an unmapped chunk).
func FuzzPoolOpsExpandable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x00\x10\x00\x00\x00\x01\x20\x00\x00\x01\x02\x00\x03\x01\x04\x05\x00\x00\x10\x00"))
	f.Add([]byte("\x00\xff\xff\x0f\x00\x00\xff\xff\x0f\x01\x06\x00\x00\x01\x00\x01\x00\x07"))
	f.Add([]byte("\x02\x02\x80\x00\x00\x02\x02\x80\x00\x00\x03\x00\x07\x00\x02\x06\x00\x00\x00\x03\x00\x07\x01\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzPoolOpsWith(t, data, Config{MaxSplit: 40 << 20, Expandable: true, ExpandableChunk: 6 << 20})
	})
}

// FuzzPoolOpsFreePages is FuzzPoolOpsExpandable with UnmapFreePages: the
// free chunks between live blocks (a big one only whole) are unmapped before each growth and at
// release, and mapped again under the blocks handed out over them (the fake
// backend panics on a touch of an unmapped chunk, and the invariants check
// that only chunks wholly inside free blocks are unmapped).
func FuzzPoolOpsFreePages(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x00\x10\x00\x00\x00\x01\x20\x00\x00\x01\x02\x00\x03\x01\x04\x05\x00\x00\x10\x00"))
	f.Add([]byte("\x02\x02\x80\x00\x00\x02\x02\x80\x00\x00\x03\x00\x07\x00\x02\x06\x00\x00\x00\x03\x00\x07\x01\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzPoolOpsWith(t, data, Config{MaxSplit: 40 << 20, Expandable: true, ExpandableChunk: 6 << 20, UnmapFreePages: true})
	})
}

// FuzzPoolOpsCaptureReuse is FuzzPoolOps with graph_capture_record_stream_reuse
// over a backend that models capture graphs (fakeGraph): while any route is
// open two of the streams capture, their work adds nodes, and forks and
// joins between them let blocks freed after record_stream be reused in the
// capture (capture_reuse.go); the checks are FuzzPoolOps's.
func FuzzPoolOpsCaptureReuse(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x08\x00\x00\x00\x00\x01\x00\x00\x01\x05\x00\x00\x02\x05\x01\x03\x00\x01\x06\x00\x01\x00\x00\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzPoolOpsWith(t, data, Config{MaxSplit: 40 << 20, CaptureReuse: true})
	})
}

func fuzzPoolOps(t *testing.T, data []byte, expandable bool) {
	fuzzPoolOpsWith(t, data, Config{MaxSplit: 40 << 20, Expandable: expandable})
}

func fuzzPoolOpsWith(t *testing.T, data []byte, cfg Config) {
	{
		g := newFakeGraph(2)
		fb := g.fakeBackend
		fb.capacity = 96 << 20
		var be Backend = fb
		if cfg.CaptureReuse {
			be = g // streams 0x1000 and 0x2000 capture while any route is open
		}
		capturing := false
		p, err := New(be, cfg)
		if err != nil {
			t.Fatal(err)
		}
		type liveBlock struct {
			ptr    uintptr
			n      uint64
			dev    int
			stream uintptr
			tag    byte
			pool   PoolID // the private pool it came from; zero: the default pool
			pl     Placement
			rs     bool // record_stream was called on it
			parked bool // freed by its caller, held by a front cache (AllocAround)
		}
		var live []liveBlock
		// Private pools: uses and open routes per (device, id), as the
		// model of what the pool must accept.
		type pkey struct {
			dev int
			id  PoolID
		}
		uses, routes := map[pkey]int{}, map[pkey]int{}
		poolIDs := []PoolID{{First: 1}, {Second: 2}}
		// privateSpan reports whether [ptr, ptr+n) of dev lies in a segment of
		// a private pool other than id: such memory must never be handed out.
		privateSpan := func(dev int, ptr uintptr, n uint64, id PoolID) bool {
			for _, seg := range p.Snapshot().Segments {
				pid := PoolID{seg.PoolID[0], seg.PoolID[1]}
				if seg.Device == dev && pid != (PoolID{}) && pid != id &&
					ptr < seg.Address+uintptr(seg.TotalSize) && seg.Address < ptr+uintptr(n) {
					return true
				}
			}
			return false
		}
		streams := []uintptr{0, 0x1000, 0x2000}
		tag := byte(1)
		next := func(k int) uint64 {
			var b [8]byte
			copy(b[:], data[:min(k, len(data))])
			data = data[min(k, len(data)):]
			return binary.LittleEndian.Uint64(b[:])
		}
		touch := func(l liveBlock) (head, tail []byte) {
			k := min(l.n, 64)
			return fb.mem(l.ptr, k), fb.mem(l.ptr+uintptr(l.n-k), k)
		}
		for steps := 0; len(data) > 0 && steps < 300; steps++ {
			op := next(1) % 10
			switch op {
			case 0, 1, 2: // alloc
				sel := next(1)
				var n uint64
				switch sel % 4 {
				case 0:
					n = next(2) % 4096
				case 1:
					n = next(3) % (2 << 20)
				case 2:
					n = next(4) % (24 << 20)
				default:
					n = 40<<20 + next(4)%(30<<20)
				}
				dev := int(sel/4) % 2
				st := streams[(sel/8)%3]
				if capturing && st == 0 {
					st = streams[1] // the legacy stream cannot capture
				}
				var id PoolID
				var ptr uintptr
				var pl Placement
				var err error
				if k := (pkey{dev, poolIDs[sel/32%2]}); routes[k] > 0 && sel%64 < 32 {
					id = k.id
					ptr, _, err = p.AllocIn(dev, st, n, id)
				} else if sel%64 >= 48 {
					// A front cache's miss: the blocks parked on dev are
					// shown; those given back are the pool's again.
					var ps []Parked
					for _, l := range live {
						if l.parked && l.dev == dev {
							ps = append(ps, Parked{Ptr: l.ptr, Req: l.n, Stream: l.stream, Type: l.pl.Type})
						}
					}
					ptr, pl, err = p.AllocAround(dev, st, n, ps)
					kept := live[:0]
					for _, l := range live {
						if !(l.parked && l.dev == dev && backOf(ps, l.ptr)) {
							kept = append(kept, l)
						}
					}
					live = kept
				} else {
					ptr, pl, err = p.Alloc(dev, st, n)
				}
				if n == 0 {
					if ptr != 0 || err != nil {
						t.Fatalf("size 0: %#x, %v", ptr, err)
					}
					continue
				}
				if err != nil {
					if !IsOutOfMemory(err) {
						t.Fatalf("alloc %d: %v", n, err)
					}
					continue
				}
				if ptr%512 != 0 {
					t.Fatalf("alloc %d: misaligned %#x", n, ptr)
				}
				l := liveBlock{ptr, n, dev, st, tag, id, pl, false, false}
				tag++
				if privateSpan(dev, ptr, n, id) {
					t.Fatalf("block [%#x,+%d) for pool %v lies in another pool's memory", ptr, n, id)
				}
				for _, o := range live {
					if o.dev == dev && ptr < o.ptr+uintptr(o.n) && o.ptr < ptr+uintptr(n) {
						t.Fatalf("new block [%#x,+%d) overlaps live [%#x,+%d)", ptr, n, o.ptr, o.n)
					}
				}
				h, tl := touch(l)
				for i := range h {
					h[i], tl[i] = l.tag, l.tag
				}
				live = append(live, l)
			case 3, 4: // free
				if len(live) == 0 {
					continue
				}
				i := int(next(1)) % len(live)
				l := live[i]
				h, tl := touch(l)
				for j := range h {
					if h[j] != l.tag || tl[j] != l.tag {
						t.Fatalf("block %#x lost its data before free", l.ptr)
					}
				}
				if l.pool == (PoolID{}) && !l.rs && !l.parked && next(1)%4 == 0 {
					live[i].parked = true // a front cache holds it: allocated to the pool
					continue
				}
				unchanged := !l.rs && !l.parked && l.pl.Unchanged()
				if err := p.Free(l.dev, l.stream, l.ptr, l.n); err != nil {
					t.Fatal(err)
				}
				live = append(live[:i], live[i+1:]...)
				if unchanged {
					// What the front cache relies on (Placement): the same
					// request again gets this very block from the best fit.
					again, _, err := p.Alloc(l.dev, l.stream, l.n)
					if err != nil || again != l.ptr {
						t.Fatalf("unchanged shard: %d bytes freed at %#x came back at %#x (%v)", l.n, l.ptr, again, err)
					}
					if err := p.Free(l.dev, l.stream, again, l.n); err != nil {
						t.Fatal(err)
					}
				}
			case 5: // record_stream, or stream work
				if len(live) > 0 && next(1)%2 == 0 {
					j := int(next(1)) % len(live)
					live[j].rs = true
					st := streams[next(1)%3]
					if capturing && live[j].stream != 0 {
						st = streams[3-live[j].stream>>12] // the other capturing stream
					}
					if err := p.RecordStream(live[j].ptr, st); err != nil {
						t.Fatal(err)
					}
				} else {
					st := streams[next(1)%3]
					fb.launch(st)
					if capturing && st != 0 {
						g.kernel(st)
					}
				}
			case 6:
				if capturing && next(1)%2 == 0 { // a fork or join inside the capture
					g.wait(streams[1+next(1)%2], streams[1+next(1)%2])
				} else {
					fb.finish(streams[next(1)%3])
				}
			case 7:
				switch next(1) % 4 {
				case 0:
					if err := p.EmptyCache(); err != nil {
						t.Fatal(err)
					}
				case 1:
					_ = p.SetLimit(int(next(1)%2), next(1)%4*(16<<20))
				case 2: // PyTorch's settings changed at run time
					sel := next(1)
					text := fmt.Sprintf("expandable_segments:%s,max_split_size_mb:%d,roundup_power2_divisions:%d,large_segment_size_mb:%d",
						[]string{"False", "True"}[sel&1], []int{40, 64, 200}[sel>>1%3], []int{1, 2, 8}[sel>>3%3], []int{20, 32}[sel>>5%2])
					if _, err := p.ApplyTorchSettings(text); err != nil {
						t.Fatal(text, err)
					}
				default:
					if err := p.Free(0, 0, 0xbad000, 7); err == nil {
						t.Fatal("free of an unknown pointer succeeded")
					}
				}
			case 8, 9: // private pools: begin, end, release
				k := pkey{int(next(1) % 2), poolIDs[next(1)%2]}
				switch next(1) % 3 {
				case 0:
					if err := p.BeginAllocateToPool(k.dev, k.id, nil); err != nil {
						t.Fatal(err)
					}
					uses[k]++
					routes[k]++
				case 1:
					err := p.EndAllocateToPool(k.dev, k.id)
					if (err == nil) != (routes[k] > 0) {
						t.Fatalf("end of %v with %d routes: %v", k, routes[k], err)
					}
					if err == nil {
						routes[k]--
					}
				default:
					err := p.ReleasePool(k.dev, k.id, false)
					if (err == nil) != (uses[k] > 0) {
						t.Fatalf("release of %v with %d uses: %v", k, uses[k], err)
					}
					if err == nil {
						if uses[k]--; uses[k] == 0 {
							routes[k] = 0
						}
					}
				}
			}
			if open := p.OpenRoutes().Load() > 0; open != capturing && cfg.CaptureReuse {
				if capturing = open; open {
					g.begin(streams[1], 1+uint64(steps))
					g.wait(streams[2], streams[1])
				} else {
					g.end(g.capture[streams[1]])
				}
			}
			if err := p.CheckInvariants(); err != nil {
				t.Fatalf("step %d (op %d): %v", steps, op, err)
			}
			if err := fb.checkChunks(); err != nil {
				t.Fatalf("step %d (op %d): %v", steps, op, err)
			}
		}
		for k, n := range uses {
			for ; n > 0; n-- {
				if err := p.ReleasePool(k.dev, k.id, false); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, l := range live {
			if err := p.Free(l.dev, l.stream, l.ptr, l.n); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		if err := p.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		for d := 0; d < 2; d++ {
			if r := p.devs[d].reserved[stAll].cur.Load(); r != 0 {
				t.Fatalf("device %d keeps %d bytes after freeing everything and empty_cache", d, r)
			}
		}
		for d := 0; d < 2; d++ {
			if m, sp := fb.Chunks(d); m != 0 || sp != 0 || fb.chunkHandles[d] != 0 {
				t.Fatalf("device %d holds %d bytes of chunks (%d mapped, %d spare) after empty_cache", d, fb.chunkHandles[d], m, sp)
			}
		}
		if len(fb.ranges) != 0 || len(fb.mapped) != 0 {
			t.Fatalf("%d ranges and %d chunks still held after empty_cache", len(fb.ranges), len(fb.mapped))
		}
	}
}

// FuzzParseSize checks that ParseSize never panics, that what it accepts
// re-parses to the same value when printed in bytes, that units scale, and
// that a decimal is accepted only with a unit of at least a KiB.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0", "512", "4KiB", "1.5 GiB", "2t", "", "x", "9999999999999999999999", "1e9", "-1", ".", "1..2MiB",
		"1.5", "0.5B", "0.0001K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			return
		}
		if strings.Contains(s, ".") && !strings.ContainsAny(strings.ToLower(s), "kmgt") {
			t.Fatalf("%q -> %d: a decimal without a unit is not a number of bytes", s, v)
		}
		back, err := ParseSize(fmt.Sprint(v))
		if err != nil || back != v {
			t.Fatalf("%q -> %d, but %d -> %d, %v", s, v, v, back, err)
		}
		if k, err := ParseSize(fmt.Sprint(v) + "K"); err == nil && k != v<<10 {
			t.Fatalf("%dK = %d", v, k)
		}
	})
}

// backOf reports whether the block at ptr is among those of ps that
// AllocAround gave back to the pool.
func backOf(ps []Parked, ptr uintptr) bool {
	for _, pk := range ps {
		if pk.Ptr == ptr {
			return pk.Back
		}
	}
	return false
}
