// Internal to export/, C++ only: what the files of the C++ shim share.
//   shim.cpp      the per-thread last error and the fork check
//   torchmode.cpp how PyTorch calls symm_pool_alloc (replace or MemPool mode)
//   routes.cpp    where an allocation goes: private pools of CUDA graphs
//                 (the pool's open routings, allocator/routes.go), the
//                 front cache (front.cpp), or the pool
//   wrappers.cpp  the public functions that only check and call Go
//   pools.cpp     PyTorch's allocator interface besides alloc and free
// shim.h is the part Go sees as well; nothing here is exported (symm.map).
// The numbers that cross between the shim and Go come first, in C, and are
// their one definition: Go reads them as C.SYMMSHIM_* (its cgo preambles
// include this file), the C++ files by name. The rest is C++ only.
#ifndef SYMM_SHIM_INTERNAL_H
#define SYMM_SHIM_INTERNAL_H
#include <stddef.h>

#include "shim.h"

// ---- numbers shared with Go ----

// goPoolRoute's operations (routes.cpp calls, export/graphs.go serves).
enum { SYMMSHIM_ROUTE_BEGIN = 0, SYMMSHIM_ROUTE_END = 1, SYMMSHIM_ROUTE_RELEASE = 2 };

// goPoolSetPool's operations (wrappers.cpp calls, export/mempools.go serves).
enum { SYMMSHIM_SET_POOL_USE_ON_OOM = 0, SYMMSHIM_SET_POOL_NO_SPLIT = 1 };

// Statistics types (allocator/stats.go's, PyTorch's order; export/codes.go
// checks them against the allocator's when libsymm is built): the front
// cache's counts and placements carry them (shim.h's type fields).
enum { SYMMSHIM_STAT_ALL = 0, SYMMSHIM_STAT_SMALL_POOL = 1, SYMMSHIM_STAT_LARGE_POOL = 2, SYMMSHIM_STAT_TYPES = 3 };

// The pool's backend, as goPoolBackend returns it (symm_pool_backend names
// it); none before the pool exists.
enum { SYMMSHIM_BACKEND_NONE = 0, SYMMSHIM_BACKEND_CUDA = 1, SYMMSHIM_BACKEND_HOST = 2 };

// The public entry points of an allocation (routes.cpp's pool_alloc api),
// and the name the errors of each carry (Go reads the names once:
// export/codes.go's allocAPIs).
enum { SYMMSHIM_API_ALLOC = 0, SYMMSHIM_API_TRY_ALLOC = 1, SYMMSHIM_APIS = 2 };
static inline const char *symmshim_api_name(int api) {
  static const char *const names[SYMMSHIM_APIS] = {"symm_pool_alloc", "symm_pool_try_alloc"};
  return api >= 0 && api < SYMMSHIM_APIS ? names[api] : names[SYMMSHIM_API_ALLOC];
}

#ifdef __cplusplus
// Hidden: the names cross files of libsymm.so only, so the compiler reaches
// them directly instead of through the GOT, as within one file.
#pragma GCC visibility push(hidden)
namespace symmshim {

// ---- errors and fork (shim.cpp) ----

// Set in a fork child: the Go runtime's threads did not survive the fork.
// Written only by the atfork child handler.
extern volatile int g_forked;

// set_error records code and msg (NUL-terminated; copied, truncated to the
// buffer) as the calling thread's last error.
void set_error(int code, const char *msg);

// fail is set_error that returns code.
int fail(int code, const char *msg);

// last_error_msg is the calling thread's last error message, "" if none.
const char *last_error_msg();

// refuse_forked records SYMM_ERR_FORKED for fn (a public function's name).
void refuse_forked(const char *fn);

// forked reports whether the caller must stop, recording the error for fn if
// so. Every public function calls it first; inline so that the common case
// costs one load.
inline bool forked(const char *fn) {
  if (__builtin_expect(g_forked, 0)) {
    refuse_forked(fn);
    return true;
  }
  return false;
}

// ---- PyTorch's mode (torchmode.cpp) ----

// How symm_pool_alloc's caller uses the pool (torchmode.cpp says how each is
// recognised): symm_torch_mode's values, include/symm.h's SYMM_TORCH_*.
enum { kTorchNone = SYMM_TORCH_NONE, kTorchReplace = SYMM_TORCH_REPLACE, kTorchMemPool = SYMM_TORCH_MEMPOOL };

// torch_resolve finds c10's current-allocator variable if PyTorch is loaded;
// never loads PyTorch. Cheap once found.
void torch_resolve();

// ---- where an allocation goes (routes.cpp) ----

// The entry points of pool_alloc (SYMMSHIM_API_*): the name its errors carry.
enum { kApiAlloc = SYMMSHIM_API_ALLOC, kApiTryAlloc = SYMMSHIM_API_TRY_ALLOC };

// pool_alloc is symm_pool_alloc without the throw: mode (kTorch*) says how
// PyTorch calls; NULL with the last error set on failure.
void *pool_alloc(int api, size_t size, int device, void *stream, int mode);

}  // namespace symmshim
#pragma GCC visibility pop
#endif  // __cplusplus
#endif
