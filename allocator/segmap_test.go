package allocator

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Free(AnyDevice) — PyTorch's raw_delete and a tensor's deleter, which
// know only the pointer — locks the shard that owns the block and no
// other: it finds the block's segment by address (segMap). Every other
// shard of both devices is held locked here; a search that locked shards
// in turn would wait for ever.
func TestFreeAnyDeviceLocksOnlyTheOwnersShard(t *testing.T) {
	for _, exp := range []bool{false, true} {
		p, err := New(NewVirtual(2, 0), Config{Expandable: exp}) // no memory behind: expandable ranges are large
		require.NoError(t, err)
		for _, st := range []uintptr{sA, sB, sC} {
			for dev := 0; dev < 2; dev++ {
				mustAlloc(t, p, dev, st, 3000)
				mustAlloc(t, p, dev, st, 5<<20)
			}
		}
		a := mustAlloc(t, p, 1, sB, 4<<20)
		owner := p.devs[1].lookup(sB)
		var held []*shard
		for _, d := range p.devs {
			for _, s := range d.shardList() {
				if s != owner {
					s.mu.Lock()
					held = append(held, s)
				}
			}
		}
		require.Len(t, held, 5)
		done := make(chan error, 1)
		go func() { done <- p.Free(AnyDevice, 0, a+0, 0) }()
		select {
		case err := <-done:
			require.NoError(t, err, "expandable %v", exp)
		case <-time.After(5 * time.Second):
			t.Fatalf("expandable %v: Free(AnyDevice) waited for a shard that does not own the block", exp)
		}
		// An address inside no segment, and one inside a segment but no
		// live block: found without any lock held by others mattering.
		go func() { done <- p.Free(AnyDevice, 0, a+512, 0) }()
		select {
		case err := <-done:
			require.ErrorIs(t, err, ErrUnknownPointer)
		case <-time.After(5 * time.Second):
			t.Fatalf("expandable %v: Free(AnyDevice) of a non-block address waited for another shard", exp)
		}
		for _, s := range held {
			s.mu.Unlock()
		}
		check(t, p)
	}
}

// The address map follows segments through their whole life: made,
// moved to another stream (steal), given back, and made again at the
// same address; Free(AnyDevice), BlockOf and RecordStream find the
// block each time, and an address of a released segment is unknown.
func TestSegmentMapFollowsSegments(t *testing.T) {
	p, f := newPool(t, Config{})
	a := mustAlloc(t, p, 0, sA, 30<<20) // a segment of its own
	seg := p.byAddr.find(a)
	require.NotNil(t, seg)
	require.Same(t, p.devs[0].lookup(sA), seg.owner.Load())
	require.NoError(t, p.Free(AnyDevice, 0, a, 0))
	require.NotNil(t, p.byAddr.find(a), "idle, still cached")

	// Stolen by stream B once A's work is done: the map still finds it,
	// and its owner is B's shard now.
	f.launch(sA)
	f.finish(sA)
	b := mustAlloc(t, p, 0, sB, 30<<20)
	require.Equal(t, a, b, "B took A's idle segment")
	require.Same(t, p.devs[0].lookup(sB), p.byAddr.find(b).owner.Load())
	addr, _, err := p.BlockOf(b + 4096)
	require.NoError(t, err)
	require.Equal(t, b, addr)
	require.NoError(t, p.RecordStream(b+4096, sC))
	require.NoError(t, p.Free(AnyDevice, 0, b, 0))

	require.NoError(t, p.EmptyCache())
	require.Nil(t, p.byAddr.find(b), "given back")
	require.ErrorIs(t, p.Free(AnyDevice, 0, b, 0), ErrUnknownPointer)
	require.Zero(t, p.byAddr.len())
	check(t, p)
}

// The cached free by pointer alone makes no heap allocation.
func TestFreeAnyDeviceMakesNoHeapAllocation(t *testing.T) {
	p, _ := newPool(t, Config{})
	for i := 0; i < 40; i++ { // a map of several segments to search
		mustAlloc(t, p, i%2, sA, 30<<20)
	}
	ptr := mustAlloc(t, p, 1, sA, 4096)
	require.NoError(t, p.Free(AnyDevice, 0, ptr, 0))
	avg := testing.AllocsPerRun(1000, func() {
		ptr, _, err := p.Alloc(1, sA, 4096)
		if err != nil {
			panic(err)
		}
		if err := p.Free(AnyDevice, 0, ptr, 0); err != nil {
			panic(err)
		}
	})
	require.Zero(t, avg)
}

// BenchmarkFreeAnyDevice is a cached alloc and a free by pointer alone with
// 16 streams on each of two devices, the block on the last one made: the
// free's cost does not grow with the shards (one binary search, one lock).
func BenchmarkFreeAnyDevice(b *testing.B) {
	p, err := New(NewVirtual(2, 0), Config{})
	require.NoError(b, err)
	for st := uintptr(1); st <= 16; st++ {
		for dev := 0; dev < 2; dev++ {
			mustAlloc(b, p, dev, st<<12, 30<<20)
			mustAlloc(b, p, dev, st<<12, 4096)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ptr, _, err := p.Alloc(1, 16<<12, 4096)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Free(AnyDevice, 0, ptr, 0); err != nil {
			b.Fatal(err)
		}
	}
}
