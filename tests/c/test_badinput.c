/* Bad input at every function of include/symm.h, on the host backend: each
 * bad call returns the documented error code, symm_last_error_code() agrees,
 * symm_last_error() starts with the function's name and names what was wrong,
 * and nothing changed: both devices' pool statistics, the open descriptors and
 * the library's mappings (memfd "symm-pool"/"symm-block") are the same before
 * and after every bad call, and at the end. A few bad environments run in
 * child processes (spawned, not forked: Go does not survive fork).
 *   test_badinput                 every area
 *   test_badinput child CASE      one bad environment (the parent sets it) */
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "symm.h"

extern char **environ;

static int verbose; /* SYMM_TEST_VERBOSE=1: print every call and its message */

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define NDEV 2          /* SYMM_HOST_DEVICES */
#define STATS_MAX 512

/* ---- what exists: descriptors, mappings, statistics ---------------------- */



typedef struct {
  int n;
  const char *name[STATS_MAX];
  int64_t v[NDEV][STATS_MAX];
} snap_t;

static void snap(snap_t *s) {
  symm_stat_t st[STATS_MAX];
  s->n = 0;
  for (int d = 0; d < NDEV; d++) {
    int n = symm_pool_stats(d, st, STATS_MAX);
    if (n < 0 || n > STATS_MAX) {
      fprintf(stderr, "symm_pool_stats(%d) = %d: %s\n", d, n, symm_last_error());
      failures++;
      return;
    }
    s->n = n;
    for (int i = 0; i < n; i++) {
      s->name[i] = st[i].name;
      s->v[d][i] = st[i].value;
    }
  }
}

static int64_t stat_of(const snap_t *s, int dev, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->name[i], name) == 0) return s->v[dev][i];
  fprintf(stderr, "no statistic %s\n", name);
  failures++;
  return INT64_MIN;
}

static int64_t stat_now(int dev, const char *name) {
  snap_t s;
  snap(&s);
  return stat_of(&s, dev, name);
}

/* An out-of-memory answer counts itself (PyTorch's num_ooms) after one retry
 * that synchronizes and releases the cache: those counters may move. A
 * segment the device refused leaves no trace in the reserved statistics
 * (their peak and totals included). */
static int oom_counter(const char *name) {
  return !strcmp(name, "num_alloc_retries") || !strcmp(name, "num_ooms") || !strcmp(name, "num_sync_all_streams");
}

/* ---- one bad call ---------------------------------------------------------- */

enum { F_OOM = 1, F_NOSTATE = 2 };

typedef struct {
  snap_t s;
  int fds, maps;
} state_t;

static void state(state_t *st) {
  snap(&st->s);
  st->fds = count_fds();
  st->maps = count_maps();
}

/* Functions a check has exercised (every function of the header must be). */
static char covered[96][48];
static int ncovered;

static void cover(const char *fn) {
  for (int i = 0; i < ncovered; i++)
    if (!strcmp(covered[i], fn)) return;
  if (ncovered < (int)(sizeof covered / sizeof covered[0])) snprintf(covered[ncovered++], sizeof covered[0], "%s", fn);
}

/* The function a call's text starts with ("symm_pool_free(p, ...)"). */
static void fn_of(const char *call, char *fn, size_t len) {
  while (*call == '(' || isspace((unsigned char)*call)) call++;
  size_t k = 0;
  while (call[k] && (isalnum((unsigned char)call[k]) || call[k] == '_') && k + 1 < len) k++;
  memcpy(fn, call, k);
  fn[k] = 0;
}

static void finish(int line, const char *call, const state_t *before, long long rc, long long want_rc, int code,
                   const char *msg, int want_code, const char *word, int flags) {
  char fn[48];
  fn_of(call, fn, sizeof fn);
  cover(fn);
  if (verbose) printf("  %s -> %lld, code %d: %s\n", call, rc, code, msg);
  int bad = 0;
#define EXPECT(cond, ...)                                              \
  do {                                                                 \
    if (cond) {                                                        \
      passes++;                                                        \
    } else {                                                           \
      failures++, bad++;                                               \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, line, call);       \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, " (last error %d: %s)\n", code, msg);            \
    }                                                                  \
  } while (0)
  EXPECT(rc == want_rc, "returned %lld, want %lld", rc, want_rc);
  EXPECT(code == want_code, "code %d, want %d", code, want_code);
  if (want_code == SYMM_OK) {
    EXPECT(msg[0] == 0, "an error message after a call that should not fail");
  } else {
    size_t n = strlen(fn);
    EXPECT(msg[0] != 0, "empty message");
    EXPECT(strncmp(msg, fn, n) == 0 && msg[n] == ':', "the message does not start with \"%s: \"", fn);
    EXPECT(word == NULL || strstr(msg, word) != NULL, "the message does not name \"%s\"", word);
  }
  if (!(flags & F_NOSTATE)) {
    state_t after;
    state(&after);
    /* The other end of a refused connection to one of our own servers is
     * closed by the server's goroutine, a moment later: wait for it. */
    for (int i = 0; i < 100 && after.fds != before->fds; i++) {
      usleep(5000);
      after.fds = count_fds();
    }
    EXPECT(after.fds == before->fds, "descriptors %d before, %d after", before->fds, after.fds);
    EXPECT(after.maps == before->maps, "mappings %d before, %d after", before->maps, after.maps);
    for (int d = 0; d < NDEV; d++)
      for (int i = 0; i < after.s.n && i < before->s.n; i++)
        if (after.s.v[d][i] != before->s.v[d][i] && !((flags & F_OOM) && oom_counter(after.s.name[i])))
          EXPECT(0, "device %d %s: %lld before, %lld after", d, after.s.name[i], (long long)before->s.v[d][i],
                 (long long)after.s.v[d][i]);
  }
#undef EXPECT
}

/* CALL(flags, want_rc, want_code, word, call): run call between two states. */
#define CALL(flags, want_rc, want_code, word, call)                                     \
  do {                                                                                  \
    state_t b_;                                                                         \
    if ((flags) & F_NOSTATE)                                                            \
      memset(&b_, 0, sizeof b_);                                                        \
    else                                                                                \
      state(&b_);                                                                       \
    symm_clear_error();                                                                 \
    long long rc_ = (long long)(intptr_t)(call);                                        \
    int code_ = symm_last_error_code();                                                 \
    char msg_[2048];                                                                    \
    symm_copy_last_error(msg_, sizeof msg_);                                            \
    finish(__LINE__, #call, &b_, rc_, (long long)(want_rc), code_, msg_, want_code, word, flags); \
  } while (0)

/* Functions returning their code. */
#define BAD(code, word, call) CALL(0, code, code, word, call)
/* Functions returning a value (-1, NULL, 0) and setting code. */
#define BADR(rc, code, word, call) CALL(0, rc, code, word, call)
/* void functions: only the last error tells. */
#define BADV(code, word, call) CALL(0, 0, code, word, ((call), 0))
/* Calls that must succeed and change nothing (size 0, NULL free, ...). */
#define NOOP(rc, call) CALL(0, rc, SYMM_OK, NULL, call)

static int area_failures;
static void area(const char *name, int checks0) {
  printf("%-28s %4d checks: %s\n", name, passes + failures - checks0, failures == area_failures ? "ok" : "FAILED");
  area_failures = failures;
}

static char hexbuf[8][32];
static int hexi;
/* The pointer as the library's messages print it (%#x). */
static const char *hex(const void *p) {
  char *b = hexbuf[hexi++ % 8];
  snprintf(b, sizeof hexbuf[0], "%#lx", (unsigned long)(uintptr_t)p);
  return b;
}

static const int bad_devs[] = {-1, NDEV, 1000, INT_MIN, INT_MAX};
#define NBAD_DEVS (int)(sizeof bad_devs / sizeof bad_devs[0])

/* ---- the last error -------------------------------------------------------- */

static void *thread_errors(void *arg) {
  (void)arg;
  /* A new thread starts with no error, whatever the others have. */
  int ok = symm_last_error_code() == SYMM_OK && symm_last_error()[0] == 0;
  symm_pool_set_memory_fraction(-1, 0);
  ok = ok && symm_last_error_code() == SYMM_ERR_INVALID;
  return (void *)(intptr_t)ok;
}

static void test_errors(void) {
  int c0 = passes + failures;
  const char *v = symm_version();
  CHECK(v != NULL && isdigit((unsigned char)v[0]) && strchr(v, '.') != NULL, "version %s", v ? v : "(null)");
  cover("symm_version");
  symm_clear_error();
  cover("symm_clear_error");
  CHECK(symm_last_error() != NULL && symm_last_error()[0] == 0, "no error: \"\", never NULL");
  CHECK(symm_last_error_code() == SYMM_OK, "no error: SYMM_OK");
  cover("symm_last_error");
  cover("symm_last_error_code");

  /* A known failure: the size query gives its length however the buffer is. */
  CHECK(symm_pool_stats(-1, NULL, 0) == -1, "stats of device -1");
  const char *m = symm_last_error();
  size_t n = strlen(m);
  CHECK(n > 10 && symm_last_error_code() == SYMM_ERR_INVALID, "a message: %s", m);
  char buf[4096];
  memset(buf, 'x', sizeof buf);
  CHECK(symm_copy_last_error(NULL, 0) == n, "NULL, 0: the length");
  CHECK(symm_copy_last_error(NULL, 5) == n, "NULL, 5: the length, nothing written");
  CHECK(symm_copy_last_error(buf, 0) == n && buf[0] == 'x', "cap 0: nothing written");
  CHECK(symm_copy_last_error(buf, 1) == n && buf[0] == 0 && buf[1] == 'x', "cap 1: only the NUL");
  CHECK(symm_copy_last_error(buf, 8) == n && strlen(buf) == 7 && buf[8] == 'x', "cap 8: 7 bytes and the NUL");
  CHECK(symm_copy_last_error(buf, n) == n && strlen(buf) == n - 1, "cap n: truncated by one");
  CHECK(symm_copy_last_error(buf, SIZE_MAX) == n && strcmp(buf, m) == 0, "cap SIZE_MAX: the message");
  cover("symm_copy_last_error");

  /* A success does not clear it; another thread does not see it. */
  CHECK(symm_pool_device_count() == NDEV, "device count");
  CHECK(symm_last_error_code() == SYMM_ERR_INVALID && strcmp(symm_last_error(), buf) == 0, "kept after a success");
  pthread_t t;
  void *ok = NULL;
  pthread_create(&t, NULL, thread_errors, NULL);
  pthread_join(t, &ok);
  CHECK(ok == (void *)1, "a new thread has its own last error");
  CHECK(strcmp(symm_last_error(), buf) == 0, "and its failures do not reach this thread");
  symm_clear_error();
  CHECK(symm_last_error_code() == SYMM_OK && symm_last_error()[0] == 0, "cleared");
  CHECK(symm_copy_last_error(buf, sizeof buf) == 0 && buf[0] == 0, "copy of no error");
  area("last error", c0);
}

/* ---- the pool ---------------------------------------------------------------- */

#define SA ((void *)0xA000) /* a stream only block a uses: its segment holds only a */
#define SB ((void *)0xB000)

static unsigned char *pa, *pb; /* live through the pool areas: a on device 0, b on device 1 */

static void test_pool_alloc(void) {
  int c0 = passes + failures;
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BADR(0, SYMM_ERR_INVALID, word, symm_pool_alloc(4096, bad_devs[i], NULL));
    BADR(0, SYMM_ERR_INVALID, word, symm_pool_alloc(SIZE_MAX, bad_devs[i], SB));
  }
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "requested 18446744073709551615 bytes", symm_pool_alloc(SIZE_MAX, 0, NULL));
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "requested 9223372036854775808 bytes", symm_pool_alloc(1ull << 63, 1, NULL));
  /* Larger than the device (SYMM_HOST_MEMORY=1GiB): one retry, then refused. */
  symm_pool_empty_cache();
  int64_t ooms = stat_now(0, "num_ooms");
  CALL(F_OOM, 0, SYMM_ERR_OUT_OF_MEMORY, "requested 2147483648 bytes", symm_pool_alloc(2 * GiB, 0, NULL));
  CALL(F_OOM, 0, SYMM_ERR_OUT_OF_MEMORY, "device 0", symm_pool_alloc(GiB + 1, 0, SB));
  CALL(F_OOM, 0, SYMM_ERR_OUT_OF_MEMORY, "device 1", symm_pool_alloc(GiB + 1, 1, SB));
  CHECK(stat_now(0, "num_ooms") == ooms + 2, "num_ooms counts each refusal");
  /* The non-throwing entry refuses the same way, under its own name. */
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BADR(0, SYMM_ERR_INVALID, word, symm_pool_try_alloc(4096, bad_devs[i], NULL));
  }
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "requested 18446744073709551615 bytes", symm_pool_try_alloc(SIZE_MAX, 0, NULL));
  CALL(F_OOM, 0, SYMM_ERR_OUT_OF_MEMORY, "device 0", symm_pool_try_alloc(2 * GiB, 0, NULL));
  NOOP(0, symm_pool_try_alloc(0, 0, NULL));
  /* Size 0: NULL and no error (PyTorch asks for 0 bytes), whatever the device. */
  NOOP(0, symm_pool_alloc(0, 0, NULL));
  NOOP(0, symm_pool_alloc(0, -1, SB));
  NOOP(0, symm_pool_alloc(0, INT_MIN, NULL));
  /* The pool still serves. */
  void *p = symm_pool_alloc(GiB / 2, 0, SB);
  CHECK(p != NULL, "half the device after the refusals");
  symm_pool_free(p, GiB / 2, 0, SB);
  symm_pool_empty_cache();
  area("symm_pool_alloc", c0);
}

static void test_pool_free(void) {
  int c0 = passes + failures;
  NOOP(0, (symm_pool_free(NULL, 16, 0, NULL), 0));
  NOOP(0, (symm_pool_free(NULL, 16, -1, NULL), 0));
  BADV(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_pool_free((void *)0xdead000, 16, 0, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, "0xfffffffffffff000", symm_pool_free((void *)~0xfffull, 0, 1, SA));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(pa + 512), symm_pool_free(pa + 512, 0, 0, SA));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(pa + 1), symm_pool_free(pa + 1, 4096, 0, SA));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(pb + 4096), symm_pool_free(pb + 4096, 0, 1, SB));
  /* Size or device not those of the allocation. */
  BADV(SYMM_ERR_INVALID, "size 4095", symm_pool_free(pa, 4095, 0, SA));
  BADV(SYMM_ERR_INVALID, "size 18446744073709551615", symm_pool_free(pa, SIZE_MAX, 0, SA));
  BADV(SYMM_ERR_INVALID, "not device 1", symm_pool_free(pa, 4096, 1, SA));
  BADV(SYMM_ERR_INVALID, "not device 0", symm_pool_free(pb, 3 * MiB, 0, SB));
  for (int i = 0; i < NBAD_DEVS; i++) {
    if (bad_devs[i] == -1) continue; /* a free's "any device": test_pool_block_of */
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BADV(SYMM_ERR_INVALID, word, symm_pool_free(pa, 4096, bad_devs[i], SA));
  }
  /* Double free: once in the front cache (when on), once back in the pool. */
  int64_t allocs = stat_now(0, "allocation.all.current");
  unsigned char *c = symm_pool_alloc(1000, 0, NULL);
  CHECK(c != NULL, "alloc");
  symm_pool_free(c, 1000, 0, NULL);
  symm_clear_error();
  symm_pool_free(c, 1000, 0, NULL); /* no state read in between: the front cache holds it */
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER && strstr(symm_last_error(), hex(c)),
        "a double free straight after the free");
  CHECK(stat_now(0, "allocation.all.current") == allocs, "nothing freed twice");
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(c), symm_pool_free(c, 1000, 0, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(c), symm_pool_free(c, 0, 0, (void *)2));
  /* A block over the front cache's size goes to the pool at once. */
  unsigned char *big = symm_pool_alloc(65 * MiB, 1, NULL);
  CHECK(big != NULL, "65 MiB");
  symm_pool_free(big, 65 * MiB, 1, NULL);
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(big), symm_pool_free(big, 65 * MiB, 1, NULL));
  /* pa and pb are still allocated: none of the above freed them. */
  CHECK(stat_now(0, "allocated_bytes.all.current") == 4096 && stat_now(1, "allocated_bytes.all.current") == 3 * MiB,
        "the live blocks are still allocated");
  symm_pool_empty_cache();
  area("symm_pool_free", c0);
}

