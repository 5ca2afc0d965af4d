// Where an allocation goes: a segment of its own (PyTorch's MemPool mode,
// torchmode.cpp), the private pool of a CUDA graph being captured (the
// pool's open routings, asked only while its count of them is not zero),
// the front cache (front.cpp), or the pool. Routes come first: an
// allocation on a capturing stream must never get a block the front cache
// parked for the shared pool. Here too are the calls that open and close
// routes (C functions and PyTorch's C++ graph hooks) and memory history,
// during which the front cache is off.
#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "front.h"
#include "shim_internal.h"

using namespace symmshim;

namespace {
// ---- routes to private pools (CUDA graphs) -------------------------------------
// The pool keeps the open routings and their filters (allocator/routes.go);
// here is only where it counts them, read before each allocation: no
// routing open, nothing else is asked. Before the pool exists it points at
// a zero (symmshim_set_open_routes sets it, before any routing can open).
const uint64_t kNoRoutes = 0;
std::atomic<const uint64_t *> g_open_routes{&kNoRoutes};

inline bool routes_open() {
  return __atomic_load_n(g_open_routes.load(std::memory_order_relaxed), __ATOMIC_ACQUIRE) != 0;
}

using Filter = std::function<bool(CUstream_st *)>;
thread_local std::string t_filter_error;  // what the last filter that threw said

// route calls goPoolRoute: op SYMMSHIM_ROUTE_BEGIN begins a routing (to
// stream's allocations, or to those filter takes: a Filter the pool owns
// from then on, even on error), SYMMSHIM_ROUTE_END ends one,
// SYMMSHIM_ROUTE_RELEASE releases the pool; returns the code.
int route(const char *fn, int op, int dev, unsigned long long first, unsigned long long second, int strict,
          void *stream, Filter *filter) {
  return goPoolRoute((char *)fn, op, dev, first, second, strict, (uintptr_t)stream, (uintptr_t)filter);
}

// History on: every alloc and free reaches the pool so that each is recorded.
std::atomic<int> g_history{0};

// front_in_use says whether the front cache, once on, serves the next
// alloc or free: it has not stepped aside, and memory history is off.
inline bool front_in_use() { return !front::aside() && g_history.load(std::memory_order_relaxed) == 0; }

// front_on says whether an alloc or free goes through the front cache. With
// it off (the default: SYMM_POOL_FRONT_CACHE unset or 0) the first test is
// the only one: one relaxed load and a branch always taken the same way.
inline bool front_on() { return front::enabled() && front_in_use(); }
}  // namespace

void *symmshim::pool_alloc(int api, size_t size, int device, void *stream, int mode) {
  if (forked(symmshim_api_name(api))) return nullptr;
  if (size == 0) return nullptr;
  uint64_t bsize = 0;
  if (mode == kTorchMemPool) {
    // PyTorch's caching allocator asks for a segment: no cache of ours
    // under it, and NULL on failure (PyTorch raises OutOfMemoryError).
    return (void *)goPoolAllocSegment(api, size, device, (uintptr_t)stream, &bsize);
  }
  if (__builtin_expect(routes_open(), 0)) {
    int routed = 0;
    uintptr_t p = goPoolRoutedAlloc(api, size, device, (uintptr_t)stream, &bsize, &routed);
    if (routed) return (void *)p;
  }
  uintptr_t p;
  if (!front::enabled()) {
    p = goPoolAlloc(api, size, device, (uintptr_t)stream, &bsize);
  } else if (front_in_use()) {
    if (uintptr_t hit = front::alloc_hit(size, device, (uintptr_t)stream)) {
      front::count_request(true);
      return (void *)hit;
    }
    p = front::alloc_miss(api, size, device, (uintptr_t)stream);
    front::count_request(false);
  } else {
    p = goPoolAlloc(api, size, device, (uintptr_t)stream, &bsize);
    if (front::aside()) front::count_request(false);  // toward stepping back
  }
  // Out of memory: a use_on_oom pool's free block, if one fits (PyTorch's
  // last resort before it raises; never for a routed allocation).
  if (__builtin_expect(p == 0, 0) && symm_last_error_code() == SYMM_ERR_OUT_OF_MEMORY)
    p = goPoolAllocOnOOM(size, device, (uintptr_t)stream, &bsize);
  return (void *)p;
}

