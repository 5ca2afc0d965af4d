/*
 * fakecuda.c — a stand-in for libcuda.so.1 that the tests of package cuda
 * compile (with the system C compiler, not cgo) and load through the same
 * code path as the real driver, so loading, the trampolines' argument
 * passing and the context handling are exercised on machines without a GPU.
 *
 * It follows the prototypes of the CUDA 12.0 ABI (cuMemAlloc_v2, ...) and the
 * documented semantics closely enough for those tests: device memory is host
 * memory, a context stack per thread, events that report "not ready" once
 * after each record. Two rules are stricter than the real driver on purpose:
 *   - stream NULL is rejected (CUDA_ERROR_INVALID_HANDLE): libsymm must send
 *     the legacy default stream as CU_STREAM_LEGACY (0x1);
 *   - memory, event and stream calls fail with CUDA_ERROR_INVALID_CONTEXT
 *     when no context is current, and devices are numbered CUdevice =
 *     ordinal + 10, so a missing context push or an ordinal passed where a
 *     CUdevice is expected shows up.
 *
 * Only cuGetProcAddress(_v2) and cuDriverGetVersion are exported; everything
 * else is reachable only through cuGetProcAddress, as libsymm requires.
 *
 * Knobs (environment, read at each call):
 *   FAKE_CUDA_OMIT=a,b      cuGetProcAddress does not know these symbols
 *   FAKE_CUDA_INIT_RESULT=n cuInit returns n
 *   FAKE_CUDA_DEVICES=n     number of devices (default 2, at most 4)
 *   FAKE_CUDA_MISALIGN=1    cuMemAlloc returns 256-byte (not 512) aligned blocks
 * Build flags: -DFAKE_V1 builds a CUDA 11.8 driver without cuGetProcAddress_v2.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;

#ifdef FAKE_V1
#define FAKE_VERSION 11080
#else
#define FAKE_VERSION 12040
#endif
/* The ABI version libsymm must ask for: 12000, clamped to an older driver's. */
#define FAKE_ABI (FAKE_VERSION < 12000 ? FAKE_VERSION : 12000)

enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  NOT_INITIALIZED = 3,
  INVALID_DEVICE = 101,
  INVALID_CONTEXT = 201,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
  NOT_READY = 600,
};

#define MAXDEV 4
#define DEVMEM (1ull << 30) /* 1 GiB per fake device */
#define DEVBASE 10          /* CUdevice = ordinal + DEVBASE */
#define STACK 16
#define MAXALLOC 4096

static int initialized;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int env_int(const char *name, int def) {
  const char *v = getenv(name);
  return (v && *v) ? atoi(v) : def;
}

static int ndev(void) {
  int n = env_int("FAKE_CUDA_DEVICES", 2);
  return n < 0 ? 0 : (n > MAXDEV ? MAXDEV : n);
}

static int dev_index(CUdevice d) {
  int i = d - DEVBASE;
  return (i >= 0 && i < ndev()) ? i : -1;
}

/* ---- contexts ---- */

#define CTX_MAGIC 0x43545821
struct ctx {
  int magic;
  int ordinal;
  int retains;
};
static struct ctx prim[MAXDEV];
static __thread struct ctx *stack[STACK];
static __thread int depth;

static struct ctx *current(void) { return depth ? stack[depth - 1] : NULL; }
static int cur_dev(void) { return current() ? current()->ordinal : -1; }

/* ---- memory ---- */

struct block {
  uintptr_t p;
  void *base;
  size_t n;
  int dev;
};
static struct block blocks[MAXALLOC];
static unsigned long long used[MAXDEV];

/* find the block containing [p, p+n); caller holds mu */
static struct block *find(uintptr_t p, size_t n) {
  for (int i = 0; i < MAXALLOC; i++)
    if (blocks[i].p && p >= blocks[i].p && p + n <= blocks[i].p + blocks[i].n)
      return &blocks[i];
  return NULL;
}

/* ---- events and streams ---- */

#define EV_MAGIC 0x45564e54
#define ST_MAGIC 0x5354524d
struct event {
  int magic;
  struct ctx *ctx;
  unsigned flags;
  int pending;
};
struct stream {
  int magic;
  struct ctx *ctx;
  unsigned flags;
};

/* A stream argument is valid if it is CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
 * or a stream of the current context. NULL is refused (see top). */
static int check_stream(CUstream s) {
  if (s == NULL) return INVALID_HANDLE;
  if (s == (CUstream)1 || s == (CUstream)2) return OK;
  struct stream *st = s;
  if (st->magic != ST_MAGIC || st->ctx != current()) return INVALID_HANDLE;
  return OK;
}

/* ---- the driver functions ---- */

#define NEED_INIT() \
  do { if (!initialized) return NOT_INITIALIZED; } while (0)
