// What PyTorch's allocator interface asks besides alloc and free (the section
// "what PyTorch's allocator interface asks" of include/symm.h): thin wrappers,
// as in wrappers.cpp, that check the fork flag and the pointers and call the
// Go exports of pools.go (the pool has the front cache give its blocks back
// where it must see them as free: allocator/front.go). None of this is on
// the cached path.
#include "../include/symm.h"
#include "_cgo_export.h"
#include "shim_internal.h"

using namespace symmshim;

extern "C" {

int symm_pool_cache_info(int device, size_t *largest_block) {
  if (forked("symm_pool_cache_info")) return SYMM_ERR_FORKED;
  if (largest_block == nullptr) return fail(SYMM_ERR_INVALID, "symm_pool_cache_info: largest_block is NULL");
  return goPoolCacheInfo(device, largest_block);
}

int symm_pool_reset_accumulated(int device) {
  if (forked("symm_pool_reset_accumulated")) return SYMM_ERR_FORKED;
  return goPoolResetAccumulated(device);
}

int symm_pool_blocks(int device, symm_pool_id_t id, symm_block_info_t *out, int cap) {
  if (forked("symm_pool_blocks")) return -1;
  if (cap < 0 || (cap > 0 && out == nullptr)) {
    fail(SYMM_ERR_INVALID, "symm_pool_blocks: out is NULL or cap is negative");
    return -1;
  }
  return goPoolBlocks(device, id.first, id.second, out, cap);
}

int symm_pool_restore_blocks(int device, symm_pool_id_t id, const symm_block_info_t *want, int n, uint64_t *freed,
                             int *nfreed, uint64_t *allocated, int *nallocated) {
  if (forked("symm_pool_restore_blocks")) return SYMM_ERR_FORKED;
  const char *bad = nullptr;
  if (nfreed == nullptr || nallocated == nullptr)
    bad = "symm_pool_restore_blocks: nfreed or nallocated is NULL";
  else if (n < 0 || (n > 0 && want == nullptr))
    bad = "symm_pool_restore_blocks: want is NULL or n is negative";
  else if (*nfreed < 0 || *nallocated < 0)
    bad = "symm_pool_restore_blocks: *nfreed or *nallocated (the capacity of freed, allocated) is negative";
  else if ((*nfreed > 0 && freed == nullptr) || (*nallocated > 0 && allocated == nullptr))
    bad = "symm_pool_restore_blocks: freed or allocated is NULL with a capacity above 0";
  if (bad != nullptr) {
    if (nfreed != nullptr) *nfreed = 0;
    if (nallocated != nullptr) *nallocated = 0;
    return fail(SYMM_ERR_INVALID, bad);
  }
  // Private pools only (the default pool is refused): nothing of theirs is
  // ever in the front cache.
  return goPoolRestoreBlocks(device, id.first, id.second, const_cast<symm_block_info_t *>(want), n, freed, nfreed,
                             allocated, nallocated);
}

int symm_pool_block_of(const void *ptr, uint64_t *address, uint64_t *requested) {
  if (forked("symm_pool_block_of")) return SYMM_ERR_FORKED;
  if (address == nullptr || requested == nullptr)
    return fail(SYMM_ERR_INVALID, "symm_pool_block_of: address or requested is NULL");
  return goPoolBlockOf((uintptr_t)ptr, address, requested);
}

int symm_pool_segment_of(const void *ptr, uint64_t *base, uint64_t *size, int *expandable) {
  if (forked("symm_pool_segment_of")) return SYMM_ERR_FORKED;
  if (base == nullptr || size == nullptr || expandable == nullptr)
    return fail(SYMM_ERR_INVALID, "symm_pool_segment_of: base, size or expandable is NULL");
  return goPoolSegmentOf((uintptr_t)ptr, base, size, expandable);
}

int symm_pool_segment_chunk(const void *ptr, uint64_t *chunk) {
  if (forked("symm_pool_segment_chunk")) return SYMM_ERR_FORKED;
  if (chunk == nullptr) return fail(SYMM_ERR_INVALID, "symm_pool_segment_chunk: chunk is NULL");
  return goPoolSegmentChunk((uintptr_t)ptr, chunk);
}

int symm_pool_chunk_at(const void *ptr, const void *at, uint64_t *base, uint64_t *size) {
  if (forked("symm_pool_chunk_at")) return SYMM_ERR_FORKED;
  if (base == nullptr) return fail(SYMM_ERR_INVALID, "symm_pool_chunk_at: base is NULL");
  if (size == nullptr) return fail(SYMM_ERR_INVALID, "symm_pool_chunk_at: size is NULL");
  return goPoolChunkAt((uintptr_t)ptr, (uintptr_t)at, base, size);
}

void *symm_pool_alloc_segment(size_t size, int device, void *stream) {
  // Never throws, in any mode: C and C++ callers get NULL and the last error.
  if (forked("symm_pool_alloc_segment") || size == 0) return nullptr;
  return (void *)goPoolNewSegment(size, device, (uintptr_t)stream);
}

}  // extern "C"