static void test_pool_record_stream(void) {
  int c0 = passes + failures;
  BADV(SYMM_ERR_UNKNOWN_POINTER, "0x0", symm_pool_record_stream(NULL, (void *)7));
  BADV(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_pool_record_stream((void *)0xdead000, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, "0xfffffffffffffe00", symm_pool_record_stream((void *)~0x1ffull, (void *)1));
  /* Past the end of a, in its segment (a is alone there): free memory of the pool. */
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(pa + 4096), symm_pool_record_stream(pa + 4096, (void *)7));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(pa + MiB), symm_pool_record_stream(pa + MiB, (void *)7));
  /* A freed block, straight after its free (in the front cache when on) and later. */
  int64_t allocs = stat_now(0, "allocation.all.current");
  unsigned char *c = symm_pool_alloc(2048, 0, NULL);
  symm_pool_free(c, 2048, 0, NULL);
  symm_clear_error();
  symm_pool_record_stream(c, (void *)7);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER && strstr(symm_last_error(), hex(c)),
        "record_stream of a block just freed");
  CHECK(stat_now(0, "allocation.all.current") == allocs, "the freed block stays freed");
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(c + 100), symm_pool_record_stream(c + 100, (void *)7));
  /* Inside a live block, on its own stream: allowed, and no effect. */
  NOOP(0, (symm_pool_record_stream(pa + 100, SA), 0));
  area("symm_pool_record_stream", c0);
}

static void test_pool_segment_of(void) {
  int c0 = passes + failures;
  uint64_t base = 7, size = 7;
  int exp = 7;
  BAD(SYMM_ERR_INVALID, "NULL", symm_pool_segment_of(pa, NULL, &size, &exp));
  BAD(SYMM_ERR_INVALID, "NULL", symm_pool_segment_of(pa, &base, NULL, &exp));
  BAD(SYMM_ERR_INVALID, "NULL", symm_pool_segment_of(pa, &base, &size, NULL));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0x0", symm_pool_segment_of(NULL, &base, &size, &exp));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_pool_segment_of((void *)0xdead000, &base, &size, &exp));
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(pa + MiB), symm_pool_segment_of(pa + MiB, &base, &size, &exp));
  CHECK(base == 7 && size == 7 && exp == 7, "outputs untouched by failures");
  /* A live block, and a pointer inside it: the same segment, holding it. */
  NOOP(0, symm_pool_segment_of(pa, &base, &size, &exp));
  CHECK(base <= (uint64_t)(uintptr_t)pa && (uint64_t)(uintptr_t)pa + 4096 <= base + size && (exp == 0 || exp == 1),
        "segment [%#llx, +%llu) holds %p", (unsigned long long)base, (unsigned long long)size, (void *)pa);
  uint64_t base2 = 0, size2 = 0;
  NOOP(0, symm_pool_segment_of(pa + 100, &base2, &size2, &exp));
  CHECK(base2 == base && size2 == size, "a pointer inside the block names the same segment");
  area("symm_pool_segment_of", c0);
}

static void test_pool_segment_chunk(void) {
  int c0 = passes + failures;
  uint64_t chunk = 7;
  BAD(SYMM_ERR_INVALID, "NULL", symm_pool_segment_chunk(pa, NULL));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0x0", symm_pool_segment_chunk(NULL, &chunk));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_pool_segment_chunk((void *)0xdead000, &chunk));
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(pa + MiB), symm_pool_segment_chunk(pa + MiB, &chunk));
  CHECK(chunk == 7, "output untouched by failures");
  /* Expandable: whole granules (2 MiB on the host backend), else 0. */
  uint64_t base = 0, size = 0;
  int exp = 0;
  NOOP(0, symm_pool_segment_of(pa, &base, &size, &exp));
  NOOP(0, symm_pool_segment_chunk(pa + 100, &chunk));
  CHECK(exp ? chunk >= (2u << 20) && chunk % (2u << 20) == 0 && size % chunk == 0 : chunk == 0,
        "chunk %llu of a %s segment of %llu bytes", (unsigned long long)chunk, exp ? "expandable" : "fixed",
        (unsigned long long)size);
  area("symm_pool_segment_chunk", c0);
}

/* The chunk holding an address of ptr's segment: the chunks under a block,
 * walked from the one holding its start, are contiguous, each the size
 * symm_pool_segment_chunk gives at its address, whole granules; a fixed
 * segment has none (0, 0) whatever at is. */
static void test_pool_chunk_at(void) {
  int c0 = passes + failures;
  uint64_t base = 7, size = 7;
  BAD(SYMM_ERR_INVALID, "base is NULL", symm_pool_chunk_at(pa, pa, NULL, &size));
  BAD(SYMM_ERR_INVALID, "size is NULL", symm_pool_chunk_at(pa, pa, &base, NULL));
  BAD(SYMM_ERR_INVALID, "base is NULL", symm_pool_chunk_at(NULL, pa, NULL, NULL));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0x0", symm_pool_chunk_at(NULL, pa, &base, &size));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_pool_chunk_at((void *)0xdead000, pa, &base, &size));
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(pa + MiB), symm_pool_chunk_at(pa + MiB, pa, &base, &size));
  CHECK(base == 7 && size == 7, "outputs untouched by failures");
  uint64_t sbase = 0, ssize = 0;
  int exp = 0;
  NOOP(0, symm_pool_segment_of(pb, &sbase, &ssize, &exp));
  unsigned char *past = (unsigned char *)(uintptr_t)(sbase + ssize);
  if (exp) {
    /* Outside the segment's mapped chunks: before it, past its end, far off. */
    BAD(SYMM_ERR_INVALID, "0x0", symm_pool_chunk_at(pb, NULL, &base, &size));
    BAD(SYMM_ERR_INVALID, hex(past), symm_pool_chunk_at(pb, past, &base, &size));
    BAD(SYMM_ERR_INVALID, hex(past + GiB), symm_pool_chunk_at(pb + 100, past + GiB, &base, &size));
    unsigned char *before = (unsigned char *)(uintptr_t)(sbase - 1);
    BAD(SYMM_ERR_INVALID, hex(before), symm_pool_chunk_at(pb, before, &base, &size));
    CHECK(base == 7 && size == 7, "outputs untouched by failures");
  } else {
    NOOP(0, symm_pool_chunk_at(pb, past + GiB, &base, &size));
    CHECK(base == 0 && size == 0, "a fixed segment has no chunks: [%#llx, +%llu)", (unsigned long long)base,
          (unsigned long long)size);
  }
  /* pb's block (3 MiB), walked chunk by chunk from a pointer inside it. */
  uint64_t at = (uint64_t)(uintptr_t)pb + 100, end = (uint64_t)(uintptr_t)pb + 3 * MiB;
  int n = 0;
  do {
    base = size = 7;
    NOOP(0, symm_pool_chunk_at(pb + 100, (void *)(uintptr_t)at, &base, &size));
    uint64_t chunk = 7;
    NOOP(0, symm_pool_segment_chunk((void *)(uintptr_t)at, &chunk));
    if (!exp) {
      CHECK(base == 0 && size == 0 && chunk == 0, "a fixed segment: chunk [%#llx, +%llu)", (unsigned long long)base,
            (unsigned long long)size);
      break;
    }
    CHECK(size == chunk && size >= 2 * MiB && size % (2 * MiB) == 0 && base % (2 * MiB) == 0,
          "chunk [%#llx, +%llu) at %#llx: symm_pool_segment_chunk says %llu", (unsigned long long)base,
          (unsigned long long)size, (unsigned long long)at, (unsigned long long)chunk);
    CHECK(base <= at && at - base < size && sbase <= base && base + size <= sbase + ssize,
          "chunk [%#llx, +%llu) holds %#llx, inside the segment [%#llx, +%llu)", (unsigned long long)base,
          (unsigned long long)size, (unsigned long long)at, (unsigned long long)sbase, (unsigned long long)ssize);
    CHECK(n == 0 || base == at, "chunk %d starts at %#llx, where the one before ended", n, (unsigned long long)base);
    if (size == 0 || base + size <= at) break;
    at = base + size;
    n++;
  } while (at < end && n < 64);
  CHECK(!exp || (n >= 1 && n <= 3), "%d chunks under a 3 MiB block", n);
  area("symm_pool_chunk_at", c0);
}

static void test_pool_block_of(void) {
  int c0 = passes + failures;
  uint64_t addr = 7, req = 7;
  BAD(SYMM_ERR_INVALID, "NULL", symm_pool_block_of(pa, NULL, &req));
  BAD(SYMM_ERR_INVALID, "NULL", symm_pool_block_of(pa, &addr, NULL));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0x0", symm_pool_block_of(NULL, &addr, &req));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_pool_block_of((void *)0xdead000, &addr, &req));
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(pa + MiB), symm_pool_block_of(pa + MiB, &addr, &req));
  CHECK(addr == 7 && req == 7, "outputs untouched by failures");
  /* A live block of 4096 bytes, at its start and inside it. */
  NOOP(0, symm_pool_block_of(pa, &addr, &req));
  CHECK(addr == (uint64_t)(uintptr_t)pa && req == 4096, "block %#llx of %llu bytes", (unsigned long long)addr,
        (unsigned long long)req);
  NOOP(0, symm_pool_block_of(pa + 100, &addr, &req));
  CHECK(addr == (uint64_t)(uintptr_t)pa && req == 4096, "a pointer inside names the block");
  /* A block freed with device -1 (the pool finds it), then unknown. */
  unsigned char *q = symm_pool_alloc(3000, 1, SB);
  CHECK(q != NULL, "alloc on device 1");
  symm_clear_error();
  symm_pool_free(q, 0, -1, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free with size 0, device -1 and no stream: %s", symm_last_error());
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(q), symm_pool_block_of(q, &addr, &req));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(q), symm_pool_free(q, 0, -1, NULL));
  area("symm_pool_block_of", c0);
}

static void test_pool_stats(void) {
  int c0 = passes + failures;
  symm_stat_t st[8];
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BADR(-1, SYMM_ERR_INVALID, word, symm_pool_stats(bad_devs[i], st, 8));
    BADR(-1, SYMM_ERR_INVALID, word, symm_pool_stats(bad_devs[i], NULL, 0));
    BAD(SYMM_ERR_INVALID, word, symm_pool_reset_peak(bad_devs[i]));
  }
  BADR(-1, SYMM_ERR_INVALID, "out is NULL", symm_pool_stats(0, NULL, 5));
  BADR(-1, SYMM_ERR_INVALID, "cap is negative", symm_pool_stats(0, st, -1));
  BADR(-1, SYMM_ERR_INVALID, "cap is negative", symm_pool_stats(1, NULL, INT_MIN));
  /* Too small a buffer is not an error: the count, and only cap entries written. */
  int n = symm_pool_stats(0, NULL, 0);
  CHECK(n > 8 && n <= STATS_MAX, "size query: %d statistics", n);
  memset(st, 0x5a, sizeof st);
  NOOP(n, symm_pool_stats(0, st, 3));
  CHECK(st[2].name != NULL && st[3].value == 0x5a5a5a5a5a5a5a5aLL, "only 3 written");
  area("symm_pool_stats/reset_peak", c0);
}

static void test_pool_limits(void) {
  int c0 = passes + failures;
  /* A valid cap first, then bad calls that must not change it. */
  symm_clear_error();
  symm_pool_set_memory_fraction(0.5, 0);
  CHECK(symm_last_error_code() == SYMM_OK, "fraction 0.5 of device 0");
  const double bad_fractions[] = {-1, -1e-300, 1.0000001, 2, NAN, INFINITY, -INFINITY, 1e300};
  for (size_t i = 0; i < sizeof bad_fractions / sizeof bad_fractions[0]; i++)
    BADV(SYMM_ERR_INVALID, "fraction", symm_pool_set_memory_fraction(bad_fractions[i], 0));
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BADV(SYMM_ERR_INVALID, word, symm_pool_set_memory_fraction(0.5, bad_devs[i]));
    BADV(SYMM_ERR_INVALID, word, symm_pool_set_memory_fraction(NAN, bad_devs[i]));
    BAD(SYMM_ERR_INVALID, word, symm_pool_set_limit(bad_devs[i], 0));
    BAD(SYMM_ERR_INVALID, word, symm_pool_set_limit(bad_devs[i], 1));
  }
  symm_clear_error();
  void *p = symm_pool_alloc(600 * MiB, 0, NULL);
  CHECK(p == NULL && symm_last_error_code() == SYMM_ERR_OUT_OF_MEMORY, "the 512 MiB cap held through the bad calls");
  CHECK(symm_pool_set_limit(0, 8 * MiB) == SYMM_OK, "limit 8 MiB");
  BAD(SYMM_ERR_INVALID, "device -1", symm_pool_set_limit(-1, 0));
  symm_clear_error();
  p = symm_pool_alloc(16 * MiB, 0, NULL);
  CHECK(p == NULL && symm_last_error_code() == SYMM_ERR_OUT_OF_MEMORY, "the 8 MiB limit held");
  CHECK(symm_pool_set_limit(0, 0) == SYMM_OK, "no limit");
  /* Expandable segments: once the pool exists, a choice applies to the
   * segments made from then on. */
  BAD(SYMM_ERR_INVALID, "enable is 2", symm_pool_set_expandable(2));
  BAD(SYMM_ERR_INVALID, "enable is -1", symm_pool_set_expandable(-1));
  const char *exp_env = getenv("SYMM_POOL_EXPANDABLE");
  int exp_on = exp_env != NULL && !strcmp(exp_env, "1");
  CHECK(symm_pool_set_expandable(exp_on) == SYMM_OK, "the pool's own choice again");
  CHECK(symm_pool_set_expandable(!exp_on) == SYMM_OK, "the other choice, at run time");
  CHECK(symm_pool_set_expandable(exp_on) == SYMM_OK, "and back");
  p = symm_pool_alloc(600 * MiB, 0, NULL);
  CHECK(p != NULL, "600 MiB without a limit");
  symm_pool_free(p, 600 * MiB, 0, NULL);
  symm_pool_empty_cache();
  area("symm_pool_set_*", c0);
}

