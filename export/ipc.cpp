// symm_pool_segment_of: the segment behind a block, for PyTorch's CUDA IPC
// (libsymm's PyTorch extension shares a segment with cudaIpcGetMemHandle and
// sends the block's offset in it, as PyTorch's own allocator does).
#include <string.h>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "shim.h"

extern "C" int symm_pool_segment_of(const void *ptr, uint64_t *base, uint64_t *size, int *expandable) {
  static const char kForked[] =
      "symm_pool_segment_of: called in a child process after fork(); libsymm (a Go runtime) does not survive fork";
  if (symmshim_forked()) {
    symmshim_set_error(SYMM_ERR_FORKED, kForked, sizeof kForked - 1);
    return SYMM_ERR_FORKED;
  }
  if (base == nullptr || size == nullptr || expandable == nullptr) {
    static const char kNull[] = "symm_pool_segment_of: base, size or expandable is NULL";
    symmshim_set_error(SYMM_ERR_INVALID, kNull, sizeof kNull - 1);
    return SYMM_ERR_INVALID;
  }
  return goPoolSegmentOf((uintptr_t)ptr, (uint64_t *)base, (uint64_t *)size, expandable);
}
