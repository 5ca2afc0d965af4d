/* C test of the caching pool through include/symm.h, on the host backend.
 * Build: make (tests/c/test_pool links -lsymm); run with SYMM_DEVICE=host. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "symm.h"


static int64_t stat(int dev, const char *name) {
  symm_stat_t st[512];
  int n = symm_pool_stats(dev, st, 512);
  for (int i = 0; i < n && i < 512; i++)
    if (strcmp(st[i].name, name) == 0) return st[i].value;
  fprintf(stderr, "no statistic %s\n", name);
  failures++;
  return -1;
}

/* Whether SYMM_POOL_FRONT_CACHE=1 turned the front cache on (make test-c
 * runs each test with 1 and 0); unset, it is off. */
static int front_cache_on(void) {
  const char *fc = getenv("SYMM_POOL_FRONT_CACHE");
  return fc && !strcmp(fc, "1");
}

/* What the first small request reserves: a 2 MiB small segment, or in an
 * expandable segment one chunk of the granularity (2 MiB), whatever the big
 * chunk: a segment maps big chunks only where it grows by a whole one. */
static int64_t first_reserve(void) { return 2 << 20; }

static void test_alloc_free(void) {
  void *s = (void *)0x1234; /* any stream value: host streams are identities */
  CHECK(symm_pool_alloc(0, 0, s) == NULL && symm_last_error_code() == SYMM_OK, "size 0 gives NULL, no error");
  size_t sizes[] = {1, 511, 512, 513, 4096, 1 << 20, (1 << 20) + 1, 25 << 20};
  void *ptrs[8];
  for (int i = 0; i < 8; i++) {
    ptrs[i] = symm_pool_alloc(sizes[i], 0, s);
    CHECK(ptrs[i] != NULL, "alloc %zu", sizes[i]);
    CHECK(((uintptr_t)ptrs[i] % 512) == 0, "alignment of %p", ptrs[i]);
    memset(ptrs[i], i + 1, sizes[i]);
  }
  for (int i = 0; i < 8; i++) {
    unsigned char *p = ptrs[i];
    CHECK(p[0] == i + 1 && p[sizes[i] - 1] == i + 1, "data of block %d intact", i);
  }
  CHECK(stat(0, "allocation.all.current") == 8, "8 live blocks");
  for (int i = 0; i < 8; i++) symm_pool_free(ptrs[i], sizes[i], 0, s);
  CHECK(symm_last_error_code() == SYMM_OK, "frees succeed");
  CHECK(stat(0, "allocated_bytes.all.current") == 0, "nothing allocated");
  CHECK(stat(0, "allocated_bytes.all.peak") > (25 << 20), "peak kept");
  void *first = symm_pool_alloc(4096, 0, s);
  symm_pool_free(first, 4096, 0, s);
  void *again = symm_pool_alloc(4096, 0, s);
  CHECK(again == first, "same stream reuses the cached block at once");
  /* Expandable: one mapping per growth (the first 2 MiB; 1 MiB + 1 more; the
   * 25 MiB block), whatever the big chunk. */
  int64_t want_allocs = 3;
  CHECK(stat(0, "num_device_alloc") == want_allocs, "three segments: small, large, and one of 26 MiB: %lld",
        (long long)stat(0, "num_device_alloc"));
  symm_pool_free(again, 4096, 0, s);
}

static void test_bad_input(void) {
  void *p = symm_pool_alloc(1000, 0, NULL);
  int64_t before = stat(0, "allocated_bytes.all.current");

  symm_clear_error();
  symm_pool_free((void *)0xdead000, 16, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER, "unknown pointer");
  CHECK(strstr(symm_last_error(), "0xdead000") != NULL, "message names the pointer");

  symm_clear_error();
  symm_pool_free(p, 999, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_ERR_INVALID, "size mismatch refused");
  CHECK(stat(0, "allocated_bytes.all.current") == before, "nothing freed");

  symm_clear_error();
  symm_pool_free(p, 1000, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "real free");
  symm_pool_free(p, 1000, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER, "double free refused");

  symm_clear_error();
  CHECK(symm_pool_alloc(10, 99, NULL) == NULL && symm_last_error_code() == SYMM_ERR_INVALID, "bad device");
  CHECK(strstr(symm_last_error(), "device 99") != NULL, "message names the device");

  symm_clear_error();
  symm_pool_set_memory_fraction(1.5, 0);
  CHECK(symm_last_error_code() == SYMM_ERR_INVALID, "fraction 1.5");
  symm_clear_error();
  symm_pool_set_memory_fraction(0.5, -3);
  CHECK(symm_last_error_code() == SYMM_ERR_INVALID, "fraction on device -3");

  CHECK(symm_pool_stats(0, NULL, 5) == -1 && symm_last_error_code() == SYMM_ERR_INVALID, "stats into NULL");
  CHECK(symm_pool_stats(42, NULL, 0) == -1, "stats of bad device");
  CHECK(symm_pool_reset_peak(42) == SYMM_ERR_INVALID, "reset of bad device");

  char small[8];
  size_t n = symm_copy_last_error(small, sizeof small);
  CHECK(n > 7 && strlen(small) == 7, "copy truncates and terminates");

  symm_clear_error();
  symm_pool_record_stream((void *)0xbeef000, (void *)3);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER, "record_stream of unknown pointer");
}

