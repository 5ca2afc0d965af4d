// The public functions that only check and call Go: the fork check and the
// pointer arguments Go cannot check. (The pool itself has the front cache
// give its blocks back before it reports statistics or listings:
// allocator/front.go.) The Go exports (go* in _cgo_export.h) set the last error
// themselves; nothing here throws.
#include "../include/symm.h"
#include "_cgo_export.h"
#include "front.h"
#include "plans.h"
#include "shim_internal.h"

using namespace symmshim;

// SYMM_CALL defines the public function name(params) that returns on_fork in
// a fork child and call otherwise; SYMM_CALL_VOID is the same for a function
// without a result. SYMM_CHECKED is SYMM_CALL with SYMM_ERR_FORKED that also
// returns SYMM_ERR_INVALID, with the message "name: why", when bad holds.
// The name in every error is the function's own (#name).
#define SYMM_CALL(ret, name, params, on_fork, call) \
  ret name params {                                 \
    if (forked(#name)) return on_fork;              \
    return call;                                    \
  }
#define SYMM_CALL_VOID(name, params, call) \
  void name params {                       \
    if (forked(#name)) return;             \
    call;                                  \
  }
#define SYMM_CHECKED(name, params, bad, why, call)          \
  int name params {                                         \
    if (forked(#name)) return SYMM_ERR_FORKED;              \
    if (bad) return fail(SYMM_ERR_INVALID, #name ": " why); \
    return call;                                            \
  }

extern "C" {

// ---- the caching pool ----------------------------------------------------------

SYMM_CALL_VOID(symm_pool_init, (int device_count), goPoolInit(device_count, 0))
SYMM_CALL_VOID(symm_pool_set_memory_fraction, (double fraction, int device), goPoolSetMemoryFraction(fraction, device))
SYMM_CALL(int, symm_pool_set_expandable, (int enable), SYMM_ERR_FORKED, goPoolSetExpandable(enable))
SYMM_CALL(int, symm_pool_set_limit, (int device, uint64_t bytes), SYMM_ERR_FORKED, goPoolSetLimit(device, bytes))
SYMM_CALL(int, symm_pool_device_count, (void), -1, goPoolDeviceCount())
SYMM_CHECKED(symm_pool_set_allocator_settings, (const char *settings), settings == nullptr, "settings is NULL",
             goPoolSetAllocatorSettings((char *)settings))
SYMM_CHECKED(symm_pool_memory_fraction, (int device, double *fraction), fraction == nullptr, "fraction is NULL",
             goPoolMemoryFraction(device, fraction))
// Private pools' settings (torch.cuda.MemPool's), export/mempools.go.
SYMM_CALL(int, symm_pool_create_pool, (int device, symm_pool_id_t id, const symm_segment_allocator_t *segs),
          SYMM_ERR_FORKED, goPoolCreatePool(device, id.first, id.second, (symm_segment_allocator_t *)segs))
SYMM_CALL(int, symm_pool_use_count, (int device, symm_pool_id_t id), -1, goPoolUseCount(device, id.first, id.second))
SYMM_CALL(int, symm_pool_set_use_on_oom, (int device, symm_pool_id_t id, int on), SYMM_ERR_FORKED,
          goPoolSetPool(SYMMSHIM_SET_POOL_USE_ON_OOM, device, id.first, id.second, on))
SYMM_CALL(int, symm_pool_set_no_split, (int device, symm_pool_id_t id), SYMM_ERR_FORKED,
          goPoolSetPool(SYMMSHIM_SET_POOL_NO_SPLIT, device, id.first, id.second, 0))
SYMM_CALL(int, symm_pool_empty_pool, (symm_pool_id_t id), SYMM_ERR_FORKED, goPoolEmptyPool(id.first, id.second))
void *symm_driver_proc(const char *name) {
  if (forked("symm_driver_proc")) return nullptr;
  if (name == nullptr) {
    fail(SYMM_ERR_INVALID, "symm_driver_proc: name is NULL");
    return nullptr;
  }
  return goDriverProc((char *)name);
}

void symm_pool_empty_cache(void) {
  if (forked("symm_pool_empty_cache")) return;
  goPoolEmptyCache();
}

void symm_pool_record_stream(void *ptr, void *stream) {
  if (forked("symm_pool_record_stream")) return;
  // The pool has the front cache give its blocks back first
  // (allocator.Pool.RecordStreamBlock).
  uintptr_t base = goPoolRecordStream((uintptr_t)ptr, (uintptr_t)stream);
  // Its next free must reach the pool, which waits for the stream's events.
  if (base != 0 && front::enabled()) front::mark_record_stream(base);
}

int symm_pool_stats(int device, symm_stat_t *out, int cap) {
  if (forked("symm_pool_stats")) return -1;
  if (cap < 0 || (cap > 0 && out == nullptr)) {
    fail(SYMM_ERR_INVALID, "symm_pool_stats: out is NULL or cap is negative");
    return -1;
  }
  return goPoolStats(device, out, cap);
}

int symm_pool_reset_peak(int device) {
  if (forked("symm_pool_reset_peak")) return SYMM_ERR_FORKED;
  return goPoolResetPeak(device);
}

int symm_pool_snapshot(char *buf, size_t cap, size_t *len) {
  if (forked("symm_pool_snapshot")) return SYMM_ERR_FORKED;
  if (len == nullptr) return fail(SYMM_ERR_INVALID, "symm_pool_snapshot: len is NULL");
  return goPoolSnapshot(buf, cap, len);
}

const char *symm_pool_backend(void) {
  if (g_forked) return "";
  switch (goPoolBackend()) {
    case SYMMSHIM_BACKEND_CUDA:
      return "cuda";
    case SYMMSHIM_BACKEND_HOST:
      return "host";
  }
  return "";
}

// ---- symmetric memory ----------------------------------------------------------

void *symm_alloc(size_t size, int device, void *stream) {
  (void)stream;
  if (forked("symm_alloc") || size == 0) return nullptr;
  return (void *)goSymmAlloc(size, device);
}

void symm_free(void *ptr, size_t size, int device, void *stream) {
  (void)size, (void)device, (void)stream;
  if (forked("symm_free") || ptr == nullptr) return;
  goSymmFree((uintptr_t)ptr);
}

// Always 0: libsymm never uses multicast (tests/check_abi.sh checks that no
// multicast entry point is referenced).
int symm_has_multicast_support(int device) {
  (void)device;
  return 0;
}

SYMM_CHECKED(symm_set_backend, (const char *name), name == nullptr, "name is NULL", goSetBackend((char *)name))
SYMM_CHECKED(symm_get_backend, (char *buf, size_t cap), buf == nullptr || cap < 8,
             "buf is NULL or shorter than 8 bytes", goGetBackend(buf, cap))
SYMM_CALL(int, symm_nvshmem_available, (void), 0, goNVSHMEMAvailable())
SYMM_CALL(int, symm_nccl_available, (void), 0, goNCCLAvailable())
SYMM_CALL(int, symm_nccl_adopt_comm, (void *comm, int device), SYMM_ERR_FORKED,
          goNCCLAdoptComm((uintptr_t)comm, device))
SYMM_CHECKED(symm_topology, (const char *lib_dirs, char *buf, size_t cap, size_t *len), len == nullptr,
             "len is NULL", goTopology((char *)lib_dirs, buf, cap, len))
SYMM_CHECKED(symm_add_library_dirs, (const char *dirs), dirs == nullptr, "dirs is NULL",
             goAddLibraryDirs((char *)dirs))

// ---- the store -----------------------------------------------------------------

SYMM_CHECKED(symm_store_server, (const char *addr, const char *token, symm_store_t *out, char *bound, size_t len),
             out == nullptr, "out is NULL",
             goStoreServer((char *)(addr ? addr : ""), (char *)(token ? token : ""), out, bound, len))
SYMM_CHECKED(symm_store_connect, (const char *addr, const char *token, int timeout_ms, symm_store_t *out),
             addr == nullptr || out == nullptr, "addr or out is NULL",
             goStoreConnect((char *)addr, (char *)(token ? token : ""), timeout_ms, out))
SYMM_CHECKED(symm_store_set, (symm_store_t s, const char *key, const void *value, size_t len),
             key == nullptr || (value == nullptr && len > 0), "key or value is NULL",
             goStoreSet(s, (char *)key, (void *)value, len))
SYMM_CHECKED(symm_store_get, (symm_store_t s, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms),
             key == nullptr || len == nullptr || (buf == nullptr && cap > 0), "key, len or buf is NULL",
             goStoreGet(s, (char *)key, buf, cap, len, timeout_ms))
SYMM_CHECKED(symm_store_add, (symm_store_t s, const char *key, int64_t delta, int64_t *out), key == nullptr,
             "key is NULL", goStoreAdd(s, (char *)key, delta, out))
SYMM_CALL(int, symm_store_close, (symm_store_t s), SYMM_ERR_FORKED, goStoreClose(s))

// ---- handles, signals and collectives --------------------------------------------

SYMM_CHECKED(symm_rendezvous,
             (void *ptr, symm_store_t store, const char *group, int rank, int world_size, symm_handle_t *out),
             group == nullptr || out == nullptr, "group or out is NULL",
             goRendezvous((uintptr_t)ptr, store, (char *)group, rank, world_size, out))
SYMM_CALL(int, symm_backend_init, (symm_store_t store, int rank, int world_size, int device), SYMM_ERR_FORKED,
          goBackendInit(store, rank, world_size, device))
SYMM_CHECKED(symm_handle_info, (symm_handle_t h, symm_handle_info_t *out), out == nullptr, "out is NULL",
             goHandleInfo(h, out))
SYMM_CHECKED(symm_world_within_direct_access,
             (symm_store_t store, const char *group, int rank, int world_size, int device, int *out),
             group == nullptr || out == nullptr, "group or out is NULL",
             goWorldWithinDirectAccess(store, (char *)group, rank, world_size, device, out))
// The signals and the collectives without a timeout launch from the
// handle's plan when it has one (plans.h): no Go on the way. Every other
// call, and one the plan passes on, goes through Go.
int symm_put_signal(symm_handle_t h, int dst_rank, int channel, void *stream) {
  if (forked("symm_put_signal")) return SYMM_ERR_FORKED;
  if (libsymm_plan_put(h, dst_rank, channel, stream) == SYMM_PLAN_DONE) return SYMM_OK;
  return goPutSignal(h, dst_rank, channel, (uintptr_t)stream);
}
int symm_wait_signal(symm_handle_t h, int src_rank, int channel, void *stream, int timeout_ms) {
  if (forked("symm_wait_signal")) return SYMM_ERR_FORKED;
  if (timeout_ms == 0 && libsymm_plan_wait(h, src_rank, channel, stream) == SYMM_PLAN_DONE) return SYMM_OK;
  return goWaitSignal(h, src_rank, channel, (uintptr_t)stream, timeout_ms);
}
int symm_barrier(symm_handle_t h, int channel, void *stream, int timeout_ms) {
  if (forked("symm_barrier")) return SYMM_ERR_FORKED;
  if (timeout_ms == 0 && libsymm_plan_barrier(h, channel, stream) == SYMM_PLAN_DONE) return SYMM_OK;
  return goBarrier(h, channel, (uintptr_t)stream, timeout_ms);
}
SYMM_CALL(int, symm_reset_signal_pad, (symm_handle_t h, int timeout_ms), SYMM_ERR_FORKED,
          goResetSignalPad(h, timeout_ms))
SYMM_CALL(int, symm_reset_signal_pad_if_any, (symm_handle_t h, int want, int timeout_ms, int *reset), SYMM_ERR_FORKED,
          goResetSignalPadIfAny(h, want, timeout_ms, reset))
SYMM_CALL(int, symm_kernels_ready, (int device), 0, goKernelsReady(device))
// SYMM_COLLECTIVE defines collective name (kind: SYMM_PLAN_COLL_*), which
// launches from the plan without a timeout and otherwise calls go.
#define SYMM_COLLECTIVE(name, kind, go)                                                                         \
  int name(symm_handle_t h, size_t offset, size_t count, int dtype, int op, void *out, const void *local_input, \
           void *stream, int timeout_ms) {                                                                      \
    if (forked(#name)) return SYMM_ERR_FORKED;                                                                  \
    if (timeout_ms == 0 && libsymm_plan_collective(kind, h, offset, count, dtype, op, (uintptr_t)out,          \
                                                   (uintptr_t)local_input, stream) == SYMM_PLAN_DONE)           \
      return SYMM_OK;                                                                                           \
    return go(h, offset, count, dtype, op, (uintptr_t)out, (uintptr_t)local_input, (uintptr_t)stream, timeout_ms); \
  }
SYMM_COLLECTIVE(symm_one_shot_all_reduce, SYMM_PLAN_COLL_ONE_SHOT, goOneShotAllReduce)
SYMM_COLLECTIVE(symm_two_shot_all_reduce, SYMM_PLAN_COLL_TWO_SHOT, goTwoShotAllReduce)
SYMM_COLLECTIVE(symm_reduce_scatter, SYMM_PLAN_COLL_REDUCE_SCATTER, goReduceScatter)
int symm_all_gather(symm_handle_t h, size_t offset, size_t count, int dtype, void *out, const void *local_input,
                    void *stream, int timeout_ms) {
  if (forked("symm_all_gather")) return SYMM_ERR_FORKED;
  if (timeout_ms == 0 && libsymm_plan_collective(SYMM_PLAN_COLL_ALL_GATHER, h, offset, count, dtype, -1,
                                                 (uintptr_t)out, (uintptr_t)local_input, stream) == SYMM_PLAN_DONE)
    return SYMM_OK;
  return goAllGather(h, offset, count, dtype, (uintptr_t)out, (uintptr_t)local_input, (uintptr_t)stream, timeout_ms);
}
int symm_push_all_reduce(symm_handle_t workspace, const void *in, void *out, size_t count, int dtype, int op,
                         void *stream, int timeout_ms) {
  if (forked("symm_push_all_reduce")) return SYMM_ERR_FORKED;
  if (timeout_ms == 0 && libsymm_plan_push(workspace, (uintptr_t)in, (uintptr_t)out, count, dtype, op, stream) ==
                             SYMM_PLAN_DONE)
    return SYMM_OK;
  return goPushAllReduce(workspace, (uintptr_t)in, (uintptr_t)out, count, dtype, op, (uintptr_t)stream, timeout_ms);
}
SYMM_CHECKED(symm_all_reduce_algorithm,
             (int world_size, size_t nbytes, size_t push_max_bytes, int algorithm, int *chosen), chosen == nullptr,
             "chosen is NULL", goAllReduceAlgorithm(world_size, nbytes, push_max_bytes, algorithm, chosen))
SYMM_CHECKED(symm_all_reduce_setting, (int *algorithm), algorithm == nullptr, "algorithm is NULL",
             goAllReduceSetting(algorithm))
SYMM_CHECKED(symm_push_max_bytes_setting, (size_t *bytes), bytes == nullptr, "bytes is NULL",
             goPushMaxBytesSetting(bytes))
SYMM_CALL(size_t, symm_push_all_reduce_workspace_size, (int world_size, size_t max_bytes), 0,
          goPushWorkspaceSize(world_size, max_bytes))

}  // extern "C"
