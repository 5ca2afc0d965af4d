// Package kernels compiles CUDA C kernels at run time with NVRTC, so that
// libsymm needs no CUDA toolkit at build time. NVRTC is opened
// with dlopen and found where topology.Candidates("nvrtc") says (the one
// owner of the search order and of pip's wheel paths). Without it, Open returns an error that
// names what is missing; callers keep their stream-memop fallback.
//
// # Files
//
// The source is one NVRTC program of three files (symm.go's SymmSource):
// symm.cu (signal-pad put, wait and barrier with in-kernel timeouts reported
// through a host-mapped word, the epoch meetings through each block's sync
// area, the one-shot all-reduce), symm_collectives.cu (the two-shot
// all-reduce, reduce-scatter, all-gather) and symm_push.cu (the push
// all-reduce), for float32, bfloat16 and float16. nvrtc.go compiles it into a
// CUBIN per compute capability; loader.go keeps each CUBIN on disk
// (SYMM_KERNEL_CACHE) and loads it once per device (cuModuleLoadData; the
// kernels are launched with cuda.Launch). The users are symmetric/kernelsig.go,
// allreduce.go, collectives.go and push.go.
package kernels
