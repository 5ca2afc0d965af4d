/*
 * symm.h — the public C ABI of libsymm.
 *
 * This header is the contract: every exported symm_* symbol is declared here
 * and nowhere else (a test checks both directions against the built library).
 *
 * Conventions
 *  - Functions returning int return SYMM_OK (0) on success and a positive
 *    SYMM_ERR_* code on failure.
 *  - Every failure records a message in the calling thread's last-error slot:
 *    read it with symm_last_error() / symm_last_error_code(). A success does
 *    not clear it; call symm_clear_error() first when you need to tell.
 *  - Functions returning void (the PyTorch functor signatures) report failure
 *    only through the last-error slot.
 *  - Streams are CUstream / cudaStream_t values passed as void*; NULL is the
 *    legacy default stream, (void*)1 and (void*)2 are CU_STREAM_LEGACY and
 *    CU_STREAM_PER_THREAD.
 *  - After fork(), every call in the child fails with SYMM_ERR_FORKED: the Go
 *    runtime does not survive fork.
 */
#ifndef SYMM_H
#define SYMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes. */
enum {
  SYMM_OK = 0,
  SYMM_ERR_INVALID = 1,        /* bad argument: device out of range, bad fraction, ... */
  SYMM_ERR_OUT_OF_MEMORY = 2,  /* device out of memory or pool limit reached (after one retry) */
  SYMM_ERR_NO_DEVICE = 3,      /* no CUDA driver / no GPU, and SYMM_DEVICE=host not set; or the chosen
                                  symmetric backend cannot run here (NVSHMEM missing or unsupported) */
  SYMM_ERR_UNKNOWN_POINTER = 4,/* free/record_stream of a pointer this pool did not hand out (or already freed) */
  SYMM_ERR_FORKED = 5,         /* called from a forked child */
  SYMM_ERR_DRIVER = 6,         /* the CUDA driver returned an error; the message has its name */
  SYMM_ERR_INTERNAL = 7,       /* a bug in libsymm (a recovered panic); the message says where */
  SYMM_ERR_TIMEOUT = 8,        /* a store read, rendezvous or signal wait did not complete in time */
  SYMM_ERR_PEER = 9,           /* another rank of the group failed or died, or the store server went away;
                                  the message names it */
  SYMM_ERR_BUSY = 10,          /* a private pool released while blocks of it are still allocated:
                                  nothing changed; the message says how many */
  SYMM_ERR_MISMATCH = 11       /* the ranks of a group met in different calls (one rank's barrier or pad
                                  reset against another's collective, or two different collectives):
                                  the message names both; the handle has failed */
};

/* ---- library ---------------------------------------------------------- */

/* The version of this header; symm_version() is the library's. Set in one
 * place, internal/version/VERSION (`make set-version V=x.y.z`). */
#define SYMM_VERSION "0.1.0"

/* The library's version, e.g. "0.1.0". Never NULL; static storage. */
const char *symm_version(void);

/* The calling thread's last failure message, or "" if none. The pointer is
 * valid until the thread's next failing call. Never NULL. */
const char *symm_last_error(void);

/* The SYMM_ERR_* code of the calling thread's last failure, SYMM_OK if none. */
int symm_last_error_code(void);

/* Clears the calling thread's last failure. Never fails. */
void symm_clear_error(void);

/* Copies the last failure message into buf (always NUL-terminated when
 * len > 0). Returns the message's full length, as snprintf does. Never
 * fails: buf NULL or len 0 only measures. */
size_t symm_copy_last_error(char *buf, size_t len);

/* ---- caching pool ------------------------------------------------------ */

/* Allocates size bytes on device, for use on stream. Returns a pointer aligned
 * to at least 512 bytes, or NULL with the last error set. size 0 returns NULL
 * and records no error (PyTorch sends 0-byte requests).
 * Signature of PyTorch's CUDAPluggableAllocator alloc functor. Called by
 * PyTorch's own code in replace mode (change_current_allocator), a failure
 * throws a C++ std::runtime_error with the message instead, since PyTorch
 * turns NULL into a tensor at address 0; every other caller (C, ctypes, a C++
 * extension) gets NULL, never an exception. In replace mode without
 * libsymm's hooks (PyTorch's plain recipe), an allocation on a stream that is
 * capturing a CUDA graph is refused (SYMM_ERR_INVALID naming the stream):
 * PyTorch would not tell libsymm to keep the graph's memory apart. */
void *symm_pool_alloc(size_t size, int device, void *stream);

/* symm_pool_alloc that never throws, whatever PyTorch's mode: NULL with the
 * last error set on failure (SYMM_ERR_OUT_OF_MEMORY, SYMM_ERR_INVALID, ...).
 * For callers through which a C++ exception cannot pass: ctypes (Python's
 * symm.alloc uses it), C, C++ code that does not catch. */
void *symm_pool_try_alloc(size_t size, int device, void *stream);

/* Returns ptr to the pool. size, device and stream are those given at
 * allocation (PyTorch passes them); size 0 skips the size check, device -1
 * finds the block on whichever device holds it, and a stream other than the
 * block's finds it too (both slower: the pool looks in more places). The
 * block is reused on the same stream at once and on other streams only after
 * the work queued on its streams has completed. NULL is ignored. An unknown
 * or already freed pointer sets SYMM_ERR_UNKNOWN_POINTER and changes nothing.
 * Signature of PyTorch's CUDAPluggableAllocator free functor. */
void symm_pool_free(void *ptr, size_t size, int device, void *stream);

/* Selects the backend and creates the per-device pools. Optional: the first
 * allocation does it too. device_count is advisory (PyTorch passes its own).
 * No return value: a failure (SYMM_ERR_NO_DEVICE without a driver and
 * without SYMM_DEVICE=host, SYMM_ERR_INVALID for a bad SYMM_* variable) is
 * the last error, and every later pool call fails the same way. */
void symm_pool_init(int device_count);

/* symm_pool_init for PyTorch's replace mode (set_init_fn, or libsymm's
 * PyTorch extension as PyTorch initializes CUDA): besides init, it records
 * that libsymm is PyTorch's allocator with its graph hooks attached, so that
 * symm_torch_mode() reports replace mode and symm_pool_alloc, called by
 * PyTorch's code, throws on failure (see above). Never use it from C. */
void symm_torch_init(int device_count);

/* Returns every unused cached segment of every device to the driver. A
 * driver error freeing one is the last error (SYMM_ERR_DRIVER); before the
 * pool exists it does nothing and sets no error. A device on which a private
 * pool is routing (a CUDA graph capture may be under way) keeps its memory,
 * as it does in the out-of-memory retry: the driver forbids freeing during a
 * capture. The first call after the routes end releases it. */
void symm_pool_empty_cache(void);

/* Caps device's reserved memory at fraction (0 <= fraction <= 1) of its total
 * memory; 0, as in PyTorch, is a cap of 0 bytes (only cached blocks serve).
 * A bad fraction or device sets SYMM_ERR_INVALID and changes nothing. */
void symm_pool_set_memory_fraction(double fraction, int device);

/* Stores in *fraction the share of device's memory its cap was set to
 * (symm_pool_set_memory_fraction, per_process_memory_fraction in PyTorch's
 * settings), or 1.0 when it has no cap or a cap in bytes (symm_pool_set_limit,
 * SYMM_POOL_LIMIT in bytes): the one record of the fraction, which libsymm's
 * PyTorch extension reports as torch.cuda.get_per_process_memory_fraction.
 * Returns SYMM_OK; SYMM_ERR_INVALID for a bad device or a NULL fraction; the
 * pool's creation error if it cannot be made. */
int symm_pool_memory_fraction(int device, double *fraction);

/* Applies PyTorch's allocator settings text (the syntax of
 * PYTORCH_CUDA_ALLOC_CONF) at run time, as torch 2.11's
 * torch._C._accelerator_setAllocatorSettings (and the deprecated
 * torch.cuda.memory._set_allocator_settings) does: libsymm's PyTorch
 * extension passes every such call on. As in PyTorch, max_split_size_mb,
 * roundup_power2_divisions and garbage_collection_threshold go back to their
 * defaults when the text does not give them; other keys keep their values.
 * Before the pool exists, the text is merged over the environment's settings
 * and the pool is made from the result. Once it exists, the pool's settings
 * (expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
 * large_segment_size_mb, roundup_power2_divisions,
 * garbage_collection_threshold) apply to the requests and segments that
 * come after, as in PyTorch: segments made before keep their size and kind;
 * per_process_memory_fraction is accepted and changes nothing (PyTorch's
 * devices read it once; symm_pool_set_memory_fraction changes the cap).
 * Returns SYMM_OK; SYMM_ERR_INVALID for a NULL or bad text (the message names
 * the key and value), or expandable segments on a backend that cannot map
 * chunks; nothing changes then. Settings libsymm ignores are written to
 * stderr. */
