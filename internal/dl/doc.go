// Package dl opens shared libraries at run time (dlopen) and looks up their
// symbols, for the packages that call the CUDA driver, NVML, NCCL and
// NVSHMEM without linking against them: a missing library or symbol is an
// error value, never a load failure of libsymm itself.
package dl
