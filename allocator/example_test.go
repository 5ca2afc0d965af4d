package allocator_test

import (
	"fmt"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/host"
)

// A pool over the host backend (the CUDA backend, cuda.NewBackend, is used
// the same way on a GPU): a freed block is reused for its stream at once,
// and the statistics have PyTorch's names.
func Example() {
	backend, err := host.New(1, 1<<30) // one device of 1 GiB of host memory
	if err != nil {
		panic(err)
	}
	pool, err := allocator.New(backend, allocator.Config{})
	if err != nil {
		panic(err)
	}
	const stream = 0 // the default stream
	a, _, err := pool.Alloc(0, stream, 1<<20)
	if err != nil {
		panic(err)
	}
	if err := pool.Free(0, stream, a, 1<<20); err != nil {
		panic(err)
	}
	b, _, _ := pool.Alloc(0, stream, 1<<20)
	fmt.Println("reused:", a == b) // 1 MiB is a small block: one 2 MiB segment
	st, _ := pool.StatsMap(0)
	fmt.Println("allocations:", st["allocation.all.allocated"], "segments:", st["segment.all.current"],
		"reserved MiB:", st["reserved_bytes.all.current"]>>20)
	pool.Free(0, stream, b, 1<<20)
	pool.EmptyCache()
	st, _ = pool.StatsMap(0)
	fmt.Println("after empty_cache, reserved:", st["reserved_bytes.all.current"])
	// Output:
	// reused: true
	// allocations: 2 segments: 1 reserved MiB: 2
	// after empty_cache, reserved: 0
}