int symm_pool_set_allocator_settings(const char *settings);

/* The CUDA driver function name (e.g. "cuStreamIsCapturing") of the driver
 * libsymm's pool runs on, resolved as libsymm resolves its own (libsymm is
 * the process's one loader of libcuda for itself and its PyTorch extension).
 * Creates the pool if needed. NULL on the host backend, when the driver has
 * no such function (no error set), or when the pool or driver cannot be
 * loaded, or name is NULL (SYMM_ERR_INVALID; the last error says why). */
void *symm_driver_proc(const char *name);

/* Chooses expandable segments (enable=1) or fixed ones (0) for the pool, as
 * SYMM_POOL_EXPANDABLE does, and wins over it. Before the pool exists the
 * pool is made with that choice; once it exists, the choice applies to the
 * segments made from then on (as PyTorch's expandable_segments setting
 * changed at run time): segments made before keep their kind, and blocks
 * are freed into the segment they came from. Returns SYMM_OK;
 * SYMM_ERR_INVALID when enable is not 0 or 1, or when the backend cannot
 * map chunks (nothing changes). Expandable segments: per device and stream, one reserved
 * address range into which chunks (SYMM_POOL_EXPANDABLE_CHUNK, 20 MiB by
 * default) are mapped as the pool grows and unmapped again at
 * symm_pool_empty_cache, before an out-of-memory retry and, inside free
 * blocks, as the pool maps elsewhere (SYMM_POOL_UNMAP_FREE_PAGES);
 * private pools (CUDA graphs) and MemPool segments stay fixed. */
int symm_pool_set_expandable(int enable);

/* Caps device's reserved memory at bytes (0 removes the cap). Returns
 * SYMM_OK, or SYMM_ERR_INVALID for a bad device, or the pool's
 * initialization error (SYMM_ERR_NO_DEVICE); the cap is unchanged then. */
int symm_pool_set_limit(int device, uint64_t bytes);

/* Marks ptr (an allocated block, or any pointer inside one) as used on stream:
 * when it is freed it is reused only after the work queued on stream at free
 * time has completed. Same stream as the allocation: no effect. A pointer
 * the pool does not hold sets SYMM_ERR_UNKNOWN_POINTER and changes nothing. */
void symm_pool_record_stream(void *ptr, void *stream);

/* One statistic: name as PyTorch's torch.cuda.memory_stats() keys it. */
typedef struct {
  const char *name; /* static storage, owned by the library */
  int64_t value;
} symm_stat_t;

/* Writes up to cap statistics of device into out and returns how many the
 * library has (call with out=NULL, cap=0 to size the array), or -1 with the
 * last error set (bad device). */
int symm_pool_stats(int device, symm_stat_t *out, int cap);

/* Resets every peak statistic of device to its current value. Returns
 * SYMM_OK, or SYMM_ERR_INVALID for a bad device (nothing reset). */
int symm_pool_reset_peak(int device);

/* Number of devices the pool serves (initializing the backend if needed),
 * or -1 with the last error set. */
int symm_pool_device_count(void);

/* Name of the active backend ("cuda", "host"), or "" before init (or after
 * fork). Never NULL and never fails. */
const char *symm_pool_backend(void);

/* ---- private pools (CUDA graphs) -------------------------------------------
 *
 * A private pool holds the memory of one or more CUDA graph captures, as
 * PyTorch's graph pools do: while allocation to it is under way, allocations
 * the route accepts come from it; its memory is never handed to allocations
 * outside it; blocks freed into it are reused only by allocations routed to it
 * again (a second graph sharing the pool). While any route is open on a
 * device, the pool records and queries no CUDA event there and allocates with
 * the thread in relaxed capture mode, so that nothing it does invalidates a
 * capture. PyTorch reaches these through symm_torch_*_pool below, which
 * symm.pool_allocator() attaches; C programs call these. */

/* PyTorch's MempoolId_t. (0, 0) is the default pool and cannot be named. */
typedef struct {
  uint64_t first, second;
} symm_pool_id_t;

/* From now until symm_pool_end_allocate_to_pool, allocations on device for
 * stream (exactly that stream value) come from private pool id, which is
 * created or takes one more use. SYMM_ERR_INVALID: bad device, id (0, 0). */
int symm_pool_begin_allocate_to_pool(int device, symm_pool_id_t id, void *stream);

/* Ends the most recent route of id on device. The pool keeps its memory.
 * SYMM_ERR_INVALID: unknown pool, or no route of it open. */
int symm_pool_end_allocate_to_pool(int device, symm_pool_id_t id);

/* Drops one use of pool id; when the last goes, its cached segments return to
 * the driver at the next symm_pool_empty_cache (or out-of-memory retry).
 * SYMM_ERR_BUSY when the last use would go while blocks of the pool are still
 * allocated (nothing changes: free them first); SYMM_ERR_INVALID for an
 * unknown pool or one already released. */
int symm_pool_release_pool(int device, symm_pool_id_t id);

/* Where a private pool's segments come from when not from the device
 * (torch.cuda.MemPool(allocator): ProcessGroupNCCL's ncclMemAlloc, PyTorch's
 * symmetric memory). alloc returns size bytes of device, NULL when it has
 * none; free gives back what alloc returned; release (may be NULL) is called
 * once, when the pool is forgotten. None may throw or call into libsymm: they
 * are called with the pool's locks held. */
typedef struct {
  void *(*alloc)(size_t size, int device, void *ctx);
  void (*free)(void *ptr, size_t size, int device, void *ctx);
  void (*release)(void *ctx);
  void *ctx;
} symm_segment_allocator_t;

/* Creates private pool id of device with one use, or takes one more use of
 * it (PyTorch's createOrIncrefPool: torch.cuda.MemPool's constructor). segs,
 * when not NULL, gives a new pool its segments, which are cut and cached as
 * the device's are and go back through segs->free when the pool's cache is
 * emptied; libsymm copies *segs and owns segs->ctx from the call on, even on
 * error (segs->release). SYMM_ERR_INVALID: bad device, id (0, 0), or segs
 * for a pool that exists. */
int symm_pool_create_pool(int device, symm_pool_id_t id, const symm_segment_allocator_t *segs);

/* The uses of pool id (PyTorch's getPoolUseCount): its creation, each route
 * open to it, each graph sharing it, less the releases. -1 with
 * SYMM_ERR_INVALID: bad device, unknown pool. */
int symm_pool_use_count(int device, symm_pool_id_t id);

/* on != 0: an allocation of the default pool of device that would fail with
 * SYMM_ERR_OUT_OF_MEMORY takes a free block of pool id (on its stream)
 * instead, as PyTorch's MemPool(use_on_oom=True); 0 turns it off.
 * SYMM_ERR_INVALID: bad device, unknown pool. */
int symm_pool_set_use_on_oom(int device, symm_pool_id_t id, int on);

/* Blocks of pool id are handed out whole from now on, never split
 * (MemPool(no_split=True)). SYMM_ERR_INVALID: bad device, unknown pool. */
int symm_pool_set_no_split(int device, symm_pool_id_t id);

/* Returns the cached segments of pool id to where they came from on every
 * device where its last use was released, and forgets it once it holds none
 * (PyTorch's emptyCache(mempool_id), which MemPool's destructor calls); the
 * default pool and other pools keep their caches. id (0, 0): as
 * symm_pool_empty_cache. Nothing goes while a route is open on the device.
 * Returns SYMM_OK, or the first failure's code (a driver's SYMM_ERR_CUDA,
 * ...; the rest is still tried, and the last error names it). */
int symm_pool_empty_pool(symm_pool_id_t id);

/* ---- memory history and snapshots ------------------------------------------
 *
 * The data of PyTorch's torch.cuda.memory._snapshot(), as JSON with the same
 * keys: {"segments": [{device, address, total_size, allocated_size,
 * active_size, requested_size, stream, segment_type ("small"/"large"),
 * segment_pool_id [first, second], is_expandable, frames, blocks: [{address,
 * size, requested_size, state ("active_allocated", "active_pending_free",
 * "inactive"), frames}]}], "device_traces": [[{action ("alloc",
 * "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
 * "snapshot"), addr (device_free for "oom"), size, stream, time_us, frames,
 * compile_context, user_metadata}], ... one list per device],
 * "allocator_settings": {...}}. frames are empty: C has no Python stack.
 * As in PyTorch, each device's history is taken before that device records
 * the snapshot's own "snapshot" event (size: its active bytes), which the
 * next snapshot lists; alloc and free entries carry the requested size. */

