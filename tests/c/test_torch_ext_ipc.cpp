/* test_torch_ext_ipc.cpp: how libsymm's PyTorch extension reads a CUDA IPC
 * handle of an expandable segment that another process sent
 * (python/symm/_torch_ext_ipc.h, used by _torch_ext.cpp's getIpcDevPtr):
 * PyTorch's layout is accepted, and libsymm's for chunks of mixed sizes
 * ('m'), and a handle whose counts do not match its bytes is refused with a
 * message before anything is read past its end or a range is sized by an
 * overflowed product or sum. How it writes one (expandable_handle: PyTorch's
 * layout for chunks of one size) from the chunks under a block
 * (chunks_under, chunks_at). And how it keeps the chunk
 * descriptors of the handles it sends (ShareBook, used by shareIpcHandle and
 * the free): one open descriptor per chunk, closed when the last shared
 * block over it is freed, also when the pointer shared was inside the
 * block. Pure C++: no torch, no CUDA (the library is linked only for
 * check.h's messages). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <functional>
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

// libsymm's 'm' handle: num_handles in the header, then the sizes given,
// then nfds descriptors, whatever num_handles says.
static std::string mixed(pid_t pid, size_t unit, size_t num_handles, const std::vector<uint64_t> &sizes, size_t nfds) {
  std::string s = handle(pid, unit, num_handles, 0, 'm');
  s.append(reinterpret_cast<const char *>(sizes.data()), sizes.size() * sizeof(uint64_t));
  for (size_t i = 0; i < nfds; i++) {
    int fd = 100 + static_cast<int>(i);
    s.append(reinterpret_cast<const char *>(&fd), sizeof fd);
  }
  return s;
}

static std::string parse(const std::string &h, Expandable *e) {
  try {
    if (h.size() >= 2 && h[1] == symm_ipc::kHandleExpandableMixed)
      return symm_ipc::parse_expandable_mixed(h.data(), h.size(), e);
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

// The mixed parser: as the 'e' one, for chunks of sizes listed one by one.
static void mixed_handles(pid_t me) {
  const uint64_t mib = 1u << 20, g = 2 * mib, big = 20 * mib;
  {  // Accepted: sizes, descriptors, the total.
    Expandable e;
    std::string err = parse(mixed(me, g, 3, {g, big, g}, 3), &e);
    CHECK(err.empty(), "a well-formed mixed handle refused: %s", err.c_str());
    CHECK(e.header.pid == me && e.header.segment_size == g && e.header.num_handles == 3, "mixed header");
    CHECK(e.sizes == std::vector<uint64_t>({g, big, g}), "mixed sizes");
    CHECK(e.fds == std::vector<int>({100, 101, 102}), "mixed descriptors");
    CHECK(e.total == 2 * g + big, "mixed total %zu", e.total);
  }
  {  // The 'e' parser lists its sizes too: the receiver maps both alike.
    Expandable e;
    CHECK(parse(handle(me, big, 2, 2), &e).empty() && e.sizes == std::vector<uint64_t>({big, big}),
          "sizes of a PyTorch handle");
  }
  // Counts that do not match the bytes: a size or a descriptor missing or
  // too many, a partial size, none.
  CHECK(refused(mixed(me, g, 3, {g, big}, 3), "not the layout libsymm writes"), "a size missing");
  CHECK(refused(mixed(me, g, 3, {g, big, g}, 2), "not the layout libsymm writes"), "a descriptor missing");
  CHECK(refused(mixed(me, g, 2, {g, big, g}, 2), "not the layout libsymm writes"), "a size too many");
  CHECK(refused(mixed(me, g, 2, {g, big}, 3), "not the layout libsymm writes"), "a descriptor too many");
  CHECK(refused(mixed(me, g, 2, {g, big}, 2) + "x", "not the layout libsymm writes"), "a trailing byte");
  CHECK(refused(mixed(me, g, 0, {}, 0), "not the layout libsymm writes"), "no chunk");
  CHECK(refused(mixed(me, 0, 1, {g}, 1), "not the layout libsymm writes"), "a unit of 0 bytes");
  {  // Truncated anywhere: never accepted, never read past the end.
    const std::string full = mixed(me, g, 3, {g, big, g}, 3);
    int bad = 0;
    for (size_t n = 0; n < full.size(); n++) {
      Expandable e;
      std::string err = parse(full.substr(0, n), &e);
      if (err.empty() || err.rfind("THREW", 0) == 0) bad++;
    }
    CHECK(bad == 0, "%d truncations of a mixed handle accepted or threw", bad);
  }
  // A num_handles whose product with 12 (a size and a descriptor) wraps
  // around to the bytes that are there.
  const size_t each = sizeof(uint64_t) + sizeof(int);
  CHECK(refused(mixed(me, g, SIZE_MAX / each + 1, {}, 0), "not the layout"), "num_handles wrapping to 0 bytes");
  CHECK(refused(mixed(me, g, SIZE_MAX / each + 2, {g}, 1), "not the layout"), "num_handles wrapping to 1 chunk");
  CHECK(refused(mixed(me, g, SIZE_MAX, {}, 0), "not the layout"), "num_handles SIZE_MAX");
  // Sizes: each a whole multiple of the unit (2 MiB), their sum in 64 bits.
  CHECK(refused(mixed(me, g, 2, {g, 3 * mib}, 2), "is not a multiple of"), "a size not a multiple of 2 MiB");
  CHECK(refused(mixed(me, g, 2, {g, mib}, 2), "is not a multiple of"), "a size below the unit");
  CHECK(refused(mixed(me, g, 2, {0, g}, 2), "is not a multiple of"), "a size of 0");
  CHECK(refused(mixed(me, g, 2, {big, g + 1}, 2), "chunk 1 of"), "the bad chunk named");
  {
    const uint64_t huge = (SIZE_MAX / g) * g;  // a multiple of the unit near 2^64
    CHECK(refused(mixed(me, g, 2, {huge, g}, 2), "larger than the address space"), "sizes summing past 2^64");
    const uint64_t half = (SIZE_MAX / 2 / g) * g;  // two fit, three do not
    CHECK(refused(mixed(me, g, 3, {half, half, half}, 3), "larger than the address space"),
          "three sizes summing past 2^64");
  }
  CHECK(refused(mixed(0, g, 1, {g}, 1), "is not a process"), "mixed: pid 0");
  CHECK(refused(mixed(-5, g, 1, {g}, 1), "is not a process"), "mixed: pid -5");
  // Another type or version: not read as a mixed handle, nor a mixed one as 'e'.
  {
    std::string h = mixed(me, g, 1, {g}, 1);
    h[0] = 3;
    CHECK(refused(h, "not libsymm's handle"), "mixed: version 3");
    Expandable e;
    CHECK(!symm_ipc::parse_expandable_mixed(handle(me, g, 1, 1).data(), handle(me, g, 1, 1).size(), &e).empty(),
          "an 'e' handle read as 'm'");
    std::string m = mixed(me, g, 1, {g}, 1);
    CHECK(!symm_ipc::parse_expandable(m.data(), m.size(), &e).empty(), "an 'm' handle read as 'e'");
  }

  // What the extension writes: PyTorch's 'e' for chunks of one size (a
  // receiver on PyTorch's allocator reads it), 'm' for mixed ones; each
  // reads back as written.
  {
    std::string h = symm_ipc::expandable_handle(me, {big, big, big}, {7, 8, 9});
    Expandable e;
    CHECK(h.size() == symm_ipc::kExpandableHead + 3 * sizeof(int) && h[1] == symm_ipc::kHandleExpandable &&
              parse(h, &e).empty() && e.header.segment_size == big && e.fds == std::vector<int>({7, 8, 9}) &&
              e.total == 3 * big,
          "chunks of one size: PyTorch's handle");
    h = symm_ipc::expandable_handle(me, {g, big, g, g}, {7, 8, 9, 10});
    CHECK(h[1] == symm_ipc::kHandleExpandableMixed && parse(h, &e).empty() && e.header.segment_size == g &&
              e.sizes == std::vector<uint64_t>({g, big, g, g}) && e.fds == std::vector<int>({7, 8, 9, 10}) &&
              e.total == 3 * g + big,
          "mixed chunks: libsymm's handle, the unit the smallest");
    CHECK(symm_ipc::expandable_handle(me, {}, {}).empty() && symm_ipc::expandable_handle(me, {g}, {1, 2}).empty() &&
              symm_ipc::expandable_handle(me, {2 * g, 3 * g}, {1, 2}).empty() &&
              symm_ipc::expandable_handle(me, {0, g}, {1, 2}).empty(),
          "no handle for no chunk, counts that differ, or sizes not multiples of the smallest");
  }
}

// A segment of mixed chunks, as the allocator maps them: big ones at
// multiples of big from base where it put them, granules elsewhere.
struct FakeSegment {
  uint64_t base, g, big;
  std::vector<bool> bigs;  // per big slot: mapped as one big chunk
  int asked = 0;
  symm_ipc::Chunk at(uint64_t a) {
    asked++;
    uint64_t i = (a - base) / big;
    if (i < bigs.size() && bigs[i]) return symm_ipc::Chunk{base + i * big, big};
    return symm_ipc::Chunk{base + (a - base) / g * g, g};
  }
};

static void mixed_chunks(void) {
  const uint64_t mib = 1u << 20, g = 2 * mib, big = 20 * mib, base = 0x7e0000000000ull, mapped = 4 * big;
  FakeSegment seg{base, g, big, {false, true, false, true}};
  auto at = [&](uint64_t a) { return seg.at(a); };
  std::vector<symm_ipc::Chunk> cs;

  // A block over granules, a big chunk and granules, from a pointer inside it.
  CHECK(symm_ipc::chunks_at(base + 17 * mib, base + 16 * mib, 26 * mib, base, mapped, at, &cs).empty(),
        "chunks_at refused a block over mixed chunks");
  CHECK(cs.size() == 4 && cs[0].base == base + 16 * mib && cs[0].size == g && cs[1].base == base + 18 * mib &&
            cs[1].size == g && cs[2].base == base + big && cs[2].size == big && cs[3].base == base + 2 * big &&
            cs[3].size == g,
        "the chunks under [16, 42) MiB: 2 granules, a big chunk, a granule (%zu)", cs.size());
  // Inside one big chunk: that chunk alone, from its start.
  CHECK(symm_ipc::chunks_at(base + 25 * mib, base + 24 * mib, 3 * mib, base, mapped, at, &cs).empty() &&
            cs.size() == 1 && cs[0].base == base + big && cs[0].size == big,
        "a block inside a big chunk");
  // A block of 0 bytes still sends the chunk under it; a requested end
  // before ptr (a pointer past a block's request) sends ptr's chunk.
  CHECK(symm_ipc::chunks_at(base + 4 * mib, base + 4 * mib, 0, base, mapped, at, &cs).empty() && cs.size() == 1 &&
            cs[0].base == base + 4 * mib && cs[0].size == g,
        "a block of 0 bytes");
  // Clipped to the mapped part: no chunk asked past it.
  seg.asked = 0;
  CHECK(symm_ipc::chunks_at(base + 3 * big, base + 3 * big, 3 * big, base, mapped, at, &cs).empty() &&
            cs.size() == 1 && cs[0].size == big && seg.asked == 1,
        "clipped to the mapped part (%d asked)", seg.asked);
  CHECK(!symm_ipc::chunks_at(base + mapped, base + mapped, mib, base, mapped, at, &cs).empty() &&
            !symm_ipc::chunks_at(base - 1, base - 1, mib, base, mapped, at, &cs).empty(),
        "a pointer outside the mapped part");
  // Uniform chunks give what chunks_under gives.
  {
    FakeSegment flat{base, g, big, {}};
    uint64_t b = 0, e = 0;
    CHECK(symm_ipc::chunks_at(base + 3 * mib, base + 3 * mib, 7 * mib, base, mapped,
                              [&](uint64_t a) { return flat.at(a); }, &cs)
                  .empty() &&
              symm_ipc::chunks_under(base + 3 * mib, base + 3 * mib, 7 * mib, base, mapped, g, &b, &e) &&
              cs.size() == (e - b) / g && cs.front().base == b && cs.back().base + g == e,
          "granules as chunks_under says");
  }
  // Answers that are not the chunk after the one before: refused, and the
  // walk ends (no loop on a chunk that does not move on).
  auto bad = [&](std::function<symm_ipc::Chunk(uint64_t)> f) {
    return !symm_ipc::chunks_at(base + 3 * mib, base + 3 * mib, 30 * mib, base, mapped, f, &cs).empty();
  };
  CHECK(bad([](uint64_t a) { return symm_ipc::Chunk{a, 0}; }), "an empty chunk");
  CHECK(bad([](uint64_t a) { return symm_ipc::Chunk{a + 1, 2u << 20}; }), "a chunk after the address");
  CHECK(bad([](uint64_t a) { return symm_ipc::Chunk{a - (4u << 20), 2u << 20}; }), "a chunk before the address");
  CHECK(bad([&](uint64_t a) { return symm_ipc::Chunk{a == base + 3 * mib ? base + 2 * mib : base, 4u << 20}; }),
        "a chunk that is not after the one before");
  CHECK(bad([](uint64_t a) { return symm_ipc::Chunk{a, UINT64_MAX}; }), "a chunk past the address space");
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

  {  // Chunks of mixed sizes, by their addresses: a block over a granule
     // and a big chunk, another over the big chunk alone; one descriptor
     // per chunk, the big one closed with the last block over it.
    ShareBook book;
    FakeFds fds;
    const uint64_t g = 2 * mib;
    std::vector<int> s1 = book.share(base, {base + chunk - g, base + chunk},
                                     [&](uint64_t) { return fds.export_chunk(); });
    std::vector<int> s2 = book.share(base + chunk + mib, {base + chunk}, [&](uint64_t) { return fds.export_chunk(); });
    CHECK(s1.size() == 2 && s2.size() == 1 && s2[0] == s1[1] && fds.open.size() == 2,
          "the big chunk's descriptor shared by both blocks");
    book.unshare(base, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open == std::vector<int>({s1[1]}), "the granule closed, the big chunk kept for the other block");
    book.unshare(base + chunk + mib, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.empty() && !book.any() && book.open_descriptors() == 0, "mixed chunks left open");
    // The (begin, end, chunk) form is the list of its multiples.
    std::vector<int> s3 = book.share(base, base, base + 3 * g, g, [&](uint64_t) { return fds.export_chunk(); });
    std::vector<int> s4 =
        book.share(base + g, {base, base + g, base + 2 * g}, [&](uint64_t) { return fds.export_chunk(); });
    CHECK(s3 == s4 && fds.open.size() == 3, "the two forms name the same chunks");
    book.unshare(base, [&](int fd) { fds.close_fd(fd); });
    book.unshare(base + g, [&](int fd) { fds.close_fd(fd); });
    CHECK(fds.open.empty(), "descriptors left open");
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

  mixed_handles(me);
  mixed_chunks();
  share_book();

  printf("test_torch_ext_ipc: %d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
