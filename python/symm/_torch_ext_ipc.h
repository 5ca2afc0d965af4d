// What libsymm's PyTorch extension (_torch_ext.cpp) reads from a CUDA IPC
// handle of an expandable segment, in PyTorch's format or libsymm's for
// chunks of mixed sizes, and writes into one, as pure functions, and the
// book of the chunk descriptors it keeps open for the handles it sent
// (ShareBook): no torch, no CUDA, so that tests/c/test_torch_ext_ipc.cpp
// checks them on machines without either. A handle comes from another
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
// 'm' is libsymm's own: an expandable segment's chunks of more than one size
// (parse_expandable_mixed), which PyTorch's format cannot say.
constexpr char kHandleVersion = 2;
constexpr char kHandleCudaMalloc = 'c';
constexpr char kHandleExpandable = 'e';
constexpr char kHandleExpandableMixed = 'm';

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
  std::vector<int> fds;         // one per chunk, numbers in the sender
  std::vector<uint64_t> sizes;  // one per chunk, its size: each mapped whole, after the one before
  size_t total = 0;             // the sum of sizes, the range to map
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
  out->sizes.assign(hd.num_handles, hd.segment_size);
  out->fds.resize(hd.num_handles);
  memcpy(out->fds.data(), data + kExpandableHead, body);
  return "";
}

// libsymm's handle of an expandable segment whose chunks differ in size
// (type 'm'): PyTorch's header, whose segment_size is the unit every chunk's
// size is a multiple of (the allocation granularity, the smallest chunk),
// then num_handles chunk sizes (a uint64_t each), then num_handles
// descriptors (an int each, valid in the sender), chunk i mapped after chunk
// i-1. Reads one of len bytes at data into *out; returns "" or what is wrong
// with it, with parse_expandable's care: the count checked against the bytes
// by division, each size and their sum without overflow.
inline std::string parse_expandable_mixed(const char *data, size_t len, Expandable *out) {
  if (len < kExpandableHead || data[0] != kHandleVersion || data[1] != kHandleExpandableMixed) {
    return "a handle of " + std::to_string(len) + " bytes is not libsymm's handle of an expandable segment of mixed " +
           "chunks (version 2, type 'm', " + std::to_string(kExpandableHead) + " bytes of header at least)";
  }
  ShareHeader hd;
  memcpy(&hd, data + 2, sizeof hd);
  const size_t body = len - kExpandableHead, each = sizeof(uint64_t) + sizeof(int);
  const std::string what = "an expandable-segment handle of " + std::to_string(len) + " bytes for " +
                           std::to_string(hd.num_handles) + " chunks of mixed sizes (multiples of " +
                           std::to_string(hd.segment_size) + " bytes)";
  if (hd.num_handles == 0 || hd.segment_size == 0 || body % each != 0 || hd.num_handles != body / each) {
    return what + ": not the layout libsymm writes (a size and a POSIX descriptor per chunk)";
  }
  if (hd.pid <= 0) return what + ": the sender's pid " + std::to_string(hd.pid) + " is not a process";
  std::vector<uint64_t> sizes(hd.num_handles);
  memcpy(sizes.data(), data + kExpandableHead, hd.num_handles * sizeof(uint64_t));
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); i++) {
    if (sizes[i] == 0 || sizes[i] % hd.segment_size != 0) {
      return what + ": chunk " + std::to_string(i) + " of " + std::to_string(sizes[i]) +
             " bytes is not a multiple of " + std::to_string(hd.segment_size);
    }
    if (sizes[i] > SIZE_MAX - total) return what + ": larger than the address space";
    total += sizes[i];
  }
  out->header = hd;
  out->total = total;
  out->sizes = std::move(sizes);
  out->fds.resize(hd.num_handles);
  memcpy(out->fds.data(), data + kExpandableHead + hd.num_handles * sizeof(uint64_t), hd.num_handles * sizeof(int));
  return "";
}

