package allocator

import (
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// A default-pool shard counts every change to what its best fit can see:
// each block that enters or leaves its bins, and each freed block that
// starts to wait for record_stream events. The count lives outside the Go
// heap, one cache line per shard, so that a cache in front of the pool
// written in C (export/front.cpp) may keep its address and read it without
// calling into Go (cgo forbids C to keep a Go pointer).
//
// What the count proves: a block allocated for a request of n bytes on a
// stream while the shard had no pending frees (record_stream blocks waiting
// for events, which join the bins at a later request without a change the
// count could show beforehand), freed while the count still reads what it
// read right after that allocation, would be placed by the pool's best fit
// exactly where it was if the same request came again. The free merges it
// back into the very hole it was cut from (or leaves its fresh segment
// idle), so the bins are again what the best fit chose from, and the best
// fit is a function of the bins.
// A front cache may therefore hand such a block to the next request of the
// same size and stream without the fragmentation that reusing an arbitrary
// freed block causes (bench/RESULTS.md: GPT-2's 1.164).

// epochSlab hands out epoch cells: cache lines of anonymous mappings that
// are never unmapped (a front cache may read a cell after its pool is gone;
// a process makes one per stream and device, 64 bytes each).
var epochSlab struct {
	mu   sync.Mutex
	page []byte
	used int
}

const (
	epochCellBytes = 64 // one cache line: shards on different threads share none
	epochSlabBytes = 64 << 10
)

// newEpochCell returns a fresh cell reading 0, or nil if no memory could be
// mapped (the shard then reports no epoch, and a front cache keeps only
// what it always kept).
func newEpochCell() *atomic.Uint64 {
	epochSlab.mu.Lock()
	defer epochSlab.mu.Unlock()
	if epochSlab.page == nil || epochSlab.used+epochCellBytes > len(epochSlab.page) {
		page, err := syscall.Mmap(-1, 0, epochSlabBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return nil
		}
		epochSlab.page, epochSlab.used = page, 0
	}
	c := (*atomic.Uint64)(unsafe.Pointer(&epochSlab.page[epochSlab.used]))
	epochSlab.used += epochCellBytes
	return c
}

// changed advances s's epoch. Called with s.mu held, so s.changes has one
// writer; the cell is stored atomically because the front cache reads it
// from other threads without the lock.
func (s *shard) changed() {
	if s.epoch != nil {
		s.changes++
		s.epoch.Store(s.changes)
	}
}

// Placement is what an allocation reports besides its address.
type Placement struct {
	Size uint64 // the block's bytes
	// Whole: the block is a fixed segment of its own (no neighbour to merge
	// with, never to grow).
	Whole bool
	// Type is the statistics type the block counts in: 1 small_pool, 2
	// large_pool (FrontCounts).
	Type int
	// Epoch is the shard's change count (memory outside the Go heap, valid
	// for the process's life; nil when the shard keeps none) and Mark what
	// it read right after this allocation: while the count still reads
	// Mark, freeing the block and asking again for the same size on the
	// same stream would give this very block back.
	Epoch *atomic.Uint64
	Mark  uint64
}

// Unchanged reports whether pl's shard has not changed since pl was taken:
// see Placement.Epoch.
func (pl Placement) Unchanged() bool { return pl.Epoch != nil && pl.Epoch.Load() == pl.Mark }