/* Turns the recording of alloc/free/segment/oom events on (enabled != 0) or
 * off on every device. max_entries bounds each device's ring, oldest events
 * overwritten (values above 2^31 mean 2^31); 0 with enabled is
 * SYMM_ERR_INVALID. While recording, every alloc and free goes through the
 * pool (the front cache is bypassed) so that each one is seen. Turning it off
 * empties every device's history, as PyTorch's recordHistory does; turning it
 * on again keeps what was recorded (off, then on, clears it). */
int symm_pool_record_history(int enabled, size_t max_entries);

/* Makes user_metadata and compile_context the annotation of every history
 * entry recorded from now on (PyTorch's torch.cuda.memory._set_memory_metadata
 * and the compile-context region of torch.compile, with
 * _record_memory_history(compile_context=True)): snapshots report them as
 * each entry's "user_metadata" and "compile_context" ("N/A" for ""). One
 * annotation per process (PyTorch keeps one per thread): the last one set by
 * any thread. Set with history off, it applies once history is on. Costs
 * nothing on allocations (one atomic load while history is on). Returns
 * SYMM_OK; SYMM_ERR_INVALID (nothing changes): a NULL string, or one over
 * 1 MiB. */
int symm_pool_set_annotation(const char *user_metadata, const char *compile_context);

/* Writes the snapshot JSON (see above) into buf with a NUL; *len receives its
 * length without the NUL. buf NULL or cap 0: a size query, which records no
 * "snapshot" event. A cap too small is SYMM_ERR_INVALID (the snapshot may
 * grow between two calls: retry). */
int symm_pool_snapshot(char *buf, size_t cap, size_t *len);

/* The modes symm_torch_mode returns. */
enum { SYMM_TORCH_NONE = 0, SYMM_TORCH_REPLACE = 1, SYMM_TORCH_MEMPOOL = 2 };

/* How PyTorch uses libsymm in this process, as symm_pool_alloc sees it:
 * SYMM_TORCH_NONE (0) PyTorch is not loaded (or not yet seen);
 * SYMM_TORCH_REPLACE (1) replace mode: libsymm's symm_pool_alloc is
 * PyTorch's current CUDA allocator (a failed allocation throws a C++
 * exception, never NULL); SYMM_TORCH_MEMPOOL (2) PyTorch is loaded and its
 * own caching allocator is current: calls that come from PyTorch are a
 * torch.cuda.MemPool asking for segments, which are served one segment each
 * and go back to the device when PyTorch frees them (PyTorch caches above).
 * Calls from any other code keep the caching pool and NULL on failure. */
int symm_torch_mode(void);

/* Tells libsymm that the PyTorch CUDAAllocator object at allocator is
 * libsymm's own (the CUDAPluggableAllocator subclass of its PyTorch
 * extension), so that symm_torch_mode() reports replace mode whenever it is
 * PyTorch's current allocator: libsymm alone decides the mode, and the
 * extension asks it. NULL forgets it. */
void symm_torch_own_allocator(const void *allocator);

/* ---- what PyTorch's allocator interface asks (cacheInfo, pool blocks, checkpoints) ----
 *
 * Virtual methods of c10::cuda::CUDACachingAllocator::CUDAAllocator that
 * PyTorch's plain CUDAPluggableAllocator refuses, for a C++ subclass to answer
 * from libsymm's pool: cacheInfo (cudnn.benchmark sizes its workspaces with
 * it), resetAccumulatedStats, checkPoolLiveAllocations and getCheckpointState
 * (the blocks of a private pool), setCheckpointPoolState (torch.compile's
 * CUDA-graph trees, mode="reduce-overhead", set a graph's pool back to a
 * checkpoint when a recording path diverges); and the segments a
 * torch.cuda.MemPool asks for. None of them is on the cached alloc/free path. */

/* *largest_block receives the size of the largest free block cached in
 * device's default pool, over all its streams; 0 when none is (PyTorch's
 * cacheInfo). Free blocks of private pools are left out (no allocation
 * outside a pool can have them), and the device's free memory is no floor:
 * PyTorch's cacheInfo starts from cudaMemGetInfo's free bytes when *largest
 * is 0, so a subclass answering it returns the larger of the two. Returns
 * SYMM_OK; SYMM_ERR_INVALID for a bad device or a NULL largest_block (nothing
 * written). */
int symm_pool_cache_info(int device, size_t *largest_block);

/* Zeroes device's accumulated statistics (PyTorch's resetAccumulatedStats):
 * every ".allocated" and ".freed" of symm_pool_stats, and num_alloc_retries,
 * num_ooms, num_sync_all_streams, num_device_alloc, num_device_free and
 * num_front_cache_hits.
 * Current and peak values are unchanged; from then on each family's current
 * is its value at the reset plus allocated minus freed. Returns SYMM_OK, or
 * SYMM_ERR_INVALID for a bad device (nothing reset). */
int symm_pool_reset_accumulated(int device);

/* symm_block_info_t.state */
enum {
  SYMM_BLOCK_FREE = 0,      /* free, cached: PyTorch's "inactive" */
  SYMM_BLOCK_ALLOCATED = 1, /* handed out and not freed */
  SYMM_BLOCK_PENDING = 2    /* freed, waiting for the events of its record_stream streams */
};

/* One block of a pool. */
typedef struct {
  uint64_t address, size;   /* a multiple of 512 each */
  uint64_t requested_size;  /* bytes asked for (allocated and pending blocks); a free block: 0 in
                               symm_pool_blocks, and in symm_pool_snapshot_list the request of the
                               allocation freed into it last, as PyTorch's snapshot reports it */
  uintptr_t stream;         /* the stream the block's segment serves */
  uint64_t segment_address; /* the segment it lies in */
  int32_t state;            /* SYMM_BLOCK_* */
  int32_t reserved;         /* 0 */
} symm_block_info_t;

/* Writes up to cap blocks of pool id of device into out: every block of every
 * segment of the pool, free ones too, sorted by address, which tile each
 * segment. id (0, 0) is the device's default pool (every stream's; an
 * expandable segment shows its mapped part). Returns the number of blocks the
 * pool has (out NULL and cap 0 size the array; the pool may change between
 * two calls: a return above cap means some were left out), or -1 with the
 * last error: SYMM_ERR_INVALID for a bad device, an unknown pool, a negative
 * cap or a NULL out with cap > 0. checkPoolLiveAllocations compares the
 * addresses of the SYMM_BLOCK_ALLOCATED blocks with its set;
 * getCheckpointState keeps the whole listing for symm_pool_restore_blocks. */
int symm_pool_blocks(int device, symm_pool_id_t id, symm_block_info_t *out, int cap);

/* Sets private pool id of device back to want, n blocks that symm_pool_blocks
 * returned for that pool earlier, in any order (PyTorch's
 * setCheckpointPoolState). Afterwards the pool's allocated blocks are exactly
 * want's SYMM_BLOCK_ALLOCATED blocks, at their addresses, with their sizes and
 * requested sizes; every other byte of the pool's segments is free (want's
 * pending blocks are restored as free: their callers had freed them). So:
 * a block allocated now and not identically in want is freed, as
 * symm_pool_free would (record_stream streams still hold it: it turns
 * pending), its address written to freed; a block allocated in want and not
 * now is allocated at its address, for its segment's stream (free space split
 * and merged as needed; the caller owns it and frees it with symm_pool_free),
 * its address written to allocated; segments the pool took after the listing
 * keep nothing allocated; blocks allocated in both with the same address,
 * size and requested size are left alone and written nowhere (one with
 * another requested size is freed and allocated: written to both).
 * PyTorch's CheckpointDelta lists every block allocated before the call as
 * freed and every allocated block of want as allocated: take those from
 * symm_pool_blocks before the call and from want. Statistics count the frees
 * and allocations as any other.
 * *nfreed and *nallocated hold, on entry, the capacity of freed and of
 * allocated (allocated needs at most the allocated blocks of want, freed at
 * most the blocks symm_pool_blocks reports allocated now; an array may be NULL
 * with capacity 0) and receive the number of addresses written, each array in
 * increasing order.
 * Returns SYMM_OK; on error nothing changed, and *nfreed and *nallocated are
 * 0 unless said. SYMM_ERR_INVALID: a bad device; id (0, 0) (the default
 * pool, shared by every stream, is never restored); an unknown or released
 * pool; NULL nfreed, nallocated, want with n > 0, or an array with capacity
 * above 0; a negative n or capacity; a capacity too small (then *nfreed and
 * *nallocated receive the counts needed: call again with arrays that large);
 * a want that is not a listing of the pool's present segments: a segment
 * that is not the pool's (released since, or another pool's), blocks that do
 * not tile their segment exactly (a gap, an overlap, a block crossing its
 * segment's start or end), an address or size that is zero or not a multiple
 * of 512 or wraps around, a state that is not SYMM_BLOCK_*, an allocated
 * block whose requested size is 0 or above its size, a stream other than its
 * segment's, a reserved field not 0. SYMM_ERR_BUSY: a pending block lies
 * where want allocates and its events cannot be waited for now (some private
 * pool of the device is routing: a CUDA graph capture may be under way; with
 * none, such blocks are waited for first, as symm_pool_empty_cache does), or
 * an allocated block that must make room is held by record_stream streams. */
