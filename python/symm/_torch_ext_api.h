// libsymm's PyTorch extension, the part every other file uses: the headers,
// the names, libsymm's function table (found with dlsym in the copy Python's
// ctypes loaded) and the helpers that turn a failed libsymm call into a
// c10::Error. _torch_ext.cpp includes it first; the extension is one
// translation unit (_torch_ext.cpp and the _torch_ext_*.h beside it), so the
// definitions here (g_api) are that unit's alone.
#ifndef SYMM_TORCH_EXT_API_H
#define SYMM_TORCH_EXT_API_H

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "symm.h"

namespace py = pybind11;
using c10::cuda::MempoolId_t;
namespace CCA = c10::cuda::CUDACachingAllocator;
using CCA::TraceEntry;

namespace {

// ---- libsymm's functions, from the copy already loaded ------------------------
struct Api {
  void *(*alloc)(size_t, int, void *) = nullptr;  // only compared (wraps_libsymm)
  void *(*try_alloc)(size_t, int, void *) = nullptr;
  void *(*alloc_segment)(size_t, int, void *) = nullptr;
  void (*free)(void *, size_t, int, void *) = nullptr;
  void (*torch_init)(int) = nullptr;
  void (*empty_cache)(void) = nullptr;
  void (*set_fraction)(double, int) = nullptr;
  void (*record_stream)(void *, void *) = nullptr;
  int (*stats)(int, symm_stat_t *, int) = nullptr;
  int (*reset_peak)(int) = nullptr;
  int (*reset_accumulated)(int) = nullptr;
  int (*cache_info)(int, size_t *) = nullptr;
  int (*segment_of)(const void *, uint64_t *, uint64_t *, int *) = nullptr;
  int (*segment_chunk)(const void *, uint64_t *) = nullptr;
  int (*block_of)(const void *, uint64_t *, uint64_t *) = nullptr;
  int (*record_history)(int, size_t) = nullptr;
  int (*set_annotation)(const char *, const char *) = nullptr;
  int (*snapshot_list)(symm_segment_info_t *, int *, symm_block_info_t *, int *, symm_trace_entry_t *, int *) = nullptr;
  int (*settings)(symm_pool_settings_t *) = nullptr;
  int (*device_count)(void) = nullptr;
  int (*set_segment_hook)(symm_segment_hook_fn, void *) = nullptr;
  int (*blocks)(int, symm_pool_id_t, symm_block_info_t *, int) = nullptr;
  int (*restore_blocks)(int, symm_pool_id_t, const symm_block_info_t *, int, uint64_t *, int *, uint64_t *,
                        int *) = nullptr;
  const char *(*last_error)(void) = nullptr;
  int (*last_error_code)(void) = nullptr;
  void (*clear_error)(void) = nullptr;
  using PoolId = std::pair<unsigned long long, unsigned long long>;
  void (*begin_pool)(int, PoolId, std::function<bool(CUstream_st *)>) = nullptr;
  void (*end_pool)(int, PoolId) = nullptr;
  void (*release_pool)(int, PoolId) = nullptr;
  int (*create_pool)(int, symm_pool_id_t, const symm_segment_allocator_t *) = nullptr;
  int (*use_count)(int, symm_pool_id_t) = nullptr;
  int (*set_use_on_oom)(int, symm_pool_id_t, int) = nullptr;
  int (*set_no_split)(int, symm_pool_id_t) = nullptr;
  int (*empty_pool)(symm_pool_id_t) = nullptr;
  int (*torch_mode)(void) = nullptr;
  void (*own_allocator)(const void *) = nullptr;
  int (*memory_fraction)(int, double *) = nullptr;
  int (*set_settings)(const char *) = nullptr;
  void *(*driver_proc)(const char *) = nullptr;
};

Api g_api;
constexpr int kTorchReplace = 1;  // symm_torch_mode(): libsymm is PyTorch's current allocator
std::string g_missing;  // optional functions this libsymm lacks, for messages

template <typename F>
void resolve(void *h, const char *name, F &fn, bool required) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (fn == nullptr) {
    TORCH_CHECK(!required, "libsymm has no ", name, " (an older libsymm.so than the symm package?)");
    if (!g_missing.empty()) g_missing += ", ";
    g_missing += name;
  }
}

