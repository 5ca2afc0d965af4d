/* test_torch_ext_ipc.cpp: how libsymm's PyTorch extension reads a CUDA IPC
 * handle of an expandable segment that another process sent
 * (python/symm/_torch_ext_ipc.h, used by _torch_ext.cpp's getIpcDevPtr):
 * PyTorch's layout is accepted, and a handle whose counts do not match its
 * bytes is refused with a message before anything is read past its end or a
 * range is sized by an overflowed product. Pure C++: no torch, no CUDA (the
 * library is linked only for check.h's messages). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "check.h"
#include "../../python/symm/_torch_ext_ipc.h"

using symm_ipc::Expandable;
using symm_ipc::ShareHeader;

// A handle as PyTorch's ExpandableSegment::share writes it, with nfds
// descriptors after the header whatever num_handles says.
static std::string handle(pid_t pid, size_t segment_size, size_t num_handles, size_t nfds, char type = 'e') {
  ShareHeader hd{};
  hd.pid = pid;
  hd.segment_size = segment_size;
  hd.num_handles = num_handles;
  std::string s;
  s.push_back(symm_ipc::kHandleVersion);
  s.push_back(type);
  s.append(reinterpret_cast<const char *>(&hd), sizeof hd);
  for (size_t i = 0; i < nfds; i++) {
    int fd = 100 + static_cast<int>(i);
    s.append(reinterpret_cast<const char *>(&fd), sizeof fd);
  }
  return s;
}

static std::string parse(const std::string &h, Expandable *e) {
  try {
    return symm_ipc::parse_expandable(h.data(), h.size(), e);
  } catch (const std::exception &ex) {  // e.g. a vector sized by a wild count
    return std::string("THREW ") + ex.what();
  }
}

static bool refused(const std::string &h, const char *want) {
  Expandable e;
  std::string err = parse(h, &e);
  bool ok = !err.empty() && err.rfind("THREW", 0) != 0 && err.find(want) != std::string::npos;
  if (!ok) fprintf(stderr, "  got: %s\n", err.empty() ? "(accepted)" : err.c_str());
  return ok;
}

int main(void) {
  const pid_t me = getpid();
  const size_t chunk = 20u << 20;  // PyTorch's chunk of expandable segments

  {  // PyTorch's layout: accepted, every descriptor read.
    Expandable e;
    std::string err = parse(handle(me, chunk, 3, 3), &e);
    CHECK(err.empty(), "a well-formed handle refused: %s", err.c_str());
    CHECK(e.header.pid == me && e.header.segment_size == chunk && e.header.num_handles == 3, "header");
    CHECK(e.fds == std::vector<int>({100, 101, 102}), "descriptors");
    CHECK(e.total == 3 * chunk, "total %zu", e.total);
  }

  // A num_handles whose product with sizeof(int) wraps around to the bytes
  // that are there: 1 + 2^62 chunks in a handle with one descriptor, and
  // 2^62 chunks in one with none.
  const size_t wrap = (SIZE_MAX / sizeof(int)) + 1;  // wrap * sizeof(int) == 0 (mod 2^64)
  CHECK(refused(handle(me, chunk, wrap + 1, 1), "not the layout libsymm reads"), "num_handles 2^62+1 with 1 descriptor");
  CHECK(refused(handle(me, chunk, wrap, 0), "not the layout libsymm reads"), "num_handles 2^62 with no descriptor");
  CHECK(refused(handle(me, chunk, SIZE_MAX, 0), "not the layout libsymm reads"), "num_handles SIZE_MAX");

  // Counts that match the bytes but whose range does not fit in 64 bits.
  CHECK(refused(handle(me, (SIZE_MAX / 2) + 1, 2, 2), "larger than the address space"), "range overflow");
  CHECK(refused(handle(me, SIZE_MAX, 3, 3), "larger than the address space"), "range overflow (3 chunks)");

  // Counts that do not match the bytes.
  CHECK(refused(handle(me, chunk, 4, 3), "not the layout"), "one descriptor missing");
  CHECK(refused(handle(me, chunk, 2, 3), "not the layout"), "one descriptor too many");
  CHECK(refused(handle(me, chunk, 0, 0), "not the layout"), "no chunk");
  CHECK(refused(handle(me, 0, 1, 1), "not the layout"), "chunks of 0 bytes");
  CHECK(refused(handle(me, chunk, 1, 1) + "xy", "not the layout"), "a partial descriptor");
  // Fabric handles (64 bytes per chunk) are not read as descriptors.
  CHECK(refused(handle(me, chunk, 1, 16), "fabric"), "fabric-handle layout");
  CHECK(refused(handle(0, chunk, 1, 1), "is not a process"), "pid 0");
  CHECK(refused(handle(-1, chunk, 1, 1), "is not a process"), "pid -1");

  // Not an expandable handle at all: too short, another type or version.
  CHECK(refused(handle(me, chunk, 1, 1).substr(0, symm_ipc::kExpandableHead - 1), "not an expandable-segment handle"),
        "truncated header");
  CHECK(refused(handle(me, chunk, 1, 1, 'c'), "not an expandable-segment handle"), "type 'c'");
  {
    std::string h = handle(me, chunk, 1, 1);
    h[0] = 3;
    CHECK(refused(h, "not an expandable-segment handle"), "version 3");
  }
  CHECK(refused(std::string(), "not an expandable-segment handle"), "empty");

  printf("test_torch_ext_ipc: %d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
