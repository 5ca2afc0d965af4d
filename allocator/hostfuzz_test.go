package allocator_test

import (
	"errors"
	"testing"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/host"
)

// FuzzHostFreePages drives a pool with expandable segments and
// UnmapFreePages over the real host backend (address ranges, chunks mapped
// with MAP_FIXED, spare chunks kept by its ChunkKeeper) with an operation
// sequence decoded from the input, backend mappings failing at an
// input-chosen rate, and unmaps failing partway through their chunks.
// After every operation: the pool's invariants hold
// (CheckInvariants compares the backend's mapped and spare chunks with the
// pool's), and every byte the backend counts as the device's is a segment,
// a mapped chunk or a spare one: used == reserved + spare. Blocks keep the
// marks written at both ends. At the end nothing is left.
func FuzzHostFreePages(f *testing.F) {
	f.Add([]byte{0, 0, 10, 3, 0, 0, 200, 8, 1, 2, 1, 0, 0, 30, 12, 0, 1, 0, 4})
	f.Add([]byte{2, 0, 255, 12, 0, 0, 9, 15, 2, 0, 1, 0, 0, 40, 16, 1, 3, 0, 1, 0, 0, 80, 14, 2, 4, 0, 0, 1, 9, 1})
	f.Add([]byte{1, 0, 100, 16, 0, 0, 100, 16, 1, 0, 100, 16, 2, 2, 1, 1, 0, 250, 16, 0, 4, 0, 0, 120, 16, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		const devices = 1
		streams := []uintptr{0, 0x1000, 0x2000}
		fds, maps := openFDs(t), memfdMaps(t)
		h, err := host.New(devices, 256<<20)
		if err != nil {
			t.Fatal(err)
		}
		if rate := float64(data[0]%4) * 0.05; rate > 0 {
			if err := h.WithFaults(rate, uint64(data[0]), host.FaultAlloc|host.FaultUnmap); err != nil {
				t.Fatal(err)
			}
		}
		data = data[1:]
		p, err := allocator.New(h, allocator.Config{Expandable: true, ExpandableChunk: 6 << 20, UnmapFreePages: true})
		if err != nil {
			t.Fatal(err)
		}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		var live []*liveBlock
		for steps := 0; len(data) > 0 && steps < 400; steps++ {
			switch op := next() % 5; {
			case op <= 1: // alloc: up to 16 MiB
				size := (uint64(next()) + 1) << (next() % 17)
				b := &liveBlock{stream: streams[int(next())%len(streams)], size: size, mark: byte(steps)}
				ptr, _, err := p.Alloc(0, b.stream, size)
				if err != nil {
					if !allocator.IsOutOfMemory(err) && !errors.Is(err, host.ErrInjectedFault) {
						t.Fatalf("step %d: alloc of %d bytes: %v", steps, size, err)
					}
					break
				}
				b.ptr = ptr
				b.write()
				live = append(live, b)
			case op == 2 && len(live) > 0: // free, on its stream or another
				i := int(next()) % len(live)
				b := live[i]
				if !b.intact() {
					t.Fatalf("step %d: block %#x (%d bytes) was overwritten while held", steps, b.ptr, b.size)
				}
				st := b.stream
				if next()%4 == 0 {
					st = streams[int(next())%len(streams)]
				}
				if err := p.Free(0, st, b.ptr, b.size); err != nil {
					t.Fatalf("step %d: %v", steps, err)
				}
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			case op == 3 && len(live) > 0: // record_stream
				b := live[int(next())%len(live)]
				if err := p.RecordStream(b.ptr, streams[int(next())%len(streams)]); err != nil {
					t.Fatalf("step %d: %v", steps, err)
				}
			case op == 4:
				if err := p.EmptyCache(); err != nil && !errors.Is(err, host.ErrInjectedFault) {
					t.Fatalf("step %d: empty_cache: %v", steps, err)
				}
			}
			if err := p.CheckInvariants(); err != nil {
				t.Fatalf("step %d: %v", steps, err)
			}
			free, total, err := h.MemInfo(0)
			if err != nil {
				t.Fatal(err)
			}
			_, spare := h.Chunks(0)
			if reserved := poolStat(t, p, 0, "reserved_bytes.all.current"); int64(total-free) != reserved+int64(spare) {
				t.Fatalf("step %d: the backend counts %d bytes, the pool reserves %d and %d are spare", steps, total-free, reserved, spare)
			}
		}
		for _, b := range live {
			if !b.intact() {
				t.Fatalf("block %#x (%d bytes) was overwritten while held", b.ptr, b.size)
			}
			if err := p.Free(0, b.stream, b.ptr, b.size); err != nil {
				t.Fatal(err)
			}
		}
		requireEmpty(t, p, h, devices, fds, maps)
	})
}
