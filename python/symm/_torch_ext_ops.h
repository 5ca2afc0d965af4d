// libsymm's collectives and signals for Python without ctypes: the checks
// of symm.one_shot_all_reduce, two_shot_all_reduce, reduce_scatter,
// all_gather, push_all_reduce and Handle.put_signal / wait_signal /
// barrier in C++, then
// one call of the C API, which launches from the handle's plan (no Go on
// the way). Also registered as PyTorch operators (torch.ops.symm.*_handle),
// so that graphs hold them without Python.
//
// Invariants:
//  - a call returns kPass, having done nothing, for anything that is not
//    the plain case (a tensor not on CUDA or not contiguous, dtypes or sizes
//    that do not match, the library's functions not resolved): Python's
//    path then checks it and words the error, so the errors are the ones
//    the ctypes path gives;
//  - otherwise it returns the C call's code (SYMM_OK, or an error whose
//    message is the library's last error, which Python raises);
//  - the stream is the device's current PyTorch stream, as the ctypes path
//    takes it, unless the caller names one.
#ifndef SYMM_TORCH_EXT_OPS_H
#define SYMM_TORCH_EXT_OPS_H

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

namespace {

constexpr int64_t kPass = -1;

// The kinds of collective, as the Python and the operators pass them.
enum { kOneShot = 0, kTwoShot = 1, kReduceScatter = 2, kAllGather = 3 };

// The functions of the calls here, as _torch_ext_api.h's SYMM_EXT_API lists
// its own: X(field, symbol), every one required, each field of the type of
// include/symm.h's prototype.
#define SYMM_EXT_OPS(X)                        \
  X(one_shot, symm_one_shot_all_reduce)        \
  X(two_shot, symm_two_shot_all_reduce)        \
  X(reduce_scatter, symm_reduce_scatter)       \
  X(all_gather, symm_all_gather)               \
  X(push, symm_push_all_reduce)                \
  X(put, symm_put_signal)                      \
  X(wait, symm_wait_signal)                    \
  X(barrier, symm_barrier)                     \
  X(last_error, symm_last_error)

struct OpsApi {
#define SYMM_EXT_OPS_FIELD(field, symbol) decltype(&::symbol) field = nullptr;
  SYMM_EXT_OPS(SYMM_EXT_OPS_FIELD)
#undef SYMM_EXT_OPS_FIELD

  // The reduction of kind (kOneShot, kTwoShot, kReduceScatter): the three
  // share one prototype (an array of them would not compile otherwise).
  decltype(&::symm_one_shot_all_reduce) reduce(int64_t kind) const {
    const decltype(&::symm_one_shot_all_reduce) by_kind[] = {one_shot, two_shot, reduce_scatter};
    return by_kind[kind];
  }
};

OpsApi g_ops;
std::atomic<bool> g_ops_ready{false};
std::mutex g_ops_mu;

// ops_init resolves the functions in the libsymm at path that Python's
// ctypes loaded; calls pass until it has run.
void ops_init(const std::string &path) {
  std::lock_guard<std::mutex> g(g_ops_mu);
  if (g_ops_ready.load()) return;
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(h != nullptr, "libsymm is not loaded from ", path, ": ", dlerror());
  OpsApi a;
#define SYMM_EXT_OPS_RESOLVE(field, symbol) resolve(h, #symbol, a.field, true);
  SYMM_EXT_OPS(SYMM_EXT_OPS_RESOLVE)
#undef SYMM_EXT_OPS_RESOLVE
  g_ops = a;
  g_ops_ready.store(true, std::memory_order_release);
}

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return SYMM_FLOAT32;
    case at::kBFloat16:
      return SYMM_BFLOAT16;
    case at::kHalf:
      return SYMM_FLOAT16;
    default:
      return -1;
  }
}

