// Timing loops of bench/bench_torch.py, which compiles this file with torch.utils.cpp_extension at run time.
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median and minimum ns per call of f: warm up, size N so that one run takes
// about target_ms, then time `reps` runs of N calls.
template <class F>
py::dict measure(F f, double target_ms, int reps) {
  for (int i = 0; i < 10; ++i) f();
  int64_t n = 1;
  double ns = 1.0;
  for (;;) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) f();
    double el = since(t0);
    if (el > 0.005 || n >= (int64_t{1} << 22)) {
      ns = std::max(el * 1e9 / n, 1.0);
      break;
    }
    n *= 4;
  }
  int64_t iters = std::clamp<int64_t>(static_cast<int64_t>(target_ms * 1e6 / ns), 5, 2000000);
  std::vector<double> runs;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) f();
    runs.push_back(since(t0) * 1e9 / iters);
  }
  std::sort(runs.begin(), runs.end());
  py::dict d;
  d["median_ns"] = runs[runs.size() / 2];
  d["min_ns"] = runs.front();
  d["iters"] = iters;
  d["reps"] = reps;
  return d;
}

// Total calls of f per second from `threads` threads running for `seconds`.
template <class F>
double throughput(int threads, double seconds, F f) {
  py::gil_scoped_release nogil;
  const c10::DeviceIndex dev = c10::cuda::current_device();
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> ready{0};
  std::vector<int64_t> counts(static_cast<size_t>(threads) * 16, 0);  // padded: no false sharing
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      c10::cuda::set_device(dev);
      for (int i = 0; i < 10; ++i) f();
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      int64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        f();
        ++n;
      }
      counts[static_cast<size_t>(t) * 16] = n;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& th : pool) th.join();
  double el = since(t0);
  int64_t total = 0;
  for (int t = 0; t < threads; ++t) total += counts[static_cast<size_t>(t) * 16];
  return total / el;
}

void raw_once(int64_t size) {
  void* p = c10::cuda::CUDACachingAllocator::raw_alloc(static_cast<size_t>(size));
  c10::cuda::CUDACachingAllocator::raw_delete(p);
}

// libsymm's functors, looked up in the copy the process has already loaded.
using AllocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);
using IntFn = int (*)(void);

void* open_lib(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) throw std::runtime_error("dlopen " + path + ": " + dlerror());
  return h;
}

template <class T>
T lookup(void* h, const char* name) {
  void* s = dlsym(h, name);
  if (!s) throw std::runtime_error(std::string("dlsym ") + name + " failed");
  return reinterpret_cast<T>(s);
}

struct Direct {
  AllocFn alloc;
  FreeFn free;
  explicit Direct(const std::string& path) {
    void* h = open_lib(path);
    alloc = lookup<AllocFn>(h, "symm_pool_alloc");
    free = lookup<FreeFn>(h, "symm_pool_free");
  }
  // Device and stream are looked up once per thread: what PyTorch's wrapper
  // does on every call (GetDevice, getCurrentCUDAStream) counts as wrapper time.
  void once(int64_t size) const {
    thread_local const int dev = c10::cuda::current_device();
    thread_local void* const stream = c10::cuda::getCurrentCUDAStream().stream();
    void* p = alloc(static_cast<size_t>(size), dev, stream);
    if (!p) throw std::runtime_error("symm_pool_alloc returned NULL");
    free(p, static_cast<size_t>(size), dev, stream);
  }
};

}  // namespace

// A pluggable allocator that does no work: the ceiling that PyTorch's
// CUDAPluggableAllocator path itself imposes. Pointers are distinct fake
// addresses; raw_alloc/raw_delete and at::empty never touch the memory.
std::atomic<uintptr_t> g_noop_next{uintptr_t(1) << 44};
extern "C" __attribute__((visibility("default"))) void* bench_noop_alloc(size_t size, int, cudaStream_t) {
  if (size == 0) return nullptr;
  return reinterpret_cast<void*>(g_noop_next.fetch_add(512, std::memory_order_relaxed));
}
extern "C" __attribute__((visibility("default"))) void bench_noop_free(void*, size_t, int, cudaStream_t) {}

// A plain cudaMalloc/cudaFree pluggable allocator: the "no caching" baseline.
extern "C" __attribute__((visibility("default"))) void* bench_cudamalloc_alloc(
    size_t size, int device, cudaStream_t) {
  if (size == 0) return nullptr;
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != device) cudaSetDevice(device);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, size);
  if (prev != device) cudaSetDevice(prev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("cudaMalloc: ") + cudaGetErrorString(err));
  }
  return p;
}

extern "C" __attribute__((visibility("default"))) void bench_cudamalloc_free(
    void* p, size_t, int, cudaStream_t) {
  if (p) cudaFree(p);
}

py::dict raw_pair(int64_t size, double target_ms, int reps) {
  return measure([size] { raw_once(size); }, target_ms, reps);
}

// The allocator interface every tensor's storage goes through: allocate()
// and the DataPtr's deleter, without the tensor around them (at::empty adds
// a StorageImpl and a TensorImpl, the same for every allocator).
py::dict allocate_pair(int64_t size, double target_ms, int reps) {
  c10::Allocator* a = c10::cuda::CUDACachingAllocator::get();
  return measure([a, size] { c10::DataPtr d = a->allocate(static_cast<size_t>(size)); }, target_ms, reps);
}

py::dict empty_pair(int64_t size, double target_ms, int reps) {
  auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, c10::cuda::current_device());
  return measure([size, opts] { auto t = at::empty({size}, opts); }, target_ms, reps);
}

// What PyTorch's raw_alloc does besides calling the allocator: look up the
// current device and stream (CUDAPluggableAllocator::raw_alloc does both).
double c10_threads(int threads, double seconds) {
  return throughput(threads, seconds, [] {
    volatile int d = c10::cuda::current_device();
    volatile cudaStream_t s = c10::cuda::getCurrentCUDAStream(d).stream();
    (void)s;
  });
}

double raw_threads(int threads, int64_t size, double seconds) {
  return throughput(threads, seconds, [size] { raw_once(size); });
}

py::dict direct_pair(const std::string& path, int64_t size, double target_ms, int reps) {
  Direct d(path);
  return measure([&d, size] { d.once(size); }, target_ms, reps);
}

double direct_threads(const std::string& path, int threads, int64_t size, double seconds) {
  Direct d(path);
  return throughput(threads, seconds, [&d, size] { d.once(size); });
}

py::dict direct_int_call(const std::string& path, const std::string& name, double target_ms, int reps) {
  IntFn fn = lookup<IntFn>(open_lib(path), name.c_str());
  volatile int sink = 0;
  return measure([fn, &sink] { sink = sink + fn(); }, target_ms, reps);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("raw_pair", &raw_pair);
  m.def("allocate_pair", &allocate_pair);
  m.def("empty_pair", &empty_pair);
  m.def("raw_threads", &raw_threads);
  m.def("direct_pair", &direct_pair);
  m.def("direct_threads", &direct_threads);
  m.def("c10_threads", &c10_threads);
  m.def("direct_int_call", &direct_int_call);
}