static void test_limit(void) {
  CHECK(symm_pool_set_limit(0, 8 << 20) == SYMM_OK, "set limit");
  symm_clear_error();
  void *p = symm_pool_alloc(64 << 20, 0, NULL);
  CHECK(p == NULL && symm_last_error_code() == SYMM_ERR_OUT_OF_MEMORY, "over the limit");
  CHECK(strstr(symm_last_error(), "requested 67108864 bytes") != NULL, "message names the size");
  CHECK(strstr(symm_last_error(), "device 0") != NULL, "message names the device");
  CHECK(stat(0, "num_ooms") >= 1, "num_ooms counted");
  CHECK(symm_pool_set_limit(0, 0) == SYMM_OK, "remove limit");
  p = symm_pool_alloc(64 << 20, 0, NULL);
  CHECK(p != NULL, "works after an OOM");
  symm_pool_free(p, 64 << 20, 0, NULL);
  symm_pool_empty_cache();
  CHECK(stat(0, "reserved_bytes.all.current") == 0, "empty_cache returns everything");
  CHECK(symm_pool_reset_peak(0) == SYMM_OK && stat(0, "reserved_bytes.all.peak") == 0, "reset peak");
}

/* A block freed into the front cache (C side) is still allocated to the pool;
 * the out-of-memory retry must get it back before it gives up. The front
 * cache keeps blocks up to 1 MiB (PyTorch's small pool: 2 MiB segments). */
static void test_retry_reclaims_front_cache(void) {
  symm_pool_empty_cache();
  void *a = symm_pool_alloc(1 << 20, 0, NULL);
  CHECK(a != NULL, "1 MiB");
  symm_pool_free(a, 1 << 20, 0, NULL); /* cached in front of the pool */
  CHECK(stat(0, "reserved_bytes.all.current") == first_reserve(), "one 2 MiB segment reserved");
  CHECK(symm_pool_set_limit(0, 20 << 20) == SYMM_OK, "limit 20 MiB");
  symm_clear_error();
  void *b = symm_pool_alloc(20 << 20, 0, NULL); /* a large segment: needs the small one released */
  CHECK(b != NULL, "20 MiB fits once the cached 1 MiB block is reclaimed: %s", symm_last_error());
  CHECK(stat(0, "reserved_bytes.all.current") <= (20 << 20), "within the limit");
  symm_pool_free(b, 20 << 20, 0, NULL);
  CHECK(symm_pool_set_limit(0, 0) == SYMM_OK, "no limit");
  /* Stats read the pool after the front cache gave its blocks back. */
  void *c = symm_pool_alloc(4096, 0, NULL);
  symm_pool_free(c, 4096, 0, NULL);
  CHECK(stat(0, "allocation.all.current") == 0, "a front-cached block is not counted as allocated");
  symm_pool_empty_cache();
  CHECK(stat(0, "reserved_bytes.all.current") == 0, "empty_cache includes the front cache");
}

/* Blocks parked in the front cache never make the pool grow: a request the
 * cache cannot serve (another size) that would need a new segment takes the
 * parked blocks back first and reuses their segment. */
