// Package nvshmem drives NVSHMEM's host library (libnvshmem_host.so.3),
// opened with dlopen: bootstrap by unique id, the symmetric heap
// (nvshmem_malloc / nvshmem_free), peer addresses (nvshmem_ptr). It is what
// symmetric memory's NVSHMEM backend stands on.
//
// The library is found where topology.Candidates("nvshmem") says (the one
// owner of the search order and of pip's wheel paths). Only NVSHMEM 3.x is
// accepted: the layout of nvshmemx_init_attr_t used here is that of 3.x's
// headers (version 1 of the struct, 144 bytes).
//
// Initialization goes through nvshmemx_hostlib_init_attr: nvshmemx_init_attr
// is a static inline of NVSHMEM's headers around nvshmemi_init_thread, which
// lives in the device library that CUDA programs link statically and is not
// exported by the host library. The host library alone serves every host
// call used here. NVSHMEM_DISABLE_NVLS=1 is forced before initialization:
// libsymm never creates multicast objects.
package nvshmem
