/* test_checkpoint.c: what PyTorch's allocator interface asks of libsymm
 * besides alloc and free, through include/symm.h on the host backend
 * (SYMM_DEVICE=host): symm_pool_cache_info, symm_pool_reset_accumulated,
 * symm_pool_blocks (checkPoolLiveAllocations, getCheckpointState),
 * symm_pool_restore_blocks (setCheckpointPoolState) with every error it
 * documents, and symm_pool_alloc_segment. A private pool is made with
 * symm_pool_begin_allocate_to_pool, as a CUDA graph capture would. Every
 * refused call must change nothing: the pool's listing and both devices'
 * statistics are the same before and after. Runs with the front cache on and
 * off and with expandable segments (make test-c). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "symm.h"

#define MiB ((size_t)1 << 20)
#define SA ((void *)0x1000)
#define SB ((void *)0x2000)
#define SC ((void *)0x3000)
#define MAXB 256
#define NSTATS 512

static const symm_pool_id_t GRAPH = {11, 0};

static int64_t stat_now(int dev, const char *name) {
  symm_stat_t st[NSTATS];
  int n = symm_pool_stats(dev, st, NSTATS);
  for (int i = 0; i < n && i < NSTATS; i++)
    if (!strcmp(st[i].name, name)) return st[i].value;
  fprintf(stderr, "no statistic %s\n", name);
  failures++;
  return INT64_MIN;
}

/* What a refused call must leave as it was: the pool's blocks and both
 * devices' statistics. */
typedef struct {
  int nb;
  symm_block_info_t b[MAXB];
  int ns;
  int64_t s[2][NSTATS];
} state_t;

static void state(state_t *st, symm_pool_id_t id) {
  memset(st, 0, sizeof *st);
  st->nb = symm_pool_blocks(0, id, st->b, MAXB);
  symm_stat_t v[NSTATS];
  for (int d = 0; d < 2; d++) {
    st->ns = symm_pool_stats(d, v, NSTATS);
    for (int i = 0; i < st->ns && i < NSTATS; i++) st->s[d][i] = v[i].value;
  }
}

static int same_state(const state_t *a, const state_t *b) {
  return a->nb == b->nb && a->ns == b->ns && !memcmp(a->b, b->b, sizeof a->b) && !memcmp(a->s, b->s, sizeof a->s);
}

static int blocks(symm_pool_id_t id, symm_block_info_t *out) { return symm_pool_blocks(0, id, out, MAXB); }

/* A refused restore: the code, a message naming the function and word,
 * *nfreed and *nallocated as said, and nothing changed. */
static void refused(int line, int want_code, const char *word, int dev, symm_pool_id_t id, const symm_block_info_t *want,
                    int n, int cap, int want_nf, int want_na) {
  uint64_t freed[MAXB], allocated[MAXB];
  int nf = cap, na = cap;
  state_t before, after;
  state(&before, GRAPH);
  symm_clear_error();
  int rc = symm_pool_restore_blocks(dev, id, want, n, freed, &nf, allocated, &na);
  state(&after, GRAPH);
  const char *msg = symm_last_error();
  CHECK(rc == want_code && symm_last_error_code() == want_code, "line %d: code %d, want %d", line, rc, want_code);
  CHECK(!strncmp(msg, "symm_pool_restore_blocks: ", 26) && strstr(msg, word), "line %d: the message names \"%s\": %s",
        line, word, msg);
  CHECK(nf == want_nf && na == want_na, "line %d: counts %d, %d; want %d, %d", line, nf, na, want_nf, want_na);
  CHECK(same_state(&before, &after), "line %d: a refused restore changed the pool", line);
}
#define REFUSED(code, word, dev, id, want, n) refused(__LINE__, code, word, dev, id, want, n, MAXB, 0, 0)

