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
 * Virtual memory management is modelled with the host's own: cuMemCreate makes
 * a memfd, cuMemExportToShareableHandle dups it, cuMemImportFromShareableHandle
 * accepts any descriptor of such a memfd (of this process or another),
 * cuMemAddressReserve maps a PROT_NONE range, cuMemMap maps the memfd over
 * part of it (still PROT_NONE) and cuMemSetAccess mprotects it and records
 * which devices may read or write it; copies, memsets and stream memory
 * operations through a mapping check that the current device has access.
 * Handles are counted references; the memory goes when it is neither held
 * nor mapped. Granularity is 2 MiB minimum, 4 MiB recommended.
 *
 * Streams remember their pending cuStreamWaitValue32 waits: cuStreamQuery
 * answers CUDA_ERROR_NOT_READY until each waited-for word meets its
 * condition (GEQ, EQ, AND, NOR, evaluated at the query).
 *
 * Knobs (environment, read at each call):
 *   FAKE_CUDA_OMIT=a,b      cuGetProcAddress does not know these symbols
 *   FAKE_CUDA_FAIL=a,b      these functions return CUDA_ERROR_UNKNOWN (999)
 *   FAKE_CUDA_INIT_RESULT=n cuInit returns n
 *   FAKE_CUDA_DEVICES=n     number of devices (default 2, at most 4)
 *   FAKE_CUDA_MISALIGN=1    cuMemAlloc returns 256-byte (not 512) aligned blocks
 *   FAKE_CUDA_NO_PEER=1     cuDeviceCanAccessPeer answers 0
 * Device attributes 90001, 90002 and 90003 (not CUDA's) report the number of
 * live address reservations, mappings and allocations, for leak checks.
 * Build flags: -DFAKE_V1 builds a CUDA 11.8 driver without cuGetProcAddress_v2.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef unsigned long long CUmemGenericAllocationHandle;

/* As in cuda.h (CUDA 12). */
typedef struct {
  int type;
  int id;
} CUmemLocation;
typedef struct {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;
typedef struct {
  CUmemLocation location;
  int flags;
} CUmemAccessDesc;

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
  ILLEGAL_ADDRESS = 700,
  UNKNOWN = 999,
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

/* whether the comma-separated list in environment variable var has sym */
static int listed(const char *var, const char *sym) {
  const char *list = getenv(var);
  size_t n = strlen(sym);
  while (list && *list) {
    const char *end = strchr(list, ',');
    size_t len = end ? (size_t)(end - list) : strlen(list);
    if (len == n && strncmp(list, sym, n) == 0) return 1;
    list = end ? end + 1 : NULL;
  }
  return 0;
}

#define FAILS(name) \
  do { if (listed("FAKE_CUDA_FAIL", name)) return UNKNOWN; } while (0)

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

/* ---- virtual memory management ---- */

#define GRAN_MIN (2ull << 20)
#define GRAN_REC (4ull << 20)
#define MAXVMM 256
#define MEMFD_PREFIX "fakecuda-vmm-"

/* An allocation: a memfd, held by handle references and mappings. */
struct vmm_alloc {
  CUmemGenericAllocationHandle handle; /* 0: slot free */
  int refs;                            /* create/import/retain - release */
  int maps;                            /* live mappings of it */
  int fd;                              /* our own descriptor of the memfd */
  size_t size;
  int dev;
  int exportable; /* POSIX file descriptor requested at creation */
  int imported;   /* counted against its device when it was created */
};
struct vmm_range {
  uintptr_t p;
  size_t n; /* 0: slot free */
};
struct vmm_map {
  uintptr_t p;
  size_t n; /* 0: slot free */
  struct vmm_alloc *a;
  unsigned rw, ro; /* devices (bit per ordinal) with read-write, read access */
};
static struct vmm_alloc allocs[MAXVMM];
static struct vmm_range ranges[MAXVMM];
static struct vmm_map maps[MAXVMM];
static unsigned long long generation;

/* the live allocation with handle h, or NULL; caller holds mu */
static struct vmm_alloc *alloc_of(CUmemGenericAllocationHandle h) {
  unsigned long long slot = h & 0xfff;
  if (h == 0 || slot >= MAXVMM) return NULL;
  struct vmm_alloc *a = &allocs[slot];
  return (a->handle == h && a->refs > 0) ? a : NULL;
}

/* a free allocation slot with a fresh handle, or NULL; caller holds mu */
static struct vmm_alloc *new_alloc(void) {
  for (int i = 0; i < MAXVMM; i++)
    if (!allocs[i].handle) {
      memset(&allocs[i], 0, sizeof allocs[i]);
      allocs[i].handle = (++generation << 12) | (unsigned)i;
      allocs[i].fd = -1;
      return &allocs[i];
    }
  return NULL;
}

/* frees a once it is neither held nor mapped; caller holds mu */
static void maybe_free(struct vmm_alloc *a) {
  if (a->refs > 0 || a->maps > 0) return;
  close(a->fd);
  if (!a->imported) used[a->dev] -= a->size;
  memset(a, 0, sizeof *a);
}

/* the mapping containing [p, p+n), or NULL; caller holds mu */
static struct vmm_map *map_of(uintptr_t p, size_t n) {
  for (int i = 0; i < MAXVMM; i++)
    if (maps[i].n && p >= maps[i].p && p + n <= maps[i].p + maps[i].n)
      return &maps[i];
  return NULL;
}

/* the reservation containing [p, p+n), or NULL; caller holds mu */
static struct vmm_range *range_of(uintptr_t p, size_t n) {
  for (int i = 0; i < MAXVMM; i++)
    if (ranges[i].n && p >= ranges[i].p && p + n <= ranges[i].p + ranges[i].n)
      return &ranges[i];
  return NULL;
}

/* whether [p, p+n) is made of whole mappings (and nothing else); at least
 * one byte, caller holds mu */
static int whole_maps(uintptr_t p, size_t n) {
  size_t covered = 0;
  if (n == 0) return 0;
  for (int i = 0; i < MAXVMM; i++) {
    struct vmm_map *m = &maps[i];
    if (!m->n || m->p + m->n <= p || m->p >= p + n) continue;
    if (m->p < p || m->p + m->n > p + n) return 0; /* cut by the range */
    covered += m->n;
  }
  return covered == n;
}

/* whether the current device may read (write = 0) or write [p, p+n): inside
 * one cuMemAlloc block, or inside one mapping it was granted access to;
 * caller holds mu */
static int accessible(uintptr_t p, size_t n, int write) {
  if (find(p, n)) return 1;
  struct vmm_map *m = map_of(p, n);
  if (!m || cur_dev() < 0) return 0;
  unsigned bit = 1u << cur_dev();
  return write ? (m->rw & bit) != 0 : ((m->rw | m->ro) & bit) != 0;
}

/* the device of the memory at p (a block or a mapping), or -1; caller holds
 * mu */
static int device_of(uintptr_t p) {
  struct block *b = find(p, 1);
  if (b) return b->dev;
  struct vmm_map *m = map_of(p, 1);
  return m ? m->a->dev : -1;
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
#define MAXWAIT 8
struct wait {
  CUdeviceptr addr;
  cuuint32_t value;
  unsigned flags;
};
struct stream {
  int magic;
  struct ctx *ctx;
  unsigned flags;
  int nwait; /* pending cuStreamWaitValue32 */
  struct wait waits[MAXWAIT];
};

/* whether the 32-bit word at w->addr meets w's condition, as the
 * CU_STREAM_WAIT_VALUE_* flags define it; caller holds mu and has checked
 * that the word is readable */
static int wait_met(const struct wait *w) {
  cuuint32_t v = *(volatile cuuint32_t *)(uintptr_t)w->addr;
  switch (w->flags) {
  case 0: return (int32_t)(v - w->value) >= 0; /* GEQ, cyclic */
  case 1: return v == w->value;                /* EQ */
  case 2: return (v & w->value) != 0;          /* AND */
  case 3: return ~(v | w->value) != 0;         /* NOR */
  default: return 0;
  }
}

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

static int count_live(int what) {
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXVMM; i++)
    n += what == 0 ? ranges[i].n != 0 : what == 1 ? maps[i].n != 0
                                                   : allocs[i].handle != 0;
  pthread_mutex_unlock(&mu);
  return n;
}

static CUresult f_cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  NEED_INIT();
  int i = dev_index(d);
  if (i < 0) return INVALID_DEVICE;
  switch (attr) {
  case 90001: *v = count_live(0); break; /* not CUDA's: leak checks */
  case 90002: *v = count_live(1); break;
  case 90003: *v = count_live(2); break;
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
  int ok = accessible((uintptr_t)dst, n, 1);
  pthread_mutex_unlock(&mu);
  if (!ok || !src) return INVALID_VALUE;
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}

static CUresult f_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  int ok = accessible((uintptr_t)src, n, 0);
  pthread_mutex_unlock(&mu);
  if (!ok || !dst) return INVALID_VALUE;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return OK;
}

static CUresult f_cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  NEED_CTX();
  pthread_mutex_lock(&mu);
  int ok = accessible((uintptr_t)dst, n, 1);
  pthread_mutex_unlock(&mu);
  if (!ok) return INVALID_VALUE;
  memset((void *)(uintptr_t)dst, v, n);
  return OK;
}

