// What libsymm's PyTorch extension (_torch_ext.cpp) reads from a CUDA IPC
// handle of an expandable segment, in PyTorch's format, as a pure function:
// no torch, no CUDA, so that tests/c/test_torch_ext_ipc.cpp checks it on
// machines without either. A handle comes from another process (through a
// torch.multiprocessing queue): nothing in it is trusted.
#ifndef SYMM_TORCH_EXT_IPC_H
#define SYMM_TORCH_EXT_IPC_H

#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
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

}  // namespace symm_ipc

#endif  // SYMM_TORCH_EXT_IPC_H
