// Command export is libsymm's C ABI: built with -buildmode=c-shared into
// libsymm.so. The contract is include/symm.h, which declares every exported
// symbol (tests/check_abi.sh checks it); symm.map exports symm_* and nothing
// else. It holds glue only: the C++ shim that every public function enters
// first, and the //export functions (go*) it calls, which convert C types,
// recover panics and map Go errors to SYMM_ERR_* codes and the calling
// thread's last-error message. The logic lives in the packages it calls.
//
// # The C++ shim
//
// shim_internal.h opens with a map of the shim's files and declares what
// they share; shim.h is the part Go calls as well.
//
//   - shim.cpp: the public "library" section (symm_version, the last error):
//     the per-thread last error and the fork check every public function
//     makes first.
//   - wrappers.cpp: the public functions that only check their arguments and
//     call Go, one macro line each; the signals and collectives among them
//     launch from the handle's plan (plans.cpp) when they can.
//   - torchmode.cpp: how PyTorch calls symm_pool_alloc, replace mode or
//     MemPool mode, decided in this one place (symm_torch_mode), and the C++
//     exception symm_pool_alloc throws in replace mode once the Go call has
//     returned; symm_pool_try_alloc, symm_torch_init,
//     symm_torch_own_allocator.
//   - routes.cpp: where an allocation goes: a segment of its own (MemPool
//     mode), the private pool of a CUDA graph being captured (one load of the
//     pool's count of open routings, allocator/routes.go, before Go is
//     asked; PyTorch's capture filters called for the pool with their
//     exceptions caught), the front cache, or the pool; symm_pool_free; the
//     calls that open and close routes, in C and as PyTorch's C++ graph
//     hooks; memory history, during which the front cache is off.
//   - front.cpp, front.h: the front cache, per-CPU slots of recently freed
//     blocks, so that a cached alloc+free stays in C (front.h states its
//     invariants; front.go reads its settings and is this cache as the pool
//     sees it, cFront). Off unless SYMM_POOL_FRONT_CACHE=1 (it pays for
//     multi-threaded C callers); off, an alloc or free reads one flag of it
//     and nothing else.
//   - liveset.cpp, liveset.h: the front cache's live set, the blocks it
//     handed out, which validates their frees.
//   - pools.cpp: what PyTorch's allocator interface asks besides alloc and
//     free: cacheInfo, pool listings and checkpoints, MemPool segments, a
//     block's segment for CUDA IPC.
//   - snapshot.cpp: snapshots as C listings, the pool's settings, and the
//     segment hook, stored here and called from Go.
//   - plans.h, plans.cpp: launch plans, what a symmetric-memory call needs
//     to launch its kernel, made by Go once per handle and read by C, so
//     that a call without a timeout launches without entering Go (plans.h
//     states the table's lifetime rules).
//
// # The Go side
//
//   - main.go: the process's one pool, made from the environment at the
//     first call, its backend, the last error, panic recovery, symm_version.
//   - errors.go: the one mapping of Go errors to SYMM_ERR_* codes.
//   - codes.go: the numbers the shim and Go pass each other, read from
//     shim_internal.h by name.
//   - front.go: the front cache's settings and its face to the pool.
//   - pool.go, settings.go: the pool's alloc and free, limits, statistics,
//     expandable segments, PyTorch's allocator settings, the memory fraction,
//     driver procedures for the extension.
//   - graphs.go, mempools.go: private pools of CUDA graphs and of
//     torch.cuda.MemPool, memory history and the JSON snapshot.
//   - pools.go, snapshot.go, seghook.go: the Go half of pools.cpp and
//     snapshot.cpp; seghook.go says when segment events reach the hook.
//   - symm.go, collectives.go: symmetric memory (blocks, rendezvous,
//     handles, signals, backends) and the collectives, with the validating
//     handle tables.
//   - plans.go: launch plans published and withdrawn by Go; plans_record.go
//     a driver that records launches instead of making them, for the tests.
//   - store.go: the rendezvous store for C programs (symm_store_*).
//   - topology.go: symm_topology and symm_world_within_direct_access.
//   - publish.go: the process's statistics page for symm top.
package main
