/*
 * shim.h — the C side of package cuda: the few driver types libsymm needs,
 * declared here instead of taken from cuda.h (no CUDA toolkit at build
 * time), and one trampoline per driver function.
 *
 * A trampoline receives the function pointer that cuGetProcAddress returned
 * (pinned to the ABI of CUDA 12.0, see driver.go), casts it to that ABI's
 * prototype and calls it. Results that the driver writes through a pointer
 * come back in a small struct returned by value, so that Go passes no
 * pointer to its own memory for them (no escape, no allocation).
 *
 * Handles (CUcontext, CUstream, CUevent) and device pointers travel as
 * integers (uintptr_t / unsigned long long) and become void* only here: Go
 * holds them as uintptr, never as unsafe.Pointer, because values such as
 * CU_STREAM_LEGACY (0x1) are not addresses and would crash the Go GC.
 *
 * Everything is static: these functions are private to the cgo file that
 * includes this header and never appear in libsymm's exported symbols.
 */
#ifndef SYMM_CUDA_SHIM_H
#define SYMM_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

typedef int CUresult;                 /* enum cudaError_enum */
typedef int CUdevice;                 /* CUdevice_v1 */
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 (64-bit) */
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;

/* Results with one or two outputs. r is the CUresult; the outputs are only
 * meaningful when r == 0. */
typedef struct { CUresult r; int v; } symm_res_int;
typedef struct { CUresult r; uintptr_t v; } symm_res_ptr;
typedef struct { CUresult r; size_t a; size_t b; } symm_res_size2;
typedef struct { CUresult r; const char *s; } symm_res_str;
typedef struct { CUresult r; void *p; } symm_res_fn;

/* ---- entry points -------------------------------------------------------- */

/* CUDA >= 12.0: cuGetProcAddress_v2. The last argument is a
 * CUdriverProcAddressQueryResult*, an enum (int). */
static inline symm_res_fn symm_getproc_v2(void *fn, const char *sym, int ver,
                                          cuuint64_t flags, int *status) {
  symm_res_fn o = {0, NULL};
  o.r = ((CUresult(*)(const char *, void **, int, cuuint64_t, int *))fn)(
      sym, &o.p, ver, flags, status);
  return o;
}

/* CUDA 11.3 .. 11.8: cuGetProcAddress without the status argument. */
static inline symm_res_fn symm_getproc_v1(void *fn, const char *sym, int ver,
                                          cuuint64_t flags) {
  symm_res_fn o = {0, NULL};
  o.r = ((CUresult(*)(const char *, void **, int, cuuint64_t))fn)(sym, &o.p,
                                                                 ver, flags);
  return o;
}

/* ---- initialization, versions, devices ----------------------------------- */

static inline CUresult symm_cuInit(void *fn, unsigned int flags) {
  return ((CUresult(*)(unsigned int))fn)(flags);
}

static inline symm_res_int symm_cuDriverGetVersion(void *fn) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(int *))fn)(&o.v);
  return o;
}

static inline symm_res_int symm_cuDeviceGetCount(void *fn) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(int *))fn)(&o.v);
  return o;
}

static inline symm_res_int symm_cuDeviceGet(void *fn, int ordinal) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(CUdevice *, int))fn)(&o.v, ordinal);
  return o;
}

/* name must hold len bytes; the driver NUL-terminates within len. */
static inline CUresult symm_cuDeviceGetName(void *fn, char *name, int len,
                                            CUdevice dev) {
  return ((CUresult(*)(char *, int, CUdevice))fn)(name, len, dev);
}

/* cuDeviceTotalMem_v2 */
static inline symm_res_size2 symm_cuDeviceTotalMem(void *fn, CUdevice dev) {
  symm_res_size2 o = {0, 0, 0};
  o.r = ((CUresult(*)(size_t *, CUdevice))fn)(&o.a, dev);
  return o;
}

static inline symm_res_int symm_cuDeviceGetAttribute(void *fn, int attr,
                                                     CUdevice dev) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(int *, int, CUdevice))fn)(&o.v, attr, dev);
  return o;
}

/* ---- contexts ------------------------------------------------------------ */

static inline symm_res_ptr symm_cuDevicePrimaryCtxRetain(void *fn,
                                                         CUdevice dev) {
  CUcontext c = NULL;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUcontext *, CUdevice))fn)(&c, dev);
  o.v = (uintptr_t)c;
  return o;
}