bool plain(const at::Tensor &t, const at::Tensor &like) {
  return t.is_cuda() && t.scalar_type() == like.scalar_type() && t.device() == like.device() && t.is_contiguous();
}

// stream_of is the stream a call runs on: stream when the caller names one
// (>= 0), else device's current PyTorch stream.
void *stream_of(int64_t device, int64_t stream) {
  if (stream >= 0) return reinterpret_cast<void *>(static_cast<uintptr_t>(stream));
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

// run_collective runs kind on handle hid (a group of world ranks) over tensor,
// which starts offset bytes into the handle's buffer: out receives the
// result, local (when defined) is copied in first. Sizes as the Python
// functions take them: one- and two-shot n elements everywhere;
// reduce-scatter world × n in, n out; all-gather world × n in and out, n
// local. Returns kPass or the C call's code.
int64_t run_collective(int64_t kind, const at::Tensor &tensor, const at::Tensor &out, const c10::optional<at::Tensor> &local,
                   int64_t hid, int64_t offset, int64_t world, int64_t timeout_ms, int64_t stream) {
  if (!g_ops_ready.load(std::memory_order_acquire) || kind < kOneShot || kind > kAllGather || world < 1 ||
      offset < 0 || timeout_ms < 0 || timeout_ms > INT32_MAX)
    return kPass;
  int code = dtype_code(tensor.scalar_type());
  if (code < 0 || !plain(tensor, tensor) || !plain(out, tensor)) return kPass;
  int64_t numel = tensor.numel();
  if (kind >= kReduceScatter && numel % world != 0) return kPass;
  int64_t n = kind >= kReduceScatter ? numel / world : numel;
  int64_t out_n = kind == kAllGather ? numel : n, local_n = kind == kReduceScatter ? numel : n;
  if (out.numel() != out_n) return kPass;
  const void *lp = nullptr;
  if (local.has_value()) {
    if (!plain(*local, tensor) || local->numel() != local_n) return kPass;
    lp = local->data_ptr();
  }
  void *s = stream_of(tensor.get_device(), stream);
  if (kind == kAllGather)
    return g_ops.all_gather(hid, static_cast<size_t>(offset), static_cast<size_t>(n), code, out.data_ptr(), lp, s,
                            static_cast<int>(timeout_ms));
  return g_ops.reduce(kind)(hid, static_cast<size_t>(offset), static_cast<size_t>(n), code, SYMM_SUM, out.data_ptr(), lp,
                            s, static_cast<int>(timeout_ms));
}

// run_push runs the push all-reduce of tensor into out (the same size; it
// may be tensor) on workspace hid. Returns kPass or the C call's code.
int64_t run_push(const at::Tensor &tensor, const at::Tensor &out, int64_t hid, int64_t timeout_ms, int64_t stream) {
  if (!g_ops_ready.load(std::memory_order_acquire) || timeout_ms < 0 || timeout_ms > INT32_MAX) return kPass;
  int code = dtype_code(tensor.scalar_type());
  if (code < 0 || !plain(tensor, tensor) || !plain(out, tensor) || out.numel() != tensor.numel()) return kPass;
  return g_ops.push(hid, tensor.data_ptr(), out.data_ptr(), static_cast<size_t>(tensor.numel()), code, SYMM_SUM,
                    stream_of(tensor.get_device(), stream), static_cast<int>(timeout_ms));
}

// run_signal runs a put (kind 0), a wait (1) or a barrier (2) of handle hid
// on device's current stream (or stream); peer is the barrier's unused.
int64_t run_signal(int64_t kind, int64_t hid, int64_t peer, int64_t channel, int64_t device, int64_t timeout_ms,
               int64_t stream) {
  if (!g_ops_ready.load(std::memory_order_acquire) || device < 0 || timeout_ms < 0 || timeout_ms > INT32_MAX ||
      peer < INT32_MIN || peer > INT32_MAX || channel < INT32_MIN || channel > INT32_MAX)
    return kPass;
  void *s = stream_of(device, stream);
  int p = static_cast<int>(peer), c = static_cast<int>(channel), t = static_cast<int>(timeout_ms);
  switch (kind) {
    case 0:
      return g_ops.put(hid, p, c, s);
    case 1:
      return g_ops.wait(hid, p, c, s, t);
    case 2:
      return g_ops.barrier(hid, c, s, t);
  }
  return kPass;
}

// The operators: the collectives on a handle, the result in out. An error
// (kPass included: a call the checks refuse) raises, with the library's
// message.
void collective_op(int64_t kind, const at::Tensor &tensor, int64_t hid, int64_t offset, int64_t world,
                         const at::Tensor &out, const c10::optional<at::Tensor> &local) {
  int64_t rc = run_collective(kind, tensor, out, local, hid, offset, world, 0, -1);
  TORCH_CHECK(rc != kPass, "symm: ", kind == kOneShot ? "one_shot_all_reduce" : kind == kTwoShot ? "two_shot_all_reduce"
                                     : kind == kReduceScatter ? "reduce_scatter" : "all_gather",
              "_handle: the tensors must be contiguous CUDA tensors of float32, bfloat16 or float16 on one device, "
              "of the sizes the collective takes (and libsymm loaded)");
  if (rc != SYMM_OK) {
    const char *m = g_ops.last_error();
    TORCH_CHECK(false, "libsymm: ", m != nullptr ? m : "a collective failed", " (code ", rc, ")");
  }
}

}  // namespace

