// Package allocator is libsymm's caching pool: pure Go over a Backend
// (cuda, host, or a test fake). It is what symm_pool_alloc/symm_pool_free
// reach, and what PyTorch's CUDAPluggableAllocator calls for every tensor.
//
// # Levels
//
// A Pool has one device per GPU. A device has one shard per stream that has
// allocated on it; a shard owns its segments (memory from the backend) and
// the blocks they are cut into, in three pools (small, large, oversize; see
// sizeclass.go for the size rules and their worst-case waste). The cached
// path — a free block of the right stream fits — takes only that shard's
// mutex, finds the shard without any lock, and makes no heap allocation.
//
// # Stream contract
//
// A block is allocated for a stream S (the stream given to Alloc).
//
//   - Freed on S, it is reused for S at once: work S queues later runs after
//     the work S queued before the free.
//   - It is reused for another stream T only once the work queued on S before
//     the free has completed: a whole idle segment moves from S to T only
//     after an event recorded on S, after the free, reports completion.
//     The pool never blocks the caller for this (except EmptyCache and the
//     out-of-memory retry, which wait).
//   - RecordStream(ptr, U) adds a stream U that must also pass: at free time
//     an event is recorded on each such U, and the block returns to the
//     cache only when all of them have completed.
//
// Segments go back to the backend only when wholly free (EmptyCache, or the
// out-of-memory retry); the CUDA backend's cuMemFree orders the release after
// all work queued on the device.
//
// # Failure
//
// Errors are values: ErrInvalid (bad device, size, fraction), ErrUnknownPointer
// (free of a pointer the pool does not hold: nothing changes) and
// ErrOutOfMemory (after releasing the device's cached segments and retrying
// once; the message names the request, the device, reserved and allocated
// bytes, and the limit).
package allocator
