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
static inline symm_res_ptr symm_cuMemAlloc(void *fn, size_t size) {
  CUdeviceptr p = 0;
  symm_res_ptr o;
  o.r = ((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, size);
  o.v = (uintptr_t)p;
  return o;
}

/* cuMemFree_v2 */
static inline CUresult symm_cuMemFree(void *fn, uintptr_t ptr) {
  return ((CUresult(*)(CUdeviceptr))fn)((CUdeviceptr)ptr);
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

/* ---- error strings ------------------------------------------------------- */

/* cuGetErrorName and cuGetErrorString share this prototype. The string is
 * static in the driver; s is NULL for a code the driver does not know. */
static inline symm_res_str symm_cuGetErrorText(void *fn, CUresult code) {
  symm_res_str o = {0, NULL};
  o.r = ((CUresult(*)(CUresult, const char **))fn)(code, &o.s);
  return o;
}

#endif /* SYMM_CUDA_SHIM_H */
