// The public C ABI of libsymm (include/symm.h): thin wrappers that check the
// fork flag, skip Go for trivial cases, call the Go exports (go* in
// _cgo_export.h) and keep the per-thread last error. C++ only so that
// symm_pool_alloc can throw in PyTorch's replace mode, after the Go call has
// returned: no Go frame is ever between a throw and its catcher.
#include <pthread.h>
#include <stdexcept>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "front.h"
#include "shim.h"

#define SYMM_VERSION_STRING "0.1.0"

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
// Set by symm_torch_init: failed allocations throw instead of returning NULL.
int g_throw = 0;
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

__attribute__((constructor)) void install_handlers() {
  pthread_atfork(nullptr, nullptr, on_fork_child);
  pthread_key_create(&g_err_key, free);
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

const char *symm_version(void) { return SYMM_VERSION_STRING; }
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

void *symm_pool_alloc(size_t size, int device, void *stream) {
  if (forked("symm_pool_alloc")) {
    if (g_throw) throw std::runtime_error(err_msg());
    return nullptr;
  }
  if (size == 0) return nullptr;
  if (front::enabled()) {
    if (uintptr_t hit = front::alloc_hit(size, device, (uintptr_t)stream)) return (void *)hit;
  }
  uint64_t bsize = 0;
  uintptr_t p = goPoolAlloc(size, device, (uintptr_t)stream, &bsize);
  if (p != 0 && front::enabled()) front::on_go_alloc(p, bsize, size, device, (uintptr_t)stream);
  if (__builtin_expect(p == 0, 0) && g_throw) {
    // PyTorch's replace mode cannot take NULL: throw, with the Go message.
    // pybind11/PyTorch turn std::runtime_error into a Python RuntimeError.
    throw std::runtime_error(err_msg());
  }
  return (void *)p;
}

void symm_pool_free(void *ptr, size_t size, int device, void *stream) {
  if (forked("symm_pool_free") || ptr == nullptr) return;
  if (front::enabled() && front::free((uintptr_t)ptr, size, device, (uintptr_t)stream)) return;
  goPoolFree((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

void symm_pool_init(int device_count) {
  if (forked("symm_pool_init")) return;
  goPoolInit(device_count, 0);
}

void symm_torch_init(int device_count) {
  if (forked("symm_torch_init")) return;
  g_throw = 1;
  goPoolInit(device_count, 1);
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

}  // extern "C"