static void test_cache_info(void) {
  size_t largest = 12345;
  symm_clear_error();
  CHECK(symm_pool_cache_info(0, NULL) == SYMM_ERR_INVALID && strstr(symm_last_error(), "symm_pool_cache_info: "),
        "NULL largest_block");
  const int bad[] = {-1, 2, INT_MAX, INT_MIN};
  for (int i = 0; i < 4; i++) {
    CHECK(symm_pool_cache_info(bad[i], &largest) == SYMM_ERR_INVALID && largest == 12345, "device %d", bad[i]);
    CHECK(strstr(symm_last_error(), "out of range") != NULL, "the message: %s", symm_last_error());
  }
  CHECK(symm_pool_cache_info(1, &largest) == SYMM_OK && largest == 0, "nothing cached on device 1: %zu", largest);
  void *a = symm_pool_alloc(1000, 0, SA);
  CHECK(a != NULL, "alloc");
  int64_t reserved = stat_now(0, "reserved_bytes.all.current");
  CHECK(symm_pool_cache_info(0, &largest) == SYMM_OK && (int64_t)largest == reserved - 1024,
        "one segment, one block of 1024 bytes: the rest, %zu (reserved %lld)", largest, (long long)reserved);
  /* Freed: with the front cache on, parked there until cache_info drains it. */
  symm_pool_free(a, 1000, 0, SA);
  CHECK(symm_pool_cache_info(0, &largest) == SYMM_OK && (int64_t)largest == reserved, "all free: %zu", largest);
  /* A private pool's free blocks are not the default pool's. */
  CHECK(symm_pool_begin_allocate_to_pool(0, (symm_pool_id_t){12, 0}, SA) == SYMM_OK, "begin");
  void *g = symm_pool_alloc(64 * MiB, 0, SA);
  symm_pool_free(g, 64 * MiB, 0, SA);
  CHECK(symm_pool_end_allocate_to_pool(0, (symm_pool_id_t){12, 0}) == SYMM_OK, "end");
  CHECK(symm_pool_cache_info(0, &largest) == SYMM_OK && (int64_t)largest == reserved, "the pool's 64 MiB left out: %zu",
        largest);
  CHECK(symm_pool_release_pool(0, (symm_pool_id_t){12, 0}) == SYMM_OK, "release");
  symm_pool_empty_cache();
  CHECK(symm_pool_cache_info(0, &largest) == SYMM_OK && largest == 0, "empty: %zu", largest);
}

static int accumulated(const char *name) {
  size_t n = strlen(name);
  return (n > 10 && !strcmp(name + n - 10, ".allocated")) || (n > 6 && !strcmp(name + n - 6, ".freed")) ||
         !strcmp(name, "num_alloc_retries") || !strcmp(name, "num_ooms") || !strcmp(name, "num_sync_all_streams") ||
         !strcmp(name, "num_device_alloc") || !strcmp(name, "num_device_free") || !strcmp(name, "num_front_cache_hits") ||
         !strcmp(name, "num_chunk_maps") || !strcmp(name, "num_chunk_unmaps") || !strcmp(name, "chunk_map_us") ||
         !strcmp(name, "chunk_unmap_us") || !strcmp(name, "num_spare_chunks_reused") ||
         !strcmp(name, "num_release_failures");
}

