/* test_graphs.cpp: private pools (CUDA graphs) through the C API and through
 * the C++ functors PyTorch calls (symm_torch_*_pool, with std::function
 * filters as CUDAGraph::capture_begin builds them), memory history and
 * snapshots. Host backend: SYMM_DEVICE=host. C++ because the functors take
 * std::pair and std::function; everything else is the C ABI. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "check.h"

static const size_t MiB = 1 << 20;
#define SA ((void *)0x1000)
#define SB ((void *)0x2000)

static long long stat_now(int dev, const char *name) {
  symm_stat_t st[256];
  int n = symm_pool_stats(dev, st, 256);
  for (int i = 0; i < n; i++)
    if (!strcmp(st[i].name, name)) return st[i].value;
  return -1;
}

static std::string snapshot() {
  size_t len = 0;
  if (symm_pool_snapshot(nullptr, 0, &len) != SYMM_OK) return "";
  std::string s(len + 4096, '\0');
  if (symm_pool_snapshot(&s[0], s.size(), &len) != SYMM_OK) return "";
  s.resize(len);
  return s;
}

/* The C API: a route by stream. */
static void test_c_routes(void) {
  symm_pool_id_t id = {1, 0};
  long long reserved0 = stat_now(0, "reserved_bytes.all.current");
  CHECK(symm_pool_begin_allocate_to_pool(0, id, SA) == SYMM_OK, "begin");
  void *a = symm_pool_alloc(MiB, 0, SA);
  void *other = symm_pool_alloc(MiB, 0, SB); /* another stream: the default pool */
  CHECK(a && other, "allocations");
  symm_pool_free(a, MiB, 0, SA); /* freed inside the "capture" */
  void *a2 = symm_pool_alloc(MiB, 0, SA);
  CHECK(a2 == a, "the pool reuses its own block at once (%p, %p)", a2, a);
  CHECK(symm_pool_end_allocate_to_pool(0, id) == SYMM_OK, "end");
  /* After the capture, SA allocates from the default pool again, and never
   * gets the pool's memory, even once the pool's block is freed. */
  symm_pool_free(a2, MiB, 0, SA);
  for (int i = 0; i < 4; i++) {
    void *x = symm_pool_alloc(MiB, 0, SA);
    CHECK(x && x != a, "outside allocation %d is not the pool's block", i);
    symm_pool_free(x, MiB, 0, SA);
  }
  symm_pool_free(other, MiB, 0, SB);
  std::string js = snapshot();
  CHECK(js.find("\"segment_pool_id\":[1,0]") != std::string::npos, "the snapshot shows the pool's segment");
  CHECK(symm_pool_release_pool(0, id) == SYMM_OK, "release");
  symm_pool_empty_cache();
  CHECK(stat_now(0, "reserved_bytes.all.current") == reserved0, "reserved back to %lld: %lld", reserved0,
        stat_now(0, "reserved_bytes.all.current"));
  CHECK(snapshot().find("\"segment_pool_id\":[1,0]") == std::string::npos, "the pool's segment is gone");
}

/* PyTorch's way: begin with a filter, two graphs sharing a pool, release in
 * the destructor order, output tensors outliving the graph. */