static void test_parked_blocks_do_not_grow_the_pool(void) {
  symm_pool_empty_cache();
  void *a = symm_pool_alloc(1 << 20, 0, NULL);  /* half of a 2 MiB segment */
  void *a2 = symm_pool_alloc(1 << 20, 0, NULL); /* the other half */
  CHECK(a != NULL && a2 != NULL, "2 x 1 MiB");
  CHECK(stat(0, "reserved_bytes.all.current") == first_reserve(), "one 2 MiB segment");
  symm_pool_free(a, 1 << 20, 0, NULL); /* parked in front (front cache on) */
  void *b = symm_pool_alloc((1 << 20) - 4096, 0, NULL); /* not the parked size: the pool's slow path */
  /* (expandable segments place a block cut from a hole at its high end) */
  CHECK((char *)b >= (char *)a && (char *)b < (char *)a + (1 << 20),
        "the parked block's place served 1 MiB - 4 KiB (%p, %p)", b, a);
  CHECK(stat(0, "reserved_bytes.all.current") == first_reserve(), "reserved stays 2 MiB: %lld",
        (long long)stat(0, "reserved_bytes.all.current"));
  symm_pool_free(b, (1 << 20) - 4096, 0, NULL);
  symm_pool_free(a2, 1 << 20, 0, NULL);
  symm_pool_empty_cache();
}

/* A miss gives the parked blocks back before the pool serves it, those that
 * other threads parked too, so a peak never counts a parked block. (Where
 * the pool must grow, it takes them back anyway: see above.) */
static void *park_one(void *arg) {
  symm_pool_free(arg, 1 << 20, 0, NULL); /* parked on this thread's CPU */
  return NULL;
}

static void test_a_miss_returns_parked_blocks(void) {
  symm_pool_empty_cache();
  void *a = symm_pool_alloc(1 << 20, 0, NULL);
  void *a2 = symm_pool_alloc(256 << 10, 0, NULL); /* 768 KiB of the 2 MiB segment left */
  CHECK(a != NULL && a2 != NULL, "1 MiB + 256 KiB");
  CHECK(symm_pool_reset_peak(0) == SYMM_OK, "reset peak");
  pthread_t t;
  pthread_create(&t, NULL, park_one, a);
  pthread_join(t, NULL);
  void *b = symm_pool_alloc(512 << 10, 0, NULL); /* another size: a miss, and it fits without growth */
  CHECK(b != NULL, "512 KiB");
  CHECK(stat(0, "allocated_bytes.all.peak") == (5 << 18), "peak 1.25 MiB (1.75 with the parked block): %lld",
        (long long)stat(0, "allocated_bytes.all.peak"));
  CHECK(stat(0, "reserved_bytes.all.peak") == first_reserve(), "one segment: %lld",
        (long long)stat(0, "reserved_bytes.all.peak"));
  symm_pool_free(b, 512 << 10, 0, NULL);
  symm_pool_free(a2, 256 << 10, 0, NULL);
  symm_pool_empty_cache();
}

/* Blocks over SYMM_POOL_FRONT_CACHE_MAX (1 MiB unless set) go back to the
 * pool at once, where another size finds them. */
static void test_large_blocks_skip_the_front_cache(void) {
  symm_pool_empty_cache();
  void *a = symm_pool_alloc(12 << 20, 0, NULL);
  CHECK(a != NULL, "12 MiB");
  symm_pool_free(a, 12 << 20, 0, NULL);
  void *b = symm_pool_alloc(11 << 20, 0, NULL);
  CHECK(b == a, "its segment served 11 MiB (%p, %p)", b, a);
  symm_pool_free(b, 11 << 20, 0, NULL);
  symm_pool_empty_cache();
}

/* A block that is a segment of its own is parked at any size (64 MiB here),
 * and the next request of its size and stream gets it back from the front
 * cache without the pool: the pool's count of allocations does not move. In
 * expandable mode no block is a segment of its own, but nothing else
 * happened on the stream in between, so it is parked all the same (see
 * test_unchanged_blocks_hit_the_front_cache); with the front cache off
 * every request reaches the pool. */