#define NEED_CTX() \
  do { NEED_INIT(); if (!current()) return INVALID_CONTEXT; } while (0)

static CUresult f_cuInit(unsigned flags) {
  int r = env_int("FAKE_CUDA_INIT_RESULT", 0);
  if (flags != 0) return INVALID_VALUE;
  if (r == 0) initialized = 1;
  return r;
}

static CUresult f_cuDriverGetVersion(int *v) {
  if (!v) return INVALID_VALUE;
  *v = FAKE_VERSION;
  return OK;
}

/* Exported too: libsymm reads the version with dlsym before it can ask an
 * 11.x cuGetProcAddress for anything. */
CUresult cuDriverGetVersion(int *v) { return f_cuDriverGetVersion(v); }

static CUresult f_cuDeviceGetCount(int *n) {
  NEED_INIT();
  *n = ndev();
  return OK;
}

static CUresult f_cuDeviceGet(CUdevice *d, int ordinal) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= ndev()) return INVALID_DEVICE;
  *d = ordinal + DEVBASE;
  return OK;
}

static CUresult f_cuDeviceGetName(char *name, int len, CUdevice d) {
  NEED_INIT();
  int i = dev_index(d);
  if (i < 0) return INVALID_DEVICE;
  if (!name || len <= 0) return INVALID_VALUE;
  snprintf(name, (size_t)len, "Fake GPU %d", i);
  return OK;
}

static CUresult f_cuDeviceTotalMem(size_t *bytes, CUdevice d) {
  NEED_INIT();
  if (dev_index(d) < 0) return INVALID_DEVICE;
  *bytes = DEVMEM;
  return OK;
}

static CUresult f_cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  NEED_INIT();
  int i = dev_index(d);
  if (i < 0) return INVALID_DEVICE;
  switch (attr) {
  case 75: *v = 9; break;       /* compute capability 9.0 */
  case 76: *v = 0; break;
  case 33: *v = 0x10 + i; break; /* PCI bus id */
  default: *v = attr; break;
  }
  return OK;
}

static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  NEED_INIT();
  int i = dev_index(d);
  if (i < 0) return INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  prim[i].magic = CTX_MAGIC;
  prim[i].ordinal = i;
  prim[i].retains++;
  pthread_mutex_unlock(&mu);
  *c = &prim[i];
  return OK;
}

static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d) {
  NEED_INIT();
  int i = dev_index(d);
  if (i < 0) return INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  int r = prim[i].retains > 0 ? OK : INVALID_CONTEXT;
  if (r == OK) prim[i].retains--;
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult f_cuCtxGetCurrent(CUcontext *c) {
  NEED_INIT();
  *c = current();
  return OK;
}

static CUresult f_cuCtxSetCurrent(CUcontext c) {
  NEED_INIT();
  if (c == NULL) {
    if (depth) depth--;
    return OK;
  }
  if (((struct ctx *)c)->magic != CTX_MAGIC) return INVALID_CONTEXT;
  if (depth == 0) depth = 1;
  stack[depth - 1] = c;
  return OK;
}

static CUresult f_cuCtxPushCurrent(CUcontext c) {
  NEED_INIT();
  if (c == NULL || ((struct ctx *)c)->magic != CTX_MAGIC) return INVALID_CONTEXT;
  if (depth == STACK) return INVALID_VALUE;
  stack[depth++] = c;
  return OK;
}

static CUresult f_cuCtxPopCurrent(CUcontext *c) {
  NEED_INIT();
  if (depth == 0) return INVALID_CONTEXT;
  *c = stack[--depth];
  return OK;
}

static CUresult f_cuCtxGetDevice(CUdevice *d) {
  NEED_CTX();
  *d = current()->ordinal + DEVBASE;
  return OK;
}

static CUresult f_cuCtxSynchronize(void) {
  NEED_CTX();
  return OK;
}

static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  if (n == 0) return INVALID_VALUE;
  int dev = cur_dev();
  int misalign = env_int("FAKE_CUDA_MISALIGN", 0);
  pthread_mutex_lock(&mu);
  if (used[dev] + n > DEVMEM) {
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  struct block *b = NULL;
  for (int i = 0; i < MAXALLOC && !b; i++)
    if (!blocks[i].p) b = &blocks[i];
  void *base = NULL;
  if (!b || posix_memalign(&base, 4096, n + 256) != 0) {
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  b->base = base;
  b->p = (uintptr_t)base + (misalign ? 256 : 0);
  b->n = n;
  b->dev = dev;
  used[dev] += n;
  *p = b->p;
  pthread_mutex_unlock(&mu);
  return OK;
}

static CUresult f_cuMemFree(CUdeviceptr p) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  struct block *b = find((uintptr_t)p, 1);
  if (!b || b->p != (uintptr_t)p) {
    pthread_mutex_unlock(&mu);
    return INVALID_VALUE;
  }
  used[b->dev] -= b->n;
  free(b->base);
  memset(b, 0, sizeof *b);
  pthread_mutex_unlock(&mu);
  return OK;
}

static CUresult f_cuMemGetInfo(size_t *free_, size_t *total) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  *free_ = DEVMEM - used[cur_dev()];
  pthread_mutex_unlock(&mu);
  *total = DEVMEM;
  return OK;
}