static void test_pool_misc(void) {
  int c0 = passes + failures;
  /* device_count is advisory: any value, no error, nothing changes. */
  NOOP(0, (symm_pool_init(-1), 0));
  NOOP(0, (symm_pool_init(INT_MIN), 0));
  NOOP(0, (symm_pool_init(1000), 0));
  NOOP(NDEV, symm_pool_device_count());
  CHECK(strcmp(symm_pool_backend(), "host") == 0, "backend %s", symm_pool_backend());
  cover("symm_pool_backend");
  /* Emptying the cache leaves live blocks alone. */
  symm_clear_error();
  symm_pool_empty_cache();
  symm_pool_empty_cache();
  CHECK(symm_last_error_code() == SYMM_OK, "empty_cache");
  CHECK(stat_now(0, "allocated_bytes.all.current") == 4096 && stat_now(1, "allocated_bytes.all.current") == 3 * MiB,
        "live blocks untouched by empty_cache");
  cover("symm_pool_empty_cache");
  /* symm_torch_init makes a failed alloc throw, which C cannot catch: it
   * runs in the children (test_children). */
  area("symm_pool_init/count/backend", c0);
}

/* ---- private pools, history, snapshots -------------------------------------- */

static void test_pool_graphs(void) {
  int c0 = passes + failures;
  symm_pool_id_t id = {9, 0}, unknown = {0, 77}, zero = {0, 0};
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BAD(SYMM_ERR_INVALID, word, symm_pool_begin_allocate_to_pool(bad_devs[i], id, SA));
    BAD(SYMM_ERR_INVALID, word, symm_pool_end_allocate_to_pool(bad_devs[i], id));
    BAD(SYMM_ERR_INVALID, word, symm_pool_release_pool(bad_devs[i], id));
  }
  BAD(SYMM_ERR_INVALID, "default pool", symm_pool_begin_allocate_to_pool(0, zero, SA));
  BAD(SYMM_ERR_INVALID, "(0, 77) on device 0: no such pool", symm_pool_end_allocate_to_pool(0, unknown));
  BAD(SYMM_ERR_INVALID, "(0, 77) on device 0: no such pool", symm_pool_release_pool(0, unknown));
  /* A pool with a live block: ending twice, and a release, are refused. */
  CHECK(symm_pool_begin_allocate_to_pool(0, id, SA) == SYMM_OK, "begin");
  void *g = symm_pool_alloc(8192, 0, SA);
  CHECK(g != NULL, "an allocation routed to the pool");
  CHECK(symm_pool_end_allocate_to_pool(0, id) == SYMM_OK, "end");
  BAD(SYMM_ERR_INVALID, "no allocation to it was begun", symm_pool_end_allocate_to_pool(0, id));
  BAD(SYMM_ERR_BUSY, "still allocated", symm_pool_release_pool(0, id));
  symm_clear_error();
  symm_pool_free(g, 8192, 0, SA);
  CHECK(symm_last_error_code() == SYMM_OK, "its block frees");
  CHECK(symm_pool_release_pool(0, id) == SYMM_OK, "then the release goes");
  BAD(SYMM_ERR_INVALID, "already released", symm_pool_release_pool(0, id));
  symm_pool_empty_cache();
  BAD(SYMM_ERR_INVALID, "no such pool", symm_pool_release_pool(0, id));
  /* History and snapshots. */
  BAD(SYMM_ERR_INVALID, "need at least 1", symm_pool_record_history(1, 0));
  NOOP(SYMM_OK, symm_pool_record_history(0, 0));
  size_t len = 0;
  BAD(SYMM_ERR_INVALID, "len is NULL", symm_pool_snapshot(NULL, 0, NULL));
  NOOP(SYMM_OK, symm_pool_snapshot(NULL, 0, &len));
  CHECK(len > 20, "snapshot size query: %zu", len);
  char small[16];
  BAD(SYMM_ERR_INVALID, "the buffer holds 16 bytes", symm_pool_snapshot(small, sizeof small, &len));
  /* A C program is neither of PyTorch's modes. */
  NOOP(0, symm_torch_mode());
  /* The C++ functors PyTorch calls (symm_torch_*_pool) take std:: types:
   * tests/c/test_graphs.cpp exercises them, bad input included. */
  cover("symm_torch_begin_allocate_to_pool");
  cover("symm_torch_end_allocate_to_pool");
  cover("symm_torch_release_pool");
  /* torch.cuda.MemPool's calls on a pool (their good use: test_graphs.cpp). */
  symm_pool_id_t nopool = {0, 78};
  BAD(SYMM_ERR_INVALID, "no such pool", symm_pool_set_no_split(0, nopool));
  BAD(SYMM_ERR_INVALID, "no such pool", symm_pool_set_use_on_oom(0, nopool, 1));
  BADR(-1, SYMM_ERR_INVALID, "no such pool", symm_pool_use_count(0, nopool));
  BADR(-1, SYMM_ERR_INVALID, "device 99", symm_pool_use_count(99, nopool));
  BAD(SYMM_ERR_INVALID, "default pool", symm_pool_create_pool(0, zero, NULL));
  BAD(SYMM_ERR_INVALID, "device -1", symm_pool_create_pool(-1, nopool, NULL));
  NOOP(SYMM_OK, symm_pool_empty_pool(nopool)); /* no such pool: nothing to give back */
  area("private pools, snapshots", c0);
}

/* ---- snapshots as C listings, the segment hook ----------------------------- */

static int hook_calls, hook_rereg;
static void count_hook(const symm_trace_entry_t *ev, int n, void *ctx) {
  (void)ev;
  hook_calls += n;
  *(int *)ctx += 1;
  hook_rereg = symm_pool_set_segment_hook(NULL, NULL); /* refused from inside */
}

static void test_pool_listing(void) {
  int c0 = passes + failures;
  symm_segment_info_t segs[64];
  symm_block_info_t blocks[256];
  symm_trace_entry_t traces[64];
  int ns = 0, nb = 0, nt = 0;
  BAD(SYMM_ERR_INVALID, "nsegs or nblocks is NULL", symm_pool_snapshot_list(segs, NULL, blocks, &nb, NULL, NULL));
  ns = -1, nb = 0;
  BAD(SYMM_ERR_INVALID, "negative", symm_pool_snapshot_list(segs, &ns, blocks, &nb, NULL, NULL));
  CHECK(ns == 0 && nb == 0, "counts 0 after a bad call: %d %d", ns, nb);
  ns = 1, nb = 0;
  BAD(SYMM_ERR_INVALID, "NULL with a capacity", symm_pool_snapshot_list(NULL, &ns, blocks, &nb, NULL, NULL));
  ns = 0, nb = 0, nt = 2;
  BAD(SYMM_ERR_INVALID, "NULL with a capacity", symm_pool_snapshot_list(segs, &ns, blocks, &nb, NULL, &nt));
  /* A live block, so that the pool has a segment to list. */
  void *p = symm_pool_alloc(4096, 0, NULL);
  CHECK(p != NULL, "alloc for the listing");
  ns = 0, nb = 0, nt = 0;
  NOOP(SYMM_OK, symm_pool_snapshot_list(NULL, &ns, NULL, &nb, NULL, &nt));
  CHECK(ns >= 1 && nb >= ns, "size query: %d segments, %d blocks", ns, nb);
  int need_s = ns, need_b = nb;
  ns = 1, nb = 0;
  BAD(SYMM_ERR_INVALID, "room to spare", symm_pool_snapshot_list(segs, &ns, blocks, &nb, NULL, NULL));
  CHECK(ns == need_s && nb == need_b, "too small: the counts needed (%d %d, want %d %d)", ns, nb, need_s, need_b);
  ns = 64, nb = 256;
  CHECK(symm_pool_snapshot_list(segs, &ns, blocks, &nb, NULL, NULL) == SYMM_OK, "listing: %s", symm_last_error());
  int found = 0;
  for (int i = 0, b = 0; i < ns; b += segs[i].nblocks, i++)
    for (int j = b; j < b + segs[i].nblocks; j++) {
      CHECK(blocks[j].segment_address == segs[i].address, "block %d lies in segment %d", j, i);
      found |= blocks[j].address == (uint64_t)(uintptr_t)p && blocks[j].state == SYMM_BLOCK_ALLOCATED &&
               blocks[j].requested_size == 4096 && segs[i].device == 0;
    }
  CHECK(found, "the live block is listed, allocated, on device 0");
  symm_pool_free(p, 4096, 0, NULL);
  /* With history: each device's events, and (as in PyTorch) the listing's
   * own "snapshot" event recorded after them, so only the next listing has
   * it, sized by the device's active bytes. Each entry carries the
   * annotation set when it happened. */
  BAD(SYMM_ERR_INVALID, "is NULL", symm_pool_set_annotation(NULL, ""));
  BAD(SYMM_ERR_INVALID, "is NULL", symm_pool_set_annotation("", NULL));
  BAD(SYMM_ERR_INVALID, "is NULL", symm_pool_set_annotation(NULL, NULL));
  CHECK(symm_pool_record_history(1, 8) == SYMM_OK, "history on");
  NOOP(SYMM_OK, symm_pool_set_annotation("meta", ""));
  void *h1 = symm_pool_alloc(512, 1, NULL);
  NOOP(SYMM_OK, symm_pool_set_annotation("", "region"));
  symm_pool_free(h1, 512, 1, NULL);
  NOOP(SYMM_OK, symm_pool_set_annotation("", ""));
  ns = 64, nb = 256, nt = 64;
  CHECK(symm_pool_snapshot_list(segs, &ns, blocks, &nb, traces, &nt) == SYMM_OK, "listing with traces: %s",
        symm_last_error());
  int last1 = -1, allocs1 = 0, frees1 = 0, snaps = 0;
  for (int i = 0; i < nt; i++) {
    snaps += traces[i].action == SYMM_TRACE_SNAPSHOT;
    CHECK(traces[i].user_metadata != NULL && traces[i].compile_context != NULL, "entry %d: annotation texts", i);
    if (traces[i].device == 1) {
      last1 = i;
      allocs1 += traces[i].action == SYMM_TRACE_ALLOC && traces[i].size == 512 &&
                 strcmp(traces[i].user_metadata, "meta") == 0 && strcmp(traces[i].compile_context, "N/A") == 0;
      frees1 += traces[i].action == SYMM_TRACE_FREE_REQUESTED && traces[i].size == 512 &&
                strcmp(traces[i].user_metadata, "") == 0 && strcmp(traces[i].compile_context, "region") == 0;
    }
  }
  CHECK(snaps == 0 && last1 >= 0 && traces[last1].action == SYMM_TRACE_FREE_COMPLETED && allocs1 == 1 && frees1 == 1,
        "device 1's events: its annotated alloc and free, no snapshot event yet (%d entries)", nt);
  ns = 64, nb = 256, nt = 64;
  CHECK(symm_pool_snapshot_list(segs, &ns, blocks, &nb, traces, &nt) == SYMM_OK, "second listing: %s",
        symm_last_error());
  uint64_t active1 = 0;
  for (int i = 0; i < ns; i++)
    if (segs[i].device == 1) active1 += segs[i].active_size;
  last1 = -1;
  for (int i = 0; i < nt; i++)
    if (traces[i].device == 1) last1 = i;
  CHECK(last1 >= 0 && traces[last1].action == SYMM_TRACE_SNAPSHOT && traces[last1].size == active1,
        "the next listing ends with the first one's snapshot event, sized by the active bytes (%llu)",
        (unsigned long long)active1);
  CHECK(symm_pool_record_history(0, 0) == SYMM_OK, "history off");
  ns = 64, nb = 256, nt = 64;
  CHECK(symm_pool_snapshot_list(segs, &ns, blocks, &nb, traces, &nt) == SYMM_OK && nt == 0,
        "off empties the history, as PyTorch's: %d entries", nt);
  BAD(SYMM_ERR_INVALID, "out is NULL", symm_pool_settings(NULL));
  symm_pool_settings_t st;
  NOOP(SYMM_OK, symm_pool_settings(&st));
  CHECK(st.alloc_conf != NULL, "settings text never NULL");
  /* The hook: told of a new segment, then nothing once unregistered. */
  int batches = 0;
  symm_pool_empty_cache();
  NOOP(SYMM_OK, symm_pool_set_segment_hook(count_hook, &batches));
  void *q = symm_pool_alloc(4096, 0, (void *)0x5e9);
  CHECK(q != NULL && hook_calls >= 1 && batches >= 1, "a new segment is told: %d events", hook_calls);
  CHECK(hook_rereg == SYMM_ERR_BUSY, "the hook cannot unregister itself from inside: %d", hook_rereg);
  NOOP(SYMM_OK, symm_pool_set_segment_hook(NULL, NULL));
  int before = hook_calls;
  symm_pool_free(q, 4096, 0, (void *)0x5e9);
  symm_pool_empty_cache();
  CHECK(hook_calls == before, "no event after unregistering");
  area("snapshot listings, hook", c0);
}

/* ---- what PyTorch's allocator interface asks ------------------------------------ */

