package allocator

import (
	"sync/atomic"
	"testing"
)

// BenchmarkCachedAllocFree is the cached path: one stream, a block of the
// size is free, so alloc+free never reach the backend.
func BenchmarkCachedAllocFree(b *testing.B) {
	for _, n := range []uint64{512, 1 << 20, 4 << 20, 64 << 20} {
		b.Run(human(n), func(b *testing.B) {
			p, _ := newPool(b, Config{})
			ptr := mustAlloc(b, p, 0, sA, n)
			_ = p.Free(0, sA, ptr, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ptr, _, _ := p.Alloc(0, sA, n)
				_ = p.Free(0, sA, ptr, n)
			}
		})
	}
}

// BenchmarkCachedParallel runs the cached path from GOMAXPROCS goroutines,
// each on its own stream (shards never contend) or all on one stream.
func BenchmarkCachedParallel(b *testing.B) {
	for _, mode := range []string{"own-stream", "one-stream"} {
		b.Run(mode, func(b *testing.B) {
			p, _ := newPool(b, Config{})
			var next atomic.Uintptr
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				st := sA
				if mode == "own-stream" {
					st = next.Add(1) << 12
				}
				for pb.Next() {
					ptr, _, err := p.Alloc(0, st, 1<<20)
					if err != nil {
						panic(err)
					}
					_ = p.Free(0, st, ptr, 1<<20)
				}
			})
		})
	}
}