// Registered where the extension loads: out is written and the input may
// be (local_input is copied into it; the two-shot sums in place), as their
// alias annotations say, so torch.compile functionalizes them.
TORCH_LIBRARY_FRAGMENT(symm, m) {
  m.def("one_shot_all_reduce_handle(Tensor(b!) input, int handle, int offset, int world, Tensor(a!) out, "
        "Tensor? local_input=None) -> ()");
  m.def("two_shot_all_reduce_handle(Tensor(b!) input, int handle, int offset, int world, Tensor(a!) out, "
        "Tensor? local_input=None) -> ()");
  m.def("reduce_scatter_handle(Tensor(b!) input, int handle, int offset, int world, Tensor(a!) out, "
        "Tensor? local_input=None) -> ()");
  m.def("all_gather_handle(Tensor(b!) input, int handle, int offset, int world, Tensor(a!) out, "
        "Tensor? local_input=None) -> ()");
}

// SYMM_COLLECTIVE_IMPL registers collective kind as operator name.
#define SYMM_COLLECTIVE_IMPL(name, kind)                                                                       \
  m.impl(name, [](const at::Tensor &t, int64_t h, int64_t off, int64_t w, const at::Tensor &o,                 \
                  const c10::optional<at::Tensor> &l) { collective_op(kind, t, h, off, w, o, l); })

TORCH_LIBRARY_IMPL(symm, CUDA, m) {
  SYMM_COLLECTIVE_IMPL("one_shot_all_reduce_handle", kOneShot);
  SYMM_COLLECTIVE_IMPL("two_shot_all_reduce_handle", kTwoShot);
  SYMM_COLLECTIVE_IMPL("reduce_scatter_handle", kReduceScatter);
  SYMM_COLLECTIVE_IMPL("all_gather_handle", kAllGather);
}

// The fake (meta) kernels torch.compile traces with: out is written in
// place, nothing is returned, so there is nothing to compute.
TORCH_LIBRARY_IMPL(symm, Meta, m) {
  for (const char *name : {"one_shot_all_reduce_handle", "two_shot_all_reduce_handle", "reduce_scatter_handle",
                           "all_gather_handle"})
    m.impl(name, [](const at::Tensor &, int64_t, int64_t, int64_t, const at::Tensor &,
                    const c10::optional<at::Tensor> &) {});
}

#endif  // SYMM_TORCH_EXT_OPS_H