static void test_whole_segments_hit_the_front_cache(void) {
  int hits = front_cache_on();
  symm_pool_empty_cache();
  CHECK(symm_pool_reset_accumulated(0) == SYMM_OK, "reset accumulated");
  void *a = symm_pool_alloc(64 << 20, 0, NULL);
  CHECK(a != NULL, "64 MiB");
  symm_pool_free(a, 64 << 20, 0, NULL);
  void *b = symm_pool_alloc(64 << 20, 0, NULL);
  CHECK(b == a, "the same segment again (%p, %p)", b, a);
  CHECK(stat(0, "num_front_cache_hits") == hits, "%lld served in front (front cache: %d)",
        (long long)stat(0, "num_front_cache_hits"), hits);
  CHECK(stat(0, "allocation.all.allocated") == 2, "two allocations counted either way: %lld",
        (long long)stat(0, "allocation.all.allocated"));
  CHECK(stat(0, "allocated_bytes.all.peak") == (64 << 20), "peak 64 MiB: %lld",
        (long long)stat(0, "allocated_bytes.all.peak"));
  symm_pool_free(b, 64 << 20, 0, NULL);
  /* Another size misses, gets the parked segment back first and reuses it. */
  void *c = symm_pool_alloc(60 << 20, 0, NULL);
  CHECK(c == a || !hits, "a miss reuses the parked segment (%p, %p)", c, a);
  /* Expandable: 64 MiB from an empty segment is whole chunks (three big
   * ones of 20 MiB and two of 2 MiB by default), nothing more. */
  int64_t want_peak = 64 << 20;
  CHECK(stat(0, "reserved_bytes.all.peak") == want_peak || !hits, "reserved peak 64 MiB: %lld",
        (long long)stat(0, "reserved_bytes.all.peak"));
  symm_pool_free(c, 60 << 20, 0, NULL);
  symm_pool_empty_cache();
  CHECK(stat(0, "reserved_bytes.all.current") == 0, "empty_cache gives the parked segment back");
}

/* A 4 MiB block is cut from a 20 MiB segment, so it is neither small nor a
 * segment of its own; it is still parked, and the next 4 MiB request on its
 * stream gets it back without the pool, as long as the pool has placed or
 * taken back nothing else of that stream since (the best fit would place
 * that request on it anyway). Otherwise the free reaches the pool. */
static void test_unchanged_blocks_hit_the_front_cache(void) {
  int hits = front_cache_on();
  symm_pool_empty_cache();
  CHECK(symm_pool_reset_accumulated(0) == SYMM_OK, "reset accumulated");
  void *a = symm_pool_alloc(4 << 20, 0, NULL);
  CHECK(a != NULL, "4 MiB");
  for (int i = 0; i < 3; i++) {
    symm_pool_free(a, 4 << 20, 0, NULL);
    void *b = symm_pool_alloc(4 << 20, 0, NULL);
    CHECK(b == a, "the same block again (%p, %p)", b, a);
  }
  CHECK(stat(0, "num_front_cache_hits") == (hits ? 3 : 0), "%lld served in front (front cache: %d)",
        (long long)stat(0, "num_front_cache_hits"), hits);
  void *c = symm_pool_alloc(3 << 20, 0, NULL); /* the pool places another block: the shard changed */
  CHECK(c != NULL, "3 MiB");
  symm_pool_free(a, 4 << 20, 0, NULL); /* not parked: to the pool */
  CHECK(stat(0, "allocation.all.freed") == 4, "%lld frees counted", (long long)stat(0, "allocation.all.freed"));
  void *d = symm_pool_alloc(4 << 20, 0, NULL);
  CHECK(d == a, "the best fit places it where it was (%p, %p)", d, a);
  CHECK(stat(0, "num_front_cache_hits") == (hits ? 3 : 0) && stat(0, "allocation.all.allocated") == 6,
        "a miss: %lld served in front, %lld allocations", (long long)stat(0, "num_front_cache_hits"),
        (long long)stat(0, "allocation.all.allocated"));
  symm_pool_free(d, 4 << 20, 0, NULL);
  symm_pool_free(c, 3 << 20, 0, NULL);
  symm_pool_empty_cache();
  CHECK(stat(0, "reserved_bytes.all.current") == 0, "empty_cache gives everything back");
}

/* Frees of blocks no request may reuse (3 MiB blocks cut from shared 20 MiB
 * segments, each allocation changing the pool) are deferred, up to 32 per
 * CPU reaching the pool in one call: none is lost, a double free of one
 * still waiting is refused at the call, and the pool's figures read after
 * them count every free. */
