// Package cuda is the CUDA driver API, loaded at run time from libcuda.so.1,
// as far as libsymm needs it: devices, contexts, memory, events, streams and
// virtual memory management for symmetric memory. It also provides Backend,
// the allocator.Backend that serves the pool from cuMemAlloc.
//
// # Loading
//
// No CUDA header or toolkit is needed to build libsymm, and libsymm does not
// link against libcuda: Load dlopens the driver (DefaultLibrary, or the path
// in SYMM_CUDA_LIB, or WithLibrary), looks up cuGetProcAddress_v2 (CUDA 12;
// the 4-argument cuGetProcAddress of CUDA 11.3+ as a fallback) and asks it for
// every function by base name at the ABI of CUDA 12.0, as PyTorch's
// c10/cuda/driver_api.h does. The pointers go in a table and are called
// through static C trampolines (shim.h) written for that ABI, so a newer
// driver cannot change a prototype under us.
//
// The driver is loaded once per process and never unloaded. A failure is an
// error value naming what is missing, never an abort: the library
// ("cuda: dlopen libcuda.so.1: ..."), a required function
// (*MissingSymbolError), or cuInit's Result. A failed load is not retried;
// every later call returns the same error. Optional functions (virtual memory
// management, stream memory operations) may be absent: calling one returns a
// *MissingSymbolError naming it.
//
// No multicast object function is resolved or called, ever (see DESIGN.md);
// a test checks the symbol table.
//
// # Handles
//
// Device pointers, contexts, streams and events are uintptr in Go and become
// void* only in C. They are not Go pointers: CU_STREAM_LEGACY is 0x1, and
// such a value in an unsafe.Pointer crashes the garbage collector.
//
// Stream 0 means the legacy default stream (PyTorch's default stream); it is
// passed to the driver as CU_STREAM_LEGACY.
//
// # Contexts
//
// Every operation names its device by ordinal. It runs with the goroutine
// locked to its OS thread (the current context is per thread), in the
// thread's current context if that belongs to the device (PyTorch's, when
// PyTorch calls the allocator), else in the device's primary context, pushed
// for the duration of the call and popped after it. Either way the calling
// thread's current context is the same after the call as before: PyTorch's
// contexts keep working. Primary contexts are retained once per device and
// kept for the life of the process. cuInit(0) runs once, in Load.
//
// # Virtual memory
//
// Symmetric memory across processes is made as PyTorch's CUDASymmetricMemory
// makes it: MemCreate (pinned device memory, exportable as a POSIX file
// descriptor, in multiples of Granularity), ExportFD in the owner, ImportFD in
// every other process (the descriptor travels over a Unix socket), MapNew
// (cuMemAddressReserve + cuMemMap + cuMemSetAccess for the devices that use
// the mapping), and UnmapFree and MemRelease to undo them. The structures the
// driver reads (CUmemAllocationProp, CUmemAccessDesc) are declared in shim.h
// with cuda.h's layout, which a test checks. Allocation handles are counted
// in Go: one this process does not hold is refused before it reaches the
// driver. StreamQuery, with StreamWaitValue32 and StreamWriteValue32, lets a
// caller notice a signal wait that does not complete.
//
// # Errors
//
// Result is a CUresult and an error; its text is the driver's own,
// "CUDA_ERROR_OUT_OF_MEMORY: out of memory". Calls wrap it with what they
// were doing ("cuMemAlloc(1048576 bytes) on device 0: ..."), so errors.As and
// errors.Is still find it. Result.OutOfMemory marks out-of-memory for
// allocator.IsOutOfMemory. NewBackend's errors wrap ErrNoDevice.
//
// All functions are safe for concurrent use.
//
// # Files
//
// driver.go loads the driver and fills the function table (Load, Proc);
// calls.go makes the calls, in the right context; api.go is the package's
// functions over them (devices, copies, streams, stream memory operations,
// virtual memory management); vmm.go the structures VMM passes and the count
// of allocation handles held; module.go kernel modules and launches;
// graphs.go what graph capture needs (allocator.CaptureGrapher); result.go
// Result. backend.go is Backend, and expand.go its expandable segments
// (allocator.Expander): one address range reserved per segment
// (cuMemAddressReserve), one cuMemCreate + cuMemMap per
// chunk (20 MiB by default), unmapped when the segment shrinks.
package cuda