static CUresult f_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  NEED_INIT();
  if (attr != 9 /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int dev = device_of((uintptr_t)p);
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
  /* CU_STREAM_WRITE_VALUE_DEFAULT only: libsymm wants the memory barrier */
  if (flags != 0 || (addr & 3)) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int ok = accessible((uintptr_t)addr, 4, 1);
  if (ok) *(volatile cuuint32_t *)(uintptr_t)addr = v;
  pthread_mutex_unlock(&mu);
  return ok ? OK : INVALID_VALUE;
}

/* The wait is queued on a stream object (the legacy and per-thread streams
 * are taken as satisfied at once) and checked by cuStreamQuery. */
static CUresult f_cuStreamWaitValue32(CUstream s, CUdeviceptr addr,
                                      cuuint32_t v, unsigned flags) {
  NEED_CTX();
  int r = check_stream(s);
  if (r) return r;
  if (flags > 3 || (addr & 3)) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  int ok = accessible((uintptr_t)addr, 4, 0);
  if (ok && s != (CUstream)1 && s != (CUstream)2) {
    struct stream *st = s;
    if (st->nwait == MAXWAIT) {
      r = OUT_OF_MEMORY;
    } else {
      struct wait w = {addr, v, flags};
      st->waits[st->nwait++] = w;
    }
  }
  pthread_mutex_unlock(&mu);
  return ok ? r : INVALID_VALUE;
}