static void test_torch_functors(void) {
  std::pair<unsigned long long, unsigned long long> id{0, 5};
  bool capturing = true;
  int calls = 0;
  /* CUDAGraph's filter: the capture stream, while it captures. */
  auto filter = [&](CUstream_st *s) {
    calls++;
    return capturing && s == (CUstream_st *)SA;
  };
  long long reserved0 = stat_now(0, "reserved_bytes.all.current");
  symm_clear_error();
  symm_torch_begin_allocate_to_pool(0, id, filter);
  CHECK(symm_last_error_code() == SYMM_OK, "begin");
  void *t1 = symm_pool_alloc(4 * MiB, 0, SA);
  void *out = symm_pool_alloc(MiB, 0, SA);
  void *side = symm_pool_alloc(MiB, 0, SB);
  CHECK(calls >= 3, "the filter was asked (%d)", calls);
  symm_pool_free(t1, 4 * MiB, 0, SA);
  symm_torch_end_allocate_to_pool(0, id);
  capturing = false;
  CHECK(symm_last_error_code() == SYMM_OK, "end");

  /* A second graph shares the pool and reuses t1's memory. */
  capturing = true;
  symm_torch_begin_allocate_to_pool(0, id, filter);
  void *u = symm_pool_alloc(4 * MiB, 0, SA);
  CHECK(u == t1, "the second graph reuses the first one's freed block");
  symm_pool_free(u, 4 * MiB, 0, SA);
  symm_torch_end_allocate_to_pool(0, id);
  capturing = false;

  /* Both graphs die; the output tensor lives on and stays valid. */
  symm_torch_release_pool(0, id);
  symm_torch_release_pool(0, id);
  CHECK(symm_last_error_code() == SYMM_OK, "two releases, as PyTorch's two graphs do");
  symm_pool_empty_cache();
  CHECK(stat_now(0, "reserved_bytes.all.current") > reserved0, "the live output keeps its segment");
  memset(out, 0x5a, MiB); /* host memory: still mapped */
  symm_pool_free(out, MiB, 0, SA);
  symm_pool_free(side, MiB, 0, SB);
  symm_pool_empty_cache();
  CHECK(stat_now(0, "reserved_bytes.all.current") == reserved0, "reserved back: %lld, want %lld",
        stat_now(0, "reserved_bytes.all.current"), reserved0);

  /* Bad input through the functors: a clear last error, never a throw. */
  symm_clear_error();
  symm_torch_release_pool(0, id);
  CHECK(symm_last_error_code() == SYMM_ERR_INVALID && strstr(symm_last_error(), "symm_torch_release_pool: ") &&
            strstr(symm_last_error(), "no such pool"),
        "release of a forgotten pool");
  symm_clear_error();
  symm_torch_end_allocate_to_pool(0, {3, 0});
  CHECK(symm_last_error_code() == SYMM_ERR_INVALID && strstr(symm_last_error(), "no such pool"), "end of an unknown pool");
  bool threw = false;
  try {
    symm_torch_begin_allocate_to_pool(-1, id, filter);
  } catch (const std::exception &e) {
    threw = strstr(e.what(), "device -1") != nullptr;
  }
  CHECK(threw, "begin on a bad device throws (PyTorch reports it from capture_begin)");

  /* A graph released before its capture ended (capture failed): the route
   * goes with it, so later allocations are not sent to a dead pool. */
  capturing = true;
  std::pair<unsigned long long, unsigned long long> id2{0, 6};
  symm_torch_begin_allocate_to_pool(0, id2, filter);
  symm_torch_release_pool(0, id2);
  void *after = symm_pool_alloc(MiB, 0, SA);
  CHECK(after != nullptr, "allocation after a released open route");
  symm_pool_free(after, MiB, 0, SA);
  capturing = false;
  symm_pool_empty_cache();
}

/* A filter that throws: the allocation it was asked about fails with the
 * filter's message (the pool calls it through a shim that catches), and the
 * routing still ends and releases cleanly. */
static void test_throwing_filter(void) {
  std::pair<unsigned long long, unsigned long long> id{0, 9};
  auto filter = [](CUstream_st *s) -> bool {
    if (s == (CUstream_st *)SB) throw std::runtime_error("no capture info for this stream");
    return s == (CUstream_st *)SA;
  };
  symm_clear_error();
  symm_torch_begin_allocate_to_pool(0, id, filter);
  CHECK(symm_last_error_code() == SYMM_OK, "begin");
  void *in = symm_pool_alloc(MiB, 0, SA);
  CHECK(in != nullptr, "the filter's stream is routed");
  symm_clear_error();
  void *bad = symm_pool_alloc(MiB, 0, SB);
  CHECK(bad == nullptr && strstr(symm_last_error(), "no capture info for this stream") &&
            strstr(symm_last_error(), "(0, 9)"),
        "a throwing filter fails the allocation: %s", symm_last_error());
  void *other = symm_pool_alloc(MiB, 1, SB); /* another device: no routing there */
  CHECK(other != nullptr, "other devices are not asked");
  symm_pool_free(other, MiB, 1, SB);
  symm_pool_free(in, MiB, 0, SA);
  symm_torch_end_allocate_to_pool(0, id);
  void *after = symm_pool_alloc(MiB, 0, SB);
  CHECK(after != nullptr, "after the end, the filter is not asked");
  symm_pool_free(after, MiB, 0, SB);
  symm_clear_error();
  symm_torch_release_pool(0, id);
  CHECK(symm_last_error_code() == SYMM_OK, "release");
  symm_pool_empty_cache();
}

/* torch.cuda.MemPool's C side: a pool over a caller's segment allocator,
 * its use count, and its cache given back through that allocator when it
 * dies (release, then symm_pool_empty_pool). */
struct Segs {
  int allocs = 0, frees = 0, releases = 0;
};
static void *segs_alloc(size_t size, int, void *ctx) {
  static_cast<Segs *>(ctx)->allocs++;
  return aligned_alloc(4096, size);
}
static void segs_free(void *p, size_t, int, void *ctx) {
  static_cast<Segs *>(ctx)->frees++;
  free(p);
}
static void segs_release(void *ctx) { static_cast<Segs *>(ctx)->releases++; }