extern "C" {

// The pool's side of routes (export/graphs.go).
void symmshim_set_open_routes(const uint64_t *count) { g_open_routes.store(count, std::memory_order_release); }

int symmshim_filter_call(uintptr_t filter, uintptr_t stream) {
  try {
    return (*reinterpret_cast<Filter *>(filter))(reinterpret_cast<CUstream_st *>(stream)) ? 1 : 0;
  } catch (const std::exception &e) {
    t_filter_error = e.what();
  } catch (...) {
    t_filter_error = "an exception that is not a std::exception";
  }
  return -1;
}

const char *symmshim_filter_error(void) { return t_filter_error.c_str(); }

void symmshim_filter_free(uintptr_t filter) { delete reinterpret_cast<Filter *>(filter); }

void symm_pool_free(void *ptr, size_t size, int device, void *stream) {
  if (forked("symm_pool_free") || ptr == nullptr) return;
  if (front_on() && front::free((uintptr_t)ptr, size, device, (uintptr_t)stream)) return;
  goPoolFree((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

int symm_pool_begin_allocate_to_pool(int device, symm_pool_id_t id, void *stream) {
  if (forked("symm_pool_begin_allocate_to_pool")) return SYMM_ERR_FORKED;
  return route("symm_pool_begin_allocate_to_pool", SYMMSHIM_ROUTE_BEGIN, device, id.first, id.second, 0, stream,
               nullptr);
}

int symm_pool_end_allocate_to_pool(int device, symm_pool_id_t id) {
  if (forked("symm_pool_end_allocate_to_pool")) return SYMM_ERR_FORKED;
  return route("symm_pool_end_allocate_to_pool", SYMMSHIM_ROUTE_END, device, id.first, id.second, 0, nullptr, nullptr);
}

int symm_pool_release_pool(int device, symm_pool_id_t id) {
  if (forked("symm_pool_release_pool")) return SYMM_ERR_FORKED;
  return route("symm_pool_release_pool", SYMMSHIM_ROUTE_RELEASE, device, id.first, id.second, 1, nullptr, nullptr);
}

int symm_pool_record_history(int enabled, size_t max_entries) {
  if (forked("symm_pool_record_history")) return SYMM_ERR_FORKED;
  // While history is on, allocations and frees bypass the front cache and
  // leave its live set alone, so a record made before could describe a
  // block that was freed and handed out again meanwhile (another stream,
  // another size). The live set is emptied at both changes of mode: before
  // history, after the cached blocks went back (they were freed unseen);
  // after it, for calls that were under way as it began. A block allocated
  // before then has no record, and its free goes to the pool, which knows it.
  if (enabled) {
    g_history.store(1);
    if (front::enabled()) {
      front::drain(-1);
      front::forget_all();
    }
  }
  int rc = goPoolRecordHistory(enabled, max_entries);
  if (!enabled || rc != SYMM_OK) {
    if (front::enabled()) {
      front::drain(-1);
      front::forget_all();
    }
    g_history.store(0);
  }
  return rc;
}

}  // extern "C"

// ---- PyTorch's CUDA-graph hooks ------------------------------------------------
// C++ linkage types on C names: PyTorch calls them through std::function
// objects made from these addresses (torch/csrc/cuda/Module.cpp).

using TorchPoolId = std::pair<unsigned long long, unsigned long long>;

extern "C" void symm_torch_begin_allocate_to_pool(int device, TorchPoolId id,
                                                  std::function<bool(CUstream_st *)> filter) {
  if (forked("symm_torch_begin_allocate_to_pool")) throw std::runtime_error(last_error_msg());
  torch_resolve();
  // Called from CUDAGraph::capture_begin, which can report an exception; the
  // capture would otherwise go on without a pool.
  if (route("symm_torch_begin_allocate_to_pool", SYMMSHIM_ROUTE_BEGIN, device, id.first, id.second, 0, nullptr,
            new Filter(std::move(filter))) != SYMM_OK)
    throw std::runtime_error(last_error_msg());
}

extern "C" void symm_torch_end_allocate_to_pool(int device, TorchPoolId id) {
  if (forked("symm_torch_end_allocate_to_pool")) return;
  // Never throws: an error stays in symm_last_error().
  route("symm_torch_end_allocate_to_pool", SYMMSHIM_ROUTE_END, device, id.first, id.second, 0, nullptr, nullptr);
}

extern "C" void symm_torch_release_pool(int device, TorchPoolId id) {
  if (forked("symm_torch_release_pool")) return;
  // Called from CUDAGraph::reset, inside a destructor: never throws.
  route("symm_torch_release_pool", SYMMSHIM_ROUTE_RELEASE, device, id.first, id.second, 0, nullptr, nullptr);
}