/* cuDevicePrimaryCtxRelease_v2 */
static inline CUresult symm_cuDevicePrimaryCtxRelease(void *fn, CUdevice dev) {
  return ((CUresult(*)(CUdevice))fn)(dev);
}

static inline symm_res_ptr symm_cuCtxGetCurrent(void *fn) {
  CUcontext c = NULL;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUcontext *))fn)(&c);
  o.v = (uintptr_t)c;
  return o;
}

static inline CUresult symm_cuCtxSetCurrent(void *fn, uintptr_t ctx) {
  return ((CUresult(*)(CUcontext))fn)((CUcontext)ctx);
}

/* cuCtxPushCurrent_v2 */
static inline CUresult symm_cuCtxPushCurrent(void *fn, uintptr_t ctx) {
  return ((CUresult(*)(CUcontext))fn)((CUcontext)ctx);
}

/* cuCtxPopCurrent_v2 */
static inline symm_res_ptr symm_cuCtxPopCurrent(void *fn) {
  CUcontext c = NULL;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUcontext *))fn)(&c);
  o.v = (uintptr_t)c;
  return o;
}

static inline symm_res_int symm_cuCtxGetDevice(void *fn) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(CUdevice *))fn)(&o.v);
  return o;
}

static inline CUresult symm_cuCtxSynchronize(void *fn) {
  return ((CUresult(*)(void))fn)();
}

/* ---- memory -------------------------------------------------------------- */

/* cuMemAlloc_v2 */
/* cuThreadExchangeStreamCaptureMode: CU_STREAM_CAPTURE_MODE_RELAXED is 2.
 * A thread in global capture mode (PyTorch's default for torch.cuda.graph)
 * may not call cuMemAlloc/cuMemFree while any capture is under way in the
 * process: the call fails and invalidates the capture. PyTorch's allocator
 * switches the thread to relaxed mode around its driver allocations; so do
 * these, in one C call so the mode is restored on the same OS thread.
 * xchg may be NULL (an old driver): then nothing is exchanged. */
static inline int symm_capture_relax(void *xchg) {
  int mode = 2;
  if (xchg != NULL) ((CUresult(*)(int *))xchg)(&mode);
  return mode;
}
static inline void symm_capture_restore(void *xchg, int mode) {
  if (xchg != NULL) ((CUresult(*)(int *))xchg)(&mode);
}

static inline symm_res_ptr symm_cuMemAlloc(void *fn, void *xchg, size_t size) {
  CUdeviceptr p = 0;
  symm_res_ptr o;
  int mode = symm_capture_relax(xchg);
  o.r = ((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, size);
  symm_capture_restore(xchg, mode);
  o.v = (uintptr_t)p;
  return o;
}

/* cuMemFree_v2 */
static inline CUresult symm_cuMemFree(void *fn, void *xchg, uintptr_t ptr) {
  int mode = symm_capture_relax(xchg);
  CUresult r = ((CUresult(*)(CUdeviceptr))fn)((CUdeviceptr)ptr);
  symm_capture_restore(xchg, mode);
  return r;
}

/* cuMemGetInfo_v2: a = free, b = total. */
static inline symm_res_size2 symm_cuMemGetInfo(void *fn) {
  symm_res_size2 o = {0, 0, 0};
  o.r = ((CUresult(*)(size_t *, size_t *))fn)(&o.a, &o.b);
  return o;
}

/* cuMemcpyHtoD_v2 */
static inline CUresult symm_cuMemcpyHtoD(void *fn, uintptr_t dst,
                                         const void *src, size_t n) {
  return ((CUresult(*)(CUdeviceptr, const void *, size_t))fn)(
      (CUdeviceptr)dst, src, n);
}

/* cuMemcpyDtoH_v2 */
static inline CUresult symm_cuMemcpyDtoH(void *fn, void *dst, uintptr_t src,
                                         size_t n) {
  return ((CUresult(*)(void *, CUdeviceptr, size_t))fn)(dst, (CUdeviceptr)src,
                                                        n);
}

/* cuMemsetD8_v2 */
static inline CUresult symm_cuMemsetD8(void *fn, uintptr_t dst,
                                       unsigned char v, size_t n) {
  return ((CUresult(*)(CUdeviceptr, unsigned char, size_t))fn)(
      (CUdeviceptr)dst, v, n);
}

/* cuPointerGetAttribute for attributes whose value is an int. */
static inline symm_res_int symm_cuPointerGetAttributeInt(void *fn, int attr,
                                                         uintptr_t ptr) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(void *, int, CUdeviceptr))fn)(&o.v, attr,
                                                    (CUdeviceptr)ptr);
  return o;
}

