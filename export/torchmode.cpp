// How PyTorch uses libsymm, and the public functions whose answer depends on
// it: symm_pool_alloc (which throws in replace mode), symm_pool_try_alloc,
// symm_torch_init, symm_torch_own_allocator and symm_torch_mode.
//
// PyTorch calls symm_pool_alloc in two ways that need opposite answers:
// replace mode (change_current_allocator: libsymm is the caching allocator,
// and a failure must throw, since PyTorch turns NULL into a tensor at address
// 0) and MemPool mode (PyTorch's own caching allocator is current and asks us
// for segments: a failure must be NULL, which PyTorch turns into
// torch.OutOfMemoryError after its own retry, and a segment it frees must go
// back to the device, since it caches already). Both come through the same
// CUDAPluggableAllocator object, with hooks or without (PyTorch's plain
// recipe sets none), so the library looks: c10's current-allocator pointer
// (c10::cuda::CUDACachingAllocator::allocator) names PyTorch's allocator
// object; a CUDAPluggableAllocator over us holds symm_pool_alloc's address in
// its alloc_fn_ std::function (the first member after the vtable pointer);
// libsymm's PyTorch extension names its own object (symm_torch_own_allocator),
// so that this file is the one place that decides the mode and the extension
// asks it (symm_torch_mode). A
// call whose return address lies in a PyTorch library while another allocator
// is current is a MemPool asking for a segment; every other caller (C, ctypes,
// a C++ extension) gets the caching pool with NULL on failure.
//
// The shim is C++ only so that symm_pool_alloc can throw in replace mode,
// after the Go call has returned: no Go frame is ever between a throw and its
// catcher.
#include <dlfcn.h>

#include <atomic>
#include <stdexcept>
#include <stdio.h>
#include <string.h>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "shim_internal.h"

using namespace symmshim;

namespace {
// Set by symm_torch_init: PyTorch's replace mode, with libsymm's hooks or
// its extension (both call it as PyTorch initializes CUDA). Unset in
// replace mode means PyTorch's plain recipe, which has no graph hooks.
std::atomic<int> g_torch_hooks{0};
std::atomic<void *> g_torch_current_var{nullptr};  // &c10::cuda::CUDACachingAllocator::allocator
std::atomic<int> g_torch_replace{0};               // sticky: the allocator is swapped once per process
std::atomic<void *> g_torch_own{nullptr};          // the extension's CUDAAllocator (symm_torch_own_allocator)

// torch_current_is_ours reports whether PyTorch's current CUDA allocator is a
// CUDAPluggableAllocator whose alloc function is symm_pool_alloc.
bool torch_current_is_ours() {
  void *var = g_torch_current_var.load(std::memory_order_acquire);
  if (var == nullptr) return false;
  void *cur = static_cast<std::atomic<void *> *>(var)->load(std::memory_order_acquire);
  if (cur == nullptr) return false;
  if (cur == g_torch_own.load(std::memory_order_acquire)) return true;
  // Every CUDAAllocator object is far larger than these 8 words.
  void *const *words = static_cast<void *const *>(cur);
  void *mine = reinterpret_cast<void *>(&symm_pool_alloc);
  for (int i = 1; i <= 8; i++)
    if (words[i] == mine) return true;
  return false;
}

// caller_is_torch reports whether code at return address ra belongs to a
// PyTorch library, caching the answer for the few call sites there are.
struct CallerEntry {
  std::atomic<uintptr_t> ra{0};
  std::atomic<int> torch{0};
};
CallerEntry g_callers[16];
bool caller_is_torch(void *ra) {
  uintptr_t a = (uintptr_t)ra;
  for (CallerEntry &e : g_callers) {
    uintptr_t v = e.ra.load(std::memory_order_acquire);
    if (v == a) return e.torch.load(std::memory_order_relaxed) != 0;
    if (v == 0) break;
  }
  Dl_info info;
  bool torch = dladdr(ra, &info) != 0 && info.dli_fname != nullptr &&
               (strstr(info.dli_fname, "libtorch") != nullptr || strstr(info.dli_fname, "libc10") != nullptr);
  for (CallerEntry &e : g_callers) {
    uintptr_t expect = 0;
    e.torch.store(torch, std::memory_order_relaxed);
    if (e.ra.compare_exchange_strong(expect, a, std::memory_order_release) || expect == a) break;
  }
  return torch;
}

int torch_mode_for(void *ra) {
  if (g_torch_replace.load(std::memory_order_relaxed)) return kTorchReplace;
  if (g_torch_current_var.load(std::memory_order_relaxed) == nullptr) return kTorchNone;
  if (torch_current_is_ours()) {
    g_torch_replace.store(1, std::memory_order_relaxed);
    return kTorchReplace;
  }
  return caller_is_torch(ra) ? kTorchMemPool : kTorchNone;
}

// PyTorch's plain recipe loads us after torch.
__attribute__((constructor)) void resolve_at_load() { torch_resolve(); }

// ---- PyTorch's plain recipe and CUDA graphs ------------------------------------
//
// With PyTorch's plain recipe (CUDAPluggableAllocator(path, "symm_pool_alloc",
// "symm_pool_free"), no hooks) PyTorch never tells libsymm that a graph
// capture begins, so memory a capture allocates and frees would go back to
// the shared pool, be handed to tensors made after the capture, and be
// overwritten by every replay: silent corruption. The driver knows which
// stream is capturing, so in that mode (and only there: with hooks or the
// extension, captures arrive as routes to private pools) every allocation
// asks it, and one on a capturing stream is refused with an error that says
// how to install libsymm instead. cuStreamIsCapturing comes from the driver
// the pool runs on (the cuda package, libsymm's one loader of libcuda); on
// the host backend there is none, and nothing can be capturing.
typedef int (*StreamIsCapturingFn)(void *stream, int *status);
std::atomic<StreamIsCapturingFn> g_is_capturing{nullptr};
std::atomic<int> g_is_capturing_resolved{0};

StreamIsCapturingFn is_capturing_fn() {
  if (g_is_capturing_resolved.load(std::memory_order_acquire)) return g_is_capturing.load(std::memory_order_relaxed);
  // Makes the pool if needed (the allocation after this would); a pool that
  // cannot be made fails that allocation with its own error.
  StreamIsCapturingFn fn = reinterpret_cast<StreamIsCapturingFn>(goDriverProc((char *)"cuStreamIsCapturing"));
  g_is_capturing.store(fn, std::memory_order_relaxed);
  g_is_capturing_resolved.store(1, std::memory_order_release);
  return fn;
}

bool plain_recipe_capturing(int device, void *stream) {
  StreamIsCapturingFn fn = is_capturing_fn();
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  if (fn == nullptr || fn(stream, &status) != 0 || status == 0) return false;
  char msg[640];
  snprintf(msg, sizeof msg,
           "symm_pool_alloc: stream %p of device %d is capturing a CUDA graph, but PyTorch was given libsymm "
           "without its graph hooks (the plain CUDAPluggableAllocator recipe): memory the capture frees would "
           "go to tensors made after it and be overwritten by every replay. Install libsymm with "
           "symm.use_as_default() or torch.cuda.memory.change_current_allocator(symm.pool_allocator()), "
           "which keep each graph's memory in a private pool",
           stream, device);
  set_error(SYMM_ERR_INVALID, msg);
  return true;
}
}  // namespace

