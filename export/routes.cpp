// Where an allocation goes: a segment of its own (PyTorch's MemPool mode,
// torchmode.cpp), the private pool of a CUDA graph being captured (the route
// table), the front cache (front.cpp), or the pool. Routes come first: an
// allocation on a capturing stream must never get a block the front cache
// parked for the shared pool. Here too are the calls that open and close
// routes (C functions and PyTorch's C++ graph hooks) and memory history,
// during which the front cache is off.
#include <atomic>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "front.h"
#include "shim_internal.h"

using namespace symmshim;

namespace {
// ---- routes to private pools (CUDA graphs) -------------------------------------
struct Route {
  int dev;
  unsigned long long first, second;
  bool by_stream;  // C API: one stream; PyTorch: its filter
  uintptr_t stream;
  std::function<bool(CUstream_st *)> filter;
};
std::mutex g_routes_mu;
std::vector<Route> g_routes;        // under g_routes_mu, newest last
std::atomic<int> g_nroutes{0};      // g_routes.size(), read without the lock

// route_for finds the newest route of device that accepts stream.
bool route_for(int dev, uintptr_t stream, unsigned long long *first, unsigned long long *second) {
  std::lock_guard<std::mutex> g(g_routes_mu);
  for (auto it = g_routes.rbegin(); it != g_routes.rend(); ++it) {
    if (it->dev != dev) continue;
    bool ok = it->by_stream ? it->stream == stream : (it->filter && it->filter((CUstream_st *)stream));
    if (ok) {
      *first = it->first;
      *second = it->second;
      return true;
    }
  }
  return false;
}

// drop_routes forgets the newest route to the pool, or all of them.
void drop_routes(int dev, unsigned long long first, unsigned long long second, bool all) {
  std::lock_guard<std::mutex> g(g_routes_mu);
  for (size_t i = g_routes.size(); i-- > 0;) {
    Route &r = g_routes[i];
    if (r.dev == dev && r.first == first && r.second == second) {
      g_routes.erase(g_routes.begin() + (long)i);
      if (!all) break;
    }
  }
  g_nroutes.store((int)g_routes.size(), std::memory_order_release);
}

// begin_route opens a route to pool (first, second) in the pool (fn names the
// caller in errors) and then here; returns the code.
int begin_route(const char *fn, Route r) {
  std::lock_guard<std::mutex> g(g_routes_mu);
  int rc = goPoolRoute((char *)fn, 0, r.dev, r.first, r.second, 0, nullptr);
  if (rc != SYMM_OK) return rc;
  g_routes.push_back(std::move(r));
  g_nroutes.store((int)g_routes.size(), std::memory_order_release);
  return SYMM_OK;
}

// end_route closes the newest route to the pool; returns the code.
int end_route(const char *fn, int dev, unsigned long long first, unsigned long long second) {
  int rc = goPoolRoute((char *)fn, 1, dev, first, second, 0, nullptr);
  if (rc == SYMM_OK) drop_routes(dev, first, second, false);
  return rc;
}

// release_route drops a use of the pool, and its routes if the release
// ended its routing; returns the code.
int release_route(const char *fn, int dev, unsigned long long first, unsigned long long second, bool strict) {
  int dropped = 0;
  int rc = goPoolRoute((char *)fn, 2, dev, first, second, strict, &dropped);
  if (rc == SYMM_OK && dropped) drop_routes(dev, first, second, true);
  return rc;
}

// History on: every alloc and free reaches the pool so that each is recorded.
std::atomic<int> g_history{0};

inline bool front_on() { return front::enabled() && g_history.load(std::memory_order_relaxed) == 0; }

// By api (kApiAlloc, kApiTryAlloc).
const char *const kApiNames[] = {"symm_pool_alloc", "symm_pool_try_alloc"};
}  // namespace

void *symmshim::pool_alloc(int api, size_t size, int device, void *stream, int mode) {
  if (forked(kApiNames[api])) return nullptr;
  if (size == 0) return nullptr;
  uint64_t bsize = 0;
  unsigned long long first, second;
  if (mode == kTorchMemPool) {
    // PyTorch's caching allocator asks for a segment: no cache of ours
    // under it, and NULL on failure (PyTorch raises OutOfMemoryError).
    return (void *)goPoolAllocSegment(api, size, device, (uintptr_t)stream, &bsize);
  }
  if (__builtin_expect(g_nroutes.load(std::memory_order_acquire) > 0, 0) &&
      route_for(device, (uintptr_t)stream, &first, &second)) {
    return (void *)goPoolAllocIn(api, size, device, (uintptr_t)stream, first, second, &bsize);
  }
  if (front_on()) {
    if (uintptr_t hit = front::alloc_hit(size, device, (uintptr_t)stream)) return (void *)hit;
    return (void *)front::alloc_miss(api, size, device, (uintptr_t)stream);
  }
  return (void *)goPoolAlloc(api, size, device, (uintptr_t)stream, &bsize);
}

extern "C" {

void symm_pool_free(void *ptr, size_t size, int device, void *stream) {
  if (forked("symm_pool_free") || ptr == nullptr) return;
  if (front_on() && front::free((uintptr_t)ptr, size, device, (uintptr_t)stream)) return;
  goPoolFree((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

int symm_pool_begin_allocate_to_pool(int device, symm_pool_id_t id, void *stream) {
  if (forked("symm_pool_begin_allocate_to_pool")) return SYMM_ERR_FORKED;
  return begin_route("symm_pool_begin_allocate_to_pool",
                     Route{device, id.first, id.second, true, (uintptr_t)stream, nullptr});
}

int symm_pool_end_allocate_to_pool(int device, symm_pool_id_t id) {
  if (forked("symm_pool_end_allocate_to_pool")) return SYMM_ERR_FORKED;
  return end_route("symm_pool_end_allocate_to_pool", device, id.first, id.second);
}

int symm_pool_release_pool(int device, symm_pool_id_t id) {
  if (forked("symm_pool_release_pool")) return SYMM_ERR_FORKED;
  return release_route("symm_pool_release_pool", device, id.first, id.second, true);
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
  if (begin_route("symm_torch_begin_allocate_to_pool",
                  Route{device, id.first, id.second, false, 0, std::move(filter)}) != SYMM_OK)
    throw std::runtime_error(last_error_msg());
}

extern "C" void symm_torch_end_allocate_to_pool(int device, TorchPoolId id) {
  if (forked("symm_torch_end_allocate_to_pool")) return;
  // Never throws: an error stays in symm_last_error().
  end_route("symm_torch_end_allocate_to_pool", device, id.first, id.second);
}

extern "C" void symm_torch_release_pool(int device, TorchPoolId id) {
  if (forked("symm_torch_release_pool")) return;
  // Called from CUDAGraph::reset, inside a destructor: never throws.
  release_route("symm_torch_release_pool", device, id.first, id.second, false);
}
