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

// torch.cuda.MemPool() while libsymm is PyTorch's allocator: a private pool
// of libsymm's, as PyTorch's own allocator makes one. The constructor takes
// a use of the pool (here: a route opened and closed at once, which
// creates the pool or adds a use), use_mem_pool routes the thread's
// allocations to it (beginAllocateToPool) and gives its own use back
// (releasePool), and the destructor's releasePool gives this one back.
// A MemPool over another allocator cannot be served: libsymm answers for
// every CUDA allocation of the process.
void SymmAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id, std::shared_ptr<CCA::CUDAAllocator> allocator) {
  TORCH_CHECK(allocator == nullptr || allocator.get() == this,
              "libsymm: torch.cuda.MemPool(", allocator->name(), " allocator) while libsymm is PyTorch's allocator "
              "(symm.use_as_default()): a MemPool over another allocator is not supported here. Make it without an "
              "allocator (torch.cuda.MemPool(): a private pool of libsymm's), or keep PyTorch's allocator and put "
              "libsymm inside MemPools only (torch.cuda.MemPool(symm.pool_allocator().allocator()))");
  g_api.clear_error();
  g_api.begin_pool(device, {id.first, id.second}, [](CUstream_st *) { return false; });  // throws on error
  g_api.end_pool(device, {id.first, id.second});
  TORCH_CHECK(g_api.last_error_code() == SYMM_OK, "libsymm: torch.cuda.MemPool: ", last_error());
}
// MemPool's destructor turns use_on_oom off (never throw here: it runs in a
// destructor); turning it on, or no_split, asks for what libsymm's private
// pools do not do, and is refused in the constructor with a clear error.
void SymmAllocator::setUseOnOOM(c10::DeviceIndex, MempoolId_t, bool use_on_oom) {
  TORCH_CHECK(!use_on_oom, "libsymm: torch.cuda.MemPool(use_on_oom=True) is not supported while libsymm is PyTorch's "
              "allocator: an out-of-memory allocation outside the pool does not fall back to it");
}
void SymmAllocator::setNoSplit(c10::DeviceIndex, MempoolId_t) {
  TORCH_CHECK(false, "libsymm: torch.cuda.MemPool(no_split=True) is not supported while libsymm is PyTorch's "
              "allocator: its private pools split blocks as the default pool does");
}

std::vector<symm_block_info_t> SymmAllocator::pool_blocks(c10::DeviceIndex device, MempoolId_t id) {
  auto fn = need(g_api.blocks, "symm_pool_blocks");
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
  auto fn = need(g_api.restore_blocks, "symm_pool_restore_blocks");
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