// expandable_handle writes the handle of chunks of sizes[i] bytes, with
// descriptor fds[i] each (as many, one at least), from process pid:
// PyTorch's format ('e', segment_size the chunks' size) when all are of one
// size, so that a receiver on PyTorch's own allocator reads it; else
// libsymm's 'm' (parse_expandable_mixed), segment_size the smallest size
// (the granularity), which every size is a multiple of. "" when the sizes
// are not so (never, from a libsymm pool).
inline std::string expandable_handle(pid_t pid, const std::vector<uint64_t> &sizes, const std::vector<int> &fds) {
  if (sizes.empty() || sizes.size() != fds.size()) return "";
  const uint64_t unit = *std::min_element(sizes.begin(), sizes.end());
  const bool mixed = *std::max_element(sizes.begin(), sizes.end()) != unit;
  for (uint64_t n : sizes) {
    if (unit == 0 || n % unit != 0) return "";
  }
  ShareHeader hd{};
  hd.pid = pid;
  hd.segment_size = unit;
  hd.num_handles = sizes.size();
  std::string s;
  s.push_back(kHandleVersion);
  s.push_back(mixed ? kHandleExpandableMixed : kHandleExpandable);
  s.append(reinterpret_cast<const char *>(&hd), sizeof hd);
  if (mixed) s.append(reinterpret_cast<const char *>(sizes.data()), sizes.size() * sizeof(uint64_t));
  s.append(reinterpret_cast<const char *>(fds.data()), fds.size() * sizeof(int));
  return s;
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

// A physical chunk of an expandable segment: [base, base+size).
struct Chunk {
  uint64_t base;
  uint64_t size;
};

// chunks_at lists the chunks under the allocated block [block,
// block+requested) from ptr on, clipped to the mapped part [base,
// base+mapped) of the segment, as chunks_under does, for a segment whose
// chunks may differ in size: at(address) is the Chunk holding address
// (symm_pool_chunk_at), asked for ptr and then for each chunk's end until
// the block's. Returns "" or what is wrong: ptr outside the mapped part, or
// an answer that is not the chunk after the one before (empty, not holding
// the address, past the end of the address space), which would send a
// range that is not the block's.
template <typename At>
std::string chunks_at(uint64_t ptr, uint64_t block, uint64_t requested, uint64_t base, uint64_t mapped, At at,
                      std::vector<Chunk> *out) {
  out->clear();
  const uint64_t limit = base + mapped;
  if (ptr < base || ptr >= limit) return "the pointer is outside its segment's mapped part";
  const uint64_t len = block + requested > ptr ? block + requested - ptr : 1;
  const uint64_t stop = std::min(ptr + len, limit);
  uint64_t a = ptr;
  do {
    Chunk c = at(a);
    if (c.size == 0 || c.base > a || a - c.base >= c.size || c.size > UINT64_MAX - c.base ||
        (!out->empty() && c.base != a)) {
      return "the chunk [" + std::to_string(c.base) + ", +" + std::to_string(c.size) + ") given for address " +
             std::to_string(a) + " is not the one that holds it" + (out->empty() ? "" : " after the one before");
    }
    out->push_back(c);
    a = c.base + c.size;
  } while (a < stop);
  return "";
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
    std::vector<uint64_t> starts;
    for (uint64_t a = begin; a < end; a += chunk) starts.push_back(a);
    return share(block, starts, open);
  }

  // share, for chunks of any sizes (a segment's may differ): starts are
  // their addresses, in order. A chunk is known by its address alone: at
  // most one descriptor per address, whatever its size.
  template <typename Open>
  std::vector<int> share(uint64_t block, const std::vector<uint64_t> &starts, Open open) {
    std::vector<int> fds;
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<uint64_t> &chunks = shared_[block];
    any_.store(true, std::memory_order_release);
    for (uint64_t a : starts) {
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
