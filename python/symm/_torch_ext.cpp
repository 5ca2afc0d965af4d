// libsymm's PyTorch extension: a subclass of torch's CUDAPluggableAllocator
// that answers, from libsymm's pool, every call the plain pluggable class
// refuses ("does not yet support ..."): memory statistics, cacheInfo
// (cudnn.benchmark), OutOfMemoryError and its observers, memory history and
// snapshots with Python stacks, the checks and checkpoints of CUDA-graph
// trees (torch.compile mode="reduce-overhead"), and CUDA IPC for
// torch.multiprocessing.
//
// Built against the user's torch at first use (python/symm/_torch_ext.py),
// loaded as a Python module; libsymm itself is never linked: its functions
// are found with dlsym in the copy Python's ctypes already loaded, so there
// is one Go runtime and one pool in the process.
//
// Invariants:
//  - Nothing here calls into Go while holding mu_ (a Go call can take
//    milliseconds: a driver allocation, an empty_cache).
//  - A C++ exception is thrown only from code PyTorch calls (its allocator
//    interface); nothing here is called by ctypes.
//  - No table of pointers here: libsymm's pool knows every block it handed
//    out (and its front cache the device, stream and size of each). A
//    tensor's free, and raw_delete, are one call into libsymm with the
//    pointer alone (size 0: unchecked; device -1: libsymm finds it).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "symm.h"
#include "_torch_ext_ipc.h"

namespace py = pybind11;
using c10::cuda::MempoolId_t;
namespace CCA = c10::cuda::CUDACachingAllocator;
using CCA::TraceEntry;

namespace {

// ---- libsymm's functions, from the copy already loaded ------------------------
struct Api {
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
  int (*block_of)(const void *, uint64_t *, uint64_t *) = nullptr;
  int (*record_history)(int, size_t) = nullptr;
  int (*snapshot)(char *, size_t, size_t *) = nullptr;
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
};

Api g_api;
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
  resolve(h, "symm_pool_try_alloc", g_api.try_alloc, true);
  resolve(h, "symm_pool_free", g_api.free, true);
  resolve(h, "symm_torch_init", g_api.torch_init, true);
  resolve(h, "symm_pool_empty_cache", g_api.empty_cache, true);
  resolve(h, "symm_pool_set_memory_fraction", g_api.set_fraction, true);
  resolve(h, "symm_pool_record_stream", g_api.record_stream, true);
  resolve(h, "symm_pool_stats", g_api.stats, true);
  resolve(h, "symm_pool_reset_peak", g_api.reset_peak, true);
  resolve(h, "symm_pool_record_history", g_api.record_history, true);
  resolve(h, "symm_pool_snapshot", g_api.snapshot, true);
  resolve(h, "symm_last_error", g_api.last_error, true);
  resolve(h, "symm_last_error_code", g_api.last_error_code, true);
  resolve(h, "symm_clear_error", g_api.clear_error, true);
  resolve(h, "symm_torch_begin_allocate_to_pool", g_api.begin_pool, true);
  resolve(h, "symm_torch_end_allocate_to_pool", g_api.end_pool, true);
  resolve(h, "symm_torch_release_pool", g_api.release_pool, true);
  resolve(h, "symm_pool_alloc_segment", g_api.alloc_segment, false);
  resolve(h, "symm_pool_reset_accumulated", g_api.reset_accumulated, false);
  resolve(h, "symm_pool_cache_info", g_api.cache_info, false);
  resolve(h, "symm_pool_segment_of", g_api.segment_of, false);
  resolve(h, "symm_pool_block_of", g_api.block_of, false);
  resolve(h, "symm_pool_blocks", g_api.blocks, false);
  resolve(h, "symm_pool_restore_blocks", g_api.restore_blocks, false);
  // The handle stays open: the library never unloads (RTLD_NODELETE).
}

// ---- the CUDA driver's VMM calls (expandable segments' IPC) -------------------
// Taken from the libcuda.so.1 PyTorch has loaded; missing ones make only the
// expandable-segment sharing fail, with a message.
struct Driver {
  CUresult (*retain)(CUmemGenericAllocationHandle *, void *) = nullptr;
  CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*addr_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = nullptr;
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) = nullptr;
  std::string missing;
};

const Driver &driver() {
  static const Driver d = [] {
    Driver x;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) {
      x.missing = "libcuda.so.1 is not loaded";
      return x;
    }
    auto get = [&](const char *name, auto &fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (fn == nullptr) x.missing += std::string(x.missing.empty() ? "" : ", ") + name;
    };
    get("cuMemRetainAllocationHandle", x.retain);
    get("cuMemExportToShareableHandle", x.export_fd);
    get("cuMemImportFromShareableHandle", x.import_fd);
    get("cuMemRelease", x.release);
    get("cuMemAddressReserve", x.reserve);
    get("cuMemAddressFree", x.addr_free);
    get("cuMemMap", x.map);
    get("cuMemUnmap", x.unmap);
    get("cuMemSetAccess", x.set_access);
    get("cuMemGetAllocationGranularity", x.granularity);
    return x;
  }();
  TORCH_CHECK(d.missing.empty(), "libsymm: CUDA IPC of expandable segments needs the driver's ", d.missing);
  return d;
}

void drv_check(CUresult r, const char *what) {
  TORCH_CHECK(r == CUDA_SUCCESS, "libsymm: ", what, " failed: CUresult ", static_cast<int>(r));
}