static void test_reset_accumulated(void) {
  const int bad[] = {-1, 2, INT_MAX, INT_MIN};
  for (int i = 0; i < 4; i++) {
    symm_clear_error();
    CHECK(symm_pool_reset_accumulated(bad[i]) == SYMM_ERR_INVALID &&
              strstr(symm_last_error(), "symm_pool_reset_accumulated: ") && strstr(symm_last_error(), "out of range"),
          "device %d", bad[i]);
  }
  void *keep = symm_pool_alloc(3 * MiB, 0, SA);
  for (int i = 0; i < 5; i++) symm_pool_free(symm_pool_alloc(4096, 0, SB), 4096, 0, SB);
  symm_stat_t before[NSTATS], after[NSTATS];
  int n = symm_pool_stats(0, before, NSTATS);
  CHECK(symm_pool_reset_accumulated(0) == SYMM_OK, "reset");
  CHECK(symm_pool_stats(0, after, NSTATS) == n, "stats");
  int zeroed = 0;
  for (int i = 0; i < n; i++) {
    if (accumulated(after[i].name)) {
      zeroed++;
      CHECK(after[i].value == 0, "%s is %lld after the reset", after[i].name, (long long)after[i].value);
    } else {
      CHECK(after[i].value == before[i].value, "%s: %lld before, %lld after", after[i].name, (long long)before[i].value,
            (long long)after[i].value);
    }
  }
  CHECK(zeroed > 50, "%d statistics are accumulated", zeroed);
  CHECK(stat_now(0, "allocated_bytes.all.current") >= (int64_t)(3 * MiB), "current unchanged");
  symm_pool_free(keep, 3 * MiB, 0, SA);
  CHECK(stat_now(0, "allocation.all.freed") == 1 && stat_now(0, "allocation.all.allocated") == 0,
        "counted from the reset: freed %lld", (long long)stat_now(0, "allocation.all.freed"));
  symm_pool_empty_cache();
}

static void test_blocks(void) {
  symm_block_info_t b[MAXB];
  symm_clear_error();
  CHECK(symm_pool_blocks(0, GRAPH, NULL, 4) == -1 && symm_last_error_code() == SYMM_ERR_INVALID &&
            strstr(symm_last_error(), "symm_pool_blocks: out is NULL"),
        "NULL out with cap 4");
  CHECK(symm_pool_blocks(0, GRAPH, b, -1) == -1 && strstr(symm_last_error(), "cap is negative"), "negative cap");
  CHECK(symm_pool_blocks(5, GRAPH, b, MAXB) == -1 && strstr(symm_last_error(), "device 5"), "bad device");
  CHECK(symm_pool_blocks(-1, (symm_pool_id_t){0, 0}, NULL, 0) == -1 && strstr(symm_last_error(), "device -1"),
        "bad device, default pool");
  CHECK(symm_pool_blocks(0, (symm_pool_id_t){0, 99}, b, MAXB) == -1 && symm_last_error_code() == SYMM_ERR_INVALID &&
            strstr(symm_last_error(), "pool (0, 99) on device 0: no such pool"),
        "unknown pool");

  /* The default pool: a block freed into the front cache shows as free. */
  void *d = symm_pool_alloc(5000, 0, SC);
  int n = blocks((symm_pool_id_t){0, 0}, b);
  CHECK(n == 2 && b[0].address == (uintptr_t)d && b[0].state == SYMM_BLOCK_ALLOCATED && b[0].requested_size == 5000 &&
            b[0].size == 5120 && b[0].stream == (uintptr_t)SC && b[0].segment_address == (uintptr_t)d &&
            b[1].state == SYMM_BLOCK_FREE && b[1].reserved == 0,
        "default pool: %d blocks", n);
  symm_pool_free(d, 5000, 0, SC);
  n = blocks((symm_pool_id_t){0, 0}, b);
  CHECK(n == 1 && b[0].state == SYMM_BLOCK_FREE && b[0].requested_size == 0, "freed: one free block (%d)", n);
  symm_pool_empty_cache();
  CHECK(symm_pool_blocks(0, (symm_pool_id_t){0, 0}, NULL, 0) == 0, "empty default pool");
}

/* Private pool GRAPH, routed from two streams: a, b on SA, c on SB. */
static void *g_a, *g_b, *g_c, *g_d;
static void make_pool(void) {
  CHECK(symm_pool_begin_allocate_to_pool(0, GRAPH, SA) == SYMM_OK, "begin");
  CHECK(symm_pool_begin_allocate_to_pool(0, GRAPH, SB) == SYMM_OK, "begin on a second stream");
  g_a = symm_pool_alloc(1000, 0, SA);
  g_b = symm_pool_alloc(3000, 0, SA);
  g_c = symm_pool_alloc(3 * MiB, 0, SB);
  g_d = symm_pool_alloc(700, 0, SA);
  CHECK(g_a && g_b && g_c && g_d, "allocations in the pool");
  symm_pool_free(g_d, 700, 0, SA);
}

