// Package nccl drives NCCL (libnccl.so.2), opened with dlopen: a
// communicator made through libsymm's store (or adopted from the caller),
// memory from ncclMemAlloc, and symmetric windows (ncclCommWindowRegister
// with NCCL_WIN_COLL_SYMMETRIC) so that NCCL's collectives on that memory
// take its symmetric-memory paths. It is what symmetric memory's NCCL
// backend stands on.
//
// The library is found where topology.Candidates("nccl") says (the one
// owner of the search order and of pip's wheel paths). Versions:
//
//   - before 2.19: no ncclMemAlloc: refused;
//   - 2.19 to 2.26: memory and communicators, but no windows: refused for
//     this backend (say so), since windows are its point;
//   - 2.27 and later: symmetric windows (NCCL_WIN_COLL_SYMMETRIC);
//   - 2.29 and later: ncclGetPeerDevicePointer would give peers' addresses;
//     libsymm maps peers itself through the CUDA backend's descriptor path,
//     which works with every version.
//
// NCCL_NVLS_ENABLE=0 is forced before a communicator is made: libsymm never
// creates multicast objects.
package nccl