static CUresult f_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  int ok = find((uintptr_t)dst, n) != NULL;
  pthread_mutex_unlock(&mu);
  if (!ok || !src) return INVALID_VALUE;
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}

static CUresult f_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  int ok = find((uintptr_t)src, n) != NULL;
  pthread_mutex_unlock(&mu);
  if (!ok || !dst) return INVALID_VALUE;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return OK;
}

static CUresult f_cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  int ok = find((uintptr_t)dst, n) != NULL;
  pthread_mutex_unlock(&mu);
  if (!ok) return INVALID_VALUE;
  memset((void *)(uintptr_t)dst, v, n);
  return OK;
}

static CUresult f_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  NEED_INIT();
  if (attr != 9 /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct block *b = find((uintptr_t)p, 1);
  int dev = b ? b->dev : -1;
  pthread_mutex_unlock(&mu);
  if (dev < 0) return INVALID_VALUE;
  *(int *)data = dev;
  return OK;
}

static CUresult f_cuEventCreate(CUevent *e, unsigned flags) {
  NEED_CTX();
  struct event *ev = calloc(1, sizeof *ev);
  ev->magic = EV_MAGIC;
  ev->ctx = current();
  ev->flags = flags;
  *e = ev;
  return OK;
}

static CUresult f_cuEventRecord(CUevent e, CUstream s) {
  NEED_CTX();
  struct event *ev = e;
  if (!ev || ev->magic != EV_MAGIC || ev->ctx != current()) return INVALID_HANDLE;
  int r = check_stream(s);
  if (r) return r;
  ev->pending = 1;
  return OK;
}

static CUresult f_cuEventQuery(CUevent e) {
  NEED_INIT();
  struct event *ev = e;
  if (!ev || ev->magic != EV_MAGIC) return INVALID_HANDLE;
  if (ev->pending) {
    ev->pending = 0; /* done by the next query */
    return NOT_READY;
  }
  return OK;
}

static CUresult f_cuEventSynchronize(CUevent e) {
  NEED_INIT();
  struct event *ev = e;
  if (!ev || ev->magic != EV_MAGIC) return INVALID_HANDLE;
  ev->pending = 0;
  return OK;
}

static CUresult f_cuEventDestroy(CUevent e) {
  NEED_INIT();
  struct event *ev = e;
  if (!ev || ev->magic != EV_MAGIC) return INVALID_HANDLE;
  ev->magic = 0;
  free(ev);
  return OK;
}

static CUresult f_cuStreamCreate(CUstream *s, unsigned flags) {
  NEED_CTX();
  struct stream *st = calloc(1, sizeof *st);
  st->magic = ST_MAGIC;
  st->ctx = current();
  st->flags = flags;
  *s = st;
  return OK;
}

static CUresult f_cuStreamDestroy(CUstream s) {
  NEED_CTX();
  int r = check_stream(s);
  if (r) return r;
  if (s == (CUstream)1 || s == (CUstream)2) return INVALID_HANDLE;
  ((struct stream *)s)->magic = 0;
  free(s);
  return OK;
}

static CUresult f_cuStreamSynchronize(CUstream s) {
  NEED_CTX();
  return check_stream(s);
}

static CUresult f_cuStreamWriteValue32(CUstream s, CUdeviceptr addr,
                                       cuuint32_t v, unsigned flags) {
  NEED_CTX();
  int r = check_stream(s);
  if (r) return r;
  if (flags != 0 || (addr & 3)) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int ok = find((uintptr_t)addr, 4) != NULL;
  pthread_mutex_unlock(&mu);
  if (!ok) return INVALID_VALUE;
  *(volatile cuuint32_t *)(uintptr_t)addr = v;
  return OK;
}

static CUresult f_cuStreamWaitValue32(CUstream s, CUdeviceptr addr,
                                      cuuint32_t v, unsigned flags) {
  NEED_CTX();
  int r = check_stream(s);
  if (r) return r;
  (void)v;
  if (flags > 3 || (addr & 3)) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int ok = find((uintptr_t)addr, 4) != NULL;
  pthread_mutex_unlock(&mu);
  return ok ? OK : INVALID_VALUE;
}