// The chunk size of VMM allocations made for sharing by POSIX descriptor on dev.
size_t vmm_granularity(const Driver &d, int dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  drv_check(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  return g;
}

// PyTorch's header of a shared expandable segment and its parsing:
// _torch_ext_ipc.h (pure, tested without torch by tests/c/test_torch_ext_ipc.cpp).
using symm_ipc::ShareHeader;

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

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

// A private pool's blocks at the end of a graph recording
// (getCheckpointState), to be restored when a cudagraph tree's path diverges.
struct PoolState : CCA::AllocatorState {
  c10::DeviceIndex device;
  MempoolId_t id;
  std::vector<symm_block_info_t> blocks;
};

std::string fmt(uint64_t n) { return c10::CachingAllocator::format_size(n); }

class SymmAllocator;
SymmAllocator *g_self = nullptr;  // the process's allocator (make_allocator), for the tensors' deleter; never reset

class SymmAllocator : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
  using Base = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

 public:
  SymmAllocator()
      : Base([this](size_t size, int dev, cudaStream_t s) { return alloc(size, dev, s); },
             [this](void *p, size_t size, int dev, cudaStream_t s) { release(p, size, dev, s); }) {}

  std::string name() override { return "symm"; }

  // ---- PyTorch's entry points ----------------------------------------------------
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
    return tensor_ptr(alloc(size, device, stream), device);
  }

  void *raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc(nbytes, device, c10::cuda::getCurrentCUDAStream(device));
  }

  void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return alloc(nbytes, device, stream);
  }

  // PyTorch gives only the pointer: libsymm finds the block (device -1). A
  // pointer libsymm did not hand out is refused, as PyTorch's allocator
  // refuses it.
  void raw_delete(void *ptr) override {
    if (ptr == nullptr) return;
    g_api.clear_error();
    release(ptr, 0, -1, nullptr);
    TORCH_CHECK(g_api.last_error_code() == SYMM_OK, "libsymm: raw_delete of ", ptr, ": ", last_error());
  }

  // A tensor's DataPtr: its context is the pointer (PyTorch requires it:
  // c10::Allocator::raw_allocate), its deleter raw_deleter's, which PyTorch
  // compares (CUDA-graph trees' _has_Standard_Deleter). The deleter frees by
  // pointer alone: libsymm's front cache keeps each block's device and
  // stream, and the pool finds it otherwise.
  static c10::DataPtr tensor_ptr(void *p, c10::DeviceIndex device) {
    return {p, p, &delete_tensor, c10::Device(c10::DeviceType::CUDA, device)};
  }
  static void delete_tensor(void *p) { g_self->release(p, 0, -1, nullptr); }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_tensor; }

  // ---- the functors ----------------------------------------------------------
  void *alloc(size_t size, int dev, cudaStream_t stream) {
    if (size == 0) return nullptr;  // PyTorch's empty tensors: no pointer
    // Replace mode when this object is PyTorch's current allocator; otherwise
    // a torch.cuda.MemPool asks for segments, which go back to the device
    // when PyTorch frees them (PyTorch caches above).
    bool replace = CCA::allocator.load() == this;
    void *p = replace ? g_api.try_alloc(size, dev, stream)
                      : need(g_api.alloc_segment, "symm_pool_alloc_segment")(size, dev, stream);
    if (p != nullptr) {
      if (recording_.load(std::memory_order_relaxed)) remember_alloc(p, dev);
      return p;
    }
    if (!replace) return nullptr;  // PyTorch raises OutOfMemoryError after its own retry
    raise_alloc_failure(size, dev);
    return nullptr;  // not reached
  }

  void release(void *p, size_t size, int dev, cudaStream_t stream) {
    if (p == nullptr) return;
    if (recording_.load(std::memory_order_relaxed)) remember_free(p, dev >= 0 ? dev : device_of(p));
    if (__builtin_expect(any_shared_.load(std::memory_order_acquire), 0)) unshare(p);
    g_api.free(p, size, dev, stream);
  }

  [[noreturn]] void raise_alloc_failure(size_t size, int dev) {
    int code = g_api.last_error_code();
    std::string why = last_error();
    if (code != SYMM_ERR_OUT_OF_MEMORY) {
      TORCH_CHECK(false, "libsymm could not allocate ", fmt(size), " on CUDA device ", dev, ": ", why);
    }
    size_t dev_free = 0, dev_total = 0;
    try {
      auto info = getMemoryInfo(static_cast<c10::DeviceIndex>(dev));
      dev_free = info.first;
      dev_total = info.second;
    } catch (...) {
      // The message goes out without the device's figures.
    }
    int64_t allocated = 0, reserved = 0;
    try {
      auto st = getDeviceStats(static_cast<c10::DeviceIndex>(dev));
      allocated = st.allocated_bytes[0].current;
      reserved = st.reserved_bytes[0].current;
    } catch (...) {
    }
    std::vector<CCA::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> g(mu_);
      observers = oom_observers_;
    }
    for (auto &o : observers) o(dev, size, dev_total, dev_free);
    std::ostringstream fraction;
    double f = fraction_of(dev);
    if (f < 1.0 && dev_total > 0)
      fraction << " of which " << fmt(static_cast<uint64_t>(f * static_cast<double>(dev_total)))
               << " is allowed to this process (memory fraction " << f << ")";
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", fmt(size), ". GPU ", dev,
                     " has a total capacity of ", fmt(dev_total), " of which ", fmt(dev_free), " is free",
                     fraction.str(), ". Of the allocated memory ", fmt(static_cast<uint64_t>(allocated)),
                     " is allocated by libsymm, and ", fmt(static_cast<uint64_t>(std::max<int64_t>(reserved - allocated, 0))),
                     " is reserved by libsymm but unallocated. (libsymm: ", why, ")");
  }

  // ---- lifecycle, cache, fraction, streams ------------------------------------
  void init(int device_count) override {
    g_api.clear_error();
    g_api.torch_init(device_count);
    if (g_api.last_error_code() != SYMM_OK) {
      TORCH_CHECK(false, "libsymm could not start its pool for PyTorch: ", last_error());
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      fractions_.assign(static_cast<size_t>(std::max(device_count, 1)), 1.0);
    }
    Base::init(device_count);  // no init_fn_ is set: only marks initialized
  }

  void emptyCache(MempoolId_t /*mempool_id*/) override {
    g_api.clear_error();
    g_api.empty_cache();
    if (g_api.last_error_code() != SYMM_OK) TORCH_WARN("libsymm: empty_cache: ", last_error());
  }

  double getMemoryFraction(c10::DeviceIndex device) override { return fraction_of(device); }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    g_api.clear_error();
    g_api.set_fraction(fraction, device);
    if (g_api.last_error_code() != SYMM_OK) TORCH_CHECK(false, "libsymm: set_per_process_memory_fraction: ", last_error());
    std::lock_guard<std::mutex> g(mu_);
    if (device >= 0) {
      if (fractions_.size() <= static_cast<size_t>(device)) fractions_.resize(static_cast<size_t>(device) + 1, 1.0);
      fractions_[static_cast<size_t>(device)] = fraction;
    }
  }

  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr) return;
    g_api.clear_error();
    g_api.record_stream(ptr.get(), stream.stream());
    if (g_api.last_error_code() != SYMM_OK) TORCH_CHECK(false, "libsymm: record_stream: ", last_error());
  }

  // PyTorch's contract (cudnn sizes its workspace by it): a zero
  // *largestBlock starts from the device's free memory, then it is raised to
  // the largest free block the pool caches.
  void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override {
    TORCH_CHECK(largestBlock != nullptr, "libsymm: cacheInfo: largestBlock is NULL");
    if (*largestBlock == 0) {
      c10::cuda::CUDAGuard guard(device);
      size_t total = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(largestBlock, &total));
    }
    size_t largest = 0;
    check(need(g_api.cache_info, "symm_pool_cache_info")(device, &largest), "cacheInfo");
    if (largest > *largestBlock) *largestBlock = largest;
  }

  // ---- statistics ----------------------------------------------------------------
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
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

  void resetPeakStats(c10::DeviceIndex device) override { check(g_api.reset_peak(device), "reset_peak_memory_stats"); }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(need(g_api.reset_accumulated, "symm_pool_reset_accumulated")(device), "reset_accumulated_memory_stats");
  }

  // ---- CUDA graphs -------------------------------------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id, std::function<bool(cudaStream_t)> filter) override {
    g_api.begin_pool(device, {id.first, id.second},
                     [f = std::move(filter)](CUstream_st *s) { return f(reinterpret_cast<cudaStream_t>(s)); });
  }
  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) override {
    g_api.end_pool(device, {id.first, id.second});
  }
  void releasePool(c10::DeviceIndex device, MempoolId_t id) override {
    g_api.release_pool(device, {id.first, id.second});
  }

  // torch.cuda.MemPool() while libsymm is PyTorch's allocator: a private pool
  // of libsymm's, as PyTorch's own allocator makes one. The constructor takes
  // a use of the pool (here: a route opened and closed at once, which
  // creates the pool or adds a use), use_mem_pool routes the thread's
  // allocations to it (beginAllocateToPool) and gives its own use back
  // (releasePool), and the destructor's releasePool gives this one back.
  // A MemPool over another allocator cannot be served: libsymm answers for
  // every CUDA allocation of the process.
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id, std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "libsymm: torch.cuda.MemPool(", allocator->name(), " allocator) while libsymm is PyTorch's allocator "
                "(symm.use_as_default()): a MemPool over another allocator is not supported here. Make it without an "
                "allocator (torch.cuda.MemPool(): a private pool of libsymm's), or keep PyTorch's allocator and put "
                "libsymm inside MemPools only (torch.cuda.MemPool(symm.pool_allocator().allocator()))");
    g_api.clear_error();
    g_api.begin_pool(device, {id.first, id.second}, [](CUstream_st *) { return false; });  // throws on error
    g_api.end_pool(device, {id.first, id.second});
    TORCH_CHECK(g_api.last_error_code() == SYMM_OK, "libsymm: torch.cuda.MemPool: ", last_error());
  }
  // MemPool's destructor turns use_on_oom off (never throw here: it runs in a
  // destructor); turning it on, or no_split, asks for what libsymm's private
  // pools do not do, and is refused in the constructor with a clear error.
  void setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool use_on_oom) override {
    TORCH_CHECK(!use_on_oom, "libsymm: torch.cuda.MemPool(use_on_oom=True) is not supported while libsymm is PyTorch's "
                "allocator: an out-of-memory allocation outside the pool does not fall back to it");
  }
  void setNoSplit(c10::DeviceIndex, MempoolId_t) override {
    TORCH_CHECK(false, "libsymm: torch.cuda.MemPool(no_split=True) is not supported while libsymm is PyTorch's "
                "allocator: its private pools split blocks as the default pool does");
  }

  std::vector<symm_block_info_t> pool_blocks(c10::DeviceIndex device, MempoolId_t id) {
    auto fn = need(g_api.blocks, "symm_pool_blocks");
    for (;;) {
      int n = fn(device, pool_id(id), nullptr, 0);
      if (n < 0) check(g_api.last_error_code(), "pool blocks");
      std::vector<symm_block_info_t> v(static_cast<size_t>(n) + 16);
      int m = fn(device, pool_id(id), v.data(), static_cast<int>(v.size()));
      if (m < 0) check(g_api.last_error_code(), "pool blocks");
      if (m <= static_cast<int>(v.size())) {
        v.resize(static_cast<size_t>(m));
        return v;
      }
    }
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void *> &expected) override {
    size_t live = 0;
    for (auto &b : pool_blocks(device, id)) {
      if (b.state != SYMM_BLOCK_ALLOCATED) continue;
      if (expected.count(reinterpret_cast<void *>(b.address)) == 0) return false;
      live++;
    }
    return live == expected.size();
  }

  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    auto st = std::make_shared<PoolState>();
    st->device = device;
    st->id = id;
    st->blocks = pool_blocks(device, id);
    return st;
  }

  // PyTorch's contract (and its native allocator's behaviour): every block
  // allocated in the pool before the call counts as freed, and every block
  // allocated in the checkpoint comes back as a new DataPtr, which the
  // caller hands to the live storages (cudagraph trees' addStorageDeleterFns);
  // one it does not take frees its block when dropped. libsymm changes only
  // the blocks that differ, so an unchanged block keeps its memory and data.
  CCA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<CCA::AllocatorState> pps) override {
    auto st = std::dynamic_pointer_cast<PoolState>(pps);
    TORCH_CHECK(st != nullptr, "libsymm: setCheckpointPoolState: the state was not made by libsymm's getCheckpointState");
    TORCH_CHECK(st->device == device, "libsymm: setCheckpointPoolState: state of device ", st->device, ", not ", device);
    auto fn = need(g_api.restore_blocks, "symm_pool_restore_blocks");
    std::vector<symm_block_info_t> before = pool_blocks(device, st->id);
    int nfreed = 0, nallocd = 0;  // a dry run sizes the arrays
    int rc = fn(device, pool_id(st->id), st->blocks.data(), static_cast<int>(st->blocks.size()), nullptr, &nfreed,
                nullptr, &nallocd);
    TORCH_CHECK(rc == SYMM_OK || rc == SYMM_ERR_INVALID, "libsymm: setCheckpointPoolState: ", last_error());
    std::vector<uint64_t> freed(static_cast<size_t>(nfreed) + 1), allocd(static_cast<size_t>(nallocd) + 1);
    nfreed = static_cast<int>(freed.size());
    nallocd = static_cast<int>(allocd.size());
    check(fn(device, pool_id(st->id), st->blocks.data(), static_cast<int>(st->blocks.size()), freed.data(), &nfreed,
             allocd.data(), &nallocd),
          "setCheckpointPoolState");
    CCA::CheckpointDelta delta;
    std::vector<void *> gone;
    for (auto &b : before) {
      if (b.state != SYMM_BLOCK_ALLOCATED) continue;
      void *p = reinterpret_cast<void *>(b.address);
      delta.ptrs_freed.push_back(p);
      gone.push_back(p);
    }
    for (auto &b : st->blocks) {
      if (b.state != SYMM_BLOCK_ALLOCATED) continue;
      delta.dataptrs_allocd.push_back(tensor_ptr(reinterpret_cast<void *>(b.address), device));
    }
    std::lock_guard<std::mutex> g(mu_);
    for (void *p : gone) live_ctx_.erase(p);
    return delta;
  }

  // ---- CUDA IPC (torch.multiprocessing) -------------------------------------------
  //
  // PyTorch's own format, so that a libsymm process and a process on
  // PyTorch's allocator read each other's tensors: version 2, type 'c', then
  // the cudaIpcMemHandle_t of the whole driver allocation (the segment); the
  // tensor's offset in it travels beside the handle.
  static constexpr char kHandleVersion = symm_ipc::kHandleVersion;
  static constexpr char kHandleCudaMalloc = symm_ipc::kHandleCudaMalloc;

  CCA::ShareableHandle shareIpcHandle(void *ptr) override {
    uint64_t base = 0, size = 0;
    int expandable = 0;
    check(need(g_api.segment_of, "symm_pool_segment_of")(ptr, &base, &size, &expandable), "shareIpcHandle");
    if (expandable) return share_expandable(ptr, base, size);
    cudaIpcMemHandle_t h;
    C10_CUDA_CHECK(cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(base)));
    std::string s;
    s.push_back(kHandleVersion);
    s.push_back(kHandleCudaMalloc);
    s.append(reinterpret_cast<const char *>(&h), sizeof h);
    return CCA::ShareableHandle{static_cast<ptrdiff_t>(reinterpret_cast<uint64_t>(ptr) - base), s};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    // The bare 64-byte handle is PyTorch's format before handle versions.
    const char *raw = nullptr;
    bool expandable = false;
    if (handle.size() == CUDA_IPC_HANDLE_SIZE) {
      raw = handle.data();
    } else if (handle.size() == 2 + CUDA_IPC_HANDLE_SIZE && handle[0] == kHandleVersion &&
               handle[1] == kHandleCudaMalloc) {
      raw = handle.data() + 2;
    } else if (handle.size() >= 2 + sizeof(ShareHeader) && handle[0] == kHandleVersion &&
               handle[1] == kHandleExpandable) {
      expandable = true;
    } else {
      TORCH_CHECK(false, "libsymm: getIpcDevPtr: a CUDA IPC handle of ", handle.size(), " bytes",
                  handle.size() >= 2 ? std::string(" (version ") + std::to_string(int(handle[0])) + ", type '" +
                                           handle[1] + "')"
                                     : std::string(),
                  " is in no format libsymm knows (version 2, type 'c' or 'e')");
    }
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto it = ipc_.find(handle);
    if (it != ipc_.end()) {
      if (auto p = it->second.lock()) return p;  // one mapping per handle: CUDA refuses a second open
    }
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    std::shared_ptr<void> sp = expandable ? open_expandable(handle, device) : open_cuda_malloc(handle, raw, device);
    ipc_[handle] = sp;
    return sp;
  }

 private:
  static constexpr char kHandleExpandable = symm_ipc::kHandleExpandable;

  std::shared_ptr<void> open_cuda_malloc(const std::string &handle, const char *raw, int device) {
    cudaIpcMemHandle_t h;
    memcpy(&h, raw, sizeof h);
    void *dev = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev, h, cudaIpcMemLazyEnablePeerAccess));
    return std::shared_ptr<void>(dev, [this, handle, device](void *p) {
      forget_ipc(handle);
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      cudaError_t e = cudaIpcCloseMemHandle(p);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();  // a destructor: report, never throw
        TORCH_WARN("libsymm: cudaIpcCloseMemHandle: ", cudaGetErrorString(e));
      }
    });
  }

  void forget_ipc(const std::string &handle) {
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto i = ipc_.find(handle);
    if (i != ipc_.end() && i->second.expired()) ipc_.erase(i);
  }

  // A segment shared as PyTorch's expandable segments are: its chunks'
  // descriptors are duplicated from the sender (pidfd_getfd, which needs the
  // same user and ptrace permission, as PyTorch's own receiver does),
  // imported and mapped into a range of this process.
  std::shared_ptr<void> open_expandable(const std::string &handle, int device) {
    const Driver &d = driver();
    // Counts from another process: checked against the handle's bytes
    // without overflow before anything is read or reserved.
    symm_ipc::Expandable eh;
    std::string bad = symm_ipc::parse_expandable(handle.data(), handle.size(), &eh);
    TORCH_CHECK(bad.empty(), "libsymm: getIpcDevPtr: ", bad);
    const ShareHeader &hd = eh.header;
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, hd.pid, 0));
    TORCH_CHECK(pidfd >= 0, "libsymm: getIpcDevPtr: pidfd_open(", hd.pid, ") of the sending process: ",
                strerror(errno));
    size_t total = eh.total;
    CUdeviceptr va = 0;
    // Default alignment (the granularity): PyTorch's chunks are 20 MiB, not
    // a power of two, which the driver refuses as an alignment.
    CUresult r = d.reserve(&va, total, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
      close(pidfd);
      drv_check(r, "cuMemAddressReserve");
    }
    size_t mapped = 0;
    std::string err;
    for (size_t i = 0; i < hd.num_handles && err.empty(); i++) {
      int fd = eh.fds[i];
      // pidfd_getfd's descriptor is close-on-exec.
      int mine = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
      if (mine < 0) {
        err = std::string("pidfd_getfd(descriptor ") + std::to_string(fd) + " of process " + std::to_string(hd.pid) +
              "): " + strerror(errno);
        break;
      }
      CUmemGenericAllocationHandle h = 0;
      r = d.import_fd(&h, reinterpret_cast<void *>(static_cast<intptr_t>(mine)),
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      close(mine);
      if (r != CUDA_SUCCESS) {
        err = "cuMemImportFromShareableHandle: CUresult " + std::to_string(static_cast<int>(r));
        break;
      }
      r = d.map(va + i * hd.segment_size, hd.segment_size, 0, h, 0);
      d.release(h);  // the mapping holds the memory now
      if (r != CUDA_SUCCESS) {
        err = "cuMemMap: CUresult " + std::to_string(static_cast<int>(r));
        break;
      }
      mapped++;
    }
    close(pidfd);
    if (err.empty()) {
      CUmemAccessDesc acc{};
      acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      acc.location.id = device;
      acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = d.set_access(va, total, &acc, 1);
      if (r != CUDA_SUCCESS) err = "cuMemSetAccess: CUresult " + std::to_string(static_cast<int>(r));
    }
    auto undo = [&d, va, total, seg = hd.segment_size](size_t n) {
      for (size_t i = 0; i < n; i++) d.unmap(va + i * seg, seg);
      d.addr_free(va, total);
    };
    if (!err.empty()) {
      undo(mapped);
      TORCH_CHECK(false, "libsymm: getIpcDevPtr: opening a shared expandable segment: ", err);
    }
    return std::shared_ptr<void>(reinterpret_cast<void *>(va), [this, handle, device, undo, n = hd.num_handles](void *) {
      forget_ipc(handle);
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      // Work queued on this device may still read the mapping: unmapping
      // does not wait for it.
      (void)cudaDeviceSynchronize();
      undo(n);
    });
  }

  // Shares the chunks under ptr's block in PyTorch's expandable-segment
  // format. Each chunk's descriptor stays open here while a shared block
  // covers it (the receiver duplicates it from this process); it is closed
  // when the last such block is freed, before the chunk can be unmapped.
  CCA::ShareableHandle share_expandable(void *ptr, uint64_t base, uint64_t mapped) {
    const Driver &d = driver();
    int dev = 0;
    C10_CUDA_CHECK(cudaGetDevice(&dev));
    uint64_t g = vmm_granularity(d, dev);
    uint64_t p = reinterpret_cast<uint64_t>(ptr), len = 1, addr = 0, requested = 0;
    // The chunks under the whole block, from ptr on (ptr may be inside it).
    if (g_api.block_of != nullptr && g_api.block_of(ptr, &addr, &requested) == SYMM_OK && addr + requested > p)
      len = addr + requested - p;
    uint64_t begin = base + (p - base) / g * g;
    uint64_t end = std::min(base + (p + len - base + g - 1) / g * g, base + mapped);
    TORCH_CHECK(end > begin, "libsymm: shareIpcHandle: ", ptr, " is outside its segment's mapped part");
    ShareHeader hd{};
    hd.pid = getpid();
    hd.segment_size = g;
    hd.num_handles = (end - begin) / g;
    std::string s;
    s.push_back(kHandleVersion);
    s.push_back(kHandleExpandable);
    s.append(reinterpret_cast<const char *>(&hd), sizeof hd);
    std::lock_guard<std::mutex> lk(share_mu_);
    std::vector<uint64_t> &chunks = shared_[ptr];
    for (uint64_t a = begin; a < end; a += g) {
      auto it = chunk_fds_.find(a);
      if (it == chunk_fds_.end()) {
        CUmemGenericAllocationHandle h = 0;
        drv_check(d.retain(&h, reinterpret_cast<void *>(a)), "cuMemRetainAllocationHandle");
        int fd = -1;
        CUresult r = d.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        d.release(h);  // retain took a reference; the mapping keeps the memory
        drv_check(r, "cuMemExportToShareableHandle");
        // The driver's descriptor is inherited across exec: a child that
        // execs (a compiler, a shell, a DataLoader's subprocess) would keep
        // the chunk's memory alive for its whole life. The Go side's are
        // close-on-exec too.
        int fl = fcntl(fd, F_GETFD);
        if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0) {
          int e = errno;
          close(fd);
          TORCH_CHECK(false, "libsymm: shareIpcHandle: making descriptor ", fd, " close-on-exec: ", strerror(e));
        }
        it = chunk_fds_.emplace(a, ChunkFd{fd, 0}).first;
      }
      it->second.refs++;
      chunks.push_back(a);
      s.append(reinterpret_cast<const char *>(&it->second.fd), sizeof(int));
    }
    any_shared_.store(true, std::memory_order_release);
    return CCA::ShareableHandle{static_cast<ptrdiff_t>(p - begin), s};
  }

  // Called before ptr goes back to the pool: closes the descriptors of
  // chunks no other shared block covers.
  void unshare(void *ptr) {
    std::lock_guard<std::mutex> lk(share_mu_);
    auto it = shared_.find(ptr);
    if (it == shared_.end()) return;
    for (uint64_t a : it->second) {
      auto c = chunk_fds_.find(a);
      if (c != chunk_fds_.end() && --c->second.refs == 0) {
        close(c->second.fd);
        chunk_fds_.erase(c);
      }
    }
    shared_.erase(it);
    any_shared_.store(!shared_.empty(), std::memory_order_release);
  }

  struct ChunkFd {
    int fd;
    int refs;
  };
  std::mutex share_mu_;  // guards shared_ and chunk_fds_
  std::atomic<bool> any_shared_{false};
  std::unordered_map<void *, std::vector<uint64_t>> shared_;
  std::unordered_map<uint64_t, ChunkFd> chunk_fds_;

 public:
  // ---- out-of-memory observers ----------------------------------------------------
  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mu_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    // PyTorch's own tools (the FSDP memory tracker) use it; libsymm's trace
    // is in its snapshots instead. Keep it so that attaching never fails.
    std::lock_guard<std::mutex> g(mu_);
    trace_trackers_.push_back(std::move(tracker));
  }

  // ---- memory history and snapshots ---------------------------------------------
  bool isHistoryEnabled() override { return history_.load(); }

  void recordHistory(bool enabled, CCA::CreateContextFn recorder, size_t max_entries, CCA::RecordContext when,
                     bool clear_history, const std::vector<std::string> &skip_actions) override {
    if (enabled && max_entries == 0) max_entries = 1;
    // libsymm's ring keeps at most 2^31 entries per device; PyTorch's default
    // is sys.maxsize.
    check(g_api.record_history(enabled ? 1 : 0, enabled ? max_entries : 0), "_record_memory_history");
    std::lock_guard<std::mutex> g(mu_);
    history_.store(enabled);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : CCA::RecordContext::NEVER;
    max_ctx_ = std::min<size_t>(max_entries, kMaxContexts);
    skip_ = std::unordered_set<std::string>(skip_actions.begin(), skip_actions.end());
    if (clear_history) {
      trace_ctx_.clear();
      cleared_at_us_ = now_us();
    }
    if (!enabled) {
      // PyTorch drops stacks when history goes off; the trace stays.
      live_ctx_.clear();
    }
    recording_.store(enabled && recorder != nullptr && when != CCA::RecordContext::NEVER);
  }

  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    std::string json;
    for (size_t cap = 1 << 16;;) {
      json.resize(cap);
      size_t len = 0;
      int rc = g_api.snapshot(&json[0], cap, &len);
      if (rc == SYMM_OK) {
        json.resize(len);
        break;
      }
      TORCH_CHECK(rc == SYMM_ERR_INVALID && len + 1 > cap, "libsymm: snapshot: ", last_error());
      cap = len + 4096;
    }
    CCA::SnapshotInfo out;
    py::gil_scoped_acquire gil;
    py::dict d = py::module_::import("json").attr("loads")(json);
    std::unordered_map<void *, std::shared_ptr<c10::GatheredContext>> live;
    std::vector<CtxRecord> traced;
    int64_t cleared_at = 0;
    std::unordered_set<std::string> skip;
    {
      std::lock_guard<std::mutex> g(mu_);
      live = live_ctx_;
      traced.assign(trace_ctx_.begin(), trace_ctx_.end());
      cleared_at = cleared_at_us_;
      skip = skip_;
    }
    bool filter = mempool_id != MempoolId_t{0, 0};
    for (auto seg : d["segments"].cast<py::list>()) {
      py::dict sd = seg.cast<py::dict>();
      c10::CachingDeviceAllocator::SegmentInfo si;
      py::list pid = sd["segment_pool_id"].cast<py::list>();
      si.owner_private_pool_id = {pid[0].cast<unsigned long long>(), pid[1].cast<unsigned long long>()};
      if (filter && si.owner_private_pool_id != mempool_id) continue;
      si.device = static_cast<c10::DeviceIndex>(sd["device"].cast<int>());
      si.address = sd["address"].cast<size_t>();
      si.total_size = sd["total_size"].cast<size_t>();
      si.requested_size = sd["requested_size"].cast<size_t>();
      si.allocated_size = sd["allocated_size"].cast<size_t>();
      si.active_size = sd["active_size"].cast<size_t>();
      si.stream = reinterpret_cast<void *>(sd["stream"].cast<uint64_t>());
      si.is_large = sd["segment_type"].cast<std::string>() == "large";
      si.is_expandable = sd["is_expandable"].cast<bool>();
      for (auto blk : sd["blocks"].cast<py::list>()) {
        py::dict bd = blk.cast<py::dict>();
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = bd["size"].cast<size_t>();
        bi.requested_size = bd["requested_size"].cast<size_t>();
        std::string state = bd["state"].cast<std::string>();
        bi.allocated = state == "active_allocated";
        bi.active = state != "inactive";
        if (bi.allocated) {
          auto it = live.find(reinterpret_cast<void *>(bd["address"].cast<uint64_t>()));
          if (it != live.end()) bi.context_when_allocated = it->second;
        }
        si.blocks.push_back(std::move(bi));
      }
      out.segments.push_back(std::move(si));
    }
    // Stacks of the trace: libsymm's ring and this class's records list the
    // same allocations and frees of each address in the same order, so the
    // newest k events of an address in the ring take the newest k stacks
    // recorded for it (older ones may have left either ring).
    std::map<std::tuple<int, int, uint64_t>, std::vector<std::shared_ptr<c10::GatheredContext>>> stacks;
    for (auto &r : traced) stacks[{r.device, r.action, r.addr}].push_back(r.ctx);
    if (include_traces) {
      int dev = 0;
      for (auto devtrace : d["device_traces"].cast<py::list>()) {
        std::vector<TraceEntry> entries;
        for (auto e : devtrace.cast<py::list>()) {
          py::dict ed = e.cast<py::dict>();
          std::string action = ed["action"].cast<std::string>();
          if (skip.count(action)) continue;
          int64_t t = ed["time_us"].cast<int64_t>();
          if (t < cleared_at) continue;
          TraceEntry::Action a = c10::CachingDeviceAllocator::parseTraceEntryAction(action);
          size_t addr = ed[a == TraceEntry::OOM ? "device_free" : "addr"].cast<size_t>();
          entries.emplace_back(a, static_cast<c10::DeviceIndex>(dev), addr, ed["size"].cast<size_t>(),
                               reinterpret_cast<void *>(ed["stream"].cast<uint64_t>()), MempoolId_t{0, 0}, 0);
          entries.back().time_.t_ = static_cast<time_t>(t);
          if (ed.contains("compile_context")) entries.back().compile_context_ = ed["compile_context"].cast<std::string>();
          if (ed.contains("user_metadata")) entries.back().user_metadata_ = ed["user_metadata"].cast<std::string>();
        }
        for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
          int kind = it->action_ == TraceEntry::ALLOC ? 0 : it->action_ == TraceEntry::FREE_REQUESTED ? 1 : -1;
          if (kind < 0) continue;
          auto s = stacks.find({dev, kind, it->addr_});
          if (s == stacks.end() || s->second.empty()) continue;
          it->context_ = std::move(s->second.back());
          s->second.pop_back();
        }
        out.device_traces.push_back(std::move(entries));
        dev++;
      }
    }
    if (d.contains("allocator_settings")) {
      py::dict as = d["allocator_settings"].cast<py::dict>();
      auto &cm = out.config_metadata;
      if (as.contains("expandable_segments")) cm.expandable_segments = as["expandable_segments"].cast<bool>();
      if (as.contains("max_split_size")) cm.max_split_size = as["max_split_size"].cast<size_t>();
      if (as.contains("garbage_collection_threshold"))
        cm.garbage_collection_threshold = as["garbage_collection_threshold"].cast<double>();
      if (as.contains("PYTORCH_CUDA_ALLOC_CONF"))
        cm.last_allocator_settings = as["PYTORCH_CUDA_ALLOC_CONF"].cast<std::string>();
    }
    return out;
  }

 private:
  static constexpr size_t kMaxContexts = 1 << 20;


  struct CtxRecord {
    int device;
    int action;  // 0 alloc, 1 free
    uint64_t addr;
    std::shared_ptr<c10::GatheredContext> ctx;
  };

  static int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  double fraction_of(int dev) {
    std::lock_guard<std::mutex> g(mu_);
    return dev >= 0 && static_cast<size_t>(dev) < fractions_.size() ? fractions_[static_cast<size_t>(dev)] : 1.0;
  }

  void remember_alloc(void *p, int dev) {
    CCA::CreateContextFn rec;
    CCA::RecordContext when;
    {
      std::lock_guard<std::mutex> g(mu_);
      rec = recorder_;
      when = when_;
    }
    if (rec == nullptr || when == CCA::RecordContext::NEVER) return;
    auto ctx = rec();  // Python and C++ stacks: outside mu_ (it may take the GIL)
    std::lock_guard<std::mutex> g(mu_);
    live_ctx_[p] = ctx;
    if (when == CCA::RecordContext::ALLOC || when == CCA::RecordContext::ALL) push_ctx({dev, 0, (uint64_t)p, ctx});
  }

  // device_of is the device of p's memory (history records of a
  // raw_delete, which has no device); -1 if CUDA cannot say.
  static int device_of(void *p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return a.device;
  }

  void remember_free(void *p, int dev) {
    CCA::CreateContextFn rec;
    CCA::RecordContext when;
    {
      std::lock_guard<std::mutex> g(mu_);
      live_ctx_.erase(p);
      rec = recorder_;
      when = when_;
    }
    if (rec == nullptr || when != CCA::RecordContext::ALL) return;
    auto ctx = rec();
    std::lock_guard<std::mutex> g(mu_);
    push_ctx({dev, 1, (uint64_t)p, ctx});
  }

  void push_ctx(CtxRecord r) {  // with mu_ held
    trace_ctx_.push_back(std::move(r));
    while (trace_ctx_.size() > max_ctx_) trace_ctx_.pop_front();
  }

  std::mutex mu_;  // guards everything below; never held across a libsymm call
  std::vector<double> fractions_;
  std::vector<CCA::OutOfMemoryObserver> oom_observers_;
  std::vector<CCA::AllocatorTraceTracker> trace_trackers_;
  std::atomic<bool> history_{false};
  std::atomic<bool> recording_{false};  // stacks are recorded
  CCA::CreateContextFn recorder_ = nullptr;
  CCA::RecordContext when_ = CCA::RecordContext::NEVER;
  size_t max_ctx_ = 0;
  std::unordered_set<std::string> skip_;
  std::unordered_map<void *, std::shared_ptr<c10::GatheredContext>> live_ctx_;
  std::deque<CtxRecord> trace_ctx_;
  int64_t cleared_at_us_ = 0;
  std::mutex ipc_mu_;  // guards ipc_
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_;
};