/* ---- events -------------------------------------------------------------- */

static inline symm_res_ptr symm_cuEventCreate(void *fn, unsigned int flags) {
  CUevent e = NULL;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUevent *, unsigned int))fn)(&e, flags);
  o.v = (uintptr_t)e;
  return o;
}

static inline CUresult symm_cuEventRecord(void *fn, uintptr_t ev,
                                          uintptr_t stream) {
  return ((CUresult(*)(CUevent, CUstream))fn)((CUevent)ev, (CUstream)stream);
}

static inline CUresult symm_cuEventQuery(void *fn, uintptr_t ev) {
  return ((CUresult(*)(CUevent))fn)((CUevent)ev);
}

static inline CUresult symm_cuEventSynchronize(void *fn, uintptr_t ev) {
  return ((CUresult(*)(CUevent))fn)((CUevent)ev);
}

/* cuEventDestroy_v2 */
static inline CUresult symm_cuEventDestroy(void *fn, uintptr_t ev) {
  return ((CUresult(*)(CUevent))fn)((CUevent)ev);
}

/* ---- streams ------------------------------------------------------------- */

static inline symm_res_ptr symm_cuStreamCreate(void *fn, unsigned int flags) {
  CUstream s = NULL;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUstream *, unsigned int))fn)(&s, flags);
  o.v = (uintptr_t)s;
  return o;
}

/* cuStreamDestroy_v2 */
static inline CUresult symm_cuStreamDestroy(void *fn, uintptr_t stream) {
  return ((CUresult(*)(CUstream))fn)((CUstream)stream);
}

static inline CUresult symm_cuStreamSynchronize(void *fn, uintptr_t stream) {
  return ((CUresult(*)(CUstream))fn)((CUstream)stream);
}

/* cuStreamWriteValue32_v2 and cuStreamWaitValue32_v2 share this prototype. */
static inline CUresult symm_cuStreamValue32(void *fn, uintptr_t stream,
                                            uintptr_t addr, cuuint32_t value,
                                            unsigned int flags) {
  return ((CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))fn)(
      (CUstream)stream, (CUdeviceptr)addr, value, flags);
}

/* cuStreamQuery: CUDA_SUCCESS when all work on the stream is done,
 * CUDA_ERROR_NOT_READY while some is pending. */
static inline CUresult symm_cuStreamQuery(void *fn, uintptr_t stream) {
  return ((CUresult(*)(CUstream))fn)((CUstream)stream);
}

/* ---- modules and kernel launches (kernels compiled at run time) ----------- */

/* cuModuleLoadData: image is a CUBIN (or PTX) in host memory. */
static inline symm_res_ptr symm_cuModuleLoadData(void *fn, const void *image) {
  void *m = 0;
  symm_res_ptr o;
  o.r = ((CUresult(*)(void **, const void *))fn)(&m, image);
  o.v = (uintptr_t)m;
  return o;
}

static inline CUresult symm_cuModuleUnload(void *fn, uintptr_t m) {
  return ((CUresult(*)(void *))fn)((void *)m);
}

static inline symm_res_ptr symm_cuModuleGetFunction(void *fn, uintptr_t m, const char *name) {
  void *f = 0;
  symm_res_ptr o;
  o.r = ((CUresult(*)(void **, void *, const char *))fn)(&f, (void *)m, name);
  o.v = (uintptr_t)f;
  return o;
}

/* cuLaunchKernel: params is an array of pointers to each argument's value
 * (C memory: the driver copies the values before it returns). */
static inline CUresult symm_cuLaunchKernel(void *fn, uintptr_t f, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                           uintptr_t stream, void **params) {
  return ((CUresult(*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **))fn)((void *)f, gx, gy, gz, bx, by, bz, shmem, (CUstream)stream, params,
                                             (void **)0);
}

/* cuMemHostAlloc: pinned host memory (flags: CU_MEMHOSTALLOC_*). */
static inline symm_res_ptr symm_cuMemHostAlloc(void *fn, size_t n, unsigned flags) {
  void *p = 0;
  symm_res_ptr o;
  o.r = ((CUresult(*)(void **, size_t, unsigned))fn)(&p, n, flags);
  o.v = (uintptr_t)p;
  return o;
}

/* cuMemHostGetDevicePointer_v2: where the device sees mapped host memory. */
static inline symm_res_ptr symm_cuMemHostGetDevicePointer(void *fn, uintptr_t p) {
  CUdeviceptr d = 0;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUdeviceptr *, void *, unsigned))fn)(&d, (void *)p, 0);
  o.v = (uintptr_t)d;
  return o;
}