static void test_deferred_frees(void) {
  enum { N = 40 };
  void *p[N];
  symm_pool_empty_cache();
  CHECK(symm_pool_reset_accumulated(0) == SYMM_OK, "reset accumulated");
  for (int i = 0; i < N; i++) {
    p[i] = symm_pool_alloc(3 << 20, 0, NULL);
    CHECK(p[i] != NULL, "3 MiB #%d", i);
  }
  for (int i = 0; i < N; i++) symm_pool_free(p[i], 3 << 20, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "frees succeed");
  symm_pool_free(p[N - 1], 3 << 20, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER, "a double free of a deferred free is refused: %d",
        symm_last_error_code());
  CHECK(stat(0, "allocation.all.current") == 0, "every free reached the pool: %lld live",
        (long long)stat(0, "allocation.all.current"));
  CHECK(stat(0, "allocation.all.freed") == N, "%lld frees counted", (long long)stat(0, "allocation.all.freed"));
  long long reserved = stat(0, "reserved_bytes.all.current");
  void *q = symm_pool_alloc(3 << 20, 0, NULL);
  CHECK(q != NULL && stat(0, "reserved_bytes.all.current") == reserved, "the freed memory serves again");
  symm_pool_free(q, 3 << 20, 0, NULL);
  symm_pool_empty_cache();
  CHECK(stat(0, "reserved_bytes.all.current") == 0, "empty_cache gives everything back");
}

/* Cumulative counts are every allocation and free the program made, as
 * PyTorch counts them, whether the front cache served it or the pool did:
 * the same figures with the front cache on and off. */
static void test_cumulative_counts(void) {
  const char *ex = getenv("SYMM_POOL_EXPANDABLE");
  int expandable = ex && strcmp(ex, "0") && strcmp(ex, ""); /* one segment per stream: all large_pool */
  symm_pool_empty_cache();
  CHECK(symm_pool_reset_accumulated(0) == SYMM_OK && symm_pool_reset_peak(0) == SYMM_OK, "reset");
  for (int i = 0; i < 10; i++) {
    void *p = symm_pool_alloc(1 << 20, 0, NULL); /* small pool */
    CHECK(p != NULL, "1 MiB");
    symm_pool_free(p, 1 << 20, 0, NULL);
  }
  for (int i = 0; i < 5; i++) {
    void *p = symm_pool_alloc(4 << 20, 0, NULL); /* large pool, reused while the pool is unchanged */
    CHECK(p != NULL, "4 MiB");
    symm_pool_free(p, (4 << 20) - 512, 0, NULL); /* wrong size: refused, counts nothing */
    CHECK(symm_last_error_code() == SYMM_ERR_INVALID, "wrong size refused");
    symm_clear_error();
    symm_pool_free(p, 4 << 20, 0, NULL);
  }
  CHECK(stat(0, "allocation.all.allocated") == 15, "15 allocations: %lld", (long long)stat(0, "allocation.all.allocated"));
  CHECK(stat(0, "allocation.all.freed") == 15, "15 frees: %lld", (long long)stat(0, "allocation.all.freed"));
  CHECK(stat(0, "allocation.small_pool.allocated") == (expandable ? 0 : 10), "small: %lld",
        (long long)stat(0, "allocation.small_pool.allocated"));
  CHECK(stat(0, "allocation.large_pool.allocated") == (expandable ? 15 : 5), "large: %lld",
        (long long)stat(0, "allocation.large_pool.allocated"));
  CHECK(stat(0, "allocated_bytes.all.allocated") == 10 * (1 << 20) + 5 * (4 << 20), "bytes: %lld",
        (long long)stat(0, "allocated_bytes.all.allocated"));
  CHECK(stat(0, "requested_bytes.all.freed") == 10 * (1 << 20) + 5 * (4 << 20), "requested bytes freed: %lld",
        (long long)stat(0, "requested_bytes.all.freed"));
  CHECK(stat(0, "active.all.allocated") == 15, "active: %lld", (long long)stat(0, "active.all.allocated"));
  CHECK(stat(0, "allocation.all.current") == 0 && stat(0, "allocation.all.peak") == 1, "current 0, peak 1");
  symm_pool_empty_cache();
}

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  void *stream = (void *)((id % 4 + 1) << 12);
  for (int i = 0; i < 20000; i++) {
    size_t n = 1 + (i * 7919 + id * 104729) % (2 << 20);
    unsigned char *p = symm_pool_alloc(n, 0, stream);
    if (p == NULL) return (void *)1;
    p[0] = (unsigned char)id;
    p[n - 1] = (unsigned char)id;
    if (p[0] != (unsigned char)id || p[n - 1] != (unsigned char)id) return (void *)2;
    symm_pool_free(p, n, 0, stream);
  }
  return NULL;
}