void load_api(const std::string &path) {
  // RTLD_NOLOAD: Python's ctypes has loaded it (RTLD_GLOBAL | RTLD_NODELETE);
  // never a second copy.
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(h != nullptr, "libsymm is not loaded from ", path, ": ", dlerror());
  g_api = Api{};
  g_missing.clear();
  resolve(h, "symm_pool_alloc", g_api.alloc, true);
  resolve(h, "symm_pool_try_alloc", g_api.try_alloc, true);
  resolve(h, "symm_pool_free", g_api.free, true);
  resolve(h, "symm_torch_init", g_api.torch_init, true);
  resolve(h, "symm_pool_empty_cache", g_api.empty_cache, true);
  resolve(h, "symm_pool_set_memory_fraction", g_api.set_fraction, true);
  resolve(h, "symm_pool_record_stream", g_api.record_stream, true);
  resolve(h, "symm_pool_stats", g_api.stats, true);
  resolve(h, "symm_pool_reset_peak", g_api.reset_peak, true);
  resolve(h, "symm_pool_record_history", g_api.record_history, true);
  resolve(h, "symm_last_error", g_api.last_error, true);
  resolve(h, "symm_last_error_code", g_api.last_error_code, true);
  resolve(h, "symm_clear_error", g_api.clear_error, true);
  resolve(h, "symm_torch_begin_allocate_to_pool", g_api.begin_pool, true);
  resolve(h, "symm_torch_end_allocate_to_pool", g_api.end_pool, true);
  resolve(h, "symm_torch_release_pool", g_api.release_pool, true);
  resolve(h, "symm_torch_mode", g_api.torch_mode, true);
  resolve(h, "symm_torch_own_allocator", g_api.own_allocator, true);
  resolve(h, "symm_pool_memory_fraction", g_api.memory_fraction, true);
  resolve(h, "symm_pool_set_allocator_settings", g_api.set_settings, true);
  resolve(h, "symm_driver_proc", g_api.driver_proc, true);
  resolve(h, "symm_pool_alloc_segment", g_api.alloc_segment, false);
  resolve(h, "symm_pool_create_pool", g_api.create_pool, false);
  resolve(h, "symm_pool_use_count", g_api.use_count, false);
  resolve(h, "symm_pool_set_use_on_oom", g_api.set_use_on_oom, false);
  resolve(h, "symm_pool_set_no_split", g_api.set_no_split, false);
  resolve(h, "symm_pool_empty_pool", g_api.empty_pool, false);
  resolve(h, "symm_pool_reset_accumulated", g_api.reset_accumulated, false);
  resolve(h, "symm_pool_cache_info", g_api.cache_info, false);
  resolve(h, "symm_pool_segment_of", g_api.segment_of, false);
  resolve(h, "symm_pool_segment_chunk", g_api.segment_chunk, false);
  resolve(h, "symm_pool_set_annotation", g_api.set_annotation, false);
  resolve(h, "symm_pool_block_of", g_api.block_of, false);
  resolve(h, "symm_pool_blocks", g_api.blocks, false);
  resolve(h, "symm_pool_restore_blocks", g_api.restore_blocks, false);
  resolve(h, "symm_pool_snapshot_list", g_api.snapshot_list, false);
  resolve(h, "symm_pool_settings", g_api.settings, false);
  resolve(h, "symm_pool_device_count", g_api.device_count, false);
  resolve(h, "symm_pool_set_segment_hook", g_api.set_segment_hook, false);
  // The handle stays open: the library never unloads (RTLD_NODELETE).
}

std::string last_error() {
  const char *m = g_api.last_error();
  return m != nullptr ? m : "";
}

// check turns a failed libsymm call (rc != SYMM_OK) into a c10::Error naming it.
void check(int rc, const char *what) {
  if (rc != SYMM_OK) TORCH_CHECK(false, "libsymm: ", what, ": ", last_error(), " (code ", rc, ")");
}

template <typename F>
F need(F fn, const char *name) {
  TORCH_CHECK(fn != nullptr, "libsymm: this libsymm.so has no ", name, "; rebuild it with the symm package's version");
  return fn;
}

symm_pool_id_t pool_id(MempoolId_t id) { return symm_pool_id_t{id.first, id.second}; }

std::string fmt(uint64_t n) { return c10::CachingAllocator::format_size(n); }

}  // namespace

#endif  // SYMM_TORCH_EXT_API_H