static inline CUresult symm_cuMemFreeHost(void *fn, uintptr_t p) {
  return ((CUresult(*)(void *))fn)((void *)p);
}

/* ---- peer access ---------------------------------------------------------- */

static inline symm_res_int symm_cuDeviceCanAccessPeer(void *fn, CUdevice dev,
                                                      CUdevice peer) {
  symm_res_int o = {0, 0};
  o.r = ((CUresult(*)(int *, CUdevice, CUdevice))fn)(&o.v, dev, peer);
  return o;
}

/* ---- virtual memory management ------------------------------------------- */

/* The types below have exactly the layout of cuda.h (CUDA 12, LP64); a test
 * compares symm_vmm_layout() with the offsets cuda.h gives. The enum members
 * are declared int: a C enum whose values fit in int has int's size and
 * alignment on every ABI libsymm builds for. */

typedef unsigned long long CUmemGenericAllocationHandle;

/* CUmemLocation_v1 */
typedef struct CUmemLocation_st {
  int type; /* CUmemLocationType */
  int id;   /* a device ordinal when type is CU_MEM_LOCATION_TYPE_DEVICE */
} CUmemLocation;

/* CUmemAllocationProp_v1 */
typedef struct CUmemAllocationProp_st {
  int type;                 /* CUmemAllocationType */
  int requestedHandleTypes; /* CUmemAllocationHandleType, a bit mask */
  CUmemLocation location;
  void *win32HandleMetaData; /* Windows only; must be NULL */
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

/* CUmemAccessDesc_v1 */
typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

/* Values from cuda.h. */
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1

typedef struct { CUresult r; CUmemGenericAllocationHandle h; } symm_res_handle;

/* The properties of every allocation libsymm makes: pinned device memory on
 * device ordinal dev, exportable as a POSIX file descriptor. Everything else
 * (compression, RDMA, usage, reserved) zero, as the driver requires. */
static inline CUmemAllocationProp symm_vmm_prop(int dev) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

/* cuMemGetAllocationGranularity for symm_vmm_prop(dev); the result is in a.
 * option is CU_MEM_ALLOC_GRANULARITY_MINIMUM or _RECOMMENDED. */
static inline symm_res_size2 symm_cuMemGetAllocationGranularity(void *fn,
                                                                int dev,
                                                                int option) {
  CUmemAllocationProp prop = symm_vmm_prop(dev);
  symm_res_size2 o = {0, 0, 0};
  o.r = ((CUresult(*)(size_t *, const CUmemAllocationProp *, int))fn)(
      &o.a, &prop, option);
  return o;
}

/* cuMemCreate(size, symm_vmm_prop(dev), flags 0) */
static inline symm_res_handle symm_cuMemCreate(void *fn, size_t size,
                                               int dev) {
  CUmemAllocationProp prop = symm_vmm_prop(dev);
  symm_res_handle o = {0, 0};
  o.r = ((CUresult(*)(CUmemGenericAllocationHandle *, size_t,
                      const CUmemAllocationProp *, unsigned long long))fn)(
      &o.h, size, &prop, 0);
  return o;
}

static inline CUresult symm_cuMemRelease(void *fn,
                                         CUmemGenericAllocationHandle h) {
  return ((CUresult(*)(CUmemGenericAllocationHandle))fn)(h);
}

/* cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR, flags 0): the driver
 * writes an int, the new file descriptor, through the void* argument. */
static inline symm_res_int
symm_cuMemExportToShareableHandle(void *fn, CUmemGenericAllocationHandle h) {
  symm_res_int o = {0, -1};
  o.r = ((CUresult(*)(void *, CUmemGenericAllocationHandle, int,
                      unsigned long long))fn)(
      &o.v, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  return o;
}

/* cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR): for this handle
 * type the void* argument is the descriptor itself, widened, as PyTorch
 * passes it; not a pointer to it. */
static inline symm_res_handle symm_cuMemImportFromShareableHandle(void *fn,
                                                                  int fd) {
  symm_res_handle o = {0, 0};
  o.r = ((CUresult(*)(CUmemGenericAllocationHandle *, void *, int))fn)(
      &o.h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  return o;
}

/* cuMemAddressReserve(size, alignment, addr 0, flags 0) */
static inline symm_res_ptr symm_cuMemAddressReserve(void *fn, size_t size,
                                                    size_t alignment) {
  CUdeviceptr p = 0;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                      unsigned long long))fn)(&p, size, alignment, 0, 0);
  o.v = (uintptr_t)p;
  return o;
}