/* Memory history turns the front cache off (every alloc and free reaches the
 * pool, so that each is recorded). A block handed out before, freed and
 * taken again while history is on, must not keep its old record in the
 * front cache's live set: after history, a free would cache it under the
 * old stream and size (the block's new owner asked for less), and the front
 * cache would hand it out for the old size; when it finally reaches the pool
 * the sizes disagree and the block is lost. Here B's request (3000 bytes)
 * takes A's idle segment, and the free passes size 0 (C's "any size"). */
static void test_history_toggle_forgets_stale_blocks(void) {
  void *sa = (void *)0x5a0, *sb = (void *)0x5b0;
  symm_pool_empty_cache();
  int64_t base = stat(0, "allocation.all.current");
  void *p = symm_pool_alloc(4096, 0, sa); /* alone in its segment */
  CHECK(p != NULL, "alloc on A");
  CHECK(symm_pool_record_history(1, 1000) == SYMM_OK, "history on");
  symm_pool_free(p, 4096, 0, sa);
  void *q = symm_pool_alloc(3000, 0, sb); /* B takes A's idle segment */
  CHECK(q != NULL, "alloc on B");
  CHECK(symm_pool_record_history(0, 0) == SYMM_OK, "history off");
  symm_pool_free(q, 0, 0, sb);
  void *r = symm_pool_alloc(4096, 0, sa);
  CHECK(r != NULL, "alloc on A again");
  symm_pool_free(r, 4096, 0, sa);
  CHECK(stat(0, "allocation.all.current") == base, "every block went back (q %s p)", q == p ? "==" : "!=");
  symm_pool_empty_cache();
}

static void test_threads(void) {
  pthread_t t[8];
  for (uintptr_t i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < 8; i++) {
    void *r;
    pthread_join(t[i], &r);
    CHECK(r == NULL, "thread %d result %p", i, r);
  }
  CHECK(stat(0, "allocation.all.current") == 0, "threads freed everything");
}

/* Where the front cache serves few requests it steps aside: past 4,096
 * requests (counted over every thread, a few hundred at a time) of which
 * fewer than 1 in 8 were served in front, the next 65,536 go to the pool as
 * with the front cache off, and a block freed meanwhile is never parked;
 * then it is in use again and serves repeats as before. Every request is
 * counted, and the peaks are the pool's own throughout. */
static void pair(size_t n, int times) {
  for (int i = 0; i < times; i++) {
    void *p = symm_pool_alloc(n, 0, NULL);
    symm_pool_free(p, n, 0, NULL);
  }
}

static void test_few_hits_step_the_front_cache_aside(void) {
  int on = front_cache_on();
  symm_pool_empty_cache();
  /* Repeats past any stepping aside the earlier tests began: then they hit. */
  pair(2048, 66 * 1024);
  CHECK(symm_pool_reset_accumulated(0) == SYMM_OK && symm_pool_reset_peak(0) == SYMM_OK, "reset");
  pair(2048, 1024);
  CHECK(stat(0, "num_front_cache_hits") >= (on ? 1000 : 0) && (on || stat(0, "num_front_cache_hits") == 0),
        "in use: %lld of 1024 served in front (front cache: %d)", (long long)stat(0, "num_front_cache_hits"), on);
  /* Sizes that never find their own parked (each miss hands back the other
   * size's block): a judgement within the first 2 x 4,096 of them steps aside. */
  for (int i = 0; i < 3 * 4096; i++) pair(i % 2 ? 1024 : 512, 1);
  int64_t before = stat(0, "num_front_cache_hits");
  pair(512, 1000); /* repeats, aside: none served in front */
  CHECK(stat(0, "num_front_cache_hits") == before, "aside: %lld served in front, %lld before",
        (long long)stat(0, "num_front_cache_hits"), (long long)before);
  void *a = symm_pool_alloc(512, 0, NULL);
  symm_pool_free(a, 512, 0, NULL);
  void *b = symm_pool_alloc(512, 0, NULL);
  CHECK(b == a && stat(0, "allocation.all.current") == 1, "aside, the pool serves the repeat: %p %p", b, a);
  symm_pool_free(b, 512, 0, NULL);
  symm_pool_free(b, 512, 0, NULL); /* a double free, judged by the pool */
  CHECK(symm_last_error_code() != SYMM_OK && stat(0, "allocation.all.current") == 0, "aside, a double free is refused: %s",
        symm_last_error());
  pair(512, 70000); /* the step aside ends within 65,536 requests, and these hit again */
  int64_t after = stat(0, "num_front_cache_hits");
  CHECK(on ? after - before >= 3000 : after == 0, "in use again: %lld served in front (front cache: %d)",
        (long long)(after - before), on);
  CHECK(stat(0, "allocation.all.allocated") == 1024 + 3 * 4096 + 1000 + 2 + 70000 &&
            stat(0, "allocation.all.current") == 0,
        "every request counted: %lld", (long long)stat(0, "allocation.all.allocated"));
  CHECK(stat(0, "allocated_bytes.all.peak") == 2048, "peak one block: %lld", (long long)stat(0, "allocated_bytes.all.peak"));
  symm_pool_empty_cache();
  CHECK(stat(0, "reserved_bytes.all.current") == 0, "empty_cache gives everything back");
}

