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
//
// SYMM_EXT_API lists them once: X(field, symbol, required). A field's type is
// decltype(&::symbol), the prototype of include/symm.h (the one place a
// prototype lives; a changed signature changes the field and fails to compile
// where the field is called wrongly). required: load_api refuses a libsymm
// without it; the others (functions newer libsymms added) stay NULL when
// missing, are listed in g_missing, and a caller takes them through SYMM_NEED.
#define SYMM_EXT_API(X)                                                \
  X(alloc, symm_pool_alloc, true) /* only compared: wraps_libsymm */   \
  X(try_alloc, symm_pool_try_alloc, true)                              \
  X(free, symm_pool_free, true)                                        \
  X(torch_init, symm_torch_init, true)                                 \
  X(empty_cache, symm_pool_empty_cache, true)                          \
  X(set_fraction, symm_pool_set_memory_fraction, true)                 \
  X(record_stream, symm_pool_record_stream, true)                      \
  X(stats, symm_pool_stats, true)                                      \
  X(reset_peak, symm_pool_reset_peak, true)                            \
  X(record_history, symm_pool_record_history, true)                    \
  X(last_error, symm_last_error, true)                                 \
  X(last_error_code, symm_last_error_code, true)                       \
  X(clear_error, symm_clear_error, true)                               \
  X(begin_pool, symm_torch_begin_allocate_to_pool, true)               \
  X(end_pool, symm_torch_end_allocate_to_pool, true)                   \
  X(release_pool, symm_torch_release_pool, true)                       \
  X(torch_mode, symm_torch_mode, true)                                 \
  X(own_allocator, symm_torch_own_allocator, true)                     \
  X(memory_fraction, symm_pool_memory_fraction, true)                  \
  X(set_settings, symm_pool_set_allocator_settings, true)              \
  X(driver_proc, symm_driver_proc, true)                               \
  X(alloc_segment, symm_pool_alloc_segment, false)                     \
  X(create_pool, symm_pool_create_pool, false)                         \
  X(use_count, symm_pool_use_count, false)                             \
  X(set_use_on_oom, symm_pool_set_use_on_oom, false)                   \
  X(set_no_split, symm_pool_set_no_split, false)                       \
  X(empty_pool, symm_pool_empty_pool, false)                           \
  X(reset_accumulated, symm_pool_reset_accumulated, false)             \
  X(cache_info, symm_pool_cache_info, false)                           \
  X(segment_of, symm_pool_segment_of, false)                           \
  X(segment_chunk, symm_pool_segment_chunk, false)                     \
  X(chunk_at, symm_pool_chunk_at, false)                               \
  X(set_annotation, symm_pool_set_annotation, false)                   \
  X(block_of, symm_pool_block_of, false)                               \
  X(blocks, symm_pool_blocks, false)                                   \
  X(restore_blocks, symm_pool_restore_blocks, false)                   \
  X(snapshot_list, symm_pool_snapshot_list, false)                     \
  X(settings, symm_pool_settings, false)                               \
  X(device_count, symm_pool_device_count, false)                       \
  X(set_segment_hook, symm_pool_set_segment_hook, false)

struct Api {
#define SYMM_EXT_FIELD(field, symbol, required) decltype(&::symbol) field = nullptr;
  SYMM_EXT_API(SYMM_EXT_FIELD)
#undef SYMM_EXT_FIELD
};

// ApiName::field is the symbol behind Api::field, for messages (SYMM_NEED).
struct ApiName {
#define SYMM_EXT_NAME(field, symbol, required) static constexpr const char *field = #symbol;
  SYMM_EXT_API(SYMM_EXT_NAME)
#undef SYMM_EXT_NAME
};

Api g_api;
constexpr int kTorchReplace = SYMM_TORCH_REPLACE;  // symm_torch_mode(): libsymm is PyTorch's current allocator
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
#define SYMM_EXT_RESOLVE(field, symbol, required) resolve(h, #symbol, g_api.field, required);
  SYMM_EXT_API(SYMM_EXT_RESOLVE)
#undef SYMM_EXT_RESOLVE
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

// SYMM_NEED(field) is the function of Api::field, or a c10::Error naming its
// symbol when this libsymm lacks it (an optional function of SYMM_EXT_API).
#define SYMM_NEED(field) need(g_api.field, ApiName::field)

symm_pool_id_t pool_id(MempoolId_t id) { return symm_pool_id_t{id.first, id.second}; }

std::string fmt(uint64_t n) { return c10::CachingAllocator::format_size(n); }

}  // namespace

#endif  // SYMM_TORCH_EXT_API_H
