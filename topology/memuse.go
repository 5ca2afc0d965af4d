package topology

/*
#include <stdint.h>
typedef int nvmlReturn_t;
typedef struct { unsigned long long total, free, used; } symm_nvmlMemory_t2;
static inline nvmlReturn_t symm_nvml_mem2(void *fn, uintptr_t d, symm_nvmlMemory_t2 *m) {
  return ((nvmlReturn_t(*)(void *, symm_nvmlMemory_t2 *))fn)((void *)d, m);
}
static inline nvmlReturn_t symm_nvml_handle2(void *fn, unsigned i, uintptr_t *h) {
  return ((nvmlReturn_t(*)(unsigned, uintptr_t *))fn)(i, h);
}
static inline nvmlReturn_t symm_nvml_count2(void *fn, unsigned *n) {
  return ((nvmlReturn_t(*)(unsigned *))fn)(n);
}
*/
import "C"

import "fmt"

// GPUMemory is one device's memory as NVML counts it now: every process's
// use together (the driver's view, what nvidia-smi shows).
type GPUMemory struct {
	Index int    `json:"index"`
	Total uint64 `json:"total_bytes"`
	Used  uint64 `json:"used_bytes"`
	Free  uint64 `json:"free_bytes"`
}

// MemoryUse reads every device's memory use from NVML (path: as Options.
// NVMLLibrary; "" is SYMM_NVML_LIB, else libnvidia-ml.so.1). Without NVML it
// returns the error: a caller without a GPU shows no device bars.
func MemoryUse(path string) ([]GPUMemory, error) {
	l, err := openNVML(nvmlPath(path))
	if err != nil {
		return nil, err
	}
	f, err := l.need("nvmlDeviceGetMemoryInfo")
	if err != nil {
		return nil, err
	}
	var n C.uint
	if err := l.err(C.symm_nvml_count2(l.fn["nvmlDeviceGetCount_v2"], &n)); err != nil {
		return nil, fmt.Errorf("nvmlDeviceGetCount_v2: %w", err)
	}
	out := make([]GPUMemory, 0, n)
	for i := 0; i < int(n); i++ {
		var h C.uintptr_t
		if err := l.err(C.symm_nvml_handle2(l.fn["nvmlDeviceGetHandleByIndex_v2"], C.uint(i), &h)); err != nil {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex_v2(%d): %w", i, err)
		}
		var m C.symm_nvmlMemory_t2
		if err := l.err(C.symm_nvml_mem2(f, h, &m)); err != nil {
			return nil, fmt.Errorf("nvmlDeviceGetMemoryInfo(%d): %w", i, err)
		}
		out = append(out, GPUMemory{Index: i, Total: uint64(m.total), Used: uint64(m.used), Free: uint64(m.free)})
	}
	return out, nil
}
