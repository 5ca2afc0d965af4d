// The public C ABI of libsymm (include/symm.h): thin wrappers that check the
// fork flag, skip Go for trivial cases, call the Go exports (go* in
// _cgo_export.h) and keep the per-thread last error. C++ only so that
// symm_pool_alloc can throw in PyTorch's replace mode, after the Go call has
// returned: no Go frame is ever between a throw and its catcher.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "front.h"
#include "shim.h"

namespace {
// Last error of the calling thread. Only a pointer is thread-local: Go's
// c-shared libraries use the initial-exec TLS model, so every thread_local
// byte comes out of glibc's small static TLS surplus, and a library that asks
// for too much fails to dlopen ("cannot allocate memory in static TLS block").
// The buffer itself is malloc'd on a thread's first error and freed at its exit.
struct LastError {
  int code;
  char msg[2048];
};
thread_local LastError *t_err;
pthread_key_t g_err_key;
// Set by symm_torch_init: PyTorch's replace mode, with libsymm's hooks or
// its extension (both call it as PyTorch initializes CUDA). Unset in
// replace mode means PyTorch's plain recipe, which has no graph hooks.
std::atomic<int> g_torch_hooks{0};
// Set in a fork child: the Go runtime's threads did not survive the fork.
volatile int g_forked = 0;

LastError *err_slot() {
  if (t_err == nullptr) {
    t_err = static_cast<LastError *>(calloc(1, sizeof(LastError)));
    if (t_err == nullptr) return nullptr;
    pthread_setspecific(g_err_key, t_err);
  }
  return t_err;
}

void on_fork_child() { g_forked = 1; }

// ---- how PyTorch uses us ------------------------------------------------------
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
// its alloc_fn_ std::function (the first member after the vtable pointer). A
// call whose return address lies in a PyTorch library while another allocator
// is current is a MemPool asking for a segment; every other caller (C, ctypes,
// a C++ extension) gets the caching pool with NULL on failure.
enum { kTorchNone = 0, kTorchReplace = 1, kTorchMemPool = 2 };
std::atomic<void *> g_torch_current_var{nullptr};  // &c10::cuda::CUDACachingAllocator::allocator
std::atomic<int> g_torch_replace{0};               // sticky: the allocator is swapped once per process

void torch_resolve() {
  if (g_torch_current_var.load(std::memory_order_acquire) != nullptr) return;
  // RTLD_NOLOAD: only if PyTorch is already in the process; never load it.
  void *h = dlopen("libc10_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return;
  void *var = dlsym(h, "_ZN3c104cuda20CUDACachingAllocator9allocatorE");
  dlclose(h);  // still loaded: PyTorch holds it
  if (var != nullptr) g_torch_current_var.store(var, std::memory_order_release);
}

// torch_current_is_ours reports whether PyTorch's current CUDA allocator is a
// CUDAPluggableAllocator whose alloc function is symm_pool_alloc.
bool torch_current_is_ours() {
  void *var = g_torch_current_var.load(std::memory_order_acquire);
  if (var == nullptr) return false;
  void *cur = static_cast<std::atomic<void *> *>(var)->load(std::memory_order_acquire);
  if (cur == nullptr) return false;
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

__attribute__((constructor)) void install_handlers() {
  pthread_atfork(nullptr, nullptr, on_fork_child);
  pthread_key_create(&g_err_key, free);
  torch_resolve();  // PyTorch's plain recipe loads us after torch
}

void set_error_c(int code, const char *msg) {
  LastError *e = err_slot();
  if (e == nullptr) return;
  e->code = code;
  snprintf(e->msg, sizeof e->msg, "%s", msg);
}

const char *err_msg() { return t_err ? t_err->msg : ""; }

// forked records the error for fn and reports whether the caller must stop.
bool forked(const char *fn) {
  if (__builtin_expect(g_forked, 0)) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "%s: called in a child process after fork(); libsymm (a Go runtime) "
             "does not survive fork: use it only in the parent, or start children "
             "with spawn/exec",
             fn);
    set_error_c(SYMM_ERR_FORKED, msg);
    return true;
  }
  return false;
}
}  // namespace

