// libsymm's PyTorch extension: CUDA graphs' private pools (torch.cuda.MemPool,
// graph capture's beginAllocateToPool) and the checks and checkpoints of
// CUDA-graph trees (torch.compile mode="reduce-overhead"), answered by
// libsymm's private pools. Part of _torch_ext.cpp's one translation unit,
// included after SymmAllocator's definition.
#ifndef SYMM_TORCH_EXT_GRAPHS_H
#define SYMM_TORCH_EXT_GRAPHS_H

#include "_torch_ext_api.h"

namespace {

// A private pool's blocks at the end of a graph recording
// (getCheckpointState), to be restored when a cudagraph tree's path diverges.
struct PoolState : CCA::AllocatorState {
  c10::DeviceIndex device;
  MempoolId_t id;
  std::vector<symm_block_info_t> blocks;
};

// ---- CUDA graphs -------------------------------------------------------------------
void SymmAllocator::beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id, std::function<bool(cudaStream_t)> filter) {
  g_api.begin_pool(device, {id.first, id.second},
                   [f = std::move(filter)](CUstream_st *s) { return f(reinterpret_cast<cudaStream_t>(s)); });
}
void SymmAllocator::endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) {
  g_api.end_pool(device, {id.first, id.second});
}
void SymmAllocator::releasePool(c10::DeviceIndex device, MempoolId_t id) {
  g_api.release_pool(device, {id.first, id.second});
}

// torch.cuda.MemPool while libsymm is PyTorch's allocator: a private pool of
// libsymm's, with PyTorch's semantics (use count, use_on_oom, no_split,
// emptyCache of its id when it dies). A MemPool over another allocator
// (ProcessGroupNCCL's ncclMemAlloc, PyTorch's symmetric memory, any
// CUDAPluggableAllocator) takes its segments from that allocator's
// raw_alloc and gives them back through its raw_delete; libsymm caches them
// in the pool as PyTorch does.
namespace mempool {
using Owner = std::shared_ptr<CCA::CUDAAllocator>;
void *alloc(size_t size, int device, void *ctx) noexcept {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    return (*static_cast<Owner *>(ctx))->raw_alloc(size);
  } catch (...) {
    // No warning here: libsymm's pool locks are held (a Python warning
    // handler could wait for the GIL). libsymm reports out-of-memory.
  }
  return nullptr;
}
void free(void *ptr, size_t /*size*/, int device, void *ctx) noexcept {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    (*static_cast<Owner *>(ctx))->raw_delete(ptr);
  } catch (...) {
    // The segment stays the allocator's; nothing to tell from under a lock.
  }
}
void release(void *ctx) noexcept { delete static_cast<Owner *>(ctx); }
}  // namespace mempool

// wraps_libsymm reports whether a is torch's CUDAPluggableAllocator over
// libsymm's own C functions (symm_pool_alloc / try_alloc / free): its
// alloc_fn_ and free_fn_ (std::function, a function pointer kept inline)
// lie in the object's first words, as export/torchmode.cpp reads them. A
// MemPool's segments come from its allocator while libsymm holds the pool's
// locks, so such an allocator would call back into libsymm and wait on
// itself forever.
bool wraps_libsymm(const CCA::CUDAAllocator *a) {
  void *const *words = reinterpret_cast<void *const *>(a);
  for (int i = 1; i <= 8; i++) {  // every CUDAAllocator object is far larger than these 9 words
    void *w = words[i];
    if (w != nullptr && (w == reinterpret_cast<void *>(g_api.alloc) || w == reinterpret_cast<void *>(g_api.try_alloc) ||
                         w == reinterpret_cast<void *>(g_api.free)))
      return true;
  }
  return false;
}

void SymmAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id, std::shared_ptr<CCA::CUDAAllocator> allocator) {
  auto create = SYMM_NEED(create_pool);
  g_api.clear_error();
  if (allocator == nullptr || allocator.get() == this) {
    check(create(device, pool_id(id), nullptr), "torch.cuda.MemPool");
    return;
  }
  TORCH_CHECK(!wraps_libsymm(allocator.get()),
              "libsymm: torch.cuda.MemPool over a CUDAPluggableAllocator of libsymm's own functions is not supported "
              "while libsymm is PyTorch's allocator (its segments would come from libsymm while libsymm holds the "
              "pool's locks): use torch.cuda.MemPool() for a private pool of libsymm's");
  symm_segment_allocator_t segs{&mempool::alloc, &mempool::free, &mempool::release,
                                new mempool::Owner(std::move(allocator))};
  check(create(device, pool_id(id), &segs), "torch.cuda.MemPool over another allocator");  // libsymm owns segs.ctx
}

int SymmAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) {
  g_api.clear_error();
  int n = SYMM_NEED(use_count)(device, pool_id(id));
  if (n < 0) check(g_api.last_error_code(), "MemPool.use_count");
  return n;
}

