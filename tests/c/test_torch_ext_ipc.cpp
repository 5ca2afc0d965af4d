/* test_torch_ext_ipc.cpp: how libsymm's PyTorch extension reads a CUDA IPC
 * handle of an expandable segment that another process sent
 * (python/symm/_torch_ext_ipc.h, used by _torch_ext.cpp's getIpcDevPtr):
 * PyTorch's layout is accepted, and a handle whose counts do not match its
 * bytes is refused with a message before anything is read past its end or a
 * range is sized by an overflowed product. And how it keeps the chunk
 * descriptors of the handles it sends (ShareBook, used by shareIpcHandle and
 * the free): one open descriptor per chunk, closed when the last shared
 * block over it is freed, also when the pointer shared was inside the
 * block. Pure C++: no torch, no CUDA (the library is linked only for
 * check.h's messages). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "../../python/symm/_torch_ext_ipc.h"

using symm_ipc::Expandable;
using symm_ipc::ShareBook;
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

// A fake driver: each chunk exported gets a new descriptor number; the test
// tracks which are open.
struct FakeFds {
  int next = 100;
  std::vector<int> open;
  int export_chunk() {
    open.push_back(next);
    return next++;
  }
  void close_fd(int fd) {
    for (size_t i = 0; i < open.size(); i++) {
      if (open[i] == fd) {
        open.erase(open.begin() + static_cast<long>(i));
        return;
      }
    }
    fprintf(stderr, "  descriptor %d closed twice or never opened\n", fd);
    failures++;
  }
};

// What shareIpcHandle and the free do with the book, as the extension does
// it: the chunks under the block from the pointer shared on (chunks_under),
// recorded under the block's start (symm_pool_block_of's address); the free
// gives the block's start back.
static std::vector<int> share(ShareBook &book, FakeFds &fds, uint64_t ptr, uint64_t block, uint64_t requested,
                              uint64_t base, uint64_t mapped, uint64_t chunk) {
  uint64_t begin = 0, end = 0;
  if (!symm_ipc::chunks_under(ptr, block, requested, base, mapped, chunk, &begin, &end)) return {};
  return book.share(block, begin, end, chunk, [&](uint64_t) { return fds.export_chunk(); });
}

static void share_book(void) {
  const uint64_t mib = 1u << 20, chunk = 20 * mib, base = 0x7f0000000000ull, mapped = 5 * chunk;

  {  // The chunks under a block, from the pointer shared on.
    uint64_t b = 0, e = 0;
    CHECK(symm_ipc::chunks_under(base + chunk + 4096, base + chunk, 3 * mib, base, mapped, chunk, &b, &e) &&
              b == base + chunk && e == base + 2 * chunk,
          "one chunk under a 3 MiB block");
    CHECK(symm_ipc::chunks_under(base + 30 * mib, base + 10 * mib, 40 * mib, base, mapped, chunk, &b, &e) &&
              b == base + chunk && e == base + 3 * chunk,
          "a pointer inside a block over three chunks: the chunks from it on");
    CHECK(symm_ipc::chunks_under(base + 90 * mib, base + 90 * mib, 40 * mib, base, mapped, chunk, &b, &e) &&
              e == base + mapped,
          "clipped to the mapped part");
    CHECK(!symm_ipc::chunks_under(base + mapped, base + mapped, mib, base, mapped, chunk, &b, &e),
          "nothing mapped under it");
  }

  {  // A pointer inside the block (PyTorch shares a storage's pointer): the
     // free, which gives the block's start, closes its descriptors.
    ShareBook book;
    FakeFds fds;
    const uint64_t block = base + chunk, interior = block + 8 * mib;
    std::vector<int> sent = share(book, fds, interior, block, 16 * mib, base, mapped, chunk);
    CHECK(sent.size() == 1 && fds.open.size() == 1 && book.any(), "one chunk shared");
    book.unshare(block, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.empty(), "the free of a block shared by an interior pointer left %zu descriptors open",
          fds.open.size());
    CHECK(book.open_descriptors() == 0 && !book.any(), "the book still holds the block");
    // A later share at that address exports the chunk again (it may be
    // another physical chunk now): never the old descriptor.
    std::vector<int> again = share(book, fds, block, block, 16 * mib, base, mapped, chunk);
    CHECK(again.size() == 1 && again[0] != sent[0], "a later share sent the old descriptor %d", again[0]);
    book.unshare(block, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.empty(), "descriptors left open");
  }

  {  // Two blocks over one chunk, each shared twice: one descriptor, closed
     // with the last block; a pointer never shared changes nothing.
    ShareBook book;
    FakeFds fds;
    const uint64_t a = base, b = base + 4 * mib;
    std::vector<int> s1 = share(book, fds, a, a, 2 * mib, base, mapped, chunk);
    std::vector<int> s2 = share(book, fds, b + 512, b, 2 * mib, base, mapped, chunk);
    std::vector<int> s3 = share(book, fds, b, b, 2 * mib, base, mapped, chunk);
    CHECK(fds.open.size() == 1 && s1 == s2 && s2 == s3, "one descriptor per chunk");
    book.unshare(base + 2 * chunk, [&](int fd) { fds.close_fd(fd); });
    book.unshare(a, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.size() == 1, "closed while block b still covers the chunk");
    book.unshare(b, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.empty() && !book.any(), "not closed with the last block");
  }

  {  // An export that fails: the chunks recorded before it stay with the
     // block and are closed at its free.
    ShareBook book;
    FakeFds fds;
    bool threw = false;
    int n = 0;
    try {
      book.share(base, base, base + 3 * chunk, chunk, [&](uint64_t) {
        if (n++ == 2) throw std::runtime_error("export failed");
        return fds.export_chunk();
      });
    } catch (const std::runtime_error &) {
      threw = true;
    }
    CHECK(threw && fds.open.size() == 2, "the failure is the caller's to see");
    book.unshare(base, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.empty(), "descriptors of a failed share left open");
  }
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

  share_book();

  printf("test_torch_ext_ipc: %d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