void symmshim::torch_resolve() {
  if (g_torch_current_var.load(std::memory_order_acquire) != nullptr) return;
  // RTLD_NOLOAD: only if PyTorch is already in the process; never load it.
  void *h = dlopen("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return;
  void *var = dlsym(h, "_ZN3c104cuda20CUDACachingAllocator9allocatorE");
  dlclose(h);  // still loaded: PyTorch holds it
  if (var != nullptr) g_torch_current_var.store(var, std::memory_order_release);
}

extern "C" {

void *symm_pool_alloc(size_t size, int device, void *stream) {
  void *ra = __builtin_return_address(0);
  int mode = torch_mode_for(ra);
  void *p;
  if (__builtin_expect(mode == kTorchReplace && g_torch_hooks.load(std::memory_order_relaxed) == 0, 0) &&
      size != 0 && plain_recipe_capturing(device, stream))
    p = nullptr;  // refused, with the last error saying why
  else
    p = pool_alloc(kApiAlloc, size, device, stream, mode);
  if (__builtin_expect(p == nullptr, 0) && size != 0 && mode == kTorchReplace && caller_is_torch(ra)) {
    // PyTorch's replace mode cannot take NULL (a tensor at address 0): throw,
    // with the Go message; pybind11 turns std::runtime_error into a Python
    // RuntimeError. Only when PyTorch's own code is the caller: through
    // ctypes or a C caller an exception would abort the process (no C frame
    // can pass it on), so they get NULL and the last error, as the header
    // promises. No Go frame is between here and PyTorch.
    throw std::runtime_error(last_error_msg());
  }
  return p;
}

void *symm_pool_try_alloc(size_t size, int device, void *stream) {
  // Never throws, whatever PyTorch's mode: for ctypes (Python's symm.alloc)
  // and C++ callers, through which an exception would abort the process.
  // Not a PyTorch caller: the caching pool, as for C.
  int mode = g_torch_replace.load(std::memory_order_relaxed) ? kTorchReplace : kTorchNone;
  return pool_alloc(kApiTryAlloc, size, device, stream, mode);
}

void symm_torch_init(int device_count) {
  if (forked("symm_torch_init")) return;
  g_torch_hooks.store(1, std::memory_order_relaxed);
  g_torch_replace.store(1, std::memory_order_relaxed);
  torch_resolve();
  goPoolInit(device_count, 1);
}

void symm_torch_own_allocator(const void *allocator) {
  if (forked("symm_torch_own_allocator")) return;
  g_torch_own.store(const_cast<void *>(allocator), std::memory_order_release);
}

int symm_torch_mode(void) {
  if (g_forked) return kTorchNone;
  torch_resolve();
  if (g_torch_replace.load() || torch_current_is_ours()) return kTorchReplace;
  return g_torch_current_var.load() != nullptr ? kTorchMemPool : kTorchNone;
}

}  // extern "C"