int symm_pool_restore_blocks(int device, symm_pool_id_t id, const symm_block_info_t *want, int n, uint64_t *freed,
                             int *nfreed, uint64_t *allocated, int *nallocated);

/* A segment of its own for size bytes (rounded up to a multiple of 512) on
 * device, for stream: what symm_pool_alloc hands a torch.cuda.MemPool, whose
 * caching allocator caches above libsymm, asked for explicitly. It goes back
 * to the device as soon as symm_pool_free frees it (no libsymm cache under
 * PyTorch's); the statistics count it as any block. Returns the segment's
 * address, or NULL with the last error: SYMM_ERR_OUT_OF_MEMORY (after
 * releasing the device's cached segments and retrying once), SYMM_ERR_INVALID
 * for a bad device. size 0 returns NULL and records no error. Never throws,
 * whatever PyTorch's mode. */
void *symm_pool_alloc_segment(size_t size, int device, void *stream);

/* The allocated block at or containing ptr: its address and the size it was
 * asked for. For callers that keep only a pointer (PyTorch's CUDA IPC shares
 * the chunks under a block). SYMM_ERR_UNKNOWN_POINTER: ptr is in no block
 * this pool has allocated; SYMM_ERR_INVALID: an output pointer is NULL.
 * Outputs are untouched then. */
int symm_pool_block_of(const void *ptr, uint64_t *address, uint64_t *requested);

/* The segment that holds the allocated block at or containing ptr: its base
 * address, its mapped size, and whether it is an expandable segment (1) or a
 * driver allocation of its own (0). PyTorch's CUDA IPC (torch.multiprocessing)
 * shares whole segments and sends a block's offset in its segment.
 * SYMM_ERR_UNKNOWN_POINTER: ptr is in no block this pool has allocated;
 * SYMM_ERR_INVALID: an output pointer is NULL. Outputs are untouched then. */
int symm_pool_segment_of(const void *ptr, uint64_t *base, uint64_t *size, int *expandable);

/* The size of the physical chunk that holds ptr, in the expandable segment of
 * the allocated block at or containing ptr: each chunk is one physical
 * allocation, which a process mapping that memory must map whole (the page
 * size in PyTorch's expandable-segment IPC handle); 0 for a segment that is a
 * driver allocation of its own. A segment may hold chunks of two sizes (the
 * granularity, and SYMM_POOL_EXPANDABLE_CHUNK's at its multiples from the
 * segment's base), so a block may lie over both: symm_pool_chunk_at says
 * which chunk holds an address. Returns SYMM_OK; SYMM_ERR_UNKNOWN_POINTER:
 * ptr is in no block this pool has allocated; SYMM_ERR_INVALID: chunk is
 * NULL. *chunk is untouched then. */
int symm_pool_segment_chunk(const void *ptr, uint64_t *chunk);

/* The physical chunk [*base, *base + *size) that holds the address at, in
 * the expandable segment of the allocated block at or containing ptr (at may
 * lie outside that block: in another block, or free, of the same segment).
 * Each chunk is one physical allocation, which a process mapping that memory
 * must map whole: what a caller sharing a block chunk by chunk (PyTorch's
 * CUDA IPC) walks, from the chunk holding ptr to the block's end, a chunk's
 * end being the next one's address. *base 0 and *size 0 for a segment that
 * is a driver allocation of its own. Returns SYMM_OK;
 * SYMM_ERR_UNKNOWN_POINTER: ptr is in no block this pool has allocated;
 * SYMM_ERR_INVALID: base or size is NULL, or at is not in a mapped chunk of
 * ptr's expandable segment. Outputs are untouched then. */
int symm_pool_chunk_at(const void *ptr, const void *at, uint64_t *base, uint64_t *size);

/* ---- snapshots as C listings, segment events -------------------------------
 *
 * symm_pool_snapshot's data as arrays of plain structs, for a C or C++ caller
 * (libsymm's PyTorch extension answers torch.cuda.memory._snapshot() with
 * them, and ProcessGroupNCCL reads that snapshot when it makes a
 * communicator), and the segment events a caller can watch as they happen
 * (PyTorch's allocator trace trackers: ProcessGroupNCCL registers each new
 * segment with NCCL through them). */

/* One segment of a listing: c10::CachingDeviceAllocator::SegmentInfo's
 * fields. An expandable segment is listed as one segment per contiguous
 * mapped range, as PyTorch lists it. */
typedef struct {
  uint64_t address, total_size;                     /* a multiple of 512 each */
  uint64_t allocated_size, active_size, requested_size;
  uintptr_t stream;                                 /* the stream the segment serves */
  symm_pool_id_t pool_id;                           /* its private pool; (0, 0): the default pool */
  int32_t device;
  int32_t is_large;                                 /* 1: segment_type "large"; 0: "small" */
  int32_t is_expandable;                            /* 1: part of an expandable segment */
  int32_t nblocks;                                  /* its blocks: the next nblocks entries of the block array */
} symm_segment_info_t;

/* symm_trace_entry_t.action: PyTorch's trace actions ("alloc", ...). */
enum {
  SYMM_TRACE_ALLOC = 0,          /* a block handed out */
  SYMM_TRACE_FREE_REQUESTED = 1, /* the caller freed it */
  SYMM_TRACE_FREE_COMPLETED = 2, /* it is reusable (after its record_stream events) */
  SYMM_TRACE_SEGMENT_ALLOC = 3,  /* a segment taken from the driver */
  SYMM_TRACE_SEGMENT_FREE = 4,   /* a segment given back */
  SYMM_TRACE_OOM = 5,            /* a request refused: address holds the device's free bytes */
  SYMM_TRACE_SNAPSHOT = 6,       /* a snapshot was taken */
  SYMM_TRACE_SEGMENT_MAP = 7,    /* chunks mapped into an expandable segment: address, size the run */
  SYMM_TRACE_SEGMENT_UNMAP = 8   /* chunks of an expandable segment unmapped: address, size the run */
};

/* One event of a device's history, or one segment event. size is, as in
 * PyTorch's history, the requested size for alloc, free_requested and
 * free_completed, the segment's or run's for segment events, and the
 * device's active bytes for snapshot. */
typedef struct {
  int32_t device, action;  /* action: SYMM_TRACE_* */
  uint64_t address, size;
  uintptr_t stream;
  int64_t time_us;         /* microseconds since the Unix epoch */
  symm_pool_id_t pool_id;  /* a segment event's private pool; (0, 0) otherwise, and in listings */
  const char *user_metadata;   /* the annotation current when it happened (symm_pool_set_annotation), "" if none; */
  const char *compile_context; /* "N/A" if none; libsymm's strings, valid for the life of the process */
} symm_trace_entry_t;

/* The snapshot (see symm_pool_snapshot) as listings: segments of every
 * device sorted by device then address, each followed in blocks by its
 * blocks (symm_block_info_t, segment_address the listed segment's address,
 * state SYMM_BLOCK_*), and, when ntraces is not NULL, every device's history
 * in traces, device by device, oldest first. *nsegs, *nblocks and *ntraces
 * hold the capacities of the arrays on entry (an array may be NULL with
 * capacity 0) and receive the counts. Every capacity 0: a size query; it
 * records nothing, and its counts are those a listing made now would need.
 * Otherwise, when history is on, each device records a "snapshot" event
 * after its history was taken (size: the device's active bytes), as
 * symm_pool_snapshot does: the event is in the next listing, not this one.
 * Returns SYMM_OK with everything written; SYMM_ERR_INVALID with nothing
 * written: nsegs or nblocks NULL, a negative capacity, a NULL array with a
 * capacity above 0 (counts 0), or a capacity too small (the counts needed
 * written: the pool may change between two calls; call again with room to
 * spare). */
int symm_pool_snapshot_list(symm_segment_info_t *segs, int *nsegs, symm_block_info_t *blocks, int *nblocks,
                            symm_trace_entry_t *traces, int *ntraces);

/* The pool's settings, as a snapshot's "allocator_settings" has them. */
typedef struct {
  int32_t expandable_segments;         /* 1: on */
  int32_t reserved;                    /* 0 */
  uint64_t max_split_size;             /* bytes; 0: off */
  double garbage_collection_threshold; /* 0: off */
  const char *alloc_conf;              /* the settings text (PYTORCH_CUDA_ALLOC_CONF's), "" if none;
                                          libsymm's, valid for the life of the process */
} symm_pool_settings_t;