static void test_pool_pytorch(void) {
  int c0 = passes + failures;
  symm_pool_id_t id = {21, 0}, unknown = {0, 78}, zero = {0, 0};
  size_t largest = 0;
  symm_block_info_t bl[16];
  uint64_t fr[16], al[16];
  int nf = 16, na = 16;
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BAD(SYMM_ERR_INVALID, word, symm_pool_cache_info(bad_devs[i], &largest));
    BAD(SYMM_ERR_INVALID, word, symm_pool_reset_accumulated(bad_devs[i]));
    BADR(-1, SYMM_ERR_INVALID, word, symm_pool_blocks(bad_devs[i], zero, bl, 16));
    BADR(-1, SYMM_ERR_INVALID, word, symm_pool_blocks(bad_devs[i], id, NULL, 0));
    BAD(SYMM_ERR_INVALID, word, symm_pool_restore_blocks(bad_devs[i], id, NULL, 0, fr, &nf, al, &na));
    BADR(0, SYMM_ERR_INVALID, word, symm_pool_alloc_segment(4096, bad_devs[i], SA));
  }
  BAD(SYMM_ERR_INVALID, "largest_block is NULL", symm_pool_cache_info(0, NULL));
  BADR(-1, SYMM_ERR_INVALID, "out is NULL", symm_pool_blocks(0, zero, NULL, 3));
  BADR(-1, SYMM_ERR_INVALID, "cap is negative", symm_pool_blocks(0, zero, bl, -1));
  BADR(-1, SYMM_ERR_INVALID, "(0, 78) on device 0: no such pool", symm_pool_blocks(0, unknown, bl, 16));
  BAD(SYMM_ERR_INVALID, "nfreed or nallocated is NULL", symm_pool_restore_blocks(0, id, NULL, 0, fr, NULL, al, &na));
  BAD(SYMM_ERR_INVALID, "nfreed or nallocated is NULL", symm_pool_restore_blocks(0, id, NULL, 0, fr, &nf, al, NULL));
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "want is NULL", symm_pool_restore_blocks(0, id, NULL, 2, fr, &nf, al, &na));
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "n is negative", symm_pool_restore_blocks(0, id, bl, -1, fr, &nf, al, &na));
  nf = -1, na = 16;
  BAD(SYMM_ERR_INVALID, "is negative", symm_pool_restore_blocks(0, id, bl, 0, fr, &nf, al, &na));
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "freed or allocated is NULL", symm_pool_restore_blocks(0, id, bl, 0, NULL, &nf, al, &na));
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "the default pool", symm_pool_restore_blocks(0, zero, NULL, 0, fr, &nf, al, &na));
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "(0, 78) on device 0: no such pool", symm_pool_restore_blocks(0, unknown, NULL, 0, fr, &nf, al, &na));
  /* A pool and a listing of it, then listings that are not its own. */
  CHECK(symm_pool_begin_allocate_to_pool(0, id, SA) == SYMM_OK, "begin");
  void *g = symm_pool_alloc(8192, 0, SA);
  CHECK(g != NULL, "a block in the pool");
  int n = symm_pool_blocks(0, id, bl, 16);
  CHECK(n == 2 && bl[0].address == (uintptr_t)g && bl[0].state == SYMM_BLOCK_ALLOCATED, "its listing: %d blocks", n);
  NOOP(n, symm_pool_blocks(0, id, NULL, 0));
  symm_block_info_t w[16];
  const struct {
    int field, delta;
    const char *word;
  } edits[] = {{0, 512, "crosses the boundary"}, {1, 1, "not a multiple of 512"}, {2, 5, "state 6"},
               {3, 1, "requested size 8193"}, {4, 0x10, "stream"}, {5, 1, "reserved"}, {6, 512, "is not one of the pool's"}};
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    memcpy(w, bl, sizeof bl[0] * n);
    symm_block_info_t *e = &w[edits[i].field == 0 ? 1 : 0];
    switch (edits[i].field) {
      case 0: e->size += edits[i].delta; break;
      case 1: e->address += edits[i].delta; break;
      case 2: e->state = 1 + edits[i].delta; break;
      case 3: e->requested_size = e->size + edits[i].delta; break;
      case 4: e->stream += edits[i].delta; break;
      case 5: e->reserved = edits[i].delta; break;
      default: e->segment_address += edits[i].delta; break;
    }
    nf = na = 16;
    BAD(SYMM_ERR_INVALID, edits[i].word, symm_pool_restore_blocks(0, id, w, n, fr, &nf, al, &na));
  }
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "a gap", symm_pool_restore_blocks(0, id, &bl[1], 1, fr, &nf, al, &na));
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "its blocks end at offset 8192", symm_pool_restore_blocks(0, id, bl, 1, fr, &nf, al, &na));
  nf = na = 16;
  NOOP(SYMM_OK, symm_pool_restore_blocks(0, id, bl, n, fr, &nf, al, &na));
  CHECK(nf == 0 && na == 0, "restoring the pool's own state changes nothing");
  symm_pool_free(g, 8192, 0, SA);
  nf = na = 0;
  BAD(SYMM_ERR_INVALID, "would free 0 blocks and allocate 1", symm_pool_restore_blocks(0, id, bl, n, NULL, &nf, NULL, &na));
  CHECK(nf == 0 && na == 1, "the counts needed: %d, %d", nf, na);
  CHECK(symm_pool_end_allocate_to_pool(0, id) == SYMM_OK && symm_pool_release_pool(0, id) == SYMM_OK, "end, release");
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "the pool was released", symm_pool_restore_blocks(0, id, bl, n, fr, &nf, al, &na));
  symm_pool_empty_cache();
  nf = na = 16;
  BAD(SYMM_ERR_INVALID, "no such pool", symm_pool_restore_blocks(0, id, bl, n, fr, &nf, al, &na));
  BADR(-1, SYMM_ERR_INVALID, "no such pool", symm_pool_blocks(0, id, bl, 16));
  /* Segments: size 0 is NULL and no error; more than the device, refused. */
  NOOP(0, symm_pool_alloc_segment(0, 0, SA));
  NOOP(0, symm_pool_alloc_segment(0, -1, SA));
  CALL(F_OOM, 0, SYMM_ERR_OUT_OF_MEMORY, "symm_pool_alloc_segment", symm_pool_alloc_segment(2 * GiB, 0, SA));
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "requested 18446744073709551615 bytes", symm_pool_alloc_segment(SIZE_MAX, 1, SB));
  area("cacheInfo, blocks, restore", c0);
}

/* The facts libsymm owns for PyTorch: the memory fraction, run-time settings,
 * the driver's functions, the extension's allocator object. */
static void test_pool_owners(void) {
  int c0 = passes + failures;
  double f = -1;
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BAD(SYMM_ERR_INVALID, word, symm_pool_memory_fraction(bad_devs[i], &f));
  }
  BAD(SYMM_ERR_INVALID, "fraction is NULL", symm_pool_memory_fraction(0, NULL));
  NOOP(SYMM_OK, symm_pool_memory_fraction(0, &f));
  CHECK(f == 1.0, "no cap: fraction 1, not %g", f);
  symm_pool_set_memory_fraction(0.5, 1);
  CHECK(symm_pool_memory_fraction(1, &f) == SYMM_OK && f == 0.5, "the fraction set: %g", f);
  CHECK(symm_pool_memory_fraction(0, &f) == SYMM_OK && f == 1.0, "device 0 keeps its own: %g", f);
  symm_pool_set_memory_fraction(1.0, 1);
  CHECK(symm_pool_memory_fraction(1, &f) == SYMM_OK && f == 1.0, "back to 1: %g", f);

  BAD(SYMM_ERR_INVALID, "settings is NULL", symm_pool_set_allocator_settings(NULL));
  BAD(SYMM_ERR_INVALID, "bogus_key", symm_pool_set_allocator_settings("bogus_key:1"));
  BAD(SYMM_ERR_INVALID, "max_split_size_mb", symm_pool_set_allocator_settings("max_split_size_mb:lots"));
  BAD(SYMM_ERR_INVALID, "per_process_memory_fraction", symm_pool_set_allocator_settings("per_process_memory_fraction:2"));
  CHECK(symm_pool_memory_fraction(0, &f) == SYMM_OK && f == 1.0, "a refused text changes nothing: %g", f);
  BAD(SYMM_ERR_INVALID, "large_segment_size_mb", symm_pool_set_allocator_settings("large_segment_size_mb:5"));
  /* The pool's settings apply to what comes next; the defaults again. */
  NOOP(SYMM_OK, symm_pool_set_allocator_settings("large_segment_size_mb:64"));
  NOOP(SYMM_OK, symm_pool_set_allocator_settings("large_segment_size_mb:20"));
  /* As on PyTorch's allocator, a run-time fraction changes nothing. */
  NOOP(SYMM_OK, symm_pool_set_allocator_settings("per_process_memory_fraction:0.25"));
  CHECK(symm_pool_memory_fraction(0, &f) == SYMM_OK && f == 1.0 && symm_pool_memory_fraction(1, &f) == SYMM_OK &&
            f == 1.0,
        "the fraction of a settings call is left alone: %g", f);

  BADR(0, SYMM_ERR_INVALID, "name is NULL", symm_driver_proc(NULL));
  /* The host backend has no driver: NULL, and no error. */
  NOOP(0, symm_driver_proc("cuStreamIsCapturing"));
  /* Naming an object (or none) is no mode of its own: nothing changes. */
  BADV(SYMM_OK, NULL, symm_torch_own_allocator(NULL));
  CHECK(symm_torch_mode() == 0, "no PyTorch here: mode %d", symm_torch_mode());
  area("fraction, settings, driver", c0);
}

/* ---- symmetric memory ------------------------------------------------------- */

static symm_store_t st_main; /* the store of every area below */
static char st_addr[64];

static void test_symm_alloc_free(void) {
  int c0 = passes + failures;
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BADR(0, SYMM_ERR_INVALID, word, symm_alloc(4096, bad_devs[i], NULL));
    BADR(0, SYMM_ERR_INVALID, word, symm_alloc(SIZE_MAX, bad_devs[i], NULL));
  }
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "18446744073709551615 bytes", symm_alloc(SIZE_MAX, 0, NULL));
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "18446744073709551600 bytes", symm_alloc(SIZE_MAX - 15, 1, NULL));
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "2147483648 bytes", symm_alloc(2 * GiB, 0, NULL));
  BADR(0, SYMM_ERR_OUT_OF_MEMORY, "1073741825 bytes", symm_alloc(GiB + 1, 1, NULL));
  NOOP(0, symm_alloc(0, 0, NULL));
  NOOP(0, symm_alloc(0, -1, NULL));

  unsigned char *p = symm_alloc(64 * 1024, 1, NULL);
  CHECK(p != NULL, "symm_alloc on device 1");
  NOOP(0, (symm_free(NULL, 0, 0, NULL), 0));
  BADV(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_free((void *)0xdead000, 0, 0, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(p + 64), symm_free(p + 64, 64 * 1024, 1, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(p - 4096), symm_free(p - 4096, 0, 0, NULL));
  /* Each allocator refuses the other's pointers. */
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(pa), symm_free(pa, 4096, 0, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(p), symm_pool_free(p, 64 * 1024, 1, NULL));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(p), symm_pool_record_stream(p, NULL));
  /* The block survived all that: it rendezvouses. */
  symm_handle_t h = 0;
  CHECK(symm_rendezvous(p, st_main, "alive", 0, 1, &h) == SYMM_OK, "the block is still live");
  symm_clear_error();
  symm_free(p, 64 * 1024, 1, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free");
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(p), symm_free(p, 64 * 1024, 1, NULL));

  /* Multicast: always 0, whatever the device. */
  for (int i = 0; i < NBAD_DEVS; i++) NOOP(0, symm_has_multicast_support(bad_devs[i]));
  NOOP(0, symm_has_multicast_support(0));
  area("symm_alloc/free/multicast", c0);
}

/* Before the first symmetric call: the backend can still be chosen. */
static void test_backend_before_use(void) {
  int c0 = passes + failures;
  char buf[64];
  BAD(SYMM_ERR_INVALID, "name is NULL", symm_set_backend(NULL));
  BAD(SYMM_ERR_INVALID, "\"tpu\"", symm_set_backend("tpu"));
  BAD(SYMM_ERR_INVALID, "backend \"\"", symm_set_backend(""));
  BAD(SYMM_ERR_INVALID, "\"CUDA\"", symm_set_backend("CUDA"));
  BAD(SYMM_ERR_INVALID, "\"host \"", symm_set_backend("host "));
  char longname[5000];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  BAD(SYMM_ERR_INVALID, "backend", symm_set_backend(longname));
  CHECK(symm_get_backend(buf, sizeof buf) == SYMM_OK && strcmp(buf, "host") == 0, "still host: %s", buf);
  NOOP(SYMM_OK, symm_set_backend("host"));
  area("symm_set_backend (before)", c0);
}

static void test_backends(void) {
  int c0 = passes + failures;
  char buf[64];
  /* Chosen once: after the first symmetric call only the one in use. */
  BAD(SYMM_ERR_INVALID, "already runs on the host backend", symm_set_backend("cuda"));
  BAD(SYMM_ERR_INVALID, "already runs on the host backend", symm_set_backend("nvshmem"));
  BAD(SYMM_ERR_INVALID, "already runs on the host backend", symm_set_backend("nccl"));
  BAD(SYMM_ERR_INVALID, "\"tpu\"", symm_set_backend("tpu"));
  NOOP(SYMM_OK, symm_set_backend("host"));

  memset(buf, 'x', sizeof buf);
  BAD(SYMM_ERR_INVALID, "buf is NULL", symm_get_backend(NULL, 64));
  BAD(SYMM_ERR_INVALID, "8 bytes", symm_get_backend(buf, 0));
  BAD(SYMM_ERR_INVALID, "8 bytes", symm_get_backend(buf, 7));
  CHECK(buf[0] == 'x', "nothing written into a buffer refused");
  NOOP(SYMM_OK, symm_get_backend(buf, 8));
  CHECK(strcmp(buf, "host") == 0, "host: %s", buf);
  memset(buf, 'x', sizeof buf);
  NOOP(SYMM_OK, symm_get_backend(buf, SIZE_MAX)); /* only the name and its NUL are written */
  CHECK(strcmp(buf, "host") == 0 && buf[5] == 'x', "host, 5 bytes: %.8s", buf);

  /* NVSHMEM and NCCL are not installed here: 0, SYMM_ERR_NO_DEVICE, and why. */
  if (symm_nvshmem_available() == 0)
    CALL(0, 0, SYMM_ERR_NO_DEVICE, "NVSHMEM", symm_nvshmem_available());
  else
    printf("  (NVSHMEM is available here: its refusal is not tested)\n");
  if (symm_nccl_available() == 0)
    CALL(0, 0, SYMM_ERR_NO_DEVICE, "NCCL", symm_nccl_available());
  else
    printf("  (NCCL is available here: its refusal is not tested)\n");
  cover("symm_nvshmem_available");
  cover("symm_nccl_available");

  /* Wrong order: there is no NCCL backend to hand a communicator to. */
  BAD(SYMM_ERR_INVALID, "host backend", symm_nccl_adopt_comm(NULL, 0));
  BAD(SYMM_ERR_INVALID, "host backend", symm_nccl_adopt_comm((void *)0x1234, 0));
  BAD(SYMM_ERR_INVALID, "host backend", symm_nccl_adopt_comm((void *)0x1234, -1));
  BAD(SYMM_ERR_INVALID, "host backend", symm_nccl_adopt_comm(NULL, INT_MIN));

  /* backend_init only checks its arguments here. */
  BAD(SYMM_ERR_INVALID, "0 is not a live store handle", symm_backend_init(0, 0, 1, 0));
  BAD(SYMM_ERR_INVALID, "-1 is not a live store handle", symm_backend_init(-1, 0, 1, 0));
  BAD(SYMM_ERR_INVALID, "store handle", symm_backend_init(st_main + 1000, 0, 1, 0));
  BAD(SYMM_ERR_INVALID, "rank -1", symm_backend_init(st_main, -1, 1, 0));
  BAD(SYMM_ERR_INVALID, "rank 1, world 1", symm_backend_init(st_main, 1, 1, 0));
  BAD(SYMM_ERR_INVALID, "world 0", symm_backend_init(st_main, 0, 0, 0));
  BAD(SYMM_ERR_INVALID, "world -4", symm_backend_init(st_main, 0, -4, 0));
  BAD(SYMM_ERR_INVALID, "rank -2147483648", symm_backend_init(st_main, INT_MIN, INT_MIN, 0));
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BAD(SYMM_ERR_INVALID, word, symm_backend_init(st_main, 0, 1, bad_devs[i]));
  }
  NOOP(SYMM_OK, symm_backend_init(st_main, 0, 1, 1));
  area("backends", c0);
}

static void test_topology(void) {
  int c0 = passes + failures;
  size_t n = 0, got = 12345;
  NOOP(SYMM_OK, symm_topology(NULL, NULL, 0, &n));
  CHECK(n > 20, "size query: %zu", n);
  char *buf = malloc(n + 64);
  BAD(SYMM_ERR_INVALID, "len is NULL", symm_topology(NULL, NULL, 0, NULL));
  BAD(SYMM_ERR_INVALID, "len is NULL", symm_topology(NULL, buf, n + 1, NULL));
  memset(buf, 'x', n + 64);
  BAD(SYMM_ERR_INVALID, "needs", symm_topology(NULL, buf, 1, &got));
  BAD(SYMM_ERR_INVALID, "needs", symm_topology(NULL, buf, n, &got)); /* no room for the NUL */
  CHECK(buf[0] == 'x' && buf[n - 1] == 'x', "nothing written into a buffer too small");
  /* A size query, not an error: buf NULL with a capacity, or capacity 0. */
  NOOP(SYMM_OK, symm_topology(NULL, NULL, 100, &got));
  NOOP(SYMM_OK, symm_topology(NULL, buf, 0, &got));
  CHECK(buf[0] == 'x', "nothing written by a size query");
  /* Directories that do not exist or are not directories are just not searched. */
  const char *dirs = "::/nonexistent:/dev/null:\x01:";
  size_t nd = 0;
  NOOP(SYMM_OK, symm_topology(dirs, NULL, 0, &nd));
  char *bd = malloc(nd + 1);
  NOOP(SYMM_OK, symm_topology(dirs, bd, nd + 1, &got));
  CHECK(got == nd && strlen(bd) == nd, "JSON of %zu bytes", nd);
  free(bd);
  /* Only the JSON and its NUL are written, whatever the capacity claims. */
  memset(buf, 'x', n + 64);
  NOOP(SYMM_OK, symm_topology(NULL, buf, SIZE_MAX, &got));
  CHECK(got == n && buf[n] == 0 && buf[n + 1] == 'x', "JSON of %zu bytes and a NUL", got);
  free(buf);
  area("symm_topology", c0);

  /* Library directories: NULL and a relative entry are refused by name, and
   * nothing of the list is kept; missing and empty entries are no error. */
  c0 = passes + failures;
  BAD(SYMM_ERR_INVALID, "dirs is NULL", symm_add_library_dirs(NULL));
  BAD(SYMM_ERR_INVALID, "\"relative/dir\" is not an absolute path", symm_add_library_dirs("/tmp:relative/dir"));
  NOOP(SYMM_OK, symm_add_library_dirs(""));
  NOOP(SYMM_OK, symm_add_library_dirs("::/nonexistent/libsymm-test:"));
  area("symm_add_library_dirs", c0);
}