// MemPool's destructor turns use_on_oom off: never throw then.
void SymmAllocator::setUseOnOOM(c10::DeviceIndex device, MempoolId_t id, bool use_on_oom) {
  g_api.clear_error();
  int rc = SYMM_NEED(set_use_on_oom)(device, pool_id(id), use_on_oom ? 1 : 0);
  if (rc == SYMM_OK) return;
  if (!use_on_oom) {
    TORCH_WARN("libsymm: use_on_oom off: ", last_error());
    return;
  }
  check(rc, "MemPool(use_on_oom=True)");
}
void SymmAllocator::setNoSplit(c10::DeviceIndex device, MempoolId_t id) {
  g_api.clear_error();
  check(SYMM_NEED(set_no_split)(device, pool_id(id)), "MemPool(no_split=True)");
}

std::vector<symm_block_info_t> SymmAllocator::pool_blocks(c10::DeviceIndex device, MempoolId_t id) {
  auto fn = SYMM_NEED(blocks);
  for (;;) {
    int n = fn(device, pool_id(id), nullptr, 0);
    if (n < 0) check(g_api.last_error_code(), "pool blocks");
    std::vector<symm_block_info_t> v(static_cast<size_t>(n) + 16);
    int m = fn(device, pool_id(id), v.data(), static_cast<int>(v.size()));
    if (m < 0) check(g_api.last_error_code(), "pool blocks");
    if (m <= static_cast<int>(v.size())) {
      v.resize(static_cast<size_t>(m));
      return v;
    }
  }
}

bool SymmAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                             const std::unordered_set<void *> &expected) {
  size_t live = 0;
  for (auto &b : pool_blocks(device, id)) {
    if (b.state != SYMM_BLOCK_ALLOCATED) continue;
    if (expected.count(reinterpret_cast<void *>(b.address)) == 0) return false;
    live++;
  }
  return live == expected.size();
}

std::shared_ptr<CCA::AllocatorState> SymmAllocator::getCheckpointState(c10::DeviceIndex device, MempoolId_t id) {
  auto st = std::make_shared<PoolState>();
  st->device = device;
  st->id = id;
  st->blocks = pool_blocks(device, id);
  return st;
}

// PyTorch's contract (and its native allocator's behaviour): every block
// allocated in the pool before the call counts as freed, and every block
// allocated in the checkpoint comes back as a new DataPtr, which the
// caller hands to the live storages (cudagraph trees' addStorageDeleterFns);
// one it does not take frees its block when dropped. libsymm changes only
// the blocks that differ, so an unchanged block keeps its memory and data.
CCA::CheckpointDelta SymmAllocator::setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<CCA::AllocatorState> pps) {
  auto st = std::dynamic_pointer_cast<PoolState>(pps);
  TORCH_CHECK(st != nullptr, "libsymm: setCheckpointPoolState: the state was not made by libsymm's getCheckpointState");
  TORCH_CHECK(st->device == device, "libsymm: setCheckpointPoolState: state of device ", st->device, ", not ", device);
  auto fn = SYMM_NEED(restore_blocks);
  std::vector<symm_block_info_t> before = pool_blocks(device, st->id);
  int nfreed = 0, nallocd = 0;  // a dry run sizes the arrays
  int rc = fn(device, pool_id(st->id), st->blocks.data(), static_cast<int>(st->blocks.size()), nullptr, &nfreed,
              nullptr, &nallocd);
  TORCH_CHECK(rc == SYMM_OK || rc == SYMM_ERR_INVALID, "libsymm: setCheckpointPoolState: ", last_error());
  std::vector<uint64_t> freed(static_cast<size_t>(nfreed) + 1), allocd(static_cast<size_t>(nallocd) + 1);
  nfreed = static_cast<int>(freed.size());
  nallocd = static_cast<int>(allocd.size());
  check(fn(device, pool_id(st->id), st->blocks.data(), static_cast<int>(st->blocks.size()), freed.data(), &nfreed,
           allocd.data(), &nallocd),
        "setCheckpointPoolState");
  CCA::CheckpointDelta delta;
  std::vector<void *> gone;
  for (auto &b : before) {
    if (b.state != SYMM_BLOCK_ALLOCATED) continue;
    void *p = reinterpret_cast<void *>(b.address);
    delta.ptrs_freed.push_back(p);
    gone.push_back(p);
  }
  for (auto &b : st->blocks) {
    if (b.state != SYMM_BLOCK_ALLOCATED) continue;
    delta.dataptrs_allocd.push_back(tensor_ptr(reinterpret_cast<void *>(b.address), device));
  }
  std::lock_guard<std::mutex> g(mu_);
  for (void *p : gone) live_ctx_.erase(p);
  return delta;
}

}  // namespace

#endif  // SYMM_TORCH_EXT_GRAPHS_H