/* Writes the pool's settings into *out. SYMM_ERR_INVALID: out is NULL. */
int symm_pool_settings(symm_pool_settings_t *out);

/* Called with n segment events (SYMM_TRACE_SEGMENT_ALLOC, _FREE, _MAP,
 * _UNMAP), oldest first per device; the array is valid during the call only. */
typedef void (*symm_segment_hook_fn)(const symm_trace_entry_t *events, int n, void *ctx);

/* Registers fn (with ctx) to be told of every segment event from now on;
 * NULL unregisters (events not yet delivered are dropped). One hook per
 * process: a second call replaces the first. The hook is called outside every
 * lock of the pool, by the thread of the libsymm call that caused the event
 * (an allocation, a free, symm_pool_empty_cache, ...), before that call
 * returns, or by a concurrent call that took the event first: either way
 * every event is delivered before the call that caused it returns. A free or
 * an unmap is told after the memory went back to the driver (PyTorch tells
 * its trackers just before). Calls into libsymm from the hook are allowed
 * (but this one); the events they cause are delivered after the hook
 * returns. The hook must not throw. Costs nothing when no hook is
 * registered. Returns SYMM_OK;
 * SYMM_ERR_BUSY when called from the hook itself (nothing changes); or the
 * pool's start-up error. */
int symm_pool_set_segment_hook(symm_segment_hook_fn fn, void *ctx);

/* ---- symmetric memory ----------------------------------------------------
 *
 * Each rank of a group allocates a block with symm_alloc (same size on every
 * rank); symm_rendezvous maps every rank's block into every rank's address
 * space. A block is [buffer | signal pad]: the pointer returned is the buffer.
 * Backend: SYMM_DEVICE (cuda: cuMemCreate + POSIX fds + cuMemMap; host:
 * memfd + mmap). Processes of one host only. Multicast is never used.
 */

/* Allocates a symmetric block with a buffer of size bytes on device. NULL
 * with the last error set on failure; size 0 gives NULL and no error.
 * Signature of PyTorch's CUDAPluggableAllocator alloc functor (MemPool). */
void *symm_alloc(size_t size, int device, void *stream);

/* Frees the block that starts at ptr: unmaps every peer's block, frees the
 * reserved address ranges, closes every descriptor; its handles become
 * invalid. An unknown pointer sets SYMM_ERR_UNKNOWN_POINTER. */
void symm_free(void *ptr, size_t size, int device, void *stream);

/* Always 0: libsymm never creates multicast objects. Never fails. */
int symm_has_multicast_support(int device);

/* ---- symmetric backends ----------------------------------------------------
 *
 * "cuda" (default: VMM + file descriptors over Unix sockets), "nvshmem"
 * (NVSHMEM's symmetric heap; libnvshmem_host.so.3 from SYMM_NVSHMEM_LIB or
 * the loader path; NVSHMEM 3.x), "nccl" (ncclMemAlloc memory registered as
 * NCCL symmetric windows; libnccl.so.2 from SYMM_NCCL_LIB or the loader
 * path; NCCL 2.27 or later) or "host" (with SYMM_DEVICE=host).
 * symm_set_backend chooses before the first symmetric call (SYMM_BACKEND
 * does the same); afterwards only the backend in use is accepted.
 *
 * The NVSHMEM backend must be initialized by every rank with
 * symm_backend_init before its first symm_alloc (rank 0's unique id goes
 * through the store). Under it symm_alloc and symm_free are collective, as
 * nvshmem_malloc and nvshmem_free are: every rank calls them with the same
 * sizes in the same order (PyTorch's NVSHMEM backend has the same rule). For
 * the other backends symm_backend_init only checks its arguments.
 *
 * The NCCL backend needs a communicator: symm_backend_init makes one over
 * the store (ncclCommInitRank, NCCL_NVLS_ENABLE=0 forced), or
 * symm_nccl_adopt_comm takes the caller's (an ncclComm_t of the same
 * libnccl.so.2, e.g. PyTorch's). A rendezvous over the communicator's whole
 * world registers the block as a symmetric window (collective); freeing
 * such a block deregisters it, so that symm_free is collective too. */
/* symm_set_backend: SYMM_OK; SYMM_ERR_INVALID for an unknown name, NULL, or
 * another backend once one is in use. */
int symm_set_backend(const char *name);
/* Writes the backend's name (in use, else chosen: symm_set_backend's, else
 * SYMM_BACKEND, else SYMM_DEVICE's) into buf (NUL-terminated).
 * SYMM_ERR_INVALID when buf is NULL, cap is under 8, or SYMM_DEVICE and
 * SYMM_BACKEND choose no backend (the message names the variable). */
int symm_get_backend(char *buf, size_t cap);
/* 1 when NVSHMEM's host library loads and is a supported version; else 0,
 * and the last error says why. Initializes nothing. */
int symm_nvshmem_available(void);
/* 1 when an NCCL with symmetric windows (2.27+) loads; else 0, and the last
 * error says why (SYMM_ERR_NO_DEVICE). Creates nothing. */
int symm_nccl_available(void);
/* The NCCL backend uses comm (an ncclComm_t) on device instead of making one.
 * SYMM_ERR_INVALID for a NULL comm, a bad device or another backend in use;
 * SYMM_ERR_NO_DEVICE when NCCL cannot be loaded or is too old. */
int symm_nccl_adopt_comm(void *comm, int device);

/* ---- topology --------------------------------------------------------------
 *
 * symm_topology writes what `symm info --json` prints: devices, the link
 * matrix (NVLink counts, PCIe path class, peer access), capabilities, the
 * NCCL and NVSHMEM libraries found, the backends that can run, whether
 * libsymm's kernels compile for each device (NVRTC; they are not loaded, so
 * no CUDA context is created) (schema in the README). lib_dirs: more directories to look for NCCL and NVSHMEM in,
 * ':'-separated (Python site-packages, where pip puts them), or NULL.
 * *len receives the JSON's length without the NUL; with buf NULL or cap 0
 * nothing else happens (a size query). A cap too small for the JSON and its
 * NUL is SYMM_ERR_INVALID. A machine without a driver is not an error: the
 * JSON says "driver": {"found": false, ...}. */
int symm_topology(const char *lib_dirs, char *buf, size_t cap, size_t *len);

/* Tells the library, once, where pip's NVIDIA wheels may be: dirs is a
 * ':'-separated list of absolute directories, each searched as a
 * site-packages directory (the wheels' sub-paths, such as nvidia/nccl/lib,
 * are the library's to know) and as a directory holding the libraries.
 * NCCL, NVSHMEM and NVRTC opened after the call look there after their
 * SYMM_*_LIB variable (which still wins) and before the loader path; one
 * already opened stays as it is (NCCL and NVSHMEM open when their backend
 * starts, NVRTC at the first kernel compilation: never when the library is
 * loaded). The Python package passes its site-packages right after loading
 * the library. Directories add to those told before (a repeat, an empty
 * entry and a missing directory are no error). Returns SYMM_OK;
 * SYMM_ERR_INVALID, nothing added, when dirs is NULL or an entry is not an
 * absolute path (the message names it). */
int symm_add_library_dirs(const char *dirs);

/* Stores: the key-value store a rendezvous exchanges metadata through.
 * Handles are small integers; 0 is never a valid one. */
typedef int64_t symm_store_t;

/* Starts a TCP store server on addr ("" = 127.0.0.1 with a free port) and
 * returns a store handle connected to it; the bound "host:port" is written to
 * bound (NUL-terminated, len bytes at most). token: shared secret clients must
 * present (NULL or "": SYMM_STORE_TOKEN, else none). */
int symm_store_server(const char *addr, const char *token, symm_store_t *out, char *bound, size_t len);

/* Connects to a store server, retrying for timeout_ms (ranks start in any
 * order). SYMM_ERR_TIMEOUT when no server answered in time; SYMM_ERR_INVALID
 * for a wrong token, a NULL argument, or an address that is not host:port
 * with a port from 1 to 65535 (at once, without retrying). */
int symm_store_connect(const char *addr, const char *token, int timeout_ms, symm_store_t *out);

/* Sets key to the len bytes at value. SYMM_ERR_INVALID for a bad handle, a
 * NULL key or value, or a key or value over the store's bounds;
 * SYMM_ERR_PEER when the server went away. */
int symm_store_set(symm_store_t s, const char *key, const void *value, size_t len);

/* Waits up to timeout_ms for key; copies at most cap bytes into buf and sets
 * *len to the value's full length. SYMM_ERR_TIMEOUT if it never came. */
int symm_store_get(symm_store_t s, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms);

/* Adds delta to the integer at key (missing = 0); *out (if not NULL) gets the result. */
int symm_store_add(symm_store_t s, const char *key, int64_t delta, int64_t *out);