/* ---- stores ------------------------------------------------------------------ */

static void test_stores(void) {
  int c0 = passes + failures;
  symm_store_t s = 777, closed = 0;
  char bound[64];
  size_t len = 777;

  /* A store handle after close. */
  CHECK(symm_store_server("", "", &closed, bound, sizeof bound) == SYMM_OK, "a server to close");
  char closed_addr[64];
  snprintf(closed_addr, sizeof closed_addr, "%s", bound);
  CHECK(symm_store_close(closed) == SYMM_OK, "close");
  /* Nobody listens there any more (tried before another server may take the port). */
  BAD(SYMM_ERR_TIMEOUT, closed_addr, symm_store_connect(closed_addr, "", 100, &s));
  BAD(SYMM_ERR_TIMEOUT, closed_addr, symm_store_connect(closed_addr, NULL, -5, &s));
  BAD(SYMM_ERR_TIMEOUT, closed_addr, symm_store_connect(closed_addr, NULL, INT_MIN, &s));

  /* symm_store_server */
  BAD(SYMM_ERR_INVALID, "out is NULL", symm_store_server("", "", NULL, bound, sizeof bound));
  BAD(SYMM_ERR_INVALID, "bogus:addr:99", symm_store_server("bogus:addr:99", "", &s, bound, sizeof bound));
  BAD(SYMM_ERR_INVALID, "99999", symm_store_server("127.0.0.1:99999", "", &s, bound, sizeof bound));
  BAD(SYMM_ERR_INVALID, "in use", symm_store_server(st_addr, "", &s, bound, sizeof bound));
  static char longtok[10000];
  memset(longtok, 't', sizeof longtok - 1);
  BAD(SYMM_ERR_INVALID, "token", symm_store_server("", longtok, &s, bound, sizeof bound));
  CHECK(s == 777, "*out untouched by a refused server");
  /* bound: NULL, one byte, or a capacity beyond the buffer: only the address is written. */
  symm_store_t t = 0;
  CHECK(symm_store_server("", "", &t, NULL, 100) == SYMM_OK && symm_store_close(t) == SYMM_OK, "bound NULL");
  memset(bound, 'x', sizeof bound);
  CHECK(symm_store_server("", "", &t, bound, 1) == SYMM_OK && bound[0] == 0 && bound[1] == 'x', "bound of one byte");
  CHECK(symm_store_close(t) == SYMM_OK, "close");
  memset(bound, 'x', sizeof bound);
  symm_clear_error();
  CHECK(symm_store_server("", "", &t, bound, SIZE_MAX) == SYMM_OK && strchr(bound, ':') != NULL,
        "bound with capacity SIZE_MAX: %.20s", bound);
  CHECK(symm_store_close(t) == SYMM_OK, "close");

  /* symm_store_connect */
  BAD(SYMM_ERR_INVALID, "addr or out is NULL", symm_store_connect(NULL, "", 100, &s));
  BAD(SYMM_ERR_INVALID, "addr or out is NULL", symm_store_connect(st_addr, "", 100, NULL));
  BAD(SYMM_ERR_INVALID, "no server address", symm_store_connect("", "", 100, &s));
  BAD(SYMM_ERR_INVALID, "missing port", symm_store_connect("nonsense", "", 100, &s));
  BAD(SYMM_ERR_INVALID, "token", symm_store_connect(st_addr, longtok, 100, &s));
  symm_store_t locked = 0;
  char locked_addr[64];
  CHECK(symm_store_server("", "secret", &locked, locked_addr, sizeof locked_addr) == SYMM_OK, "a server with a token");
  BAD(SYMM_ERR_INVALID, "authentication failed", symm_store_connect(locked_addr, "wrong", 1000, &s));
  BAD(SYMM_ERR_INVALID, "authentication failed", symm_store_connect(locked_addr, NULL, 1000, &s));
  CHECK(s == 777, "*out untouched by a refused connect");
  CHECK(symm_store_close(locked) == SYMM_OK, "close");

  /* set / get / add on handles that are not live */
  const symm_store_t dead[] = {0, -1, 12345, closed, INT64_MIN, INT64_MAX};
  for (size_t i = 0; i < sizeof dead / sizeof dead[0]; i++) {
    char word[64];
    snprintf(word, sizeof word, "%lld is not a live store handle", (long long)dead[i]);
    int64_t out = 5;
    BAD(SYMM_ERR_INVALID, word, symm_store_set(dead[i], "k", "v", 1));
    BAD(SYMM_ERR_INVALID, word, symm_store_get(dead[i], "k", bound, sizeof bound, &len, 10));
    BAD(SYMM_ERR_INVALID, word, symm_store_add(dead[i], "k", 1, &out));
    BAD(SYMM_ERR_INVALID, word, symm_store_close(dead[i]));
    CHECK(out == 5 && len == 777, "outputs untouched");
  }

  /* symm_store_set */
  CHECK(symm_store_set(st_main, "k", "old", 3) == SYMM_OK, "set k");
  static char longkey[5000];
  memset(longkey, 'k', sizeof longkey - 1);
  BAD(SYMM_ERR_INVALID, "key or value is NULL", symm_store_set(st_main, NULL, "v", 1));
  BAD(SYMM_ERR_INVALID, "key or value is NULL", symm_store_set(st_main, "k", NULL, 3));
  BAD(SYMM_ERR_INVALID, "4999 bytes", symm_store_set(st_main, longkey, "v", 1));
  BAD(SYMM_ERR_INVALID, "UTF-8", symm_store_set(st_main, "\xff\xfe", "v", 1));
  BAD(SYMM_ERR_INVALID, "18446744073709551615 bytes", symm_store_set(st_main, "k", "new", SIZE_MAX));
  BAD(SYMM_ERR_INVALID, "4294967297 bytes", symm_store_set(st_main, "k", "new", (1ull << 32) + 1));
  size_t huge = 64 * MiB + 1;
  char *hv = calloc(1, huge);
  BAD(SYMM_ERR_INVALID, "67108865 bytes", symm_store_set(st_main, "k", hv, huge));
  free(hv);
  char got[64] = {0};
  CHECK(symm_store_get(st_main, "k", got, sizeof got, &len, 1000) == SYMM_OK && len == 3 && !memcmp(got, "old", 3),
        "k unchanged by the refused sets: %.*s", (int)len, got);
  NOOP(SYMM_OK, symm_store_set(st_main, "empty", NULL, 0)); /* an empty value is a value */

  /* symm_store_get */
  len = 777;
  BAD(SYMM_ERR_INVALID, "key, len or buf is NULL", symm_store_get(st_main, NULL, got, sizeof got, &len, 10));
  BAD(SYMM_ERR_INVALID, "key, len or buf is NULL", symm_store_get(st_main, "k", got, sizeof got, NULL, 10));
  BAD(SYMM_ERR_INVALID, "key, len or buf is NULL", symm_store_get(st_main, "k", NULL, 4, &len, 10));
  BAD(SYMM_ERR_INVALID, "4999 bytes", symm_store_get(st_main, longkey, got, sizeof got, &len, 10));
  BAD(SYMM_ERR_TIMEOUT, "\"missing\"", symm_store_get(st_main, "missing", got, sizeof got, &len, 20));
  BAD(SYMM_ERR_TIMEOUT, "\"missing\"", symm_store_get(st_main, "missing", got, sizeof got, &len, 0));
  BAD(SYMM_ERR_TIMEOUT, "\"missing\"", symm_store_get(st_main, "missing", got, sizeof got, &len, -1));
  BAD(SYMM_ERR_TIMEOUT, "\"missing\"", symm_store_get(st_main, "missing", got, sizeof got, &len, INT_MIN));
  CHECK(len == 777, "*len untouched by a failed get");
  /* A buffer too small is not an error: cap bytes, and the full length. */
  memset(got, 'x', sizeof got);
  NOOP(SYMM_OK, symm_store_get(st_main, "k", got, 2, &len, 10));
  CHECK(len == 3 && got[0] == 'o' && got[1] == 'l' && got[2] == 'x', "2 of 3 bytes, len 3");
  NOOP(SYMM_OK, symm_store_get(st_main, "k", NULL, 0, &len, 10));
  memset(got, 'x', sizeof got);
  NOOP(SYMM_OK, symm_store_get(st_main, "k", got, SIZE_MAX, &len, 10)); /* only the value is written */
  CHECK(len == 3 && !memcmp(got, "old", 3) && got[3] == 'x', "the value and nothing after it");

  /* symm_store_add */
  int64_t out = 5;
  BAD(SYMM_ERR_INVALID, "key is NULL", symm_store_add(st_main, NULL, 1, &out));
  BAD(SYMM_ERR_INVALID, "4999 bytes", symm_store_add(st_main, longkey, 1, &out));
  BAD(SYMM_ERR_INVALID, "not a decimal int64", symm_store_add(st_main, "k", 1, &out));
  BAD(SYMM_ERR_INVALID, "not a decimal int64", symm_store_add(st_main, "empty", 1, &out));
  CHECK(symm_store_set(st_main, "n", "9223372036854775807", 19) == SYMM_OK, "n = INT64_MAX");
  BAD(SYMM_ERR_INVALID, "overflows", symm_store_add(st_main, "n", 1, &out));
  CHECK(symm_store_add(st_main, "m", -1, NULL) == SYMM_OK, "m = -1, out NULL");
  BAD(SYMM_ERR_INVALID, "overflows", symm_store_add(st_main, "m", INT64_MIN, &out));
  CHECK(out == 5, "*out untouched by a failed add");
  CHECK(symm_store_add(st_main, "n", 0, &out) == SYMM_OK && out == INT64_MAX, "n unchanged");
  CHECK(symm_store_get(st_main, "k", got, sizeof got, &len, 10) == SYMM_OK && len == 3 && !memcmp(got, "old", 3),
        "k unchanged by the refused adds");
  area("symm_store_*", c0);
}

/* ---- rendezvous and signals ------------------------------------------------- */

static void test_rendezvous(unsigned char *p, symm_handle_t h) {
  int c0 = passes + failures;
  symm_handle_t out = 777;
  BAD(SYMM_ERR_INVALID, "group or out is NULL", symm_rendezvous(p, st_main, NULL, 0, 1, &out));
  BAD(SYMM_ERR_INVALID, "group or out is NULL", symm_rendezvous(p, st_main, "solo", 0, 1, NULL));
  BAD(SYMM_ERR_INVALID, "group \"\"", symm_rendezvous(p, st_main, "", 0, 1, &out));
  BAD(SYMM_ERR_INVALID, "rank -1, world 1", symm_rendezvous(p, st_main, "g", -1, 1, &out));
  BAD(SYMM_ERR_INVALID, "rank 1, world 1", symm_rendezvous(p, st_main, "g", 1, 1, &out));
  BAD(SYMM_ERR_INVALID, "rank 0, world 0", symm_rendezvous(p, st_main, "g", 0, 0, &out));
  BAD(SYMM_ERR_INVALID, "world -3", symm_rendezvous(p, st_main, "g", 0, -3, &out));
  BAD(SYMM_ERR_INVALID, "rank -2147483648", symm_rendezvous(p, st_main, "g", INT_MIN, INT_MAX, &out));
  BAD(SYMM_ERR_INVALID, "world size 513", symm_rendezvous(p, st_main, "g", 0, 513, &out));
  BAD(SYMM_ERR_INVALID, "0 is not a live store handle", symm_rendezvous(p, 0, "g", 0, 1, &out));
  BAD(SYMM_ERR_INVALID, "store handle", symm_rendezvous(p, st_main + 1000, "g", 0, 1, &out));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0x0", symm_rendezvous(NULL, st_main, "g", 0, 1, &out));
  BAD(SYMM_ERR_UNKNOWN_POINTER, "0xdead000", symm_rendezvous((void *)0xdead000, st_main, "g", 0, 1, &out));
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(pa), symm_rendezvous(pa, st_main, "g", 0, 1, &out));
  /* The block again with its group, as another rank or world. */
  BAD(SYMM_ERR_INVALID, "\"solo\"", symm_rendezvous(p, st_main, "solo", 0, 2, &out));
  BAD(SYMM_ERR_INVALID, "\"solo\"", symm_rendezvous(p + 100, st_main, "solo", 1, 2, &out));
  CHECK(out == 777, "*out untouched by a refused rendezvous");
  /* A peer that never comes: the timeout (SYMM_TIMEOUT_MS=300), naming it. */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  BAD(SYMM_ERR_TIMEOUT, "rank 1", symm_rendezvous(p, st_main, "nobody", 0, 2, &out));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  CHECK(secs < 5, "within the timeout: %.2f s", secs);
  /* The same block and group: the same handle, from any address inside. */
  NOOP(SYMM_OK, symm_rendezvous(p + 100, st_main, "solo", 0, 1, &out));
  CHECK(out == h, "the same handle");

  /* symm_handle_info */
  symm_handle_info_t info;
  memset(&info, 0x5a, sizeof info);
  BAD(SYMM_ERR_INVALID, "out is NULL", symm_handle_info(h, NULL));
  const symm_handle_t bogus[] = {0, -1, 12345, h + 1000, INT64_MIN, INT64_MAX};
  for (size_t i = 0; i < sizeof bogus / sizeof bogus[0]; i++) {
    char word[80];
    snprintf(word, sizeof word, "%lld is not a live symmetric-memory handle", (long long)bogus[i]);
    BAD(SYMM_ERR_INVALID, word, symm_handle_info(bogus[i], &info));
  }
  CHECK(info.rank == 0x5a5a5a5a, "info untouched by a refused call");

  /* symm_world_within_direct_access */
  int d = 7;
  BAD(SYMM_ERR_INVALID, "group or out is NULL", symm_world_within_direct_access(st_main, NULL, 0, 1, 0, &d));
  BAD(SYMM_ERR_INVALID, "group or out is NULL", symm_world_within_direct_access(st_main, "g", 0, 1, 0, NULL));
  BAD(SYMM_ERR_INVALID, "group \"\"", symm_world_within_direct_access(st_main, "", 0, 1, 0, &d));
  BAD(SYMM_ERR_INVALID, "rank -1", symm_world_within_direct_access(st_main, "g", -1, 1, 0, &d));
  BAD(SYMM_ERR_INVALID, "rank 2, world 2", symm_world_within_direct_access(st_main, "g", 2, 2, 0, &d));
  BAD(SYMM_ERR_INVALID, "world 0", symm_world_within_direct_access(st_main, "g", 0, 0, 0, &d));
  BAD(SYMM_ERR_INVALID, "world -2147483648", symm_world_within_direct_access(st_main, "g", 0, INT_MIN, 0, &d));
  BAD(SYMM_ERR_INVALID, "0 is not a live store handle", symm_world_within_direct_access(0, "g", 0, 1, 0, &d));
  BAD(SYMM_ERR_INVALID, "store handle", symm_world_within_direct_access(st_main + 1000, "g", 0, 1, 0, &d));
  for (int i = 0; i < NBAD_DEVS; i++) {
    char word[32];
    snprintf(word, sizeof word, "device %d", bad_devs[i]);
    BAD(SYMM_ERR_INVALID, word, symm_world_within_direct_access(st_main, "g", 0, 1, bad_devs[i], &d));
  }
  CHECK(d == 7, "*out untouched by a refused call");
  NOOP(SYMM_OK, symm_world_within_direct_access(st_main, "g", 0, 1, 0, &d));
  CHECK(d == 1, "host memory: direct access");
  area("symm_rendezvous/handle_info/...", c0);
}

