// libsymm's PyTorch extension: what torch.cuda.memory_stats(), cacheInfo
// (cudnn.benchmark) and the per-process memory fraction read, answered from
// libsymm's pool, and PyTorch's allocator settings made at run time, passed
// on to it. Part of _torch_ext.cpp's one translation unit, included
// after SymmAllocator's definition.
#ifndef SYMM_TORCH_EXT_STATS_H
#define SYMM_TORCH_EXT_STATS_H

#include "_torch_ext_api.h"

namespace {

// The DeviceStats field each of libsymm's statistic names fills (PyTorch's
// torch.cuda.memory_stats() keys: family.type.field, then scalars).
struct StatSlot {
  c10::CachingAllocator::Stat *stat = nullptr;  // set with field
  int field = 0;                                  // 0 current, 1 peak, 2 allocated, 3 freed
  int64_t *scalar = nullptr;
};

bool stat_slot(const std::string &name, CCA::DeviceStats &s, StatSlot &out) {
  static const std::pair<const char *, c10::CachingAllocator::StatArray CCA::DeviceStats::*> families[] = {
      {"allocation", &CCA::DeviceStats::allocation},
      {"segment", &CCA::DeviceStats::segment},
      {"active", &CCA::DeviceStats::active},
      {"inactive_split", &CCA::DeviceStats::inactive_split},
      {"allocated_bytes", &CCA::DeviceStats::allocated_bytes},
      {"reserved_bytes", &CCA::DeviceStats::reserved_bytes},
      {"active_bytes", &CCA::DeviceStats::active_bytes},
      {"inactive_split_bytes", &CCA::DeviceStats::inactive_split_bytes},
      {"requested_bytes", &CCA::DeviceStats::requested_bytes},
  };
  static const char *types[] = {"all", "small_pool", "large_pool"};
  static const char *fields[] = {"current", "peak", "allocated", "freed"};
  auto field_of = [](const std::string &f) {
    for (int i = 0; i < 4; i++)
      if (f == fields[i]) return i;
    return -1;
  };
  size_t dot = name.rfind('.');
  if (dot == std::string::npos) {
    static const std::pair<const char *, int64_t CCA::DeviceStats::*> scalars[] = {
        {"num_alloc_retries", &CCA::DeviceStats::num_alloc_retries},
        {"num_ooms", &CCA::DeviceStats::num_ooms},
        {"num_sync_all_streams", &CCA::DeviceStats::num_sync_all_streams},
        {"num_device_alloc", &CCA::DeviceStats::num_device_alloc},
        {"num_device_free", &CCA::DeviceStats::num_device_free},
        {"max_split_size", &CCA::DeviceStats::max_split_size},
    };
    for (auto &sc : scalars)
      if (name == sc.first) {
        out.scalar = &(s.*(sc.second));
        return true;
      }
    return false;
  }
  int field = field_of(name.substr(dot + 1));
  if (field < 0) return false;
  std::string head = name.substr(0, dot);
  if (head == "oversize_allocations" || head == "oversize_segments") {
    out.stat = head == "oversize_allocations" ? &s.oversize_allocations : &s.oversize_segments;
    out.field = field;
    return true;
  }
  size_t dot2 = head.rfind('.');
  if (dot2 == std::string::npos) return false;
  std::string fam = head.substr(0, dot2), type = head.substr(dot2 + 1);
  for (auto &f : families) {
    if (fam != f.first) continue;
    for (int t = 0; t < 3; t++)
      if (type == types[t]) {
        out.stat = &(s.*(f.second))[t];
        out.field = field;
        return true;
      }
  }
  return false;
}

// ---- statistics ----------------------------------------------------------------
c10::CachingDeviceAllocator::DeviceStats SymmAllocator::getDeviceStats(c10::DeviceIndex device) {
  CCA::DeviceStats s;
  int n = g_api.stats(device, nullptr, 0);
  if (n < 0) check(SYMM_ERR_INVALID, "memory_stats");
  std::vector<symm_stat_t> v(static_cast<size_t>(n));
  n = g_api.stats(device, v.data(), n);
  if (n < 0) check(SYMM_ERR_INVALID, "memory_stats");
  for (int i = 0; i < n && i < static_cast<int>(v.size()); i++) {
    StatSlot slot;
    if (v[i].name == nullptr || !stat_slot(v[i].name, s, slot)) continue;  // a newer libsymm's extra stat
    if (slot.scalar != nullptr) {
      *slot.scalar = v[i].value;
    } else {
      int64_t *f[] = {&slot.stat->current, &slot.stat->peak, &slot.stat->allocated, &slot.stat->freed};
      *f[slot.field] = v[i].value;
    }
  }
  return s;
}

void SymmAllocator::resetPeakStats(c10::DeviceIndex device) { check(g_api.reset_peak(device), "reset_peak_memory_stats"); }

void SymmAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check(SYMM_NEED(reset_accumulated)(device), "reset_accumulated_memory_stats");
}

