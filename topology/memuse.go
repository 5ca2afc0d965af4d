package topology

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
	hs, err := l.handles()
	if err != nil {
		return nil, err
	}
	out := make([]GPUMemory, 0, len(hs))
	for i, h := range hs {
		total, used, free, err := l.memory(h)
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", i, err)
		}
		out = append(out, GPUMemory{Index: i, Total: total, Used: used, Free: free})
	}
	return out, nil
}
