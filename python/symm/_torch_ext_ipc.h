// What libsymm's PyTorch extension (_torch_ext.cpp) reads from a CUDA IPC
// handle of an expandable segment, in PyTorch's format, as a pure function,
// and the book of the chunk descriptors it keeps open for the handles it
// sent (ShareBook): no torch, no CUDA, so that tests/c/test_torch_ext_ipc.cpp
// checks both on machines without either. A handle comes from another
// process (through a torch.multiprocessing queue): nothing in it is trusted.
#ifndef SYMM_TORCH_EXT_IPC_H
#define SYMM_TORCH_EXT_IPC_H

#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace symm_ipc {

// PyTorch's handle: a version byte (2), a type byte ('c': a cudaIpcMemHandle_t
// of a cudaMalloc'd segment; 'e': an expandable segment), then the payload.
constexpr char kHandleVersion = 2;
constexpr char kHandleCudaMalloc = 'c';
constexpr char kHandleExpandable = 'e';

// PyTorch's header of a shared expandable segment (c10/cuda/CUDACachingAllocator.cpp,
// ExpandableSegment::share): the sender's pid, the size of each physical
// chunk and their number; then one POSIX descriptor (an int, valid in the
// sender) per chunk, which the receiver duplicates with pidfd_getfd.
struct ShareHeader {
  pid_t pid;
  size_t segment_size;
  size_t num_handles;
};

constexpr size_t kExpandableHead = 2 + sizeof(ShareHeader);

struct Expandable {
  ShareHeader header{};
  std::vector<int> fds;  // one per chunk, numbers in the sender
  size_t total = 0;      // header.num_handles * header.segment_size, the range to map
};

// Reads a version-2 'e' handle of len bytes at data into *out. Returns "" or
// what is wrong with it. The number of chunks is checked against the bytes
// that follow the header by division (a multiplication wraps around for a huge
// num_handles and lets the reader run past the handle), and the size of the
// whole range without overflowing.
inline std::string parse_expandable(const char *data, size_t len, Expandable *out) {
  if (len < kExpandableHead || data[0] != kHandleVersion || data[1] != kHandleExpandable) {
    return "a handle of " + std::to_string(len) + " bytes is not an expandable-segment handle (version 2, type 'e', " +
           std::to_string(kExpandableHead) + " bytes of header at least)";
  }
  ShareHeader hd;
  memcpy(&hd, data + 2, sizeof hd);
  const size_t body = len - kExpandableHead;
  const std::string what = "an expandable-segment handle of " + std::to_string(len) + " bytes for " +
                           std::to_string(hd.num_handles) + " chunks of " + std::to_string(hd.segment_size) + " bytes";
  if (hd.num_handles == 0 || hd.segment_size == 0 || body % sizeof(int) != 0 || hd.num_handles != body / sizeof(int)) {
    return what + ": not the layout libsymm reads (POSIX descriptors); was it made with fabric handles?";
  }
  if (hd.segment_size > SIZE_MAX / hd.num_handles) return what + ": larger than the address space";
  if (hd.pid <= 0) return what + ": the sender's pid " + std::to_string(hd.pid) + " is not a process";
  out->header = hd;
  out->total = hd.num_handles * hd.segment_size;
  out->fds.resize(hd.num_handles);
  memcpy(out->fds.data(), data + kExpandableHead, body);
  return "";
}

// chunks_under returns the chunks [*begin, *end) (addresses, multiples of
// chunk from base) under the allocated block [block, block+requested) from
// ptr on (ptr may be inside the block), clipped to the mapped part
// [base, base+mapped) of the segment: what an expandable-segment handle of
// ptr sends. false when nothing of it is mapped.
inline bool chunks_under(uint64_t ptr, uint64_t block, uint64_t requested, uint64_t base, uint64_t mapped,
                         uint64_t chunk, uint64_t *begin, uint64_t *end) {
  uint64_t len = block + requested > ptr ? block + requested - ptr : 1;
  *begin = base + (ptr - base) / chunk * chunk;
  *end = std::min(base + (ptr + len - base + chunk - 1) / chunk * chunk, base + mapped);
  return *end > *begin;
}

// ShareBook keeps the descriptor of each chunk an expandable-segment handle
// sent open while a shared block covers the chunk (the receiver duplicates
// it from this process with pidfd_getfd, at any time), and closes it when
// the last such block goes back to the pool: before the chunk can be
// unmapped, so that a later handle at that address never sends a
// descriptor of an old physical chunk.
//
// Invariant: a block's one key is its start (symm_pool_block_of's address),
// the pointer the pool takes back at its free, whatever pointer was
// shared: PyTorch shares a storage's pointer, which may be inside the
// block. Each chunk's refs is the number of entries naming it in shared_.
class ShareBook {
 public:
  // share records that the block starting at block shares chunks [begin,
  // end) of size chunk and returns their descriptors, in order: a chunk's
  // open one, or open(chunk address)'s, a new descriptor (open may throw:
  // the chunks recorded before it stay with the block until unshare).
  template <typename Open>
  std::vector<int> share(uint64_t block, uint64_t begin, uint64_t end, uint64_t chunk, Open open) {
    std::vector<int> fds;
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<uint64_t> &chunks = shared_[block];
    any_.store(true, std::memory_order_release);
    for (uint64_t a = begin; a < end; a += chunk) {
      auto it = fds_.find(a);
      if (it == fds_.end()) it = fds_.emplace(a, ChunkFd{open(a), 0}).first;
      it->second.refs++;
      chunks.push_back(a);
      fds.push_back(it->second.fd);
    }
    return fds;
  }

  // unshare: the block starting at block goes back to the pool; close(fd)
  // is called for each chunk no other shared block covers. A block never
  // shared is ignored.
  template <typename Close>
  void unshare(uint64_t block, Close close) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = shared_.find(block);
    if (it == shared_.end()) return;
    for (uint64_t a : it->second) {
      auto c = fds_.find(a);
      if (c != fds_.end() && --c->second.refs == 0) {
        close(c->second.fd);
        fds_.erase(c);
      }
    }
    shared_.erase(it);
    any_.store(!shared_.empty(), std::memory_order_release);
  }

  // any: some block is shared. One load on every free, so that a process
  // that never shares pays nothing more.
  bool any() const { return any_.load(std::memory_order_acquire); }

  // open_descriptors: the chunks' descriptors held open now (tests).
  size_t open_descriptors() {
    std::lock_guard<std::mutex> lk(mu_);
    return fds_.size();
  }

 private:
  struct ChunkFd {
    int fd;
    int refs;
  };
  std::mutex mu_;  // guards shared_ and fds_
  std::atomic<bool> any_{false};
  std::unordered_map<uint64_t, std::vector<uint64_t>> shared_;  // block start -> the chunks it shared
  std::unordered_map<uint64_t, ChunkFd> fds_;                   // chunk address -> its open descriptor
};

}  // namespace symm_ipc

#endif  // SYMM_TORCH_EXT_IPC_H