static CUresult f_cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
  case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
  case NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
  default: *s = NULL; return INVALID_VALUE;
  }
}

static CUresult f_cuGetErrorString(CUresult e, const char **s) {
  switch (e) {
  case OUT_OF_MEMORY: *s = "fake out of memory"; return OK;
  case NOT_READY: *s = "fake not ready"; return OK;
  default: *s = NULL; return INVALID_VALUE;
  }
}

/* ---- entry points ---- */

static const struct {
  const char *name;
  void *fn;
} table[] = {
    {"cuInit", (void *)f_cuInit},
    {"cuDriverGetVersion", (void *)f_cuDriverGetVersion},
    {"cuDeviceGetCount", (void *)f_cuDeviceGetCount},
    {"cuDeviceGet", (void *)f_cuDeviceGet},
    {"cuDeviceGetName", (void *)f_cuDeviceGetName},
    {"cuDeviceTotalMem", (void *)f_cuDeviceTotalMem},
    {"cuDeviceGetAttribute", (void *)f_cuDeviceGetAttribute},
    {"cuDevicePrimaryCtxRetain", (void *)f_cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", (void *)f_cuDevicePrimaryCtxRelease},
    {"cuCtxGetCurrent", (void *)f_cuCtxGetCurrent},
    {"cuCtxSetCurrent", (void *)f_cuCtxSetCurrent},
    {"cuCtxPushCurrent", (void *)f_cuCtxPushCurrent},
    {"cuCtxPopCurrent", (void *)f_cuCtxPopCurrent},
    {"cuCtxGetDevice", (void *)f_cuCtxGetDevice},
    {"cuCtxSynchronize", (void *)f_cuCtxSynchronize},
    {"cuMemAlloc", (void *)f_cuMemAlloc},
    {"cuMemFree", (void *)f_cuMemFree},
    {"cuMemGetInfo", (void *)f_cuMemGetInfo},
    {"cuMemcpyHtoD", (void *)f_cuMemcpyHtoD},
    {"cuMemcpyDtoH", (void *)f_cuMemcpyDtoH},
    {"cuMemsetD8", (void *)f_cuMemsetD8},
    {"cuPointerGetAttribute", (void *)f_cuPointerGetAttribute},
    {"cuEventCreate", (void *)f_cuEventCreate},
    {"cuEventRecord", (void *)f_cuEventRecord},
    {"cuEventQuery", (void *)f_cuEventQuery},
    {"cuEventSynchronize", (void *)f_cuEventSynchronize},
    {"cuEventDestroy", (void *)f_cuEventDestroy},
    {"cuStreamCreate", (void *)f_cuStreamCreate},
    {"cuStreamDestroy", (void *)f_cuStreamDestroy},
    {"cuStreamSynchronize", (void *)f_cuStreamSynchronize},
    {"cuStreamWriteValue32", (void *)f_cuStreamWriteValue32},
    {"cuStreamWaitValue32", (void *)f_cuStreamWaitValue32},
    {"cuGetErrorName", (void *)f_cuGetErrorName},
    {"cuGetErrorString", (void *)f_cuGetErrorString},
    /* No virtual memory management: those stay unresolved in the tests. */
};

static int omitted(const char *sym) {
  const char *list = getenv("FAKE_CUDA_OMIT");
  size_t n = strlen(sym);
  while (list && *list) {
    const char *end = strchr(list, ',');
    size_t len = end ? (size_t)(end - list) : strlen(list);
    if (len == n && strncmp(list, sym, n) == 0) return 1;
    list = end ? end + 1 : NULL;
  }
  return 0;
}

/* Base names only ("cuMemAlloc", never "cuMemAlloc_v2"), the pinned ABI
 * version only, default flags only: anything else is a libsymm bug. */
static CUresult lookup(const char *sym, void **pfn, int ver, cuuint64_t flags,
                       int *found) {
  *pfn = NULL;
  *found = 0;
  if (!sym || flags != 0 || ver != FAKE_ABI) return INVALID_VALUE;
  if (omitted(sym)) return OK;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].name, sym) == 0) {
      *pfn = table[i].fn;
      *found = 1;
      return OK;
    }
  return OK;
}

/* CUDA 11.3+: symbol not found is CUDA_ERROR_NOT_FOUND. */
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver,
                          cuuint64_t flags) {
  int found;
  CUresult r = lookup(sym, pfn, ver, flags, &found);
  return (r == OK && !found) ? NOT_FOUND : r;
}

#ifndef FAKE_V1
/* CUDA 12: not found is success with NULL and status
 * CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (1). */
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver,
                             cuuint64_t flags, int *status) {
  int found;
  CUresult r = lookup(sym, pfn, ver, flags, &found);
  if (status) *status = found ? 0 : 1;
  return r;
}
#endif