/* Closes a store handle (and stops the server if it was made by
 * symm_store_server), and the links of the groups joined through it
 * (symm_rendezvous), which are forgotten with their handshake counts: a group
 * of the same name joined later over another store starts afresh on every
 * rank. SYMM_ERR_INVALID for a bad or already closed handle. */
int symm_store_close(symm_store_t s);

/* A block joined with a group. */
typedef int64_t symm_handle_t;

/* Every rank of the group calls it, with the same group name, in the same
 * order for its blocks; ptr is any address inside this rank's block. Waits
 * for the peers at most SYMM_TIMEOUT_MS. The same block and group again gives
 * the same handle. A group's first rendezvous in a process makes the group's
 * link through one all-gather in the store: one Unix connection to each peer
 * (one descriptor each, kept until symm_store_close of the store), checked to
 * end at the process that published that rank (pid, uid, start time) before
 * any block's descriptor is sent on it; later ones exchange two messages with
 * each peer and use the store no more. Ranks must share a host, a uid and a
 * pid namespace. Every rank succeeds or every
 * rank fails: SYMM_ERR_TIMEOUT (a rank did not come, named), SYMM_ERR_PEER
 * (a rank failed or died, named with its cause), SYMM_ERR_UNKNOWN_POINTER
 * (ptr is not in a live block), SYMM_ERR_INVALID (bad rank, world, group,
 * store, or ranks that disagree on sizes, hosts or devices); nothing stays
 * mapped after a failure. */
int symm_rendezvous(void *ptr, symm_store_t store, const char *group, int rank, int world_size, symm_handle_t *out);

/* Joins the backend's world (NVSHMEM: bootstrap by unique id through store,
 * collective, once per process, on device). SYMM_ERR_INVALID for bad
 * arguments, SYMM_ERR_NO_DEVICE when the backend's library cannot run,
 * SYMM_ERR_TIMEOUT/SYMM_ERR_PEER when a rank does not come or fails. */
int symm_backend_init(symm_store_t store, int rank, int world_size, int device);

typedef struct {
  int rank, world_size;
  size_t buffer_size;     /* bytes of each rank's buffer */
  size_t signal_pad_size; /* bytes of each rank's signal pad (uint32 slots) */
  uintptr_t buffer_ptrs;  /* host array of world_size pointers (void**): rank r's buffer as mapped here */
  uintptr_t signal_pad_ptrs;     /* host array of world_size pad pointers */
  uintptr_t buffer_ptrs_dev;     /* the same arrays in device memory (for kernels) */
  uintptr_t signal_pad_ptrs_dev;
} symm_handle_info_t;

/* Fills out for handle h; the arrays stay valid until the block is freed.
 * SYMM_ERR_INVALID for a bad handle or NULL out, SYMM_ERR_UNKNOWN_POINTER
 * when the handle's block was freed. */
int symm_handle_info(symm_handle_t h, symm_handle_info_t *out);

/* *out = 1 when every rank of the group, each on its device, can map every
 * other rank's device memory (peer access over NVLink or PCIe), so that a
 * rendezvous of the group can succeed; 0 otherwise. Every rank of the group
 * calls it (it goes through the store) and all get the same answer. The host
 * backend answers 1. SYMM_ERR_INVALID for bad arguments or a NULL out,
 * SYMM_ERR_TIMEOUT when a rank does not come. */
int symm_world_within_direct_access(symm_store_t store, const char *group, int rank, int world_size, int device,
                                    int *out);

/* Signals, in stream order (the stream is ignored on the host backend):
 * put_signal sets this rank's slot of channel in dst_rank's pad; wait_signal
 * waits for src_rank's slot to be set, then clears it; barrier does both with
 * every peer. A barrier run by kernels (below) on a handle whose group owns
 * its block's sync area (the first group rendezvoused on the block: see
 * symm_one_shot_all_reduce) meets through that area instead (one store per
 * peer, no round trip); it leaves the signal pad alone, so put_signal and
 * wait_signal on the same channel do not see it. So does a barrier on the
 * host backend for such a handle. A meeting there carries its kind: a
 * barrier that meets a peer's collective (or a collective another one)
 * fails on both ranks with SYMM_ERR_MISMATCH naming both calls, and fails
 * the handle. timeout_ms > 0: the calling thread waits for the call's own
 * operations (not for the whole stream: work queued before or after them is
 * not a late peer) and returns SYMM_ERR_TIMEOUT, naming the rank and
 * channel, if they have not completed within timeout_ms of the stream
 * reaching them; with stream memory operations the handle stays usable (the
 * queued wait takes the late signal itself; with kernels, below, it fails).
 * Earlier work that still holds the stream after SYMM_TIMEOUT_MS (at least
 * timeout_ms) gives SYMM_ERR_TIMEOUT saying so and blaming no peer; the
 * operations stay queued. 0 (the default): on GPUs the call only queues the
 * operations, and a watchdog checks in the background that the stream gets
 * past them within SYMM_TIMEOUT_MS of reaching them (work queued before or
 * after them is not a late peer); if it does not, the handle fails: the
 * message is printed to standard error once and every later signal call on
 * the handle returns SYMM_ERR_TIMEOUT with it (with stream memory operations
 * a queued wait cannot be withdrawn: the stream stays blocked until the
 * signal comes; with kernels, below, the stream goes on). On the host
 * backend the calling thread waits, at most SYMM_TIMEOUT_MS. Negative:
 * SYMM_ERR_INVALID. put_signal first waits until the peer has taken our
 * previous signal on that channel (queued on the stream on GPUs; on the host
 * backend for at most SYMM_TIMEOUT_MS). */
int symm_put_signal(symm_handle_t h, int dst_rank, int channel, void *stream);
int symm_wait_signal(symm_handle_t h, int src_rank, int channel, void *stream, int timeout_ms);
int symm_barrier(symm_handle_t h, int channel, void *stream, int timeout_ms);

/* The launch path. On GPUs with the kernels, after a handle's first call
 * succeeds, the signals and the one-shot, two-shot, reduce-scatter and
 * all-gather below, called with timeout_ms 0 (put_signal has none), launch
 * their kernel from the handle's launch plan, in C (no Go runtime on
 * the way, no lock): the same kernel, arguments and checks as the first
 * call's path, which every other call (a timeout, an argument refused, a
 * failed handle) still takes and which words the errors. The kernel is
 * launched in the primary context of the handle's device: where it is
 * current already nothing changes; a thread with no current context gets it
 * bound (as cudaSetDevice would, once: its later calls find it current);
 * over another context it is pushed and popped. A handle's plan is
 * withdrawn when the handle fails and before its block is freed; a call
 * that began before that ends before the block's memory goes.
 * SYMM_LAUNCH_THROUGH_GO=1 keeps every call on the first call's path. */

/* Starts h's signals over on every rank of its group, as a block handed out
 * again by a caching allocator (PyTorch's MemPool) needs before its next
 * use: each rank waits for the work queued on its device, the ranks agree
 * (no peer can still be signalling), each zeroes its own signal pad, and
 * the ranks agree again before any returns. On GPUs, a group that owns the
 * block's sync area (symm_one_shot_all_reduce) does it in one kernel that
 * meets its peers through that area, zeroes the pad and meets them again,
 * waited for once, with no store request, when the kernels ran on every rank's device at
 * the rendezvous (the ranks agree on the way there). Otherwise (the host
 * backend, a group that does not own the area, or kernels missing on some
 * rank) the ranks agree through the group's store, and a group that owns
 * the area zeroes the area and its meeting counts as well. Every rank of
 * the group calls it, in the same order per group,
 * with no signal or collective of h under way. timeout_ms bounds each wait
 * for the peers (0: SYMM_TIMEOUT_MS). Returns SYMM_OK; SYMM_ERR_INVALID for
 * a bad handle or a negative timeout_ms, SYMM_ERR_UNKNOWN_POINTER when the
 * handle's block was freed, SYMM_ERR_TIMEOUT when a rank does not come,
 * SYMM_ERR_PEER when one fails or dies (the message names it),
 * SYMM_ERR_MISMATCH when, on GPUs, a peer met the reset's barriers with a
 * collective (a reset that one rank decided alone). */
int symm_reset_signal_pad(symm_handle_t h, int timeout_ms);

/* symm_reset_signal_pad decided by every rank together: each rank says
 * whether it wants the reset (want: 0 or 1), over the group's link, and if
 * any rank does, every rank resets (as symm_reset_signal_pad) and *reset
 * (when not NULL) is 1 on every rank; else no rank resets and *reset is 0.
 * For a caller that decides from what only it can see (PyTorch: whether
 * its tensors on a block handed out again are still alive, which a
 * reference cycle can delay on one rank): calling it on every rank keeps
 * any rank from resetting alone. Every rank of the group calls it, in the
 * same order per group, with no signal or collective of h under way.
 * Returns SYMM_OK; SYMM_ERR_INVALID for a bad handle, want other than 0 or
 * 1, or a negative timeout_ms; otherwise the errors of
 * symm_reset_signal_pad, with *reset 0. */
