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
//    pointer alone (size 0: unchecked; device -1: libsymm finds it), and a
//    refused one is reported the same way for both (free_by_pointer).
//
// One translation unit, so that building and loading stay one compiler call
// and one module: this file (the module, make_allocator, and SymmAllocator's
// declaration and core: allocate, the functors, out-of-memory) includes the
// headers beside it, each SymmAllocator's members for one concern, defined
// after the class:
//   _torch_ext_api.h       headers, names, libsymm's function table, check()
//   _torch_ext_stats.h     memory_stats, cacheInfo, the memory fraction, settings
//   _torch_ext_graphs.h    private pools (MemPool, graph capture), checkpoints
//   _torch_ext_cuda_ipc.h  CUDA IPC, with the driver's VMM calls
//   _torch_ext_ipc.h       a received IPC handle's parsing and the book of
//                          shared chunks' descriptors (pure, tested alone)
//   _torch_ext_snapshot.h  memory history and snapshots
// _torch_ext.py builds it and keys its cache by all of them (HEADERS).
#include "_torch_ext_api.h"
#include "_torch_ext_ipc.h"

namespace {

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
    // PyTorch's allocator refuses such a size before anything else, in its
    // own words (a program or test may look for them).
    constexpr size_t kOneExaByte = 1ull << 60;
    TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte, "CUDA out of memory. Tried to allocate more than 1EB memory.");
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

  // raw_delete and a tensor's deleter free by pointer alone (free_by_pointer),
  // under one rule: a free the pool refuses (a pointer it did not hand out,
  // or one freed already) changes nothing and is reported, never dropped.
  // PyTorch's allocator raises for both ("invalid device pointer"); here
  // raw_delete raises as it does (its callers, e.g.
  // torch.cuda.caching_allocator_delete, can catch it), and the deleter,
  // which runs in a DataPtr's destructor where a throw ends the process
  // (std::terminate: PyTorch's own deleter aborts there), warns with the
  // same message instead.
  void raw_delete(void *ptr) override {
    std::string why = free_by_pointer(ptr);
    TORCH_CHECK(why.empty(), "libsymm: raw_delete of ", ptr, ": ", why);
  }

  // A tensor's DataPtr: its context is the pointer (PyTorch requires it:
  // c10::Allocator::raw_allocate), its deleter raw_deleter's, which PyTorch
  // compares (CUDA-graph trees' _has_Standard_Deleter). The deleter frees by
  // pointer alone: libsymm's front cache keeps each block's device and
  // stream, and the pool finds it otherwise.
  static c10::DataPtr tensor_ptr(void *p, c10::DeviceIndex device) {
    return {p, p, &delete_tensor, c10::Device(c10::DeviceType::CUDA, device)};
  }
  static void delete_tensor(void *p) {
    std::string why = g_self->free_by_pointer(p);
    if (!why.empty()) TORCH_WARN("libsymm: freeing a tensor's memory at ", p, ": ", why);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_tensor; }

  // free_by_pointer frees the block at p (its start, as allocate handed it
  // out) on whichever device holds it (device -1: libsymm's front cache
  // knows its device and stream, else the pool finds its segment by
  // address, locking only the shard that owns it). Returns "" or why the
  // pool refused it (nothing freed).
  std::string free_by_pointer(void *p) {
    if (p == nullptr) return "";
    g_api.clear_error();
    release(p, 0, -1, nullptr);
    return g_api.last_error_code() == SYMM_OK ? "" : last_error();
  }

  // ---- the caching allocator turned off (torch.cuda.caching_allocator_enable) ----
  // As PyTorch's allocator does then, each request is a device allocation of
  // its own (cudaMalloc), outside the pool and its statistics, given back at
  // its free (cudaFree). uncached_ holds those pointers, so that a free finds
  // them whatever the setting is by then.
  void enable(bool value) override { enabled_.store(value, std::memory_order_relaxed); }
  bool isEnabled() const override { return enabled_.load(std::memory_order_relaxed); }

  void *uncached_alloc(size_t size, int dev) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
    void *p = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&p, size));
    std::lock_guard<std::mutex> g(uncached_mu_);
    uncached_.insert(p);
    any_uncached_.store(true, std::memory_order_release);
    return p;
  }

  // Frees p if it is an uncached allocation; reports whether it was.
  bool uncached_free(void *p) {
    {
      std::lock_guard<std::mutex> g(uncached_mu_);
      if (uncached_.erase(p) == 0) return false;
      any_uncached_.store(!uncached_.empty(), std::memory_order_release);
    }
    C10_CUDA_CHECK(cudaFree(p));
    return true;
  }

  // ---- the functors ----------------------------------------------------------
  void *alloc(size_t size, int dev, cudaStream_t stream) {
    if (size == 0) return nullptr;  // PyTorch's empty tensors: no pointer
    // Replace mode when this object is PyTorch's current allocator; otherwise
    // a torch.cuda.MemPool asks for segments, which go back to the device
    // when PyTorch frees them (PyTorch caches above). libsymm decides
    // (export/torchmode.cpp; make_allocator named this object to it).
    bool replace = g_api.torch_mode() == kTorchReplace;
    if (replace && __builtin_expect(!enabled_.load(std::memory_order_relaxed), 0)) return uncached_alloc(size, dev);
    void *p = replace ? g_api.try_alloc(size, dev, stream)
                      : SYMM_NEED(alloc_segment)(size, dev, stream);
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
    if (__builtin_expect(any_uncached_.load(std::memory_order_acquire), 0) && uncached_free(p)) return;
    if (recording_.load(std::memory_order_relaxed)) remember_free(p, dev >= 0 ? dev : device_of(p));
    if (__builtin_expect(share_book_.any(), 0)) unshare(p);
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

  // ---- lifecycle, cache, streams ---------------------------------------------------
  void init(int device_count) override {
    g_api.clear_error();
    g_api.torch_init(device_count);
    if (g_api.last_error_code() != SYMM_OK) {
      TORCH_CHECK(false, "libsymm could not start its pool for PyTorch: ", last_error());
    }
    Base::init(device_count);  // no init_fn_ is set: only marks initialized
    // PyTorch initializes only its current allocator, so this object is it
    // (replace mode). torch 2.11's changeCurrentAllocator sets only the CUDA
    // allocator pointer; the device-generic registry (c10::GetAllocator(kCUDA),
    // through which torch.accelerator's memory calls reach the allocator)
    // would still name PyTorch's own, never initialized one, and
    // torch.accelerator.memory_stats() would answer {}. It names this one too,
    // at the highest priority (PyTorch registers its own at 0).
    c10::SetAllocator(c10::DeviceType::CUDA, this, std::numeric_limits<uint8_t>::max());
  }

  // A private pool's id (MemPool's destructor): only that pool, once its
  // last use went, as PyTorch's emptyCache(mempool_id).
  void emptyCache(MempoolId_t mempool_id) override {
    FreeSpan span = begin_free_span();  // memory history: the stack its segment frees carry
    g_api.clear_error();
    if (mempool_id != MempoolId_t{0, 0} && g_api.empty_pool != nullptr)
      g_api.empty_pool(pool_id(mempool_id));
    else
      g_api.empty_cache();
    end_free_span(std::move(span));
    if (g_api.last_error_code() != SYMM_OK) TORCH_WARN("libsymm: empty_cache: ", last_error());
  }

  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr) return;
    g_api.clear_error();
    g_api.record_stream(ptr.get(), stream.stream());
    if (g_api.last_error_code() != SYMM_OK) TORCH_CHECK(false, "libsymm: record_stream: ", last_error());
  }

  // ---- out-of-memory observers ----------------------------------------------------
  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mu_);
    oom_observers_.push_back(std::move(observer));
  }

  // ---- statistics, cacheInfo, memory fraction: _torch_ext_stats.h ---------------
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;

  // ---- CUDA graphs' private pools and checkpoints: _torch_ext_graphs.h -----------
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id, std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) override;
  void releasePool(c10::DeviceIndex device, MempoolId_t id) override;
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id, std::shared_ptr<CCA::CUDAAllocator> allocator) override;
  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) override;
  void setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex, MempoolId_t) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void *> &expected) override;
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override;
  CCA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<CCA::AllocatorState> pps) override;

  // ---- CUDA IPC (torch.multiprocessing): _torch_ext_cuda_ipc.h -------------------
  CCA::ShareableHandle shareIpcHandle(void *ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // ---- memory history and snapshots: _torch_ext_snapshot.h -----------------------
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, CCA::CreateContextFn recorder, size_t max_entries, CCA::RecordContext when,
                     bool clear_history, const std::vector<std::string> &skip_actions) override;
  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override;
  void pushCompileContext(std::string &md) override;
  void popCompileContext() override;
  void setUserMetadata(const std::string &metadata) override;
  std::string getUserMetadata() override;

 private:
  static constexpr size_t kMaxContexts = 1 << 20;
  static constexpr size_t kMaxFreeSpans = 1024;

  struct CtxRecord {
    int device;
    int action;  // 0 alloc, 1 free
    uint64_t addr;
    std::shared_ptr<c10::GatheredContext> ctx;  // null: none was gathered (its entry has no stack)
  };
  // A call that gives segments back (emptyCache) with context "all": the
  // segment frees libsymm recorded between t0 and t1 (µs) carry its stack.
  struct FreeSpan {
    int64_t t0 = 0, t1 = 0;
    std::shared_ptr<c10::GatheredContext> ctx;
  };

  double fraction_of(int dev);  // stats: libsymm's, 1.0 if it cannot say
  std::vector<symm_block_info_t> pool_blocks(c10::DeviceIndex device, MempoolId_t id);  // graphs
  // CUDA IPC
  std::shared_ptr<void> open_cuda_malloc(const std::string &handle, const char *raw, int device);
  void forget_ipc(const std::string &handle);
  std::shared_ptr<void> open_expandable(const std::string &handle, int device);
  CCA::ShareableHandle share_expandable(void *ptr, uint64_t base, uint64_t mapped);
  void unshare(void *block);
  // history
  void remember_alloc(void *p, int dev);
  static int device_of(void *p);
  void remember_free(void *p, int dev);
  void push_ctx(CtxRecord r);  // with mu_ held
  FreeSpan begin_free_span();
  void end_free_span(FreeSpan span);
  void send_annotation();  // this thread's user metadata and compile context to libsymm
  static void on_segment_events(const symm_trace_entry_t *ev, int n, void *ctx) noexcept;  // trace trackers

  symm_ipc::ShareBook share_book_;  // descriptors of the chunks shared handles sent, by block start
  std::mutex mu_;  // guards everything below; never held across a libsymm call
  std::vector<CCA::OutOfMemoryObserver> oom_observers_;
  std::vector<CCA::AllocatorTraceTracker> trace_trackers_;
  std::atomic<bool> history_{false};
  std::atomic<bool> recording_{false};  // history is on: each alloc and free is remembered (with a stack or none)
  CCA::CreateContextFn recorder_ = nullptr;
  CCA::RecordContext when_ = CCA::RecordContext::NEVER;
  size_t max_ctx_ = 0;
  std::unordered_set<std::string> skip_;
  std::unordered_map<void *, std::shared_ptr<c10::GatheredContext>> live_ctx_;
  std::deque<CtxRecord> trace_ctx_;  // one per alloc and free libsymm's history records, in its order
  std::deque<FreeSpan> free_spans_;
  std::mutex ipc_mu_;  // guards ipc_
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_;
  std::atomic<bool> enabled_{true};        // torch.cuda.caching_allocator_enable
  std::atomic<bool> any_uncached_{false};  // uncached_ is not empty
  std::mutex uncached_mu_;                 // guards uncached_
  std::unordered_set<void *> uncached_;    // allocations made while the caching allocator was off
};

}  // namespace