static void test_restore(void) {
  make_pool();
  symm_block_info_t ck[MAXB], b[MAXB], w[MAXB];
  int n = blocks(GRAPH, ck);
  CHECK(n == 5, "the checkpoint: a, b and free space; c and free space (%d)", n);
  int size_query = symm_pool_blocks(0, GRAPH, NULL, 0);
  CHECK(size_query == n, "size query %d", size_query);
  memset(b, 0x5a, sizeof b);
  CHECK(symm_pool_blocks(0, GRAPH, b, 2) == n && b[2].address == 0x5a5a5a5a5a5a5a5aull, "cap 2: two written");
  for (int i = 1; i < n; i++) CHECK(ck[i - 1].address < ck[i].address, "sorted by address");
  int small = ck[0].segment_address == (uintptr_t)g_a ? 0 : 2; /* index of a in the listing */
  CHECK(ck[small].address == (uintptr_t)g_a && ck[small + 1].address == (uintptr_t)g_b &&
            ck[small + 1].requested_size == 3000 && ck[small + 2].state == SYMM_BLOCK_FREE,
        "the small segment's blocks");

  /* The run after the checkpoint: b freed, c freed, new blocks. */
  symm_pool_free(g_b, 3000, 0, SA);
  void *e = symm_pool_alloc(4096, 0, SA); /* where b was, and beyond */
  void *f = symm_pool_alloc(30 * MiB, 0, SB); /* a new segment */
  symm_pool_free(g_c, 3 * MiB, 0, SB);
  void *h = symm_pool_alloc(5 * MiB, 0, SB); /* where c was */
  CHECK(e && f && h, "allocations after the checkpoint");
  int64_t allocated_ck = 0, requested_ck = 0, nblocks_ck = 0;
  for (int i = 0; i < n; i++)
    if (ck[i].state == SYMM_BLOCK_ALLOCATED)
      nblocks_ck++, allocated_ck += (int64_t)ck[i].size, requested_ck += (int64_t)ck[i].requested_size;

  /* ---- every error, nothing changed ---- */
  uint64_t fr[MAXB], al[MAXB];
  int nf = MAXB, na = MAXB;
  symm_clear_error();
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, fr, NULL, al, &na) == SYMM_ERR_INVALID &&
            strstr(symm_last_error(), "nfreed or nallocated is NULL") && na == 0,
        "NULL nfreed");
  nf = MAXB;
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, fr, &nf, al, NULL) == SYMM_ERR_INVALID && nf == 0, "NULL nallocated");
  REFUSED(SYMM_ERR_INVALID, "want is NULL", 0, GRAPH, NULL, 3);
  REFUSED(SYMM_ERR_INVALID, "n is negative", 0, GRAPH, ck, -1);
  refused(__LINE__, SYMM_ERR_INVALID, "is negative", 0, GRAPH, ck, n, -1, 0, 0);
  nf = 4, na = 4;
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, NULL, &nf, al, &na) == SYMM_ERR_INVALID &&
            strstr(symm_last_error(), "freed or allocated is NULL") && nf == 0 && na == 0,
        "NULL freed with capacity 4");
  nf = 4, na = 4;
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, fr, &nf, NULL, &na) == SYMM_ERR_INVALID, "NULL allocated");
  REFUSED(SYMM_ERR_INVALID, "device 2 out of range", 2, GRAPH, ck, n);
  REFUSED(SYMM_ERR_INVALID, "device -1 out of range", -1, GRAPH, ck, n);
  REFUSED(SYMM_ERR_INVALID, "the default pool", 0, ((symm_pool_id_t){0, 0}), ck, n);
  REFUSED(SYMM_ERR_INVALID, "pool (0, 77) on device 0: no such pool", 0, ((symm_pool_id_t){0, 77}), ck, n);
  REFUSED(SYMM_ERR_INVALID, "no such pool", 1, GRAPH, ck, n);