int symm_reset_signal_pad_if_any(symm_handle_t h, int want, int timeout_ms, int *reset);

/* ---- kernels -----------------------------------------------------------------
 *
 * On GPUs, put_signal, wait_signal and barrier are one kernel launch each
 * (CUDA C compiled at run time with NVRTC, kept in SYMM_KERNEL_CACHE) when
 * the kernels can run, else stream memory operations (SYMM_SIGNALS=auto,
 * the default; "kernel": kernels or SYMM_ERR_NO_DEVICE; "memop": never
 * kernels). A kernel's waits stop at the timeout (timeout_ms, else
 * SYMM_TIMEOUT_MS) and report through a host-mapped word, so the stream
 * goes on; the call (timeout_ms > 0) or the watchdog (0) turns the report
 * into SYMM_ERR_TIMEOUT naming the peer and channel. Either way the handle
 * fails: a wait that stopped may leave a late signal in the pad, which a
 * later wait would take as its own, so every later call on the handle
 * returns SYMM_ERR_TIMEOUT; free the block and rendezvous again. A call
 * with timeout_ms waits for its own kernel, not for the whole stream, and
 * counts the timeout from when the stream reaches the kernel: work queued
 * before it or after it is not a late peer. Earlier work that still holds
 * the stream after SYMM_TIMEOUT_MS gives SYMM_ERR_TIMEOUT without failing
 * the handle (the kernel stays queued; if it then reports a late peer, the
 * handle fails). */

/* 1 when libsymm's kernels run on device (NVRTC found, the kernels compiled
 * or read from the cache, and loaded); else 0 and the last error says why
 * (SYMM_ERR_NO_DEVICE: no NVRTC, the host backend, ...). */
int symm_kernels_ready(int device);

/* Element types of the collectives' dtype arguments, one line each:
 * X(name, code, size of an element in bytes). This table is their one
 * definition: the enum of codes and the sizes (SYMM_FLOAT32_SIZE, ...) below
 * are made from it, and libsymm's Go (kernels/abi.go), CUDA (the kernels'
 * source, through Go) and Python (symm._codes.Dtype, tested) read it. */
#define SYMM_DTYPES(X)     \
  X(SYMM_FLOAT32, 0, 4)  \
  X(SYMM_BFLOAT16, 1, 2) \
  X(SYMM_FLOAT16, 2, 2)
#define SYMM_DTYPE_CODE_(name, code, size) name = code,
#define SYMM_DTYPE_SIZE_(name, code, size) name##_SIZE = size,
enum { SYMM_DTYPES(SYMM_DTYPE_CODE_) };
enum { SYMM_DTYPES(SYMM_DTYPE_SIZE_) };
/* Reduce operations of the collectives' op arguments. */
enum { SYMM_SUM = 0 };

/* One-shot all-reduce (PyTorch's symm_mem.one_shot_all_reduce): every rank
 * of h's group reads count elements (SYMM_FLOAT32, SYMM_BFLOAT16 or
 * SYMM_FLOAT16) at byte offset of every rank's buffer, sums them (float32
 * accumulation, in rank order: every rank gets the same
 * bits) and writes the sum to out, in stream order; every rank calls it with
 * the same offset, count and dtype. local_input (or NULL) is copied into this
 * rank's buffer first (one_shot_all_reduce_copy). Block b of the kernel
 * meets block b of every peer on channel b (at most SYMM_COLLECTIVE_BLOCKS
 * channels, 96 by default) before reading and after, so the inputs may be rewritten as soon as the call's
 * work is done. The first group rendezvoused on a block (on every rank)
 * owns the block's sync area, which follows the signal pad: its collectives
 * and kernel barriers meet there, with one store per peer and no round trip;
 * any other group's meet on signal-pad channel b with put/take, as PyTorch's
 * do (then do not run signals of h on those channels concurrently). Calls
 * of one handle that meet on the same channel must be ordered (one stream,
 * or streams ordered by events). offset and count × element size must be multiples of 4, out
 * must not overlap this rank's input, nor local_input unless it is
 * local_input itself (in place). timeout_ms as for symm_barrier. On the
 * host backend the calling thread does it (pointers are host memory).
 * SYMM_ERR_INVALID for a bad dtype, op, size, offset or output;
 * SYMM_ERR_NO_DEVICE when the kernels cannot run (see symm_kernels_ready);
 * SYMM_ERR_TIMEOUT when a peer does not come; SYMM_ERR_MISMATCH when a peer
 * met it with another call (a barrier, a pad reset, another collective)
 * through the sync area. count 0 does nothing. */
int symm_one_shot_all_reduce(symm_handle_t h, size_t offset, size_t count, int dtype, int op, void *out,
                             const void *local_input, void *stream, int timeout_ms);

/* Two-shot all-reduce for large messages (PyTorch's
 * symm_mem.two_shot_all_reduce_): reduce-scatter then all-gather over the
 * mapped buffers, in one kernel. The count elements at byte offset are split
 * into one contiguous share per rank (the last share takes the rest); rank s
 * sums share s of every rank's buffer (float32 accumulation, in rank order:
 * every rank gets the same bits, and the same bits as
 * symm_one_shot_all_reduce) and stores the sum into share s of EVERY rank's
 * buffer. So the call leaves the sum in every rank's buffer at offset (in
 * place); out, when it is not this rank's buffer at offset, receives a copy
 * of it as well (out of place: the buffer holds the sum too). Each rank
 * moves 1/world of the message to and from each peer, instead of all of it
 * as the one-shot does. Parameters, stream order, local_input (copied into
 * this rank's buffer first), channels (block b meets block b of every peer
 * on channel b, before the reads and after the stores, as the one-shot's),
 * timeout_ms, errors (SYMM_ERR_INVALID, SYMM_ERR_NO_DEVICE, SYMM_ERR_TIMEOUT)
 * and the host backend as for symm_one_shot_all_reduce,
 * except that out may be this rank's buffer at offset itself: out and
 * local_input must each be that exact address or not overlap it, and out
 * must not overlap local_input unless it is local_input itself. */
int symm_two_shot_all_reduce(symm_handle_t h, size_t offset, size_t count, int dtype, int op, void *out,
                             const void *local_input, void *stream, int timeout_ms);

/* Reduce-scatter (NCCL's ncclReduceScatter, PyTorch's reduce_scatter_tensor)
 * on symmetric buffers. count is the element count of ONE rank's share:
 * every rank's buffer holds world × count elements at byte offset (share s:
 * elements s·count .. s·count+count−1), and rank r receives in out (count
 * elements) the sum of share r of every rank's buffer, in rank order
 * 0..world−1 with float32 accumulation (the same bits on every rank that
 * sums that share, and as the all-reduces). dtype SYMM_FLOAT32,
 * SYMM_BFLOAT16 or SYMM_FLOAT16, op SYMM_SUM; offset and count × element size multiples of 4
 * bytes. local_input, when not NULL, holds the whole world × count input and
 * is copied into this rank's buffer first. out may be this rank's own share
 * r of its buffer (in place) or memory disjoint from its world shares;
 * local_input may be the buffer at offset itself or disjoint from it; out
 * may be local_input's share r (NCCL's in place) or disjoint from
 * local_input. One kernel in stream order: block b meets block b of every
 * peer on channel b (as the one-shot's) before the reads and after them (so the call
 * must not run concurrently with other signals of h). The host backend runs
 * the same protocol in the calling thread. Returns SYMM_OK (count 0 does
 * nothing); SYMM_ERR_INVALID (a bad handle, dtype, op, size, offset,
 * alignment, NULL out, a negative timeout_ms, or an overlap, each named),
 * SYMM_ERR_NO_DEVICE (the kernels cannot run), SYMM_ERR_TIMEOUT (a peer did
 * not come within timeout_ms, naming it; 0: SYMM_TIMEOUT_MS, watched on the
 * device), SYMM_ERR_FORKED. */
int symm_reduce_scatter(symm_handle_t h, size_t offset, size_t count, int dtype, int op, void *out,
                        const void *local_input, void *stream, int timeout_ms);