extern "C" {

void symmshim_set_error(int code, const char *msg, size_t len) {
  LastError *e = err_slot();
  if (e == nullptr) return;
  e->code = code;
  if (len >= sizeof e->msg) len = sizeof e->msg - 1;
  memcpy(e->msg, msg, len);
  e->msg[len] = 0;
}

int symmshim_forked(void) { return g_forked; }

int symmshim_refuse_forked(const char *fn) { return forked(fn) ? 1 : 0; }

const char *symm_version(void) { return goVersion(); }  // internal/version/VERSION, embedded in Go
const char *symm_last_error(void) { return err_msg(); }
int symm_last_error_code(void) { return t_err ? t_err->code : SYMM_OK; }
void symm_clear_error(void) {
  if (t_err != nullptr) {
    t_err->code = SYMM_OK;
    t_err->msg[0] = 0;
  }
}

size_t symm_copy_last_error(char *buf, size_t len) {
  const char *m = err_msg();
  size_t n = strlen(m);
  if (buf != nullptr && len > 0) {
    size_t k = n < len - 1 ? n : len - 1;
    memcpy(buf, m, k);
    buf[k] = 0;
  }
  return n;
}

}  // extern "C"

namespace {
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
// how to install libsymm instead. cuStreamIsCapturing is taken from the
// libcuda.so.1 already in the process (PyTorch has loaded it); without one
// (the host backend) nothing can be capturing.
typedef int (*StreamIsCapturingFn)(void *stream, int *status);
std::atomic<StreamIsCapturingFn> g_is_capturing{nullptr};
std::atomic<int> g_is_capturing_resolved{0};

StreamIsCapturingFn is_capturing_fn() {
  if (g_is_capturing_resolved.load(std::memory_order_acquire)) return g_is_capturing.load(std::memory_order_relaxed);
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  StreamIsCapturingFn fn = nullptr;
  if (h != nullptr) {
    fn = reinterpret_cast<StreamIsCapturingFn>(dlsym(h, "cuStreamIsCapturing"));
    dlclose(h);  // still loaded: its other users hold it
  }
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
  set_error_c(SYMM_ERR_INVALID, msg);
  return true;
}

}  // namespace