// SymmAllocator's members, by concern.
#include "_torch_ext_stats.h"
#include "_torch_ext_graphs.h"
#include "_torch_ext_cuda_ipc.h"
#include "_torch_ext_snapshot.h"
#include "_torch_ext_ops.h"

namespace {

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
    // libsymm decides replace vs MemPool mode: it must know this object
    // when PyTorch's current-allocator pointer names it.
    g_api.own_allocator(static_cast<CCA::CUDAAllocator *>(g_allocator.get()));
    forward_settings();
  }
  return g_allocator;
}

// change_current installs it as PyTorch's process-wide allocator (replace
// mode): torch's changeCurrentAllocator, which refuses once CUDA is initialized.
void change_current(const std::shared_ptr<CCA::CUDAAllocator> &a) {
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
}

bool is_current() { return g_allocator && g_api.torch_mode() == kTorchReplace; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "libsymm's CUDA allocator for PyTorch (a CUDAPluggableAllocator subclass)";
  m.def("make_allocator", &make_allocator, py::arg("libsymm_path"));
  m.def("change_current", &change_current);
  m.def("is_current", &is_current);
  m.def("missing", []() { return g_missing; });
  m.def("ops_init", &ops_init, py::arg("libsymm_path"));
  m.def("collective", &run_collective, py::arg("kind"), py::arg("tensor"), py::arg("out"), py::arg("local"), py::arg("hid"),
        py::arg("offset"), py::arg("world"), py::arg("timeout_ms"), py::arg("stream"));
  m.def("push", &run_push, py::arg("tensor"), py::arg("out"), py::arg("hid"), py::arg("timeout_ms"), py::arg("stream"));
  m.def("signal", &run_signal, py::arg("kind"), py::arg("hid"), py::arg("peer"), py::arg("channel"), py::arg("device"),
        py::arg("timeout_ms"), py::arg("stream"));
}