#define EDIT(expr)                    \
  do {                                \
    memcpy(w, ck, sizeof ck[0] * n);  \
    expr;                             \
  } while (0)
  EDIT(w[small].segment_address = 0xdead000);
  REFUSED(SYMM_ERR_INVALID, "segment 0xdead000 is not one of the pool's", 0, GRAPH, w, n);
  EDIT(w[small + 2].size += 512);
  REFUSED(SYMM_ERR_INVALID, "crosses the boundary of its segment", 0, GRAPH, w, n);
  EDIT((w[small].address -= 512, w[small].size += 512));
  REFUSED(SYMM_ERR_INVALID, "crosses the boundary", 0, GRAPH, w, n);
  EDIT(w[small + 1].size += 512);
  REFUSED(SYMM_ERR_INVALID, "an overlap", 0, GRAPH, w, n);
  EDIT(memmove(&w[small + 1], &w[small + 2], sizeof w[0] * (n - small - 2)));
  REFUSED(SYMM_ERR_INVALID, "a gap", 0, GRAPH, w, n - 1);
  EDIT(w[small + 1].address += 1);
  REFUSED(SYMM_ERR_INVALID, "not a multiple of 512", 0, GRAPH, w, n);
  EDIT(w[small + 1].size = 0);
  REFUSED(SYMM_ERR_INVALID, "is zero or not a multiple of 512", 0, GRAPH, w, n);
  EDIT((w[small + 1].address = UINT64_MAX - 511, w[small + 1].size = 1024));
  REFUSED(SYMM_ERR_INVALID, "is not an address range", 0, GRAPH, w, n);
  EDIT(w[small + 1].state = 3);
  REFUSED(SYMM_ERR_INVALID, "state 3", 0, GRAPH, w, n);
  EDIT(w[small + 1].state = -7);
  REFUSED(SYMM_ERR_INVALID, "state -7", 0, GRAPH, w, n);
  EDIT(w[small].requested_size = 0);
  REFUSED(SYMM_ERR_INVALID, "requested size 0", 0, GRAPH, w, n);
  EDIT(w[small].requested_size = w[small].size + 1);
  REFUSED(SYMM_ERR_INVALID, "requested size 1025: want 1 to its size 1024", 0, GRAPH, w, n);
  EDIT(w[small].stream = (uintptr_t)SB);
  REFUSED(SYMM_ERR_INVALID, "its segment is stream 0x1000's", 0, GRAPH, w, n);
  EDIT(w[small].reserved = 9);
  REFUSED(SYMM_ERR_INVALID, "want[", 0, GRAPH, w, n);
  /* Arrays too small: the counts needed (e, f, h freed; b, c allocated). */
  refused(__LINE__, SYMM_ERR_INVALID, "would free 3 blocks and allocate 2", 0, GRAPH, ck, n, 1, 3, 2);
  /* Another pool, released but still there: refused. */
  symm_pool_id_t other = {13, 0};
  CHECK(symm_pool_begin_allocate_to_pool(0, other, SC) == SYMM_OK, "begin another pool");
  symm_pool_free(symm_pool_alloc(512, 0, SC), 512, 0, SC);
  CHECK(symm_pool_end_allocate_to_pool(0, other) == SYMM_OK && symm_pool_release_pool(0, other) == SYMM_OK, "release it");
  REFUSED(SYMM_ERR_INVALID, "the pool was released", 0, other, NULL, 0);
  symm_pool_empty_cache();

  /* ---- the restore ---- */
  nf = MAXB, na = MAXB;
  symm_clear_error();
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, fr, &nf, al, &na) == SYMM_OK, "restore");
  uint64_t want_freed[3] = {(uintptr_t)e, (uintptr_t)f, (uintptr_t)h}, want_alloc[2] = {(uintptr_t)g_b, (uintptr_t)g_c};
  for (int i = 0; i < 3; i++)
    for (int j = i + 1; j < 3; j++)
      if (want_freed[j] < want_freed[i]) {
        uint64_t t = want_freed[i];
        want_freed[i] = want_freed[j], want_freed[j] = t;
      }
  if (want_alloc[1] < want_alloc[0]) {
    uint64_t t = want_alloc[0];
    want_alloc[0] = want_alloc[1], want_alloc[1] = t;
  }
  CHECK(nf == 3 && !memcmp(fr, want_freed, sizeof want_freed), "freed: e, f, h in address order (%d)", nf);
  CHECK(na == 2 && !memcmp(al, want_alloc, sizeof want_alloc), "allocated: b and c again (%d)", na);
  int m = blocks(GRAPH, b);
  CHECK(m == n + 1, "the checkpoint's blocks and f's new segment: %d", m);
  int j = 0;
  for (int i = 0; i < m; i++) {
    if (b[i].segment_address == (uintptr_t)f) {
      CHECK(b[i].state == SYMM_BLOCK_FREE && b[i].size >= 30 * MiB, "f's segment is free");
      continue;
    }
    CHECK(j < n && !memcmp(&b[i], &ck[j], sizeof b[i]), "block %d is the checkpoint's block %d", i, j);
    j++;
  }
  CHECK(stat_now(0, "allocation.all.current") == nblocks_ck, "allocation.all.current %lld",
        (long long)stat_now(0, "allocation.all.current"));
  CHECK(stat_now(0, "allocated_bytes.all.current") == allocated_ck, "allocated bytes");
  CHECK(stat_now(0, "requested_bytes.all.current") == requested_ck, "requested bytes");
  CHECK(stat_now(0, "active_bytes.all.current") == allocated_ck, "active bytes");
  /* Again: nothing to do. */
  nf = 0, na = 0;
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, NULL, &nf, NULL, &na) == SYMM_OK && nf == 0 && na == 0,
        "a second restore changes nothing");
  /* checkPoolLiveAllocations: the allocated addresses are a, b, c. */
  int live = 0;
  m = blocks(GRAPH, b);
  for (int i = 0; i < m; i++)
    if (b[i].state == SYMM_BLOCK_ALLOCATED)
      live += b[i].address == (uintptr_t)g_a || b[i].address == (uintptr_t)g_b || b[i].address == (uintptr_t)g_c ? 1 : 100;
  CHECK(live == 3, "the live set is {a, b, c}");
  memset(g_b, 0x33, 3000); /* host memory: the restored block is usable */
  memset(g_c, 0x44, 3 * MiB);
  CHECK(symm_pool_end_allocate_to_pool(0, GRAPH) == SYMM_OK && symm_pool_end_allocate_to_pool(0, GRAPH) == SYMM_OK,
        "the pool's captures end");

  /* SYMM_ERR_BUSY: b freed while another pool routes (a capture may be under
   * way), so pending on its record_stream stream, where the checkpoint has it
   * allocated; its event cannot be waited for while the route is open. */
  symm_pool_id_t capturing = {14, 0};
  CHECK(symm_pool_begin_allocate_to_pool(1, capturing, SA) == SYMM_OK, "a route on device 1 does not matter");
  CHECK(symm_pool_begin_allocate_to_pool(0, capturing, SC) == SYMM_OK, "a route on device 0");
  symm_pool_record_stream(g_b, SC);
  symm_pool_free(g_b, 3000, 0, SA);
  state_t before, after;
  state(&before, GRAPH);
  nf = MAXB, na = MAXB;
  int rc = symm_pool_restore_blocks(0, GRAPH, ck, n, fr, &nf, al, &na);
  state(&after, GRAPH);
  CHECK(rc == SYMM_ERR_BUSY && symm_last_error_code() == SYMM_ERR_BUSY &&
            strstr(symm_last_error(), "symm_pool_restore_blocks: ") &&
            strstr(symm_last_error(), "waiting for record_stream events") && nf == 0 && na == 0,
        "busy: %d", rc);
  CHECK(same_state(&before, &after), "a busy restore changed nothing");
  CHECK(symm_pool_end_allocate_to_pool(0, capturing) == SYMM_OK && symm_pool_release_pool(0, capturing) == SYMM_OK,
        "the capture ends");
  nf = MAXB, na = MAXB;
  CHECK(symm_pool_restore_blocks(0, GRAPH, ck, n, fr, &nf, al, &na) == SYMM_OK && nf == 0 && na == 1 &&
            al[0] == (uintptr_t)g_b,
        "with no capture under way, b's events are waited for and b is allocated again");

  /* The restored blocks are the caller's. */
  symm_clear_error();
  symm_pool_free(g_a, 1000, 0, SA);
  symm_pool_free(g_b, 3000, 0, SA);
  symm_pool_free(g_c, 3 * MiB, 0, SB);
  CHECK(symm_last_error_code() == SYMM_OK, "they free with their requested sizes");
  CHECK(symm_pool_end_allocate_to_pool(1, capturing) == SYMM_OK && symm_pool_release_pool(1, capturing) == SYMM_OK,
        "device 1's route");
  CHECK(symm_pool_release_pool(0, GRAPH) == SYMM_OK && symm_pool_release_pool(0, GRAPH) == SYMM_OK, "release");
  symm_pool_empty_cache();
  CHECK(stat_now(0, "reserved_bytes.all.current") == 0, "all returned: %lld",
        (long long)stat_now(0, "reserved_bytes.all.current"));
}