namespace {
// The entry points of pool_alloc (export/pool.go's allocAPIs): the name its
// errors carry.
enum { kApiAlloc = 0, kApiTryAlloc = 1 };
const char *const kApiNames[] = {"symm_pool_alloc", "symm_pool_try_alloc"};

// pool_alloc is symm_pool_alloc without the throw: mode says how PyTorch
// calls (torch_mode_for); NULL with the last error set on failure.
void *pool_alloc(int api, size_t size, int device, void *stream, int mode) {
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
}  // namespace

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
    throw std::runtime_error(err_msg());
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

void symm_pool_free(void *ptr, size_t size, int device, void *stream) {
  if (forked("symm_pool_free") || ptr == nullptr) return;
  if (front_on() && front::free((uintptr_t)ptr, size, device, (uintptr_t)stream)) return;
  goPoolFree((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

void symm_pool_init(int device_count) {
  if (forked("symm_pool_init")) return;
  goPoolInit(device_count, 0);
}

void symm_torch_init(int device_count) {
  if (forked("symm_torch_init")) return;
  g_torch_hooks.store(1, std::memory_order_relaxed);
  g_torch_replace.store(1, std::memory_order_relaxed);
  torch_resolve();
  goPoolInit(device_count, 1);
}

int symm_torch_mode(void) {
  if (g_forked) return kTorchNone;
  torch_resolve();
  if (g_torch_replace.load() || torch_current_is_ours()) return kTorchReplace;
  return g_torch_current_var.load() != nullptr ? kTorchMemPool : kTorchNone;
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

int symm_pool_snapshot(char *buf, size_t cap, size_t *len) {
  if (forked("symm_pool_snapshot")) return SYMM_ERR_FORKED;
  if (len == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_pool_snapshot: len is NULL");
    return SYMM_ERR_INVALID;
  }
  // Front-cached blocks were freed by the caller: show them as free.
  if (front::enabled()) front::drain(-1);
  return goPoolSnapshot(buf, cap, len);
}

void symm_pool_empty_cache(void) {
  if (forked("symm_pool_empty_cache")) return;
  if (front::enabled()) front::drain(-1);
  goPoolEmptyCache();
}

void symm_pool_set_memory_fraction(double fraction, int device) {
  if (forked("symm_pool_set_memory_fraction")) return;
  goPoolSetMemoryFraction(fraction, device);
}

int symm_pool_set_expandable(int enable) {
  if (forked("symm_pool_set_expandable")) return SYMM_ERR_FORKED;
  return goPoolSetExpandable(enable);
}

int symm_pool_set_limit(int device, uint64_t bytes) {
  if (forked("symm_pool_set_limit")) return SYMM_ERR_FORKED;
  return goPoolSetLimit(device, bytes);
}

void symm_pool_record_stream(void *ptr, void *stream) {
  if (forked("symm_pool_record_stream")) return;
  // A block in the front cache was freed by the caller but is still
  // allocated to the pool: give the cached blocks back first, so that the
  // pool answers SYMM_ERR_UNKNOWN_POINTER for them as it does without the
  // front cache, instead of recording a stream on a freed block. Only when
  // something is cached: record_stream is rare next to alloc and free
  // (PyTorch avoids it for NCCL), and a drain costs the cached blocks.
  if (front::enabled() && front::any_cached()) front::drain(-1);
  uintptr_t base = goPoolRecordStream((uintptr_t)ptr, (uintptr_t)stream);
  // Its next free must reach the pool, which waits for the stream's events.
  if (base != 0 && front::enabled()) front::mark_record_stream(base);
}

int symm_pool_stats(int device, symm_stat_t *out, int cap) {
  if (forked("symm_pool_stats")) return -1;
  if (cap < 0 || (cap > 0 && out == nullptr)) {
    set_error_c(SYMM_ERR_INVALID, "symm_pool_stats: out is NULL or cap is negative");
    return -1;
  }
  // The pool counts front-cached blocks as allocated: give them back first,
  // so that current values are exact.
  if (front::enabled()) front::drain(device);
  return goPoolStats(device, out, cap);
}

int symm_pool_reset_peak(int device) {
  if (forked("symm_pool_reset_peak")) return SYMM_ERR_FORKED;
  if (front::enabled()) front::drain(device);
  return goPoolResetPeak(device);
}

int symm_pool_device_count(void) {
  if (forked("symm_pool_device_count")) return -1;
  return goPoolDeviceCount();
}

const char *symm_pool_backend(void) {
  if (g_forked) return "";
  switch (goPoolBackend()) {
    case 1:
      return "cuda";
    case 2:
      return "host";
  }
  return "";
}

void *symm_alloc(size_t size, int device, void *stream) {
  (void)stream;
  if (forked("symm_alloc") || size == 0) return nullptr;
  return (void *)goSymmAlloc(size, device);
}

void symm_free(void *ptr, size_t size, int device, void *stream) {
  (void)size, (void)device, (void)stream;
  if (forked("symm_free") || ptr == nullptr) return;
  goSymmFree((uintptr_t)ptr);
}

int symm_has_multicast_support(int device) {
  (void)device;
  return 0;
}

#define SYMM_GUARD(fn)                     \
  if (forked(fn)) return SYMM_ERR_FORKED;

int symm_store_server(const char *addr, const char *token, symm_store_t *out, char *bound, size_t len) {
  SYMM_GUARD("symm_store_server");
  if (out == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_store_server: out is NULL");
    return SYMM_ERR_INVALID;
  }
  return goStoreServer((char *)(addr ? addr : ""), (char *)(token ? token : ""), out, bound, len);
}

int symm_store_connect(const char *addr, const char *token, int timeout_ms, symm_store_t *out) {
  SYMM_GUARD("symm_store_connect");
  if (addr == nullptr || out == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_store_connect: addr or out is NULL");
    return SYMM_ERR_INVALID;
  }
  return goStoreConnect((char *)addr, (char *)(token ? token : ""), timeout_ms, out);
}

int symm_store_set(symm_store_t s, const char *key, const void *value, size_t len) {
  SYMM_GUARD("symm_store_set");
  if (key == nullptr || (value == nullptr && len > 0)) {
    set_error_c(SYMM_ERR_INVALID, "symm_store_set: key or value is NULL");
    return SYMM_ERR_INVALID;
  }
  return goStoreSet(s, (char *)key, (void *)value, len);
}

int symm_store_get(symm_store_t s, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms) {
  SYMM_GUARD("symm_store_get");
  if (key == nullptr || len == nullptr || (buf == nullptr && cap > 0)) {
    set_error_c(SYMM_ERR_INVALID, "symm_store_get: key, len or buf is NULL");
    return SYMM_ERR_INVALID;
  }
  return goStoreGet(s, (char *)key, buf, cap, len, timeout_ms);
}

int symm_store_add(symm_store_t s, const char *key, int64_t delta, int64_t *out) {
  SYMM_GUARD("symm_store_add");
  if (key == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_store_add: key is NULL");
    return SYMM_ERR_INVALID;
  }
  return goStoreAdd(s, (char *)key, delta, out);
}

int symm_store_close(symm_store_t s) {
  SYMM_GUARD("symm_store_close");
  return goStoreClose(s);
}

int symm_rendezvous(void *ptr, symm_store_t store, const char *group, int rank, int world_size, symm_handle_t *out) {
  SYMM_GUARD("symm_rendezvous");
  if (group == nullptr || out == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_rendezvous: group or out is NULL");
    return SYMM_ERR_INVALID;
  }
  return goRendezvous((uintptr_t)ptr, store, (char *)group, rank, world_size, out);
}

int symm_world_within_direct_access(symm_store_t store, const char *group, int rank, int world_size, int device,
                                    int *out) {
  SYMM_GUARD("symm_world_within_direct_access");
  if (group == nullptr || out == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_world_within_direct_access: group or out is NULL");
    return SYMM_ERR_INVALID;
  }
  return goWorldWithinDirectAccess(store, (char *)group, rank, world_size, device, out);
}

int symm_set_backend(const char *name) {
  SYMM_GUARD("symm_set_backend");
  if (name == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_set_backend: name is NULL");
    return SYMM_ERR_INVALID;
  }
  return goSetBackend((char *)name);
}

int symm_get_backend(char *buf, size_t cap) {
  SYMM_GUARD("symm_get_backend");
  if (buf == nullptr || cap < 8) {
    set_error_c(SYMM_ERR_INVALID, "symm_get_backend: buf is NULL or shorter than 8 bytes");
    return SYMM_ERR_INVALID;
  }
  return goGetBackend(buf, cap);
}

int symm_nvshmem_available(void) {
  if (forked("symm_nvshmem_available")) return 0;
  return goNVSHMEMAvailable();
}

int symm_nccl_available(void) {
  if (forked("symm_nccl_available")) return 0;
  return goNCCLAvailable();
}

int symm_nccl_adopt_comm(void *comm, int device) {
  SYMM_GUARD("symm_nccl_adopt_comm");
  return goNCCLAdoptComm((uintptr_t)comm, device);
}

int symm_backend_init(symm_store_t store, int rank, int world_size, int device) {
  SYMM_GUARD("symm_backend_init");
  return goBackendInit(store, rank, world_size, device);
}

int symm_topology(const char *lib_dirs, char *buf, size_t cap, size_t *len) {
  SYMM_GUARD("symm_topology");
  if (len == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_topology: len is NULL");
    return SYMM_ERR_INVALID;
  }
  return goTopology((char *)lib_dirs, buf, cap, len);
}

int symm_handle_info(symm_handle_t h, symm_handle_info_t *out) {
  SYMM_GUARD("symm_handle_info");
  if (out == nullptr) {
    set_error_c(SYMM_ERR_INVALID, "symm_handle_info: out is NULL");
    return SYMM_ERR_INVALID;
  }
  return goHandleInfo(h, out);
}

int symm_put_signal(symm_handle_t h, int dst_rank, int channel, void *stream) {
  SYMM_GUARD("symm_put_signal");
  return goPutSignal(h, dst_rank, channel, (uintptr_t)stream);
}

int symm_wait_signal(symm_handle_t h, int src_rank, int channel, void *stream, int timeout_ms) {
  SYMM_GUARD("symm_wait_signal");
  return goWaitSignal(h, src_rank, channel, (uintptr_t)stream, timeout_ms);
}

int symm_barrier(symm_handle_t h, int channel, void *stream, int timeout_ms) {
  SYMM_GUARD("symm_barrier");
  return goBarrier(h, channel, (uintptr_t)stream, timeout_ms);
}

int symm_one_shot_all_reduce(symm_handle_t h, size_t offset, size_t count, int dtype, int op, void *out,
                             const void *local_input, void *stream, int timeout_ms) {
  SYMM_GUARD("symm_one_shot_all_reduce");
  return goOneShotAllReduce(h, offset, count, dtype, op, (uintptr_t)out, (uintptr_t)local_input, (uintptr_t)stream,
                            timeout_ms);
}

int symm_kernels_ready(int device) {
  if (forked("symm_kernels_ready")) return 0;
  return goKernelsReady(device);
}

}  // extern "C"

// ---- PyTorch's CUDA-graph hooks ------------------------------------------------
// C++ linkage types on C names: PyTorch calls them through std::function
// objects made from these addresses (torch/csrc/cuda/Module.cpp).

using TorchPoolId = std::pair<unsigned long long, unsigned long long>;

extern "C" void symm_torch_begin_allocate_to_pool(int device, TorchPoolId id,
                                                  std::function<bool(CUstream_st *)> filter) {
  if (forked("symm_torch_begin_allocate_to_pool")) throw std::runtime_error(err_msg());
  torch_resolve();
  // Called from CUDAGraph::capture_begin, which can report an exception; the
  // capture would otherwise go on without a pool.
  if (begin_route("symm_torch_begin_allocate_to_pool",
                  Route{device, id.first, id.second, false, 0, std::move(filter)}) != SYMM_OK)
    throw std::runtime_error(err_msg());
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
