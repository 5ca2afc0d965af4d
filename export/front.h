// The front cache: up to 64 recently freed blocks per CPU and pool (small,
// large), kept in C so that a cached alloc+free never crosses into Go (a
// C->Go call costs ~100 ns and does not scale across threads; measured in
// bench/RESULTS.md). It is a
// level of its own in front of the pool (allocator/front.go states the
// contract between the two; export/main.go's cFront is this cache as the
// pool sees it). Go still owns every block: to the pool, a block in the
// front cache is allocated, and the pool alone judges bad frees.
//
// Invariants:
//  - The live set (liveset.h) holds every block handed out while the front cache is on
//    and in use (not aside, no memory history), as LIVE (the caller has it) or CACHED
//    (in one CPU's cache slots); it is emptied at each change of mode, after the parked
//    blocks went back, so a block handed out before has no record and its free goes to Go.
//  - A free is cached only if the block is LIVE, has no record_stream stream,
//    and size/device match the allocation; anything else goes to Go, which
//    validates it (unknown pointer, wrong size) and changes nothing on error.
//    A free of a CACHED block (a double free) goes to Go too, after the
//    block: the pool answers it as it would without the front cache.
//    A cached block that no request may reuse (a large block cut from a
//    shared segment, see below) waits in its CPU's deferred list: up to 32
//    such frees reach the pool in one C->Go call, usually the next miss's.
//  - A CACHED block is reused only for the same device, stream and requested
//    size: the stream contract holds as in the pool (same stream at once).
//    One larger than SYMM_POOL_FRONT_CACHE_MAX (and not a segment of its
//    own) is parked and reused only while its pool shard has not changed
//    since it was allocated, when the pool would place it there anyway.
//  - Before the pool places a block (alloc_miss), the blocks parked in the
//    bins it reads (its device, stream, and small or large pool) and the
//    device's deferred frees go back to it, in the same call; the others
//    stay parked, and the pool takes them back itself before it steals,
//    collects or grows, or could raise a peak (allocator.AllocAround): every
//    peak is the one the pool alone reaches, and the pool sees the frees it
//    would have seen, except those whose block was reused whole.
#ifndef SYMM_FRONT_H
#define SYMM_FRONT_H
#include <atomic>
#include <stddef.h>
#include <stdint.h>

#include "shim.h"

namespace front {
// enabled reports whether SYMM_POOL_FRONT_CACHE=1 turned the front cache on
// (symmshim_front_enable, once, when the pool is made). Inline, one relaxed
// load: with the front cache off (the default) it is the only thing of the
// front cache an alloc or free reads.
extern std::atomic<int> g_enabled;
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed) != 0; }
// aside reports whether the front cache has stepped aside: it served too
// few of the latest requests, and the next ones go to the pool as with it
// off (front.cpp says when it steps aside and back). Only count_request
// sets it, so aside implies enabled. Inline: read on every alloc and free.
extern std::atomic<int> g_aside;
inline bool aside() { return g_aside.load(std::memory_order_relaxed) != 0; }
// count_request counts a request that reached the front cache (hit: it
// served it) or went past it while aside; every few hundred requests of a
// thread it judges whether to step aside or back. Call with no lock held.
void count_request(bool hit);
// alloc_hit returns a cached block for (size, dev, stream) or 0.
uintptr_t alloc_hit(size_t size, int dev, uintptr_t stream);
// alloc_miss asks the pool for a block (api: export/pool.go's allocAPIs),
// handing back in the same call the blocks parked in the bins it reads and
// dev's deferred frees, and records it; 0 with the last error set on
// failure.
uintptr_t alloc_miss(int api, size_t size, int dev, uintptr_t stream);
// on_go_alloc records a block the pool handed out (pl: where it placed it).
void on_go_alloc(uintptr_t ptr, size_t size, int dev, uintptr_t stream, const symmshim_placed &pl);
// free returns true if it cached the free; false means: hand it to Go (a
// block it held parked is already back in the pool).
bool free(uintptr_t ptr, size_t size, int dev, uintptr_t stream);
// any_cached reports whether some CPU's slots hold a block (a hint, read
// without the CPUs' locks: the caller's own frees are always seen).
bool any_cached();
// mark_record_stream flags block base: its frees go to Go (events).
void mark_record_stream(uintptr_t base);
// drain hands every block of dev (-1: all devices) cached when it begins
// back to Go; it ends even while other threads go on freeing.
void drain(int dev);
// forget_all empties the live set: every block's next free goes to Go.
// For a change of mode in which frees and allocations bypass the front cache
// (memory history): records kept across it could be stale.
void forget_all();
}  // namespace front
#endif
