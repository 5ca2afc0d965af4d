/* cudadrv.h: the CUDA driver functions the C GPU test programs use, opened
 * with dlopen as libsymm opens them: no CUDA toolkit is needed to build the
 * tests. load_driver() resolves them and runs cuInit(0); 0 on success. */
#ifndef SYMM_TEST_CUDADRV_H
#define SYMM_TEST_CUDADRV_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGetCount)(int *);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxGetCurrent)(CUcontext *);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree)(CUdeviceptr);
static CUresult (*cuMemsetD32)(CUdeviceptr, unsigned, size_t);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuMemGetInfo)(size_t *, size_t *);

static inline int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
    return -1;
  }
#define SYM(var, name) \
  if (!(*(void **)&var = dlsym(lib, name))) { fprintf(stderr, "missing %s\n", name); return -1; }
  SYM(cuInit, "cuInit");
  SYM(cuDeviceGetCount, "cuDeviceGetCount");
  SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(cuCtxGetCurrent, "cuCtxGetCurrent");
  SYM(cuCtxSynchronize, "cuCtxSynchronize");
  SYM(cuMemAlloc, "cuMemAlloc_v2");
  SYM(cuMemFree, "cuMemFree_v2");
  SYM(cuMemsetD32, "cuMemsetD32_v2");
  SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(cuMemGetInfo, "cuMemGetInfo_v2");
#undef SYM
  return cuInit(0) == 0 ? 0 : -1;
}

#endif