static inline CUresult symm_cuMemAddressFree(void *fn, uintptr_t ptr,
                                             size_t size) {
  return ((CUresult(*)(CUdeviceptr, size_t))fn)((CUdeviceptr)ptr, size);
}

/* cuMemMap(ptr, size, offset 0, handle, flags 0) */
static inline CUresult symm_cuMemMap(void *fn, uintptr_t ptr, size_t size,
                                     CUmemGenericAllocationHandle h) {
  return ((CUresult(*)(CUdeviceptr, size_t, size_t,
                       CUmemGenericAllocationHandle, unsigned long long))fn)(
      (CUdeviceptr)ptr, size, 0, h, 0);
}

static inline CUresult symm_cuMemUnmap(void *fn, uintptr_t ptr, size_t size) {
  return ((CUresult(*)(CUdeviceptr, size_t))fn)((CUdeviceptr)ptr, size);
}

/* desc points to count descriptors; the driver only reads them. */
static inline CUresult symm_cuMemSetAccess(void *fn, uintptr_t ptr,
                                           size_t size,
                                           const CUmemAccessDesc *desc,
                                           size_t count) {
  return ((CUresult(*)(CUdeviceptr, size_t, const CUmemAccessDesc *,
                       size_t))fn)((CUdeviceptr)ptr, size, desc, count);
}

static inline symm_res_handle symm_cuMemRetainAllocationHandle(void *fn,
                                                               uintptr_t addr) {
  symm_res_handle o = {0, 0};
  o.r = ((CUresult(*)(CUmemGenericAllocationHandle *, void *))fn)(
      &o.h, (void *)addr);
  return o;
}

/* The layout of the declarations above as this C compiler sees it, for the
 * test that compares it with cuda.h's. */
typedef struct {
  size_t prop_size, prop_align, prop_type, prop_handle_types, prop_location,
      prop_location_type, prop_location_id, prop_win32, prop_alloc_flags,
      prop_alloc_flags_size, prop_compression, prop_rdma, prop_usage,
      prop_reserved;
  size_t loc_size;
  size_t access_size, access_align, access_location, access_flags;
  size_t handle_size;
} symm_vmm_layout;

static inline symm_vmm_layout symm_vmm_layout_get(void) {
  symm_vmm_layout l;
  l.prop_size = sizeof(CUmemAllocationProp);
  l.prop_align = _Alignof(CUmemAllocationProp);
  l.prop_type = offsetof(CUmemAllocationProp, type);
  l.prop_handle_types = offsetof(CUmemAllocationProp, requestedHandleTypes);
  l.prop_location = offsetof(CUmemAllocationProp, location);
  l.prop_location_type = offsetof(CUmemAllocationProp, location.type);
  l.prop_location_id = offsetof(CUmemAllocationProp, location.id);
  l.prop_win32 = offsetof(CUmemAllocationProp, win32HandleMetaData);
  l.prop_alloc_flags = offsetof(CUmemAllocationProp, allocFlags);
  l.prop_alloc_flags_size = sizeof(((CUmemAllocationProp *)0)->allocFlags);
  l.prop_compression = offsetof(CUmemAllocationProp, allocFlags.compressionType);
  l.prop_rdma = offsetof(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
  l.prop_usage = offsetof(CUmemAllocationProp, allocFlags.usage);
  l.prop_reserved = offsetof(CUmemAllocationProp, allocFlags.reserved);
  l.loc_size = sizeof(CUmemLocation);
  l.access_size = sizeof(CUmemAccessDesc);
  l.access_align = _Alignof(CUmemAccessDesc);
  l.access_location = offsetof(CUmemAccessDesc, location);
  l.access_flags = offsetof(CUmemAccessDesc, flags);
  l.handle_size = sizeof(CUmemGenericAllocationHandle);
  return l;
}

/* ---- error strings ------------------------------------------------------- */

/* cuGetErrorName and cuGetErrorString share this prototype. The string is
 * static in the driver; s is NULL for a code the driver does not know. */
static inline symm_res_str symm_cuGetErrorText(void *fn, CUresult code) {
  symm_res_str o = {0, NULL};
  o.r = ((CUresult(*)(CUresult, const char **))fn)(code, &o.s);
  return o;
}

#include "shim_graphs.h"

#endif /* SYMM_CUDA_SHIM_H */