static CUresult f_cuStreamQuery(CUstream s) {
  NEED_CTX();
  int r = check_stream(s);
  if (r) return r;
  if (s == (CUstream)1 || s == (CUstream)2) return OK;
  struct stream *st = s;
  pthread_mutex_lock(&mu);
  while (st->nwait > 0) {
    struct wait *w = &st->waits[0];
    if (!accessible((uintptr_t)w->addr, 4, 0)) {
      r = ILLEGAL_ADDRESS; /* freed or unmapped under the wait */
      break;
    }
    if (!wait_met(w)) {
      r = NOT_READY;
      break;
    }
    memmove(&st->waits[0], &st->waits[1], (size_t)(--st->nwait) * sizeof *w);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult f_cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
  NEED_INIT();
  int i = dev_index(d), j = dev_index(peer);
  if (i < 0 || j < 0) return INVALID_DEVICE;
  if (!can) return INVALID_VALUE;
  *can = i != j && !env_int("FAKE_CUDA_NO_PEER", 0);
  return OK;
}

/* ---- virtual memory management ---- */

/* libsymm's properties only: pinned memory on a device ordinal (not a
 * CUdevice), at most the POSIX descriptor handle type, the rest zero. */
static CUresult check_prop(const CUmemAllocationProp *p) {
  if (!p || p->type != 1 /* PINNED */) return INVALID_VALUE;
  if (p->requestedHandleTypes & ~1) return INVALID_VALUE;
  if (p->location.type != 1 /* DEVICE */) return INVALID_VALUE;
  if (p->location.id < 0 || p->location.id >= ndev()) return INVALID_DEVICE;
  if (p->win32HandleMetaData) return INVALID_VALUE;
  if (p->allocFlags.compressionType || p->allocFlags.gpuDirectRDMACapable ||
      p->allocFlags.usage)
    return INVALID_VALUE;
  for (int i = 0; i < 4; i++)
    if (p->allocFlags.reserved[i]) return INVALID_VALUE;
  return OK;
}

static CUresult f_cuMemGetAllocationGranularity(size_t *g,
                                                const CUmemAllocationProp *p,
                                                int option) {
  NEED_CTX();
  FAILS("cuMemGetAllocationGranularity");
  int r = check_prop(p);
  if (r) return r;
  if (!g || option < 0 || option > 1) return INVALID_VALUE;
  *g = option ? GRAN_REC : GRAN_MIN;
  return OK;
}

static CUresult f_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                              const CUmemAllocationProp *p,
                              unsigned long long flags) {
  NEED_CTX();
  FAILS("cuMemCreate");
  int r = check_prop(p);
  if (r) return r;
  if (!h || flags || size == 0 || size % GRAN_MIN) return INVALID_VALUE;
  int dev = p->location.id;
  char name[64];
  snprintf(name, sizeof name, MEMFD_PREFIX "%d", dev);
  pthread_mutex_lock(&mu);
  struct vmm_alloc *a = NULL;
  if (used[dev] + size > DEVMEM || !(a = new_alloc())) {
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    if (fd >= 0) close(fd);
    memset(a, 0, sizeof *a);
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  a->refs = 1;
  a->fd = fd;
  a->size = size;
  a->dev = dev;
  a->exportable = p->requestedHandleTypes & 1;
  used[dev] += size;
  *h = a->handle;
  pthread_mutex_unlock(&mu);
  return OK;
}

static CUresult f_cuMemRelease(CUmemGenericAllocationHandle h) {
  NEED_CTX();
  FAILS("cuMemRelease");
  pthread_mutex_lock(&mu);
  struct vmm_alloc *a = alloc_of(h);
  if (a) {
    a->refs--;
    maybe_free(a);
  }
  pthread_mutex_unlock(&mu);
  return a ? OK : INVALID_VALUE;
}

/* The new descriptor is not close-on-exec (dup's), like the driver's. */
static CUresult f_cuMemExportToShareableHandle(void *out,
                                               CUmemGenericAllocationHandle h,
                                               int type,
                                               unsigned long long flags) {
  NEED_CTX();
  FAILS("cuMemExportToShareableHandle");
  if (!out || type != 1 /* POSIX_FILE_DESCRIPTOR */ || flags)
    return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct vmm_alloc *a = alloc_of(h);
  int fd = (a && a->exportable) ? dup(a->fd) : -1;
  pthread_mutex_unlock(&mu);
  if (fd < 0) return INVALID_VALUE;
  *(int *)out = fd;
  return OK;
}

/* Any descriptor of a memfd made by cuMemCreate, in this process or another,
 * imports; its name says its device. The descriptor is the void* itself. */
static CUresult f_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
                                                 void *os, int type) {
  NEED_CTX();
  FAILS("cuMemImportFromShareableHandle");
  int fd = (int)(intptr_t)os;
  if (!h || type != 1 || fd < 0) return INVALID_VALUE;
  char path[64], target[256];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n < 0) return INVALID_VALUE;
  target[n] = 0;
  const char *prefix = "/memfd:" MEMFD_PREFIX;
  if (strncmp(target, prefix, strlen(prefix)) != 0) return INVALID_VALUE;
  int dev = atoi(target + strlen(prefix));
  struct stat st;
  if (dev < 0 || dev >= ndev() || fstat(fd, &st) != 0 || st.st_size <= 0)
    return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct vmm_alloc *a = new_alloc();
  int own = a ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (own < 0) {
    if (a) memset(a, 0, sizeof *a);
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  a->refs = 1;
  a->fd = own;
  a->size = (size_t)st.st_size;
  a->dev = dev;
  a->exportable = 1;
  a->imported = 1;
  *h = a->handle;
  pthread_mutex_unlock(&mu);
  return OK;
}