/* All-gather (NCCL's ncclAllGather, PyTorch's all_gather_into_tensor) on
 * symmetric buffers. count is the element count of one rank's share: every
 * rank's buffer holds world × count elements at byte offset, and share r of
 * rank r's buffer is its input (copied there first from local_input, count
 * elements, when not NULL). out (world × count elements) receives share s
 * of rank s's buffer at share s, for every s. A copy: any dtype of 2 or 4
 * bytes (SYMM_FLOAT32, SYMM_BFLOAT16, SYMM_FLOAT16); offset and count ×
 * element size multiples of 4 bytes. out may be this rank's buffer at
 * offset itself (in place) or memory disjoint from its world shares;
 * local_input may be the buffer's share r, out's share r (NCCL's in place),
 * or disjoint from both. Stream order, channels, timeout_ms, the host
 * backend and the returns as for symm_reduce_scatter: SYMM_OK (count 0 does
 * nothing); SYMM_ERR_INVALID (a bad handle, dtype, size, offset, alignment,
 * NULL out, a negative timeout_ms, or an overlap, each named),
 * SYMM_ERR_NO_DEVICE, SYMM_ERR_TIMEOUT, SYMM_ERR_FORKED. */
int symm_all_gather(symm_handle_t h, size_t offset, size_t count, int dtype, void *out, const void *local_input,
                    void *stream, int timeout_ms);

/* ---- push all-reduce: small messages, one kernel, no barrier -----------------
 *
 * The latency-optimised all-reduce for small messages (a few KiB to about a
 * MiB), made to be captured in CUDA graphs. Its handle is a WORKSPACE: a
 * symmetric block of its own (symm_alloc of the size below, then
 * symm_rendezvous with one group, once), which holds no user data. Each call
 * is one kernel: every rank stores its input, 8 bytes at a time each with
 * the call's 32-bit flag in the same 16-byte line, straight into its slot of
 * every peer's workspace, then waits on the lines of its own workspace
 * until every peer's flags are there (no barrier before or after) and sums
 * in rank order (float32 accumulation: every rank gets the same bits). The
 * workspace's two halves alternate from call to call and the call counter
 * lives in device memory, read and advanced by the kernel, so nothing is
 * ever reset and a CUDA graph replays the calls as captured. The first call
 * on a handle also sets the workspace up (one more kernel; every rank meets
 * every other there on signal-pad channel 0): make one call before
 * capturing a graph. Calls on one workspace must be ordered (one stream, or
 * streams ordered by events), every rank making the same calls with the
 * same count and dtype in the same order; do not use the workspace's block
 * for anything else (signals on channel 0 included). */

/* Bytes of a workspace buffer (the size to give symm_alloc) for a group of
 * world_size ranks and messages of up to max_bytes bytes: 4 × world_size ×
 * max_bytes, max_bytes rounded up to 8. Conversely a workspace of S bytes
 * takes messages of up to 8 × floor(S / (32 × world_size)) bytes. 0, with
 * SYMM_ERR_INVALID as the last error, for world_size < 1, max_bytes 0 or a
 * size that overflows. */
size_t symm_push_all_reduce_workspace_size(int world_size, size_t max_bytes);

/* Every rank of the workspace's group sums the count elements of dtype
 * (SYMM_FLOAT32, SYMM_BFLOAT16 or SYMM_FLOAT16) at in of every rank and
 * writes the sum to its out, in stream order: one kernel launch, and the
 * call returns (timeout_ms 0) without waiting for it. in and out are any
 * device memory (host memory on the host backend, where the calling thread
 * does the work), aligned to the element size; count may be any number up
 * to the workspace's limit; out may be in (in place), but may not overlap
 * it otherwise, and neither may lie in the workspace. timeout_ms as for
 * symm_barrier: a peer that does not come within it (else SYMM_TIMEOUT_MS)
 * gives SYMM_ERR_TIMEOUT naming the peer and the call, the stream goes on,
 * and the workspace's handle fails for good (its late data could meet a
 * later call): free it and make another. Returns SYMM_OK (count 0 does
 * nothing); SYMM_ERR_INVALID for a bad handle, dtype, op, timeout, a NULL,
 * misaligned or overlapping pointer, a message over the workspace's limit
 * (the message says the limit and the workspace size that would take it),
 * or a workspace block joined with more than one group; SYMM_ERR_NO_DEVICE
 * when the kernels cannot run (see symm_kernels_ready);
 * SYMM_ERR_UNKNOWN_POINTER when the workspace was freed; SYMM_ERR_TIMEOUT
 * as said, also for every call on a handle that failed. */
int symm_push_all_reduce(symm_handle_t workspace, const void *in, void *out, size_t count, int dtype, int op,
                         void *stream, int timeout_ms);

/* ---- choosing the all-reduce ------------------------------------------------
 *
 * The one place where the all-reduce's algorithm is chosen, shared by C and
 * Python (symm.all_reduce). SYMM_ALL_REDUCE_AUTO asks libsymm to choose:
 * SYMM_ALL_REDUCE (auto, push, two_shot or one_shot) when it forces one,
 * else from the crossovers measured on H200s (symmetric/choose.go has the
 * table and the run): the push all-reduce up to 1 MiB on 2 GPUs, 256 KiB
 * on 3, 128 KiB on 4 and more (more than 4: not measured, an
 * extrapolation), the two-shot above, and the two-shot too for a message
 * over push_max_bytes (the largest message the caller's push workspace
 * takes; 0: none, never the push). PUSH, TWO_SHOT and ONE_SHOT name
 * symm_push_all_reduce, symm_two_shot_all_reduce and
 * symm_one_shot_all_reduce. */
enum { SYMM_ALL_REDUCE_AUTO = 0, SYMM_ALL_REDUCE_PUSH = 1, SYMM_ALL_REDUCE_TWO_SHOT = 2, SYMM_ALL_REDUCE_ONE_SHOT = 3 };

/* Writes into *chosen the algorithm (SYMM_ALL_REDUCE_PUSH, _TWO_SHOT or
 * _ONE_SHOT) of an all-reduce of nbytes bytes on a group of world_size
 * ranks: algorithm itself when it is not SYMM_ALL_REDUCE_AUTO (the caller
 * forces one), else as said above. Every rank gets the same answer for the
 * same arguments and environment. Returns SYMM_OK; SYMM_ERR_INVALID (nothing
 * written) when chosen is NULL, world_size < 1, algorithm is not one of the
 * enum, a push (asked for, or forced by SYMM_ALL_REDUCE=push) of a message
 * over push_max_bytes (the message says the limit), or SYMM_ALL_REDUCE
 * holds another word (the message names the variable); SYMM_ERR_NO_DEVICE
 * when the symmetric backend cannot start (as for symm_alloc). */
int symm_all_reduce_algorithm(int world_size, size_t nbytes, size_t push_max_bytes, int algorithm, int *chosen);

/* Writes into *algorithm what SYMM_ALL_REDUCE sets: SYMM_ALL_REDUCE_AUTO
 * (unset or auto) or the algorithm it forces, so that a caller with choices
 * of its own (Python's NCCL hand-off for large messages) reads the setting
 * from the library instead of the environment. Returns SYMM_OK;
 * SYMM_ERR_INVALID (nothing written) when algorithm is NULL or a symmetric
 * setting is bad (the message names the variable); SYMM_ERR_NO_DEVICE when
 * the symmetric backend cannot start (as for symm_alloc). */
int symm_all_reduce_setting(int *algorithm);

/* Writes into *bytes the largest message of a push workspace made now:
 * SYMM_PUSH_MAX_BYTES (a positive number of bytes, read at each call),
 * else 1 MiB, rounded up to 8 as the workspace takes it, so that a caller
 * sizing workspaces (Python's symm.push_workspace) reads the setting from
 * the library. Returns SYMM_OK; SYMM_ERR_INVALID (nothing written) when
 * bytes is NULL or the variable holds anything else (the message names
 * it). */
int symm_push_max_bytes_setting(size_t *bytes);

#ifdef __cplusplus
} /* extern "C" */

/* ---- PyTorch's CUDA-graph hooks (C++ only) -----------------------------------
 *
 * Functors with the exact types of torch 2.11's CUDAPluggableAllocator
 * (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
 * set_release_pool; MempoolId_t is std::pair<unsigned long long, unsigned long
 * long>, cudaStream_t is CUstream_st *). symm.pool_allocator() attaches them;
 * a program that builds its own CUDAPluggableAllocator over libsymm attaches
 * them with allocator().set_begin_allocate_to_pool(address) and so on. They
 * never throw, except begin when the pool cannot start (no device), which
 * PyTorch reports from capture_begin. Release follows PyTorch: a graph may
 * die before its output tensors, whose blocks stay valid and go back to the
 * device once freed (and emptied). */
#include <functional>
#include <utility>
struct CUstream_st;
extern "C" void symm_torch_begin_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> id,
                                                  std::function<bool(CUstream_st *)> filter);
extern "C" void symm_torch_end_allocate_to_pool(int device, std::pair<unsigned long long, unsigned long long> id);
extern "C" void symm_torch_release_pool(int device, std::pair<unsigned long long, unsigned long long> id);
#endif
#endif /* SYMM_H */