static void test_mempool_over_allocator(void) {
  Segs segs;
  symm_segment_allocator_t a = {segs_alloc, segs_free, segs_release, &segs};
  symm_pool_id_t id = {0, 21};
  CHECK(symm_pool_create_pool(0, id, &a) == SYMM_OK, "create");
  CHECK(symm_pool_use_count(0, id) == 1, "use count 1");
  CHECK(symm_pool_create_pool(0, id, &a) == SYMM_ERR_INVALID && segs.releases == 1,
        "an existing pool refuses an allocator, and releases it");
  segs.releases = 0;
  CHECK(symm_pool_set_no_split(0, id) == SYMM_OK, "no_split");
  CHECK(symm_pool_begin_allocate_to_pool(0, id, SA) == SYMM_OK, "begin");
  CHECK(symm_pool_use_count(0, id) == 2, "a route takes a use");
  void *x = symm_pool_alloc(1000, 0, SA);
  void *y = symm_pool_alloc(1000, 0, SA);
  CHECK(x && y && segs.allocs == 2, "two whole segments from the allocator (no_split): %d", segs.allocs);
  CHECK(symm_pool_end_allocate_to_pool(0, id) == SYMM_OK && symm_pool_release_pool(0, id) == SYMM_OK, "end");
  CHECK(symm_pool_use_count(0, id) == 1, "back to 1");
  symm_pool_free(x, 1000, 0, SA);
  symm_pool_free(y, 1000, 0, SA);
  CHECK(symm_pool_empty_pool(id) == SYMM_OK && segs.frees == 0, "a live pool keeps its cache");
  /* The MemPool dies: use_on_oom off, release, empty its cache. */
  CHECK(symm_pool_set_use_on_oom(0, id, 0) == SYMM_OK, "use_on_oom off");
  CHECK(symm_pool_release_pool(0, id) == SYMM_OK, "release");
  CHECK(symm_pool_empty_pool(id) == SYMM_OK, "empty its cache");
  CHECK(segs.frees == 2 && segs.releases == 1, "given back through the allocator: %d frees, %d releases", segs.frees,
        segs.releases);
  CHECK(symm_pool_use_count(0, id) == -1 && symm_last_error_code() == SYMM_ERR_INVALID, "forgotten");
  symm_pool_id_t zero = {0, 0};
  CHECK(symm_pool_create_pool(0, zero, nullptr) == SYMM_ERR_INVALID, "(0, 0) is the default pool");
}

/* use_on_oom: the default pool, out of memory, takes a free block of the
 * pool (device 1, limited to 40 MiB). */
static void test_use_on_oom(void) {
  symm_pool_id_t id = {0, 22};
  CHECK(symm_pool_set_limit(1, 40 * MiB) == SYMM_OK, "limit");
  CHECK(symm_pool_create_pool(1, id, nullptr) == SYMM_OK, "create");
  CHECK(symm_pool_set_use_on_oom(1, id, 1) == SYMM_OK, "use_on_oom");
  CHECK(symm_pool_begin_allocate_to_pool(1, id, SA) == SYMM_OK, "begin");
  void *big = symm_pool_alloc(30 * MiB, 1, SA);
  CHECK(big != nullptr, "the pool's block");
  CHECK(symm_pool_end_allocate_to_pool(1, id) == SYMM_OK && symm_pool_release_pool(1, id) == SYMM_OK, "end");
  symm_pool_free(big, 30 * MiB, 1, SA);
  void *d = symm_pool_alloc(30 * MiB, 1, SA);
  CHECK(d == big, "out of memory, the default pool took the pool's free block (%p, %p)", d, big);
  void *e = symm_pool_try_alloc(30 * MiB, 1, SB);
  CHECK(e == nullptr && symm_last_error_code() == SYMM_ERR_OUT_OF_MEMORY, "another stream: out of memory");
  symm_pool_free(d, 30 * MiB, 1, SA);
  CHECK(symm_pool_set_use_on_oom(1, id, 0) == SYMM_OK && symm_pool_release_pool(1, id) == SYMM_OK, "dies");
  CHECK(symm_pool_empty_pool(id) == SYMM_OK && symm_pool_use_count(1, id) == -1, "gone");
  CHECK(symm_pool_set_limit(1, 0) == SYMM_OK, "no limit");
}

static void test_history(void) {
  CHECK(symm_pool_record_history(1, 1000) == SYMM_OK, "history on");
  void *p = symm_pool_alloc(3000, 0, SA);
  symm_pool_free(p, 3000, 0, SA);
  std::string js = snapshot();
  CHECK(js.find("\"action\":\"alloc\"") != std::string::npos, "alloc recorded");
  CHECK(js.find("\"action\":\"free_completed\"") != std::string::npos, "free recorded (front cache bypassed)");
  CHECK(js.find("\"device_traces\":[[") != std::string::npos, "one trace list per device");
  CHECK(symm_pool_record_history(0, 0) == SYMM_OK, "history off");
}

int main(void) {
  setenv("SYMM_DEVICE", "host", 0);
  setenv("SYMM_HOST_DEVICES", "2", 1);
  int fds0 = (symm_pool_device_count(), count_fds());
  test_c_routes();
  test_torch_functors();
  test_throwing_filter();
  test_mempool_over_allocator();
  test_use_on_oom();
  test_history();
  CHECK(symm_torch_mode() == 0, "no PyTorch here");
  CHECK(count_fds() == fds0, "descriptors %d -> %d", fds0, count_fds());
  printf("test_graphs: %d passed, %d failed\n", passes, failures);
  return failures != 0;
}