/* A statistics read hands back what the front cache holds when it begins,
 * and ends while other threads go on freeing into it (symm top's refresh
 * reads every 250 ms beside a program that never pauses). */
static volatile int g_churn_stop;

static void *churn(void *arg) {
  size_t n = 4096 << (uintptr_t)arg;
  while (!__atomic_load_n(&g_churn_stop, __ATOMIC_RELAXED)) {
    void *p = symm_pool_alloc(n, 0, NULL);
    symm_pool_free(p, n, 0, NULL);
  }
  return NULL;
}

static void test_stats_end_beside_steady_frees(void) {
  pthread_t t[4];
  for (uintptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, (void *)i);
  symm_stat_t st[512];
  int reads = 0;
  for (int i = 0; i < 2000; i++) reads += symm_pool_stats(0, st, 512) > 0;
  __atomic_store_n(&g_churn_stop, 1, __ATOMIC_RELAXED);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  CHECK(reads == 2000, "every statistics read ended and succeeded (%d of 2000)", reads);
  CHECK(stat(0, "allocation.all.current") == 0, "the churning threads freed everything");
}

static void test_fork(void) {
  int fds[2];
  if (pipe(fds) != 0) return;
  pid_t pid = fork();
  if (pid == 0) {
    void *p = symm_pool_alloc(4096, 0, NULL);
    char msg[256];
    snprintf(msg, sizeof msg, "%d %s", p == NULL ? symm_last_error_code() : -1, symm_last_error());
    ssize_t w = write(fds[1], msg, strlen(msg) + 1);
    (void)w;
    _exit(0);
  }
  close(fds[1]);
  char buf[512] = {0};
  ssize_t r = read(fds[0], buf, sizeof buf - 1);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(r > 0 && atoi(buf) == SYMM_ERR_FORKED, "fork child gets SYMM_ERR_FORKED: %s", buf);
  CHECK(strstr(buf, "fork") != NULL, "message says fork");
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exits cleanly");
  void *p = symm_pool_alloc(4096, 0, NULL);
  CHECK(p != NULL, "parent still works");
  symm_pool_free(p, 4096, 0, NULL);
}

int main(void) {
  CHECK(strlen(symm_version()) > 0, "version");
  symm_pool_init(0);
  CHECK(symm_last_error_code() == SYMM_OK, "init");
  CHECK(strcmp(symm_pool_backend(), "host") == 0, "host backend (%s)", symm_pool_backend());
  CHECK(symm_pool_device_count() >= 1, "device count");
  test_alloc_free();
  test_bad_input();
  test_limit();
  test_retry_reclaims_front_cache();
  test_large_blocks_skip_the_front_cache();
  test_whole_segments_hit_the_front_cache();
  test_unchanged_blocks_hit_the_front_cache();
  test_deferred_frees();
  test_cumulative_counts();
  test_parked_blocks_do_not_grow_the_pool();
  test_a_miss_returns_parked_blocks();
  test_history_toggle_forgets_stale_blocks();
  test_threads();
  test_few_hits_step_the_front_cache_aside();
  test_stats_end_beside_steady_frees();
  test_fork();
  printf("test_pool: %d passed, %d failed\n", passes, failures);
  return failures != 0;
}
