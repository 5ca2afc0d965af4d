// The trace replay loop of bench/replay_torch.py, which compiles this file with torch.utils.cpp_extension at run time.
#include <torch/extension.h>
#include <pybind11/stl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {
namespace CCA = c10::cuda::CUDACachingAllocator;
using Clock = std::chrono::steady_clock;

struct Op { bool alloc; int64_t slot, size, stream; };
struct Pass { double ns = 0; int64_t calls = 0, errors = 0, end_frees = 0; };

// Runs f; an exception (e.g. c10::OutOfMemoryError) is recorded, not thrown on: one failed call must
// not end the replay. A try block costs nothing on the path that does not throw.
template <class F>
bool guarded(F&& f, std::string& first_error) {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    if (first_error.empty()) first_error = std::string(e.what()).substr(0, 800);
  } catch (...) {
    if (first_error.empty()) first_error = "unknown exception";
  }
  return false;
}

// Through PyTorch: what a program's allocations go through.
struct TorchCalls {
  void* alloc(size_t size, cudaStream_t stream) const { return CCA::raw_alloc_with_stream(size, stream); }
  void free(void* p, size_t, cudaStream_t) const { CCA::raw_delete(p); }
};

// libsymm's C functions called directly (found in the copy the process loaded): the pool's own
// share of a call, without PyTorch's entry points and libsymm's extension above them.
struct DirectCalls {
  void* (*fa)(size_t, int, void*) = nullptr;
  void (*ff)(void*, size_t, int, void*) = nullptr;
  int dev = 0;
  explicit DirectCalls(const std::string& lib) {
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!h) throw std::runtime_error("replay: " + lib + " is not loaded in this process");
    fa = reinterpret_cast<void* (*)(size_t, int, void*)>(dlsym(h, "symm_pool_alloc"));
    ff = reinterpret_cast<void (*)(void*, size_t, int, void*)>(dlsym(h, "symm_pool_free"));
    if (!fa || !ff) throw std::runtime_error("replay: symm_pool_alloc/symm_pool_free not found in " + lib);
    cudaGetDevice(&dev);
  }
  void* alloc(size_t size, cudaStream_t stream) const { return fa(size, dev, stream); }
  void free(void* p, size_t size, cudaStream_t stream) const { ff(p, size, dev, stream); }
};

template <class Calls>
Pass run_pass(const Calls& c, const std::vector<Op>& ops, const std::vector<cudaStream_t>& streams,
              std::vector<void*>& live, std::string& first_error) {
  Pass r;
  auto t0 = Clock::now();
  for (const Op& op : ops) {
    void*& p = live[op.slot];
    if (op.alloc) {
      p = nullptr;  // stays NULL if the call fails: the matching free is then skipped
      guarded([&] { p = c.alloc(static_cast<size_t>(op.size), streams[op.stream]); }, first_error);
      r.errors += p == nullptr;
      ++r.calls;
    } else if (p != nullptr) {
      r.errors += !guarded([&] { c.free(p, static_cast<size_t>(op.size), streams[op.stream]); }, first_error);
      p = nullptr;
      ++r.calls;
    }
  }
  r.ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  for (size_t i = 0; i < live.size(); ++i) {  // left live, untimed: every pass starts from nothing live
    void*& p = live[i];
    if (p == nullptr) continue;
    size_t size = 0;  // the slot's size: its last alloc's
    for (auto it = ops.rbegin(); it != ops.rend(); ++it)
      if (it->alloc && it->slot == static_cast<int64_t>(i)) {
        size = static_cast<size_t>(it->size);
        break;
      }
    r.errors += !guarded([&] { c.free(p, size, streams[0]); }, first_error);
    p = nullptr;
    ++r.end_frees;
  }
  return r;
}
}  // namespace

// columns: 4 int64 columns of nops values (op 1 alloc / 0 free, slot, size, stream index), as
// bench/replay_torch.py's columns_bytes lays them out. stream_handles[0] is ignored (current stream).
// direct_lib: when not empty, the path of libsymm.so as loaded in this process; its
// symm_pool_alloc/symm_pool_free are called instead of PyTorch's allocator.
py::dict replay(const std::string& columns, int64_t nops, int64_t nslots,
                const std::vector<uint64_t>& stream_handles, int64_t passes, const std::string& direct_lib) {
  if (nops < 0 || nslots < 0 || passes < 1 || stream_handles.empty() ||
      columns.size() != static_cast<size_t>(nops) * 4 * sizeof(int64_t))
    throw std::invalid_argument("replay: want 4 int64 columns of nops values, a stream, a pass");
  std::vector<int64_t> v(static_cast<size_t>(nops) * 4);
  if (!v.empty()) std::memcpy(v.data(), columns.data(), columns.size());
  std::vector<Op> ops(static_cast<size_t>(nops));
  std::vector<char> is_live(static_cast<size_t>(nslots), 0);
  const int64_t nstreams = static_cast<int64_t>(stream_handles.size());
  for (int64_t i = 0; i < nops; ++i) {  // checked once here, so that the timed loop checks nothing
    Op op{v[i] != 0, v[nops + i], v[2 * nops + i], v[3 * nops + i]};
    if (op.slot < 0 || op.slot >= nslots || op.stream < 0 || op.stream >= nstreams || op.size <= 0 ||
        (is_live[op.slot] != 0) == op.alloc)
      throw std::invalid_argument("replay: op " + std::to_string(i) + " is out of range or unpaired");
    is_live[op.slot] = op.alloc;
    ops[i] = op;
  }
  std::vector<cudaStream_t> streams{c10::cuda::getCurrentCUDAStream().stream()};
  for (int64_t i = 1; i < nstreams; ++i)
    streams.push_back(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream_handles[i])));
  std::vector<void*> live(static_cast<size_t>(nslots), nullptr);
  std::vector<Pass> out;
  std::string first_error;
  if (direct_lib.empty()) {
    py::gil_scoped_release nogil;
    for (int64_t k = 0; k < passes; ++k) out.push_back(run_pass(TorchCalls{}, ops, streams, live, first_error));
  } else {
    DirectCalls c(direct_lib);
    py::gil_scoped_release nogil;
    for (int64_t k = 0; k < passes; ++k) out.push_back(run_pass(c, ops, streams, live, first_error));
  }
  std::vector<std::tuple<double, int64_t, int64_t, int64_t>> per_pass;
  for (const Pass& p : out) per_pass.emplace_back(p.calls ? p.ns / p.calls : 0.0, p.calls, p.errors, p.end_frees);
  py::dict d;
  d["passes"] = py::cast(per_pass);  // per pass: ns per call, calls, failed calls, blocks left live
  d["first_error"] = first_error;
  return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("replay", &replay); }