std::shared_ptr<SymmAllocator> g_allocator;
std::mutex g_install_mu;

// make_allocator returns the process's SymmAllocator as PyTorch's
// CUDAAllocator (pybind11 gives Python a torch._C._cuda_CUDAAllocator, which
// torch.cuda.MemPool and change_current_allocator take).
std::shared_ptr<CCA::CUDAAllocator> make_allocator(const std::string &libsymm_path) {
  std::lock_guard<std::mutex> g(g_install_mu);
  if (!g_allocator) {
    load_api(libsymm_path);
    g_allocator = std::make_shared<SymmAllocator>();
    g_self = g_allocator.get();
  }
  return g_allocator;
}

// change_current installs it as PyTorch's process-wide allocator (replace
// mode): torch's changeCurrentAllocator, which refuses once CUDA is initialized.
void change_current(const std::shared_ptr<CCA::CUDAAllocator> &a) {
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
}

bool is_current() { return g_allocator && CCA::allocator.load() == g_allocator.get(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "libsymm's CUDA allocator for PyTorch (a CUDAPluggableAllocator subclass)";
  m.def("make_allocator", &make_allocator, py::arg("libsymm_path"));
  m.def("change_current", &change_current);
  m.def("is_current", &is_current);
  m.def("missing", []() { return g_missing; });
}