static CUresult f_cuMemAddressReserve(CUdeviceptr *p, size_t size,
                                      size_t align, CUdeviceptr addr,
                                      unsigned long long flags) {
  NEED_CTX();
  FAILS("cuMemAddressReserve");
  if (!p || addr || flags || size == 0 || size % GRAN_MIN) return INVALID_VALUE;
  if (align & (align - 1)) return INVALID_VALUE;
  if (align < GRAN_MIN) align = GRAN_MIN;
  pthread_mutex_lock(&mu);
  struct vmm_range *rg = NULL;
  for (int i = 0; i < MAXVMM && !rg; i++)
    if (!ranges[i].n) rg = &ranges[i];
  void *m = rg ? mmap(NULL, size + align, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
               : MAP_FAILED;
  if (m == MAP_FAILED) {
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  uintptr_t base = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
  if (base > (uintptr_t)m) munmap(m, base - (uintptr_t)m);
  size_t tail = (uintptr_t)m + size + align - (base + size);
  if (tail) munmap((void *)(base + size), tail);
  rg->p = base;
  rg->n = size;
  *p = base;
  pthread_mutex_unlock(&mu);
  return OK;
}

/* The whole reservation, with nothing mapped in it. */
static CUresult f_cuMemAddressFree(CUdeviceptr p, size_t size) {
  NEED_CTX();
  FAILS("cuMemAddressFree");
  pthread_mutex_lock(&mu);
  struct vmm_range *rg = range_of((uintptr_t)p, size);
  int r = (rg && rg->p == (uintptr_t)p && rg->n == size) ? OK : INVALID_VALUE;
  for (int i = 0; r == OK && i < MAXVMM; i++)
    if (maps[i].n && maps[i].p >= rg->p && maps[i].p < rg->p + rg->n)
      r = INVALID_VALUE; /* still mapped */
  if (r == OK) {
    munmap((void *)rg->p, rg->n);
    rg->p = rg->n = 0;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult f_cuMemMap(CUdeviceptr p, size_t size, size_t offset,
                           CUmemGenericAllocationHandle h,
                           unsigned long long flags) {
  NEED_CTX();
  FAILS("cuMemMap");
  if (offset || flags || size == 0 || size % GRAN_MIN || p % GRAN_MIN)
    return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct vmm_alloc *a = alloc_of(h);
  struct vmm_map *m = NULL;
  int r = (a && size <= a->size && range_of((uintptr_t)p, size)) ? OK
                                                                  : INVALID_VALUE;
  for (int i = 0; r == OK && i < MAXVMM; i++) {
    if (maps[i].n && maps[i].p < p + size && p < maps[i].p + maps[i].n)
      r = INVALID_VALUE; /* already mapped */
    else if (!maps[i].n && !m)
      m = &maps[i];
  }
  if (r == OK && !m) r = OUT_OF_MEMORY;
  if (r == OK && mmap((void *)(uintptr_t)p, size, PROT_NONE,
                      MAP_SHARED | MAP_FIXED, a->fd, 0) == MAP_FAILED)
    r = OUT_OF_MEMORY;
  if (r == OK) {
    m->p = p;
    m->n = size;
    m->a = a;
    m->rw = m->ro = 0;
    a->maps++;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult f_cuMemUnmap(CUdeviceptr p, size_t size) {
  NEED_CTX();
  FAILS("cuMemUnmap");
  pthread_mutex_lock(&mu);
  int r = whole_maps((uintptr_t)p, size) ? OK : INVALID_VALUE;
  for (int i = 0; r == OK && i < MAXVMM; i++) {
    struct vmm_map *m = &maps[i];
    if (!m->n || m->p < p || m->p >= p + size) continue;
    /* back to reserved address space */
    mmap((void *)m->p, m->n, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    m->a->maps--;
    maybe_free(m->a);
    memset(m, 0, sizeof *m);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult f_cuMemSetAccess(CUdeviceptr p, size_t size,
                                 const CUmemAccessDesc *desc, size_t count) {
  NEED_CTX();
  FAILS("cuMemSetAccess");
  if (!desc || count == 0) return INVALID_VALUE;
  for (size_t k = 0; k < count; k++) {
    if (desc[k].location.type != 1) return INVALID_VALUE;
    if (desc[k].location.id < 0 || desc[k].location.id >= ndev())
      return INVALID_DEVICE; /* an ordinal, not a CUdevice */
    if (desc[k].flags != 0 && desc[k].flags != 1 && desc[k].flags != 3)
      return INVALID_VALUE;
  }
  pthread_mutex_lock(&mu);
  int r = whole_maps((uintptr_t)p, size) ? OK : INVALID_VALUE;
  for (int i = 0; r == OK && i < MAXVMM; i++) {
    struct vmm_map *m = &maps[i];
    if (!m->n || m->p < p || m->p >= p + size) continue;
    for (size_t k = 0; k < count; k++) {
      unsigned bit = 1u << desc[k].location.id;
      m->rw &= ~bit;
      m->ro &= ~bit;
      if (desc[k].flags == 3) m->rw |= bit;
      if (desc[k].flags == 1) m->ro |= bit;
    }
    int prot = m->rw ? PROT_READ | PROT_WRITE : m->ro ? PROT_READ : PROT_NONE;
    if (mprotect((void *)m->p, m->n, prot) != 0) r = UNKNOWN;
  }
  pthread_mutex_unlock(&mu);
  return r;
}

static CUresult f_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h,
                                              void *addr) {
  NEED_CTX();
  FAILS("cuMemRetainAllocationHandle");
  if (!h) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct vmm_map *m = map_of((uintptr_t)addr, 1);
  if (m) {
    m->a->refs++;
    *h = m->a->handle;
  }
  pthread_mutex_unlock(&mu);
  return m ? OK : INVALID_VALUE;
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
    {"cuStreamQuery", (void *)f_cuStreamQuery},
    {"cuDeviceCanAccessPeer", (void *)f_cuDeviceCanAccessPeer},
    {"cuMemGetAllocationGranularity", (void *)f_cuMemGetAllocationGranularity},
    {"cuMemCreate", (void *)f_cuMemCreate},
    {"cuMemRelease", (void *)f_cuMemRelease},
    {"cuMemExportToShareableHandle", (void *)f_cuMemExportToShareableHandle},
    {"cuMemImportFromShareableHandle",
     (void *)f_cuMemImportFromShareableHandle},
    {"cuMemAddressReserve", (void *)f_cuMemAddressReserve},
    {"cuMemAddressFree", (void *)f_cuMemAddressFree},
    {"cuMemMap", (void *)f_cuMemMap},
    {"cuMemUnmap", (void *)f_cuMemUnmap},
    {"cuMemSetAccess", (void *)f_cuMemSetAccess},
    {"cuMemRetainAllocationHandle", (void *)f_cuMemRetainAllocationHandle},
};

static int omitted(const char *sym) { return listed("FAKE_CUDA_OMIT", sym); }

/* Base names only ("cuMemAlloc", never "cuMemAlloc_v2"), the pinned ABI
 * version only, default flags only: anything else is a libsymm bug. */
static CUresult lookup(const char *sym, void **pfn, int ver, cuuint64_t flags,
                       int *found) {
  *pfn = NULL;
  *found = 0;
  /* 12030: the graph functions with edge data, asked for on their own
   * (libsymm's symbolVersion); a driver older than that has none. */
  if (!sym || flags != 0 || (ver != FAKE_ABI && ver != 12030)) return INVALID_VALUE;
  if (ver == 12030 && FAKE_VERSION < 12030) return OK;
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