static void test_signals(unsigned char *p, symm_handle_t h) {
  int c0 = passes + failures;
  /* h: a world of one, rank 0. */
  const int bad_ranks[] = {-1, 1, INT_MIN, INT_MAX};
  const int bad_channels[] = {-1, 512, INT_MAX, INT_MIN};
  for (int i = 0; i < 4; i++) {
    char word[32];
    snprintf(word, sizeof word, "destination rank %d outside", bad_ranks[i]);
    BAD(SYMM_ERR_INVALID, word, symm_put_signal(h, bad_ranks[i], 0, NULL));
    snprintf(word, sizeof word, "source rank %d outside", bad_ranks[i]);
    BAD(SYMM_ERR_INVALID, word, symm_wait_signal(h, bad_ranks[i], 0, NULL, 10));
    snprintf(word, sizeof word, "channel %d", bad_channels[i]);
    BAD(SYMM_ERR_INVALID, word, symm_put_signal(h, 0, bad_channels[i], NULL));
    BAD(SYMM_ERR_INVALID, word, symm_wait_signal(h, 0, bad_channels[i], NULL, 10));
    BAD(SYMM_ERR_INVALID, word, symm_barrier(h, bad_channels[i], NULL, 10));
  }
  /* A negative timeout is refused (0 means: no timeout on GPUs, SYMM_TIMEOUT_MS on host). */
  BAD(SYMM_ERR_INVALID, "timeout_ms -1 is negative", symm_wait_signal(h, 0, 3, NULL, -1));
  BAD(SYMM_ERR_INVALID, "timeout_ms -5 is negative", symm_barrier(h, 0, NULL, -5));
  /* A second put that nobody takes does not hang on the host backend: the
   * first one fills the slot, the second waits at most SYMM_TIMEOUT_MS (set
   * to 300 ms for this program) and reports it; the waits then clear it. */
  NOOP(SYMM_OK, symm_put_signal(h, 0, 7, NULL));
  BAD(SYMM_ERR_TIMEOUT, "has not taken our previous signal", symm_put_signal(h, 0, 7, NULL));
  NOOP(SYMM_OK, symm_wait_signal(h, 0, 7, NULL, 1000));
  /* A signal nobody sent: the timeout, naming the rank and channel. */
  BAD(SYMM_ERR_TIMEOUT, "rank 0 on channel 3", symm_wait_signal(h, 0, 3, NULL, 20));
  BAD(SYMM_ERR_TIMEOUT, "timed out", symm_wait_signal(h, 0, 511, (void *)2, 1));
  /* The pads are as they were: a signal goes round. */
  symm_handle_info_t info;
  CHECK(symm_handle_info(h, &info) == SYMM_OK && info.world_size == 1 && info.rank == 0, "info");
  uint32_t *pad = ((uint32_t **)info.signal_pad_ptrs)[0];
  int zero = 1;
  for (size_t i = 0; i < info.signal_pad_size / 4; i++) zero &= pad[i] == 0;
  CHECK(zero, "every slot still 0");
  NOOP(SYMM_OK, symm_put_signal(h, 0, 511, NULL));
  NOOP(SYMM_OK, symm_wait_signal(h, 0, 511, NULL, 1000));
  NOOP(SYMM_OK, symm_barrier(h, 0, NULL, 1000));
  /* symm_reset_signal_pad: a pad left dirty comes back zero (a world of
   * one agrees with itself), and signals go round again. */
  BAD(SYMM_ERR_INVALID, "timeout_ms -1 is negative", symm_reset_signal_pad(h, -1));
  BAD(SYMM_ERR_INVALID, "is not a live symmetric-memory handle", symm_reset_signal_pad(h + 1000, 0));
  BAD(SYMM_ERR_INVALID, "0 is not a live symmetric-memory handle", symm_reset_signal_pad(0, 0));
  NOOP(SYMM_OK, symm_put_signal(h, 0, 9, NULL));
  CHECK(pad[9] == 1, "the put left its slot set: %u", pad[9]);
  NOOP(SYMM_OK, symm_reset_signal_pad(h, 0));
  zero = 1;
  for (size_t i = 0; i < info.signal_pad_size / 4; i++) zero &= pad[i] == 0;
  CHECK(zero, "every slot 0 after the reset");
  NOOP(SYMM_OK, symm_reset_signal_pad(h, 1000));
  /* symm_reset_signal_pad_if_any: a world of one resets when it wants to,
   * and only then. */
  int reset = 7;
  BAD(SYMM_ERR_INVALID, "want 2 is neither 0 nor 1", symm_reset_signal_pad_if_any(h, 2, 0, &reset));
  BAD(SYMM_ERR_INVALID, "timeout_ms -1 is negative", symm_reset_signal_pad_if_any(h, 1, -1, &reset));
  BAD(SYMM_ERR_INVALID, "0 is not a live symmetric-memory handle", symm_reset_signal_pad_if_any(0, 1, 0, &reset));
  NOOP(SYMM_OK, symm_put_signal(h, 0, 9, NULL));
  NOOP(SYMM_OK, symm_reset_signal_pad_if_any(h, 0, 0, &reset));
  CHECK(reset == 0 && pad[9] == 1, "nobody wanted a reset: reset %d, slot %u", reset, pad[9]);
  NOOP(SYMM_OK, symm_reset_signal_pad_if_any(h, 1, 0, &reset));
  CHECK(reset == 1 && pad[9] == 0, "a reset wanted: reset %d, slot %u", reset, pad[9]);
  NOOP(SYMM_OK, symm_reset_signal_pad_if_any(h, 1, 0, NULL));
  NOOP(SYMM_OK, symm_put_signal(h, 0, 9, NULL));
  NOOP(SYMM_OK, symm_wait_signal(h, 0, 9, NULL, 1000));
  /* The all-reduce: every bad argument refused by name, then a world of one
   * sums to its own input. */
  float in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = (float)i - 20.5f;
  memcpy(p, in, sizeof in);
  BAD(SYMM_ERR_INVALID, "dtype 3", symm_one_shot_all_reduce(h, 0, 64, 3, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "dtype -1", symm_one_shot_all_reduce(h, 0, 64, -1, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "op 1", symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, 1, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "output is NULL", symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "overlaps", symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, p + 128, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "multiples of 4", symm_one_shot_all_reduce(h, 6, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "multiples of 4", symm_one_shot_all_reduce(h, 0, 63, SYMM_BFLOAT16, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "4-byte aligned",
      symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, (char *)out + 2, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "do not fit", symm_one_shot_all_reduce(h, 0, SIZE_MAX / 8, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "overflow", symm_one_shot_all_reduce(h, 0, SIZE_MAX / 2, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "timeout_ms -3 is negative",
      symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, -3));
  NOOP(SYMM_OK, symm_one_shot_all_reduce(h, 0, 0, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, NULL, 0));
  memset(out, 0, sizeof out);
  NOOP(SYMM_OK, symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 1000));
  CHECK(!memcmp(in, out, sizeof in), "a world of one sums to its input");
  /* An output overlapping local_input at a shift: refused, naming the shift
   * (one block would overwrite input another has not copied yet); in place
   * is fine. */
  float io[80], io0[80];
  for (int i = 0; i < 80; i++) io[i] = io0[i] = (float)i * 0.5f;
  BAD(SYMM_ERR_INVALID, "overlaps local_input",
      symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io + 1, io, NULL, 0));
  BAD(SYMM_ERR_INVALID, "at a shift of -60 bytes",
      symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io, io + 15, NULL, 0));
  BAD(SYMM_ERR_INVALID, "at a shift of +252 bytes",
      symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io + 63, io, NULL, 0));
  CHECK(!memcmp(io, io0, sizeof io) && !memcmp(p, in, sizeof in), "a refused all-reduce writes and copies nothing");
  NOOP(SYMM_OK, symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io, io, NULL, 1000));
  CHECK(!memcmp(io, io0, sizeof io) && !memcmp(p, io0, sizeof in), "in place: a world of one sums to its local input");
  memcpy(p, in, sizeof in);
  /* The two-shot all-reduce: the one-shot's refusals, by its own name; the
   * buffer itself as the output (in place), and no other overlap with it. */
  BAD(SYMM_ERR_INVALID, "two_shot_all_reduce: dtype 3", symm_two_shot_all_reduce(h, 0, 64, 3, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "op 1", symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, 1, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "output is NULL", symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "overlaps this rank's buffer",
      symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, p + 128, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "local_input", symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, p + 4, NULL, 0));
  BAD(SYMM_ERR_INVALID, "multiples of 4", symm_two_shot_all_reduce(h, 6, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "4-byte aligned",
      symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, (char *)out + 2, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "do not fit", symm_two_shot_all_reduce(h, 0, SIZE_MAX / 8, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "timeout_ms -3 is negative",
      symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, -3));
  BAD(SYMM_ERR_INVALID, "at a shift of -60 bytes",
      symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io, io + 15, NULL, 0));
  CHECK(!memcmp(io, io0, sizeof io) && !memcmp(p, in, sizeof in), "a refused two-shot all-reduce writes and copies nothing");
  NOOP(SYMM_OK, symm_two_shot_all_reduce(h, 0, 0, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, NULL, 0));
  memset(out, 0, sizeof out);
  NOOP(SYMM_OK, symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 1000));
  CHECK(!memcmp(in, out, sizeof in), "two-shot: a world of one sums to its input");
  NOOP(SYMM_OK, symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, p, NULL, NULL, 1000));
  CHECK(!memcmp(p, in, sizeof in), "two-shot in place: a world of one sums to its input");
  NOOP(SYMM_OK, symm_two_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io, io, NULL, 1000));
  CHECK(!memcmp(io, io0, sizeof io) && !memcmp(p, io0, sizeof in), "two-shot from local_input: in place and in the buffer");
  memcpy(p, in, sizeof in);
  /* Reduce-scatter and all-gather: each bad argument refused by name with
   * nothing written; a world of one gives back its input, in place and not. */
  BAD(SYMM_ERR_INVALID, "reduce_scatter: dtype 3", symm_reduce_scatter(h, 0, 64, 3, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "op 1", symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, 1, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "output is NULL", symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "overlaps this rank's buffer",
      symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, p + 128, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "reduce_scatter: local_input", symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, p + 4, NULL, 0));
  BAD(SYMM_ERR_INVALID, "multiples of 4", symm_reduce_scatter(h, 0, 63, SYMM_BFLOAT16, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "multiples of 4", symm_reduce_scatter(h, 6, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "4-byte aligned", symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, (char *)out + 2, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "do not fit", symm_reduce_scatter(h, 0, SIZE_MAX / 8, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "timeout_ms -3 is negative", symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, -3));
  BAD(SYMM_ERR_INVALID, "(256 bytes) at a shift of -60 bytes",
      symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, io, io + 15, NULL, 0));
  BAD(SYMM_ERR_INVALID, "all_gather: dtype 3", symm_all_gather(h, 0, 64, 3, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "output is NULL", symm_all_gather(h, 0, 64, SYMM_FLOAT16, NULL, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "all_gather: the output", symm_all_gather(h, 0, 64, SYMM_FLOAT32, p + 4, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "all_gather: local_input", symm_all_gather(h, 0, 64, SYMM_FLOAT32, out, p + 8, NULL, 0));
  BAD(SYMM_ERR_INVALID, "multiples of 4", symm_all_gather(h, 0, 3, SYMM_FLOAT16, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "do not fit", symm_all_gather(h, 8, 1 << 30, SYMM_FLOAT32, out, NULL, NULL, 0));
  BAD(SYMM_ERR_INVALID, "timeout_ms -1 is negative", symm_all_gather(h, 0, 64, SYMM_FLOAT32, out, NULL, NULL, -1));
  BAD(SYMM_ERR_INVALID, "(256 bytes) at a shift of +4 bytes",
      symm_all_gather(h, 0, 64, SYMM_FLOAT32, io + 1, io, NULL, 0));
  CHECK(!memcmp(io, io0, sizeof io) && !memcmp(p, in, sizeof in), "a refused reduce-scatter or all-gather writes nothing");
  NOOP(SYMM_OK, symm_reduce_scatter(h, 0, 0, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, NULL, 0));
  NOOP(SYMM_OK, symm_all_gather(h, 0, 0, SYMM_FLOAT32, NULL, NULL, NULL, 0));
  memset(out, 0, sizeof out);
  NOOP(SYMM_OK, symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 1000));
  CHECK(!memcmp(in, out, sizeof in), "reduce-scatter: a world of one sums to its input");
  NOOP(SYMM_OK, symm_reduce_scatter(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, p, NULL, NULL, 1000));
  CHECK(!memcmp(p, in, sizeof in), "reduce-scatter in place");
  memset(out, 0, sizeof out);
  NOOP(SYMM_OK, symm_all_gather(h, 0, 128, SYMM_BFLOAT16, out, NULL, NULL, 1000));
  CHECK(!memcmp(in, out, sizeof in), "all-gather: a world of one gathers its input");
  NOOP(SYMM_OK, symm_all_gather(h, 0, 64, SYMM_FLOAT32, io, io, NULL, 1000));
  CHECK(!memcmp(io, io0, sizeof io) && !memcmp(p, io0, sizeof in), "all-gather from local_input in place");
  memcpy(p, in, sizeof in);
  /* The push all-reduce, on a workspace of its own (messages of up to 256
   * bytes for one rank): every bad argument refused by name before anything
   * is written, then a world of one sums to its own input. */
  NOOP(1024, symm_push_all_reduce_workspace_size(1, 256));
  BADR(0, SYMM_ERR_INVALID, "for 0 ranks", symm_push_all_reduce_workspace_size(0, 8));
  BADR(0, SYMM_ERR_INVALID, "messages of up to 0 bytes", symm_push_all_reduce_workspace_size(1, 0));
  BADR(0, SYMM_ERR_INVALID, "overflows", symm_push_all_reduce_workspace_size(2, SIZE_MAX));
  unsigned char *w = symm_alloc(1024, 0, NULL);
  symm_handle_t ws = 0;
  CHECK(w && symm_rendezvous(w, st_main, "push-solo", 0, 1, &ws) == SYMM_OK, "push workspace");
  float po[64];
  memset(po, 0, sizeof po);
  BAD(SYMM_ERR_INVALID, "dtype 3", symm_push_all_reduce(ws, in, po, 64, 3, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "dtype -1", symm_push_all_reduce(ws, in, po, 64, -1, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "op 1", symm_push_all_reduce(ws, in, po, 64, SYMM_FLOAT32, 1, NULL, 0));
  BAD(SYMM_ERR_INVALID, "is NULL", symm_push_all_reduce(ws, NULL, po, 64, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "is NULL", symm_push_all_reduce(ws, in, NULL, 64, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "aligned to the 4-byte float32 element",
      symm_push_all_reduce(ws, (char *)in + 2, po, 16, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "aligned to the 2-byte float16 element",
      symm_push_all_reduce(ws, in, (char *)po + 1, 16, SYMM_FLOAT16, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "at a shift of +4 bytes", symm_push_all_reduce(ws, io, io + 1, 64, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "workspace's own buffer", symm_push_all_reduce(ws, w + 64, po, 16, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "exceed the workspace's limit of 256 bytes per call",
      symm_push_all_reduce(ws, in, po, 65, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "overflow", symm_push_all_reduce(ws, in, po, SIZE_MAX / 2, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BAD(SYMM_ERR_INVALID, "timeout_ms -2 is negative", symm_push_all_reduce(ws, in, po, 64, SYMM_FLOAT32, SYMM_SUM, NULL, -2));
  float zero64[64] = {0};
  CHECK(!memcmp(po, zero64, sizeof po) && !memcmp(io, io0, sizeof io), "a refused push writes nothing");
  NOOP(SYMM_OK, symm_push_all_reduce(ws, NULL, NULL, 0, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  NOOP(SYMM_OK, symm_push_all_reduce(ws, in, po, 64, SYMM_FLOAT32, SYMM_SUM, NULL, 1000));
  CHECK(!memcmp(in, po, sizeof in), "push: a world of one sums to its input");
  NOOP(SYMM_OK, symm_push_all_reduce(ws, po, po, 3, SYMM_BFLOAT16, SYMM_SUM, NULL, 0));
  CHECK(!memcmp(in, po, sizeof in), "push in place, 6 bytes: a world of one sums to its input");
  symm_clear_error();
  symm_free(w, 0, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free the push workspace");
  char dead[80];
  snprintf(dead, sizeof dead, "%lld is not a live symmetric-memory handle", (long long)ws);
  BAD(SYMM_ERR_INVALID, dead, symm_push_all_reduce(ws, in, po, 64, SYMM_FLOAT32, SYMM_SUM, NULL, 0));
  BADR(0, SYMM_ERR_NO_DEVICE, "host backend has no device kernels", symm_kernels_ready(0));
  /* The all-reduce's choice: refused by name, nothing written; then the
   * measured crossovers and a forced algorithm. */
  int chosen = -1;
  BAD(SYMM_ERR_INVALID, "algorithm is NULL", symm_all_reduce_setting(NULL));
  NOOP(SYMM_OK, symm_all_reduce_setting(&chosen));
  CHECK(chosen == SYMM_ALL_REDUCE_AUTO, "SYMM_ALL_REDUCE unset: auto (got %d)", chosen);
  /* The push workspace's limit: read at each call, so a value set after the
   * library loaded is seen; a bad one is refused by name, nothing written. */
  size_t push_max = 0;
  BAD(SYMM_ERR_INVALID, "bytes is NULL", symm_push_max_bytes_setting(NULL));
  NOOP(SYMM_OK, symm_push_max_bytes_setting(&push_max));
  CHECK(push_max == 1 << 20, "SYMM_PUSH_MAX_BYTES unset: 1 MiB (got %zu)", push_max);
  setenv("SYMM_PUSH_MAX_BYTES", "100", 1);
  NOOP(SYMM_OK, symm_push_max_bytes_setting(&push_max));
  CHECK(push_max == 104, "SYMM_PUSH_MAX_BYTES=100, set after load: 104, rounded up to 8 (got %zu)", push_max);
  setenv("SYMM_PUSH_MAX_BYTES", "1M", 1);
  push_max = 7;
  BAD(SYMM_ERR_INVALID, "SYMM_PUSH_MAX_BYTES=\"1M\": want a positive number of bytes", symm_push_max_bytes_setting(&push_max));
  CHECK(push_max == 7, "a refused setting writes nothing");
  unsetenv("SYMM_PUSH_MAX_BYTES");
  chosen = -1;
  BAD(SYMM_ERR_INVALID, "chosen is NULL", symm_all_reduce_algorithm(4, 4096, 1 << 20, SYMM_ALL_REDUCE_AUTO, NULL));
  BAD(SYMM_ERR_INVALID, "all-reduce over 0 ranks", symm_all_reduce_algorithm(0, 4096, 1 << 20, SYMM_ALL_REDUCE_AUTO, &chosen));
  BAD(SYMM_ERR_INVALID, "all-reduce algorithm 4", symm_all_reduce_algorithm(2, 4096, 1 << 20, 4, &chosen));
  BAD(SYMM_ERR_INVALID, "all-reduce algorithm -1", symm_all_reduce_algorithm(2, 4096, 1 << 20, -1, &chosen));
  BAD(SYMM_ERR_INVALID, "over the push workspace's limit of 1048576 bytes",
      symm_all_reduce_algorithm(2, 2 << 20, 1 << 20, SYMM_ALL_REDUCE_PUSH, &chosen));
  CHECK(chosen == -1, "a refused choice writes nothing");
  NOOP(SYMM_OK, symm_all_reduce_algorithm(4, 128 << 10, 1 << 20, SYMM_ALL_REDUCE_AUTO, &chosen));
  CHECK(chosen == SYMM_ALL_REDUCE_PUSH, "4 ranks, 128 KiB: the push (got %d)", chosen);
  NOOP(SYMM_OK, symm_all_reduce_algorithm(4, 256 << 10, 1 << 20, SYMM_ALL_REDUCE_AUTO, &chosen));
  CHECK(chosen == SYMM_ALL_REDUCE_TWO_SHOT, "4 ranks, 256 KiB: the two-shot (got %d)", chosen);
  NOOP(SYMM_OK, symm_all_reduce_algorithm(2, 256 << 10, 64 << 10, SYMM_ALL_REDUCE_AUTO, &chosen));
  CHECK(chosen == SYMM_ALL_REDUCE_TWO_SHOT, "over the workspace's limit: the two-shot (got %d)", chosen);
  NOOP(SYMM_OK, symm_all_reduce_algorithm(2, 4096, 1 << 20, SYMM_ALL_REDUCE_ONE_SHOT, &chosen));
  CHECK(chosen == SYMM_ALL_REDUCE_ONE_SHOT, "forced: the one-shot (got %d)", chosen);
  /* After the block is freed its handle is dead everywhere. */
  symm_clear_error();
  symm_free(p, 0, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free");
  char word[80];
  snprintf(word, sizeof word, "%lld is not a live symmetric-memory handle", (long long)h);
  BAD(SYMM_ERR_INVALID, word, symm_handle_info(h, &info));
  BAD(SYMM_ERR_INVALID, word, symm_put_signal(h, 0, 0, NULL));
  BAD(SYMM_ERR_INVALID, word, symm_wait_signal(h, 0, 0, NULL, 10));
  BAD(SYMM_ERR_INVALID, word, symm_barrier(h, 0, NULL, 10));
  BAD(SYMM_ERR_INVALID, word, symm_reset_signal_pad(h, 0));
  BAD(SYMM_ERR_INVALID, word, symm_reset_signal_pad_if_any(h, 1, 0, NULL));
  BAD(SYMM_ERR_INVALID, word, symm_one_shot_all_reduce(h, 0, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0));
  symm_handle_t hout = 777;
  BAD(SYMM_ERR_UNKNOWN_POINTER, hex(p), symm_rendezvous(p, st_main, "solo", 0, 1, &hout));
  BADV(SYMM_ERR_UNKNOWN_POINTER, hex(p), symm_free(p, 0, 0, NULL));
  area("signals, all-reduce", c0);
}

/* ---- bad environments, in children ------------------------------------------- */

static int child_main(const char *name) {
  if (!strcmp(name, "bad-device")) { /* SYMM_DEVICE=tpu */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE=\"tpu\"", (symm_pool_init(0), 0));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE", symm_pool_alloc(16, 0, NULL));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE", (symm_pool_free((void *)0xdead000, 16, 0, NULL), 0));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE", (symm_pool_record_stream((void *)0xdead000, NULL), 0));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE", (symm_pool_set_memory_fraction(0.5, 0), 0));
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "SYMM_DEVICE", symm_pool_set_limit(0, 1));
    CALL(F_NOSTATE, -1, SYMM_ERR_INVALID, "SYMM_DEVICE", symm_pool_stats(0, NULL, 0));
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "SYMM_DEVICE", symm_pool_reset_peak(0));
    CALL(F_NOSTATE, -1, SYMM_ERR_INVALID, "SYMM_DEVICE", symm_pool_device_count());
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE", symm_alloc(4096, 0, NULL));
    CALL(F_NOSTATE, 0, SYMM_OK, NULL, (symm_pool_empty_cache(), 0));
    CHECK(strcmp(symm_pool_backend(), "") == 0, "no backend: %s", symm_pool_backend());
    /* PyTorch's init: the error is recorded (nothing throws before an alloc). */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_DEVICE=\"tpu\"", (symm_torch_init(1), 0));
  } else if (!strcmp(name, "bad-host-devices")) { /* SYMM_HOST_DEVICES=0 */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_HOST_DEVICES", symm_pool_alloc(16, 0, NULL));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_HOST_DEVICES", (symm_torch_init(-1), 0));
    /* After PyTorch's init a failed alloc throws only when PyTorch's own code
     * calls: from C it is NULL and the last error, and the process lives. */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_HOST_DEVICES", symm_pool_alloc(16, 0, NULL));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_HOST_DEVICES", symm_pool_try_alloc(16, 0, NULL));
  } else if (!strcmp(name, "torch-init-oom")) { /* SYMM_HOST_MEMORY=64MiB */
    /* PyTorch's init, then allocations that cannot fit, from C: NULL and
     * SYMM_ERR_OUT_OF_MEMORY, never an exception (which would abort here). */
    CALL(F_NOSTATE, 0, SYMM_OK, NULL, (symm_torch_init(1), 0));
    CHECK(symm_torch_mode() == 1, "replace mode after symm_torch_init: %d", symm_torch_mode());
    CALL(F_NOSTATE, 0, SYMM_ERR_OUT_OF_MEMORY, "symm_pool_alloc", symm_pool_alloc((size_t)1 << 40, 0, NULL));
    CALL(F_NOSTATE, 0, SYMM_ERR_OUT_OF_MEMORY, "symm_pool_try_alloc", symm_pool_try_alloc((size_t)1 << 40, 0, NULL));
    void *p = symm_pool_alloc(4096, 0, NULL);
    CHECK(p != NULL, "the pool still serves after the failures: %s", symm_last_error());
    symm_pool_free(p, 4096, 0, NULL);
  } else if (!strcmp(name, "bad-host-memory")) { /* SYMM_HOST_MEMORY=lots */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_HOST_MEMORY", symm_pool_alloc(16, 0, NULL));
  } else if (!strcmp(name, "bad-front-cache")) { /* SYMM_POOL_FRONT_CACHE=2 */
    CALL(F_NOSTATE, -1, SYMM_ERR_INVALID, "SYMM_POOL_FRONT_CACHE", symm_pool_device_count());
  } else if (!strcmp(name, "bad-front-cache-max")) { /* SYMM_POOL_FRONT_CACHE_MAX=65MiB */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_POOL_FRONT_CACHE_MAX=\"65MiB\"", symm_pool_alloc(16, 0, NULL));
  } else if (!strcmp(name, "tiny-front-cache-max")) { /* SYMM_POOL_FRONT_CACHE_MAX=100 */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "512 B to 64 MiB", symm_pool_alloc(16, 0, NULL));
  } else if (!strcmp(name, "bad-publish")) { /* SYMM_PUBLISH=banana: refused, as every other 0/1 setting */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_PUBLISH=\"banana\": want 0 or 1", symm_pool_alloc(16, 0, NULL));
  } else if (!strcmp(name, "bad-expandable")) { /* SYMM_POOL_EXPANDABLE=yes */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_POOL_EXPANDABLE", symm_pool_alloc(16, 0, NULL));
  } else if (!strcmp(name, "expandable-before-init")) { /* SYMM_POOL_EXPANDABLE=0, then the call wins */
    CHECK(symm_pool_set_expandable(1) == SYMM_OK, "chosen before the pool exists");
    void *p = symm_pool_alloc(3 << 20, 0, NULL);
    CHECK(p != NULL, "an allocation in an expandable segment");
    char json[8192];
    size_t len = 0;
    CHECK(symm_pool_snapshot(json, sizeof json, &len) == SYMM_OK && strstr(json, "\"is_expandable\":true") != NULL,
          "the snapshot shows an expandable segment");
    CHECK(symm_pool_set_expandable(1) == SYMM_OK, "the same choice again");
    CHECK(symm_pool_set_expandable(0) == SYMM_OK, "fixed segments from now on");
    void *q = symm_pool_alloc(3 << 20, 0, NULL);
    CHECK(q != NULL && symm_pool_snapshot(json, sizeof json, &len) == SYMM_OK && strstr(json, "\"is_expandable\":false") != NULL &&
              strstr(json, "\"is_expandable\":true") != NULL,
          "a fixed segment beside the expandable one");
    symm_pool_free(p, 3 << 20, 0, NULL);
    symm_pool_free(q, 3 << 20, 0, NULL);
  } else if (!strcmp(name, "bad-backend")) { /* SYMM_BACKEND=quantum: the pool still works */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_BACKEND=\"quantum\"", symm_alloc(4096, 0, NULL));
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "SYMM_BACKEND", symm_nccl_adopt_comm(NULL, 0));
    char name[16];
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "SYMM_BACKEND=\"quantum\"", symm_get_backend(name, sizeof name));
    void *p = symm_pool_alloc(16, 0, NULL);
    CHECK(p != NULL, "the pool does not depend on SYMM_BACKEND");
    symm_pool_free(p, 16, 0, NULL);
  } else if (!strcmp(name, "bad-signals")) { /* SYMM_SIGNALS=fast: refused by name; the pool still works */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_SIGNALS=\"fast\"", symm_alloc(4096, 0, NULL));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "want auto, kernel or memop", symm_kernels_ready(0));
    void *p = symm_pool_alloc(16, 0, NULL);
    CHECK(p != NULL, "the pool does not depend on SYMM_SIGNALS");
    symm_pool_free(p, 16, 0, NULL);
  } else if (!strcmp(name, "bad-all-reduce")) { /* SYMM_ALL_REDUCE=fastest: refused by name; the pool still works */
    int chosen = -1;
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "SYMM_ALL_REDUCE=\"fastest\": want auto, push, two_shot or one_shot",
         symm_all_reduce_algorithm(2, 4096, 1 << 20, SYMM_ALL_REDUCE_AUTO, &chosen));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_ALL_REDUCE", symm_alloc(4096, 0, NULL));
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "SYMM_ALL_REDUCE=\"fastest\"", symm_all_reduce_setting(&chosen));
    CHECK(chosen == -1, "a refused choice writes nothing");
    void *p = symm_pool_alloc(16, 0, NULL);
    CHECK(p != NULL, "the pool does not depend on SYMM_ALL_REDUCE");
    symm_pool_free(p, 16, 0, NULL);
  } else if (!strcmp(name, "bad-collective-blocks")) { /* SYMM_COLLECTIVE_BLOCKS=0: refused by name; the pool still works */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_COLLECTIVE_BLOCKS=\"0\": want a number of blocks from 1 to 512",
         symm_alloc(4096, 0, NULL));
    void *p = symm_pool_alloc(16, 0, NULL);
    CHECK(p != NULL, "the pool does not depend on SYMM_COLLECTIVE_BLOCKS");
    symm_pool_free(p, 16, 0, NULL);
  } else if (!strcmp(name, "forced-all-reduce")) { /* SYMM_ALL_REDUCE=one_shot: chosen at every size; a caller's choice wins */
    int chosen = -1;
    CALL(F_NOSTATE, SYMM_OK, SYMM_OK, NULL, symm_all_reduce_algorithm(4, 4096, 1 << 20, SYMM_ALL_REDUCE_AUTO, &chosen));
    CHECK(chosen == SYMM_ALL_REDUCE_ONE_SHOT, "SYMM_ALL_REDUCE=one_shot, 4 KiB: the one-shot (got %d)", chosen);
    CALL(F_NOSTATE, SYMM_OK, SYMM_OK, NULL, symm_all_reduce_algorithm(4, 64 << 20, 1 << 20, SYMM_ALL_REDUCE_AUTO, &chosen));
    CHECK(chosen == SYMM_ALL_REDUCE_ONE_SHOT, "SYMM_ALL_REDUCE=one_shot, 64 MiB: the one-shot (got %d)", chosen);
    CALL(F_NOSTATE, SYMM_OK, SYMM_OK, NULL, symm_all_reduce_algorithm(4, 4096, 1 << 20, SYMM_ALL_REDUCE_PUSH, &chosen));
    CHECK(chosen == SYMM_ALL_REDUCE_PUSH, "the caller's choice wins over SYMM_ALL_REDUCE (got %d)", chosen);
    CALL(F_NOSTATE, SYMM_OK, SYMM_OK, NULL, symm_all_reduce_setting(&chosen));
    CHECK(chosen == SYMM_ALL_REDUCE_ONE_SHOT, "the setting: the one-shot (got %d)", chosen);
  } else if (!strcmp(name, "bad-timeout")) { /* SYMM_TIMEOUT_MS=-5 */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "SYMM_TIMEOUT_MS", symm_alloc(4096, 0, NULL));
  } else if (!strcmp(name, "nvshmem-on-host")) { /* SYMM_BACKEND=nvshmem with SYMM_DEVICE=host */
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "needs GPUs", symm_alloc(4096, 0, NULL));
  } else if (!strcmp(name, "nccl-on-host")) { /* chosen with symm_set_backend, SYMM_DEVICE=host */
    CHECK(symm_set_backend("nccl") == SYMM_OK, "nccl may be chosen before the first symmetric call");
    CALL(F_NOSTATE, SYMM_ERR_INVALID, SYMM_ERR_INVALID, "needs GPUs", symm_nccl_adopt_comm((void *)0x1234, 0));
    CALL(F_NOSTATE, 0, SYMM_ERR_INVALID, "needs GPUs", symm_alloc(4096, 0, NULL));
  } else if (!strcmp(name, "no-driver")) { /* SYMM_DEVICE unset, no NVIDIA driver here */
    size_t n = 0;
    CHECK(symm_topology(NULL, NULL, 0, &n) == SYMM_OK, "topology");
    char *buf = malloc(n + 1);
    int driver = symm_topology(NULL, buf, n + 1, &n) == SYMM_OK && strstr(buf, "\"found\":false") == NULL;
    free(buf);
    if (!driver) {
      CALL(F_NOSTATE, 0, SYMM_ERR_NO_DEVICE, NULL, symm_pool_alloc(16, 0, NULL));
      CALL(F_NOSTATE, -1, SYMM_ERR_NO_DEVICE, NULL, symm_pool_device_count());
      CALL(F_NOSTATE, 0, SYMM_ERR_NO_DEVICE, NULL, symm_alloc(4096, 0, NULL));
    }
  } else {
    fprintf(stderr, "unknown child %s\n", name);
    return 2;
  }
  return failures != 0;
}