// PyTorch's contract (cudnn sizes its workspace by it): a zero
// *largestBlock starts from the device's free memory, then it is raised to
// the largest free block the pool caches.
void SymmAllocator::cacheInfo(c10::DeviceIndex device, size_t *largestBlock) {
  TORCH_CHECK(largestBlock != nullptr, "libsymm: cacheInfo: largestBlock is NULL");
  if (*largestBlock == 0) {
    c10::cuda::CUDAGuard guard(device);
    size_t total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(largestBlock, &total));
  }
  size_t largest = 0;
  check(SYMM_NEED(cache_info)(device, &largest), "cacheInfo");
  if (largest > *largestBlock) *largestBlock = largest;
}

// ---- memory fraction -----------------------------------------------------------
// libsymm keeps it (symm_pool_memory_fraction): set here, by
// per_process_memory_fraction in PyTorch's settings, or by C callers.
double SymmAllocator::getMemoryFraction(c10::DeviceIndex device) {
  double f = 1.0;
  check(g_api.memory_fraction(device, &f), "get_per_process_memory_fraction");
  return f;
}

void SymmAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  g_api.clear_error();
  g_api.set_fraction(fraction, device);
  if (g_api.last_error_code() != SYMM_OK) TORCH_CHECK(false, "libsymm: set_per_process_memory_fraction: ", last_error());
}

double SymmAllocator::fraction_of(int dev) {
  double f = 1.0;
  return g_api.memory_fraction(dev, &f) == SYMM_OK ? f : 1.0;
}

// ---- allocator settings at run time ---------------------------------------------
// torch 2.11 has no allocator method for them: torch._C._accelerator_setAllocatorSettings
// (and torch.cuda.memory._set_allocator_settings) parse the text
// (c10::CachingAllocator::setAllocatorSettings) and call the one device
// parser hook, CUDA's (CUDAAllocatorConfig::parseArgs). The hook is wrapped
// once: PyTorch's parse runs first, so a text PyTorch refuses raises as
// before and never reaches libsymm; then, while libsymm is PyTorch's
// allocator, libsymm applies the same text to what comes next, and raises
// only for a text it refuses (symm_pool_set_allocator_settings says why).
void forward_settings() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto &hook = c10::CachingAllocator::AcceleratorAllocatorConfig::getConfigParserHook();
    hook = [prev = std::move(hook)](const std::string &env) {
      if (prev) prev(env);
      if (g_api.torch_mode() != kTorchReplace) return;  // PyTorch's allocator is current: its settings
      g_api.clear_error();
      int rc = g_api.set_settings(env.c_str());
      if (rc == SYMM_ERR_INVALID) TORCH_CHECK_VALUE(false, "libsymm: allocator settings \"", env, "\": ", last_error());
      TORCH_CHECK(rc == SYMM_OK, "libsymm: allocator settings \"", env, "\": ", last_error());
    };
  });
}

}  // namespace

#endif  // SYMM_TORCH_EXT_STATS_H