static void test_alloc_segment(void) {
  symm_clear_error();
  CHECK(symm_pool_alloc_segment(0, 0, SA) == NULL && symm_last_error_code() == SYMM_OK, "size 0: NULL, no error");
  CHECK(symm_pool_alloc_segment(4096, 7, SA) == NULL && symm_last_error_code() == SYMM_ERR_INVALID &&
            strstr(symm_last_error(), "symm_pool_alloc_segment: ") && strstr(symm_last_error(), "device 7"),
        "bad device");
  CHECK(symm_pool_alloc_segment((size_t)1 << 40, 0, SA) == NULL && symm_last_error_code() == SYMM_ERR_OUT_OF_MEMORY &&
            strstr(symm_last_error(), "symm_pool_alloc_segment: "),
        "out of memory (SYMM_HOST_MEMORY)");
  int64_t reserved = stat_now(0, "reserved_bytes.all.current");
  void *p = symm_pool_alloc_segment(3 * MiB + 100, 0, SA);
  CHECK(p != NULL && (uintptr_t)p % 512 == 0, "a segment");
  CHECK(stat_now(0, "reserved_bytes.all.current") == reserved + (int64_t)(3 * MiB + 512), "exactly its size, rounded to 512");
  CHECK(stat_now(0, "allocated_bytes.all.current") == (int64_t)(3 * MiB + 512), "counted as a block");
  memset(p, 1, 3 * MiB + 100);
  symm_clear_error();
  symm_pool_free(p, 3 * MiB + 100, 0, SA);
  CHECK(symm_last_error_code() == SYMM_OK, "free");
  CHECK(stat_now(0, "reserved_bytes.all.current") == reserved, "back to the device at once, no empty_cache");
}

int main(void) {
  setenv("SYMM_DEVICE", "host", 0);
  setenv("SYMM_HOST_DEVICES", "2", 1);
  setenv("SYMM_HOST_MEMORY", "1GiB", 1);
  int fds0 = (symm_pool_device_count(), count_fds()), maps0 = count_maps();
  test_cache_info();
  test_reset_accumulated();
  test_blocks();
  test_restore();
  test_alloc_segment();
  for (int d = 0; d < 2; d++)
    CHECK(stat_now(d, "allocated_bytes.all.current") == 0 && stat_now(d, "reserved_bytes.all.current") == 0,
          "device %d: nothing allocated or reserved", d);
  CHECK(count_fds() == fds0, "descriptors %d -> %d", fds0, count_fds());
  CHECK(count_maps() == maps0, "mappings %d -> %d", maps0, count_maps());
  printf("test_checkpoint: %d passed, %d failed\n", passes, failures);
  return failures != 0;
}