static int spawn_child(const char *self, const char *name, const char *const *env) {
  /* The parent's environment, with env's NAME=VALUE entries replacing (or,
   * VALUE empty after '=', removing) its own. */
  int n = 0;
  while (environ[n]) n++;
  char **envp = calloc(n + 16, sizeof *envp);
  int k = 0;
  for (int i = 0; i < n; i++) {
    int drop = 0;
    for (const char *const *e = env; *e; e++) {
      size_t l = strchr(*e, '=') - *e + 1;
      drop |= strncmp(environ[i], *e, l) == 0;
    }
    if (!drop) envp[k++] = environ[i];
  }
  for (const char *const *e = env; *e; e++)
    if (strchr(*e, '=')[1] != 0) envp[k++] = (char *)*e;
  char *args[] = {(char *)self, "child", (char *)name, NULL};
  pid_t pid;
  int status = -1;
  if (posix_spawn(&pid, self, NULL, NULL, args, envp) == 0) waitpid(pid, &status, 0);
  free(envp);
  return status;
}

static void test_children(const char *self) {
  int c0 = passes + failures;
  const struct {
    const char *name;
    const char *env[4];
  } cases[] = {
      {"bad-device", {"SYMM_DEVICE=tpu", NULL}},
      {"bad-host-devices", {"SYMM_HOST_DEVICES=0", NULL}},
      {"bad-host-memory", {"SYMM_HOST_MEMORY=lots", NULL}},
      {"bad-front-cache", {"SYMM_POOL_FRONT_CACHE=2", NULL}},
      {"bad-front-cache-max", {"SYMM_POOL_FRONT_CACHE_MAX=65MiB", NULL}},
      {"tiny-front-cache-max", {"SYMM_POOL_FRONT_CACHE_MAX=100", NULL}},
      {"bad-publish", {"SYMM_PUBLISH=banana", NULL}},
      {"bad-expandable", {"SYMM_POOL_EXPANDABLE=yes", NULL}},
      {"expandable-before-init", {"SYMM_POOL_EXPANDABLE=0", NULL}},
      {"bad-backend", {"SYMM_BACKEND=quantum", NULL}},
      {"bad-timeout", {"SYMM_TIMEOUT_MS=-5", NULL}},
      {"bad-signals", {"SYMM_SIGNALS=fast", NULL}},
      {"bad-all-reduce", {"SYMM_ALL_REDUCE=fastest", NULL}},
      {"forced-all-reduce", {"SYMM_ALL_REDUCE=one_shot", NULL}},
      {"bad-collective-blocks", {"SYMM_COLLECTIVE_BLOCKS=0", NULL}},
      {"nvshmem-on-host", {"SYMM_BACKEND=nvshmem", NULL}},
      {"nccl-on-host", {"SYMM_BACKEND=", NULL}},
      {"no-driver", {"SYMM_DEVICE=", "SYMM_CUDA_LIB=/nonexistent/libcuda.so.1", NULL}},
      {"torch-init-oom", {"SYMM_HOST_MEMORY=64MiB", NULL}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int status = spawn_child(self, cases[i].name, cases[i].env);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %s: status %#x", cases[i].name, status);
  }
  cover("symm_torch_init");
  area("bad environments (children)", c0);
}

/* ---- every function of the header -------------------------------------------- */

static void check_coverage(void) {
  static const char *all[] = {
      "symm_version", "symm_last_error", "symm_last_error_code", "symm_clear_error", "symm_copy_last_error",
      "symm_pool_alloc", "symm_pool_try_alloc", "symm_pool_free", "symm_pool_init", "symm_torch_init", "symm_pool_empty_cache",
      "symm_pool_set_memory_fraction", "symm_pool_set_limit", "symm_pool_set_expandable", "symm_pool_record_stream", "symm_pool_stats",
      "symm_pool_reset_peak", "symm_pool_device_count", "symm_pool_backend", "symm_pool_begin_allocate_to_pool",
      "symm_pool_end_allocate_to_pool", "symm_pool_release_pool", "symm_pool_record_history", "symm_pool_snapshot",
      "symm_torch_mode", "symm_torch_begin_allocate_to_pool", "symm_torch_end_allocate_to_pool",
      "symm_torch_release_pool", "symm_alloc", "symm_free",
      "symm_has_multicast_support", "symm_set_backend", "symm_get_backend", "symm_nvshmem_available",
      "symm_nccl_available", "symm_nccl_adopt_comm", "symm_topology", "symm_add_library_dirs", "symm_store_server", "symm_store_connect",
      "symm_store_set", "symm_store_get", "symm_store_add", "symm_store_close", "symm_rendezvous",
      "symm_backend_init", "symm_handle_info", "symm_world_within_direct_access", "symm_put_signal",
      "symm_wait_signal", "symm_barrier", "symm_reset_signal_pad", "symm_reset_signal_pad_if_any", "symm_kernels_ready", "symm_one_shot_all_reduce", "symm_two_shot_all_reduce",
      "symm_reduce_scatter", "symm_all_gather", "symm_push_all_reduce_workspace_size", "symm_all_reduce_algorithm", "symm_all_reduce_setting",
      "symm_push_max_bytes_setting",
      "symm_push_all_reduce", "symm_pool_segment_of", "symm_pool_segment_chunk", "symm_pool_chunk_at",
      "symm_pool_block_of",
      "symm_pool_cache_info", "symm_pool_reset_accumulated", "symm_pool_blocks", "symm_pool_restore_blocks",
      "symm_pool_alloc_segment", "symm_pool_snapshot_list", "symm_pool_settings", "symm_pool_set_annotation", "symm_pool_set_segment_hook",
      "symm_pool_memory_fraction", "symm_pool_set_allocator_settings", "symm_driver_proc", "symm_torch_own_allocator",
      "symm_pool_create_pool", "symm_pool_use_count", "symm_pool_set_use_on_oom", "symm_pool_set_no_split",
      "symm_pool_empty_pool"};
  int missing = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    int found = 0;
    for (int j = 0; j < ncovered; j++) found |= !strcmp(all[i], covered[j]);
    if (!found) fprintf(stderr, "not exercised: %s\n", all[i]);
    missing += !found;
  }
  CHECK(missing == 0, "%d functions of the header not exercised", missing);
  /* The header may have grown: every function it declares must be here. */
  FILE *f = fopen("include/symm.h", "r");
  if (f == NULL) return; /* run from elsewhere: the list above is the check */
  char line[512];
  while (fgets(line, sizeof line, f)) {
    for (char *s = strstr(line, "symm_"); s; s = strstr(s + 1, "symm_")) {
      if (s > line && (isalnum((unsigned char)s[-1]) || s[-1] == '_')) continue;
      char fn[64];
      fn_of(s, fn, sizeof fn);
      const char *after = s + strlen(fn);
      while (*after == ' ') after++;
      if (*after != '(') continue;
      int found = 0;
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) found |= !strcmp(all[i], fn);
      CHECK(found, "include/symm.h declares %s, which this test does not know", fn);
    }
  }
  fclose(f);
}

int main(int argc, char **argv) {
  /* A child has the parent's environment, with its case's changes. */
  if (argc >= 3 && !strcmp(argv[1], "child")) return child_main(argv[2]);
  setenv("SYMM_DEVICE", "host", 0);
  setenv("SYMM_HOST_MEMORY", "1GiB", 1);
  setenv("SYMM_HOST_DEVICES", "2", 1);
  setenv("SYMM_TIMEOUT_MS", "300", 1);

  verbose = getenv("SYMM_TEST_VERBOSE") && !strcmp(getenv("SYMM_TEST_VERBOSE"), "1");
  /* Before anything is initialized. */
  int c0 = passes + failures;
  CHECK(strcmp(symm_pool_backend(), "") == 0, "no backend before init: %s", symm_pool_backend());
  symm_clear_error();
  symm_pool_empty_cache();
  CHECK(symm_last_error_code() == SYMM_OK, "empty_cache before init does nothing");
  /* The first call initializes the pool; a bad free must still be refused. */
  CALL(F_NOSTATE, 0, SYMM_ERR_UNKNOWN_POINTER, "0xdead000", (symm_pool_free((void *)0xdead000, 16, 0, NULL), 0));
  area("before init", c0);
  test_backend_before_use();

  test_errors();
  /* A warm-up rendezvous through a store of its own, closed before the
   * baseline with the group's link. On a machine with a driver, the
   * first symm_topology opens the driver and NVML for good (their
   * descriptors stay open, as they do in any CUDA program): open them
   * before the baseline too. */
  symm_store_t st_warm;
  char warm_addr[64];
  if (symm_store_server("", "", &st_warm, warm_addr, sizeof warm_addr) != SYMM_OK) {
    fprintf(stderr, "store server: %s\n", symm_last_error());
    return 2;
  }
  void *warm = symm_alloc(4096, 0, NULL);
  symm_handle_t wh;
  CHECK(warm && symm_rendezvous(warm, st_warm, "warm", 0, 1, &wh) == SYMM_OK, "warm-up rendezvous");
  symm_free(warm, 0, 0, NULL);
  CHECK(symm_store_close(st_warm) == SYMM_OK, "close the warm-up store");
  size_t warm_len = 0;
  symm_topology(NULL, NULL, 0, &warm_len);
  int fds0 = count_fds(), maps0 = count_maps();
  /* The store every symmetric area uses: closed at the end, before the
   * count, with the links of the groups joined through it. */
  if (symm_store_server("", "", &st_main, st_addr, sizeof st_addr) != SYMM_OK) {
    fprintf(stderr, "store server: %s\n", symm_last_error());
    return 2;
  }

  pa = symm_pool_alloc(4096, 0, SA);
  pb = symm_pool_alloc(3 * MiB, 1, SB);
  CHECK(pa && pb, "live blocks");
  test_pool_alloc();
  test_pool_free();
  test_pool_record_stream();
  test_pool_segment_of();
  test_pool_segment_chunk();
  test_pool_chunk_at();
  test_pool_block_of();
  test_pool_stats();
  test_pool_limits();
  test_pool_misc();
  test_pool_graphs();
  test_pool_listing();
  test_pool_pytorch();
  test_pool_owners();

  test_symm_alloc_free();
  test_backends();
  test_topology();
  test_stores();
  unsigned char *p = symm_alloc(64 * 1024, 0, NULL);
  symm_handle_t h = 0;
  CHECK(p && symm_rendezvous(p, st_main, "solo", 0, 1, &h) == SYMM_OK, "a block and its handle");
  test_rendezvous(p, h);
  test_signals(p, h); /* frees p */
  test_children(argv[0]);

  /* Nothing leaked: the live blocks were never freed by a bad call. */
  c0 = passes + failures;
  symm_clear_error();
  symm_pool_free(pa, 4096, 0, SA);
  symm_pool_free(pb, 3 * MiB, 1, SB);
  CHECK(symm_last_error_code() == SYMM_OK, "the live blocks free once");
  symm_pool_empty_cache();
  for (int d = 0; d < NDEV; d++) {
    CHECK(stat_now(d, "allocated_bytes.all.current") == 0, "device %d: nothing allocated", d);
    CHECK(stat_now(d, "reserved_bytes.all.current") == 0, "device %d: nothing reserved", d);
  }
  CHECK(symm_store_close(st_main) == SYMM_OK, "close the store");
  CHECK(count_fds() == fds0, "descriptors: %d at the start, %d at the end", fds0, count_fds());
  CHECK(count_maps() == maps0, "mappings: %d at the start, %d at the end", maps0, count_maps());
  check_coverage();
  area("leaks and coverage", c0);

  printf("test_badinput: %d passed, %d failed\n", passes, failures);
  return failures != 0;
}
