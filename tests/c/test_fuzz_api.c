/* A seeded random sequence of calls to the C ABI (host backend), with
 * arguments drawn from interesting sets: live, freed, interior and random
 * pointers; sizes 0, 1, 511, 512, 1 MiB, 64 MiB, SIZE_MAX and random;
 * devices -1, 0, 1, 1000, INT_MIN; fractions -1, 0, 0.5, 1, 2, NaN; live,
 * closed and random handles. A model of what is live predicts each answer
 * where it is determined (the code, and that a live block is freed once and
 * only then); every answer must be a valid code with a message naming the
 * function, never SYMM_ERR_INTERNAL (a recovered panic). At the end everything
 * live is freed: nothing is allocated or reserved, the blocks' first and last
 * bytes were never overwritten by another allocation, and the descriptors and
 * mappings are back to the baseline taken after the first successful alloc.
 *   SYMM_FUZZ_SEED=N (default: from the clock; printed)  SYMM_FUZZ_ITERS=N (20000)
 * Random integers are passed as pointers only where the library looks them
 * up (free, record_stream, symm_free, rendezvous); out-parameters always get
 * valid buffers or NULL. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SYMM_TEST_OWN_CHECK
#include "check.h"
#include "symm.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define NDEV 2 /* SYMM_HOST_DEVICES */
#define CAPACITY GiB /* SYMM_HOST_MEMORY */

static int failures, checks;
static long iter;
static const char *op = "setup";

#define FAIL(...)                                                                              \
  do {                                                                                         \
    failures++;                                                                                \
    if (failures <= 25) {                                                                      \
      fprintf(stderr, "FAIL iteration %ld (%s) line %d: ", iter, op, __LINE__);                \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, " (last error %d: %s)\n", symm_last_error_code(), symm_last_error());   \
    }                                                                                          \
  } while (0)
#define CHECK(cond, ...)    \
  do {                      \
    checks++;               \
    if (!(cond)) FAIL(__VA_ARGS__); \
  } while (0)

/* ---- random --------------------------------------------------------------------- */

static uint64_t rng;
static uint64_t next(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return n ? next() % n : 0; }
static int chance(int percent) { return (int)below(100) < percent; }
#define PICK(arr) (arr)[below(sizeof(arr) / sizeof((arr)[0]))]

static const int devs[] = {-1, 0, 1, 1000, INT_MIN};
static int dev_ok(int d) { return d >= 0 && d < NDEV; }
static void *const streams[] = {NULL, (void *)1, (void *)2, (void *)0x1000, (void *)0x2000};

static size_t rand_size(void) {
  switch (below(9)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return 511;
    case 3: return 512;
    case 4: return MiB;
    case 5: return 64 * MiB;
    case 6: return SIZE_MAX;
    case 7: return next(); /* almost always more than any device */
    default: return 1 + below(4 * MiB);
  }
}

/* ---- the model ------------------------------------------------------------------- */

#define MAXP 64
typedef struct {
  unsigned char *p;
  size_t size;
  int dev;
  void *stream;
  unsigned char tag;
} pblock_t;
static pblock_t pool[MAXP];
static int npool;

#define NSLOT 3
static const int slot_channels[NSLOT] = {0, 1, 511};
#define MAXS 16
typedef struct {
  unsigned char *p;
  size_t size;
  unsigned char tag;
  symm_handle_t h[2]; /* groups "a" and "b" (0: none) */
  int slot[NSLOT];    /* our own slot of each channel: 1 once signalled (one pad, every group) */
} sblock_t;
static sblock_t sym[MAXS];
static int nsym;

#define MAXDEAD 64
static uintptr_t freed[MAXDEAD]; /* pointers freed (pool and symmetric) */
static int nfreed;
static symm_handle_t dead_handles[MAXDEAD];
static int ndead_handles;
static symm_store_t dead_stores[16];
static int ndead_stores;

static void remember_freed(const void *p) { freed[nfreed++ % MAXDEAD] = (uintptr_t)p; }

static symm_store_t st_main;
static char st_addr[64];
#define MAXSTORES 4
static symm_store_t extra[MAXSTORES]; /* connected to st_main's server (shared keys) or own servers */
static int extra_is_client[MAXSTORES];
static int nextra;

/* The keys of st_main's server: absent, an int64, or bytes that are not one. */
#define NKEYS 6
enum { K_ABSENT, K_INT, K_BYTES };
static struct {
  int kind;
  int64_t v;
  char bytes[32];
  size_t len;
} keys[NKEYS];

/* A symmetric block's extent: buffer, signal pad (2048 bytes at a 16-byte
 * offset), rounded up to pages (the host provider's granularity). */
/* A symmetric block's bytes: the buffer rounded up to 16, the signal pad
 * (2048) and the sync area (2048), in whole pages (the host backend's
 * granularity). */
static size_t extent(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (((size + 15) & ~(size_t)15) + 2048 + 2048 + page - 1) / page * page;
}
static int sym_containing(uintptr_t a) {
  for (int i = 0; i < nsym; i++)
    if (a >= (uintptr_t)sym[i].p && a < (uintptr_t)sym[i].p + extent(sym[i].size)) return i;
  return -1;
}

static int find_pool(uintptr_t p) {
  for (int i = 0; i < npool; i++)
    if ((uintptr_t)pool[i].p == p) return i;
  return -1;
}
static int find_sym(uintptr_t p) {
  for (int i = 0; i < nsym; i++)
    if ((uintptr_t)sym[i].p == p) return i;
  return -1;
}
/* 1: inside a live pool block's request; 2: maybe inside its block (rounded up,
 * or a remainder too small to split off); 0: in no live pool block. */
static int pool_containing(uintptr_t a) {
  int maybe = 0;
  for (int i = 0; i < npool; i++) {
    uintptr_t s = (uintptr_t)pool[i].p;
    if (a >= s && a < s + pool[i].size) return 1;
    if (a >= s && a < s + ((pool[i].size + 511) & ~(size_t)511) + MiB + 512) maybe = 2;
  }
  return maybe;
}

static void check_tags(const unsigned char *p, size_t size, unsigned char tag, const char *what) {
  CHECK(p[0] == tag && p[size - 1] == tag, "%s %p (%zu bytes): tags %u/%u, want %u: overwritten by another block",
        what, (const void *)p, size, p[0], p[size - 1], tag);
}

static int overlaps_live(uintptr_t p, size_t size) {
  for (int i = 0; i < npool; i++)
    if (p < (uintptr_t)pool[i].p + pool[i].size && (uintptr_t)pool[i].p < p + size) return 1;
  for (int i = 0; i < nsym; i++)
    if (p < (uintptr_t)sym[i].p + sym[i].size && (uintptr_t)sym[i].p < p + size) return 1;
  return 0;
}

/* ---- what every call must satisfy ------------------------------------------------ */

static int codes[16];
/* Per function: calls and successes (SYMM_TEST_VERBOSE=1 prints them). */
static struct {
  const char *fn;
  int calls, ok;
} tally[48];

/* The call's code: in the valid set, never INTERNAL/FORKED/DRIVER here, and
 * a failure has a message starting with the function's name. */
static int answer(const char *fn) {
  int code = symm_last_error_code();
  checks++;
  if (code < SYMM_OK || code > SYMM_ERR_TIMEOUT) {
    FAIL("%s: code %d outside SYMM_OK..SYMM_ERR_TIMEOUT", fn, code);
  } else if (code == SYMM_ERR_INTERNAL || code == SYMM_ERR_FORKED || code == SYMM_ERR_DRIVER) {
    FAIL("%s: code %d cannot happen on the host backend in the parent", fn, code);
  }
  if (code >= 0 && code < 16) codes[code]++;
  for (int i = 0; i < 48; i++)
    if (tally[i].fn == NULL || !strcmp(tally[i].fn, fn)) {
      tally[i].fn = fn;
      tally[i].calls++;
      tally[i].ok += code == SYMM_OK;
      break;
    }
  if (code != SYMM_OK) {
    const char *m = symm_last_error();
    size_t n = strlen(fn);
    CHECK(m[0] != 0 && strncmp(m, fn, n) == 0 && m[n] == ':', "%s: message \"%.80s\" does not name the function", fn, m);
  }
  return code;
}

#define EXPECT(fn, code, want)                                                   \
  do {                                                                           \
    checks++;                                                                    \
    if ((code) != (want)) FAIL("%s: code %d, want %d", fn, code, want);          \
  } while (0)
#define EXPECT2(fn, code, a, b)                                                  \
  do {                                                                           \
    checks++;                                                                    \
    if ((code) != (a) && (code) != (b)) FAIL("%s: code %d, want %d or %d", fn, code, a, b); \
  } while (0)

/* ---- pointers -------------------------------------------------------------------- */

static uintptr_t any_pointer(void) {
  switch (below(7)) {
    case 0:
      if (npool) return (uintptr_t)pool[below(npool)].p;
      break;
    case 1:
      if (npool) {
        pblock_t *b = &pool[below(npool)];
        return (uintptr_t)b->p + 1 + below(b->size);
      }
      break;
    case 2:
      if (nfreed) return freed[below(nfreed < MAXDEAD ? nfreed : MAXDEAD)];
      break;
    case 3:
      if (nsym) return (uintptr_t)sym[below(nsym)].p + (chance(50) ? 0 : below(sym[0].size + 4096));
      break;
    case 4:
      return chance(10) ? 0 : (uintptr_t)next();
    case 5:
      return (uintptr_t)(below(1ull << 47) & ~(uintptr_t)511); /* a user-space-looking address */
  }
  return npool && chance(70) ? (uintptr_t)pool[below(npool)].p : (uintptr_t)next();
}

/* ---- the operations -------------------------------------------------------------- */

static void op_pool_alloc(void) {
  op = "symm_pool_alloc";
  size_t size = rand_size();
  int dev = chance(80) ? (int)below(NDEV) : PICK(devs);
  void *stream = PICK(streams);
  symm_clear_error();
  unsigned char *p = symm_pool_alloc(size, dev, stream);
  int code = answer(op);
  if (size == 0) {
    CHECK(p == NULL && code == SYMM_OK, "size 0: %p, code %d", (void *)p, code);
    return;
  }
  if (!dev_ok(dev)) {
    CHECK(p == NULL, "device %d: %p", dev, (void *)p);
    EXPECT(op, code, SYMM_ERR_INVALID);
    return;
  }
  if (size > CAPACITY) {
    CHECK(p == NULL, "%zu bytes: %p", size, (void *)p);
    EXPECT(op, code, SYMM_ERR_OUT_OF_MEMORY);
    return;
  }
  if (p == NULL) { /* the device is full, or a limit */
    EXPECT(op, code, SYMM_ERR_OUT_OF_MEMORY);
    return;
  }
  CHECK(code == SYMM_OK, "success with code %d", code);
  CHECK(((uintptr_t)p & 511) == 0, "alignment of %p", (void *)p);
  CHECK(!overlaps_live((uintptr_t)p, size), "%p (%zu bytes) overlaps a live block", (void *)p, size);
  unsigned char tag = (unsigned char)(1 + below(255));
  p[0] = p[size - 1] = tag;
  if (npool == MAXP) { /* the model is full: give it straight back */
    symm_clear_error();
    symm_pool_free(p, size, dev, stream);
    CHECK(symm_last_error_code() == SYMM_OK, "free of a fresh block");
    remember_freed(p);
    return;
  }
  pool[npool++] = (pblock_t){p, size, dev, stream, tag};
}

static void op_pool_free(void) {
  op = "symm_pool_free";
  uintptr_t ptr = npool && chance(40) ? (uintptr_t)pool[below(npool)].p : any_pointer();
  int i = find_pool(ptr);
  size_t size;
  int dev;
  void *stream;
  if (i >= 0) check_tags(pool[i].p, pool[i].size, pool[i].tag, "pool block");
  if (i >= 0) {
    size = chance(70) ? pool[i].size : chance(50) ? 0 : chance(50) ? pool[i].size + 1 : rand_size();
    dev = chance(85) ? pool[i].dev : PICK(devs);
    stream = chance(80) ? pool[i].stream : PICK(streams);
  } else {
    size = chance(50) ? 0 : rand_size();
    dev = chance(70) ? (int)below(NDEV) : PICK(devs);
    stream = PICK(streams);
  }
  symm_clear_error();
  symm_pool_free((void *)ptr, size, dev, stream);
  int code = answer(op);
  if (ptr == 0) {
    EXPECT(op, code, SYMM_OK);
  } else if (i >= 0) {
    /* device -1: whichever device holds the block */
    if ((dev == pool[i].dev || dev == -1) && (size == 0 || size == pool[i].size)) {
      EXPECT(op, code, SYMM_OK);
      if (code == SYMM_OK) {
        remember_freed(pool[i].p);
        pool[i] = pool[--npool];
      }
    } else {
      EXPECT(op, code, SYMM_ERR_INVALID); /* wrong size or device: not freed */
    }
  } else if (!dev_ok(dev)) {
    EXPECT2(op, code, SYMM_ERR_INVALID, SYMM_ERR_UNKNOWN_POINTER);
  } else {
    EXPECT(op, code, SYMM_ERR_UNKNOWN_POINTER);
  }
}

static void op_record_stream(void) {
  op = "symm_pool_record_stream";
  uintptr_t ptr = any_pointer();
  void *stream = PICK(streams);
  symm_clear_error();
  symm_pool_record_stream((void *)ptr, stream);
  int code = answer(op);
  switch (pool_containing(ptr)) {
    case 1: EXPECT(op, code, SYMM_OK); break;
    case 2: EXPECT2(op, code, SYMM_OK, SYMM_ERR_UNKNOWN_POINTER); break;
    default: EXPECT(op, code, SYMM_ERR_UNKNOWN_POINTER);
  }
}

static void op_symm_alloc(void) {
  op = "symm_alloc";
  size_t size = rand_size();
  if (size == 64 * MiB && chance(50)) size = 4096;
  int dev = chance(80) ? (int)below(NDEV) : PICK(devs);
  if (nsym == MAXS && size != 0 && dev_ok(dev) && size <= CAPACITY) return; /* the model is full */
  symm_clear_error();
  unsigned char *p = symm_alloc(size, dev, PICK(streams));
  int code = answer(op);
  if (size == 0) {
    CHECK(p == NULL && code == SYMM_OK, "size 0: %p, code %d", (void *)p, code);
  } else if (!dev_ok(dev)) {
    CHECK(p == NULL, "device %d: %p", dev, (void *)p);
    EXPECT(op, code, SYMM_ERR_INVALID);
  } else if (size > CAPACITY) {
    CHECK(p == NULL, "%zu bytes: %p", size, (void *)p);
    EXPECT(op, code, SYMM_ERR_OUT_OF_MEMORY);
  } else {
    CHECK(p != NULL && code == SYMM_OK, "%zu bytes on device %d: %p, code %d", size, dev, (void *)p, code);
    if (p == NULL) return;
    CHECK(!overlaps_live((uintptr_t)p, size), "%p (%zu bytes) overlaps a live block", (void *)p, size);
    unsigned char tag = (unsigned char)(1 + below(255));
    p[0] = p[size - 1] = tag;
    sblock_t b = {p, size, tag, {0, 0}, {0}};
    sym[nsym++] = b;
  }
}

static void kill_handles(sblock_t *b) {
  for (int g = 0; g < 2; g++)
    if (b->h[g]) dead_handles[ndead_handles++ % MAXDEAD] = b->h[g];
}

static void op_symm_free(void) {
  op = "symm_free";
  uintptr_t ptr = chance(40) && nsym ? (uintptr_t)sym[below(nsym)].p : any_pointer();
  int i = find_sym(ptr);
  if (i >= 0) check_tags(sym[i].p, sym[i].size, sym[i].tag, "symmetric block"); /* before: free unmaps it */
  symm_clear_error();
  symm_free((void *)ptr, below(2) ? rand_size() : 0, PICK(devs), NULL);
  int code = answer(op);
  if (ptr == 0) {
    EXPECT(op, code, SYMM_OK);
  } else if (i >= 0) {
    EXPECT(op, code, SYMM_OK);
    kill_handles(&sym[i]);
    remember_freed(sym[i].p);
    sym[i] = sym[--nsym];
  } else {
    EXPECT(op, code, SYMM_ERR_UNKNOWN_POINTER);
  }
}

/* A store handle: st_main, another live one, a closed one, or made up. For
 * key operations (keys_only) only clients of st_main's server: a server made
 * by symm_store_server has its own keys. */
static symm_store_t any_store(int *live, int keys_only) {
  switch (below(6)) {
    case 0:
      for (int tries = 0; tries < 4 && nextra; tries++) {
        int i = (int)below(nextra);
        if (keys_only && !extra_is_client[i]) continue;
        *live = 1;
        return extra[i];
      }
      break;
    case 1:
      if (ndead_stores) {
        *live = 0;
        return dead_stores[below(ndead_stores < 16 ? ndead_stores : 16)];
      }
      break;
    case 2:
      *live = 0;
      return chance(50) ? 0 : (symm_store_t)next();
  }
  *live = 1;
  return st_main;
}

static void op_rendezvous(void) {
  op = "symm_rendezvous";
  int live;
  symm_store_t st = any_store(&live, 0);
  int bi = nsym && chance(80) ? (int)below(nsym) : -1;
  uintptr_t ptr = bi >= 0 ? (uintptr_t)sym[bi].p + (chance(50) ? 0 : below(sym[bi].size)) : any_pointer();
  int g = (int)below(2);
  const char *group = chance(3) ? "" : g ? "b" : "a";
  static const int rw[][2] = {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {-1, 1}, {1, 1}, {0, 0}, {0, -1}, {INT_MIN, INT_MAX}, {0, 513}};
  int k = (int)below(10), rank = rw[k][0], world = rw[k][1];
  symm_handle_t h = 0;
  symm_clear_error();
  int rc = symm_rendezvous((void *)ptr, st, group, rank, world, &h);
  int code = answer(op);
  CHECK(rc == code, "returned %d, code %d", rc, code);
  int in = sym_containing(ptr); /* any byte of the block: buffer, pad, rounding */
  if (!live || k >= 4 || group[0] == 0) {
    EXPECT(op, code, SYMM_ERR_INVALID);
  } else if (in < 0) {
    EXPECT(op, code, SYMM_ERR_UNKNOWN_POINTER);
  } else {
    EXPECT(op, code, SYMM_OK);
    if (code == SYMM_OK) {
      if (sym[in].h[g]) CHECK(h == sym[in].h[g], "the same block and group: a new handle");
      sym[in].h[g] = h;
    }
  }
}

/* A handle: of a live block (with the block), stale, or made up. */
static symm_handle_t any_handle(sblock_t **blk) {
  *blk = NULL;
  int k = (int)below(10);
  if (k < 6) {
    for (int tries = 0; tries < 4 && nsym; tries++) {
      sblock_t *b = &sym[below(nsym)];
      int g = (int)below(2);
      if (b->h[g]) {
        *blk = b;
        return b->h[g];
      }
    }
  }
  if (k < 8 && ndead_handles) return dead_handles[below(ndead_handles < MAXDEAD ? ndead_handles : MAXDEAD)];
  return chance(50) ? (symm_handle_t)below(100) : (symm_handle_t)next();
}

static void op_handle_info(void) {
  op = "symm_handle_info";
  sblock_t *b;
  symm_handle_t h = any_handle(&b);
  symm_handle_info_t info;
  memset(&info, 0, sizeof info);
  symm_clear_error();
  int rc = symm_handle_info(h, &info);
  int code = answer(op);
  CHECK(rc == code, "returned %d, code %d", rc, code);
  if (b) {
    EXPECT(op, code, SYMM_OK);
    CHECK(info.rank == 0 && info.world_size == 1 && info.buffer_size == b->size &&
              ((void **)info.buffer_ptrs)[0] == (void *)b->p,
          "info of a handle of %p", (void *)b->p);
  } else {
    EXPECT(op, code, SYMM_ERR_INVALID);
  }
}

static void op_signal(void) {
  sblock_t *b;
  symm_handle_t h = any_handle(&b);
  static const int ranks[] = {0, 0, 0, 0, -1, 1, INT_MIN};
  static const int chans[] = {0, 1, 511, 0, 1, 511, -1, 512, INT_MAX};
  int rank = PICK(ranks), ch = PICK(chans);
  int slot = -1;
  for (int s = 0; s < NSLOT; s++)
    if (slot_channels[s] == ch) slot = s;
  int valid = b != NULL && rank == 0 && slot >= 0;
  int rc, code;
  switch (below(3)) {
    case 0:
      op = "symm_put_signal";
      if (valid && b->slot[slot]) return; /* a second put waits for the peer's wait: it would block */
      symm_clear_error();
      rc = symm_put_signal(h, rank, ch, PICK(streams));
      code = answer(op);
      if (valid && code == SYMM_OK) b->slot[slot] = 1;
      break;
    case 1:
      op = "symm_wait_signal";
      symm_clear_error();
      rc = symm_wait_signal(h, rank, ch, PICK(streams), 1);
      code = answer(op);
      if (valid) {
        EXPECT(op, code, b->slot[slot] ? SYMM_OK : SYMM_ERR_TIMEOUT);
        b->slot[slot] = 0;
        CHECK(rc == code, "returned %d, code %d", rc, code);
        return;
      }
      break;
    default:
      op = "symm_barrier";
      symm_clear_error();
      rc = symm_barrier(h, ch, PICK(streams), 1); /* a world of one: no peer to wait for */
      code = answer(op);
      valid = b != NULL && slot >= 0;
  }
  CHECK(rc == code, "returned %d, code %d", rc, code);
  EXPECT(op, code, valid ? SYMM_OK : SYMM_ERR_INVALID);
}

static void op_stats(void) {
  static symm_stat_t st[256];
  int dev = chance(70) ? (int)below(NDEV) : PICK(devs);
  if (chance(20)) {
    op = "symm_pool_reset_peak";
    symm_clear_error();
    int rc = symm_pool_reset_peak(dev);
    int code = answer(op);
    CHECK(rc == code, "returned %d, code %d", rc, code);
    EXPECT(op, code, dev_ok(dev) ? SYMM_OK : SYMM_ERR_INVALID);
    return;
  }
  op = "symm_pool_stats";
  static const int caps[] = {0, 3, 256, -1, 5};
  int cap = PICK(caps);
  symm_stat_t *out = cap == 5 || (cap == 0 && chance(50)) ? NULL : st;
  symm_clear_error();
  int n = symm_pool_stats(dev, out, cap);
  int code = answer(op);
  if (!dev_ok(dev) || cap < 0 || (cap > 0 && out == NULL)) {
    CHECK(n == -1, "returned %d", n);
    EXPECT(op, code, SYMM_ERR_INVALID);
  } else {
    CHECK(n > 100 && n <= 256, "returned %d", n);
    EXPECT(op, code, SYMM_OK);
  }
}

static void op_limits(void) {
  int dev = chance(70) ? (int)below(NDEV) : PICK(devs);
  if (chance(50)) {
    op = "symm_pool_set_memory_fraction";
    static const double fr[] = {-1, 0, 0.5, 1, 2, NAN};
    double f = PICK(fr);
    symm_clear_error();
    symm_pool_set_memory_fraction(f, dev);
    int code = answer(op);
    EXPECT(op, code, dev_ok(dev) && f >= 0 && f <= 1 ? SYMM_OK : SYMM_ERR_INVALID); /* 0: a cap of 0 bytes, as in PyTorch */
  } else {
    op = "symm_pool_set_limit";
    static const uint64_t lim[] = {0, 0, MiB, 64 * MiB, 512 * MiB, UINT64_MAX};
    symm_clear_error();
    int rc = symm_pool_set_limit(dev, PICK(lim));
    int code = answer(op);
    CHECK(rc == code, "returned %d, code %d", rc, code);
    EXPECT(op, code, dev_ok(dev) ? SYMM_OK : SYMM_ERR_INVALID);
  }
}

static const char *key_name(int k) {
  static char name[NKEYS][8];
  snprintf(name[k], sizeof name[k], "k%d", k);
  return name[k];
}

static void op_store(void) {
  int live;
  symm_store_t st = any_store(&live, 1);
  int k = (int)below(NKEYS);
  const char *key = key_name(k);
  int rc, code;
  switch (below(4)) {
    case 0: { /* set */
      op = "symm_store_set";
      static const char *vals[] = {"12", "-5", "abc", "", "9223372036854775807", "-9223372036854775808"};
      const char *v = PICK(vals);
      size_t len = strlen(v);
      int bad = chance(3);
      symm_clear_error();
      rc = symm_store_set(st, bad ? NULL : key, bad ? NULL : v, len);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      if (bad || !live) {
        EXPECT(op, code, SYMM_ERR_INVALID);
      } else {
        EXPECT(op, code, SYMM_OK);
        char *end;
        long long n = strtoll(v, &end, 10);
        keys[k].kind = len > 0 && *end == 0 ? K_INT : K_BYTES;
        keys[k].v = n;
        memcpy(keys[k].bytes, v, len);
        keys[k].len = len;
      }
      break;
    }
    case 1: { /* get, without waiting */
      op = "symm_store_get";
      char buf[64];
      static const size_t caps[] = {0, 2, 64};
      size_t cap = PICK(caps), len = 999;
      symm_clear_error();
      rc = symm_store_get(st, key, cap ? buf : NULL, cap, &len, chance(50) ? 0 : -1);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      if (!live) {
        EXPECT(op, code, SYMM_ERR_INVALID);
      } else if (keys[k].kind == K_ABSENT) {
        EXPECT(op, code, SYMM_ERR_TIMEOUT);
      } else {
        EXPECT(op, code, SYMM_OK);
        char want[32];
        size_t wl = keys[k].len;
        if (keys[k].kind == K_INT) wl = (size_t)snprintf(want, sizeof want, "%lld", (long long)keys[k].v);
        else memcpy(want, keys[k].bytes, wl);
        CHECK(code != SYMM_OK || (len == wl && memcmp(buf, want, cap < wl ? cap : wl) == 0),
              "%s: %zu bytes, want %zu", key, len, wl);
      }
      break;
    }
    case 2: { /* add */
      op = "symm_store_add";
      static const int64_t deltas[] = {1, -1, 0, 1000, INT64_MAX, INT64_MIN};
      int64_t d = PICK(deltas), out = 0;
      int nullkey = chance(3);
      symm_clear_error();
      rc = symm_store_add(st, nullkey ? NULL : key, d, chance(30) ? NULL : &out);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      if (!live || nullkey) {
        EXPECT(op, code, SYMM_ERR_INVALID);
        break;
      }
      int64_t cur = keys[k].kind == K_INT ? keys[k].v : 0;
      int over = (d > 0 && cur > INT64_MAX - d) || (d < 0 && cur < INT64_MIN - d);
      if (keys[k].kind == K_BYTES || over) {
        EXPECT(op, code, SYMM_ERR_INVALID);
      } else {
        EXPECT(op, code, SYMM_OK);
        CHECK(code != SYMM_OK || out == 0 || out == cur + d, "%s: %lld + %lld gave %lld", key, (long long)cur,
              (long long)d, (long long)out);
        keys[k].kind = K_INT;
        keys[k].v = cur + d;
      }
      break;
    }
    default: { /* the handles' life: server, connect, close */
      if (chance(50) && nextra < MAXSTORES) {
        symm_store_t s = 0;
        int client = chance(60);
        op = client ? "symm_store_connect" : "symm_store_server";
        symm_clear_error();
        rc = client ? symm_store_connect(st_addr, NULL, 1000, &s) : symm_store_server("", NULL, &s, NULL, 0);
        code = answer(op);
        CHECK(rc == code && code == SYMM_OK && s != 0, "a new store: %d", code);
        if (code == SYMM_OK) {
          extra_is_client[nextra] = client;
          extra[nextra++] = s;
        }
      } else {
        op = "symm_store_close";
        int i = nextra && chance(60) ? (int)below(nextra) : -1;
        symm_store_t s = i >= 0 ? extra[i] : any_store(&live, 0);
        if (s == st_main) return; /* every area uses it */
        for (int j = 0; j < nextra; j++)
          if (extra[j] == s) i = j;
        symm_clear_error();
        rc = symm_store_close(s);
        code = answer(op);
        CHECK(rc == code, "returned %d, code %d", rc, code);
        EXPECT(op, code, i >= 0 ? SYMM_OK : SYMM_ERR_INVALID);
        if (i >= 0) {
          dead_stores[ndead_stores++ % 16] = s;
          extra[i] = extra[nextra - 1];
          extra_is_client[i] = extra_is_client[nextra - 1];
          nextra--;
        }
      }
    }
  }
}

static void op_misc(void) {
  int rc, code, out = 7;
  switch (below(12)) {
    case 0:
      op = "symm_pool_empty_cache";
      symm_clear_error();
      symm_pool_empty_cache();
      EXPECT(op, answer(op), SYMM_OK);
      break;
    case 1:
      op = "symm_pool_device_count";
      symm_clear_error();
      rc = symm_pool_device_count();
      EXPECT(op, answer(op), SYMM_OK);
      CHECK(rc == NDEV, "%d devices", rc);
      CHECK(strcmp(symm_pool_backend(), "host") == 0, "backend %s", symm_pool_backend());
      break;
    case 2:
      op = "symm_pool_init";
      symm_clear_error();
      symm_pool_init(PICK(devs));
      EXPECT(op, answer(op), SYMM_OK);
      break;
    case 3: {
      op = "symm_set_backend";
      static const char *names[] = {"host", "cuda", "tpu", "", NULL, "nccl"};
      const char *n = PICK(names);
      symm_clear_error();
      rc = symm_set_backend(n);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      EXPECT(op, code, n && !strcmp(n, "host") ? SYMM_OK : SYMM_ERR_INVALID);
      break;
    }
    case 4: {
      op = "symm_get_backend";
      char buf[16];
      static const size_t caps[] = {0, 7, 8, 16, SIZE_MAX};
      size_t cap = PICK(caps);
      char *b = chance(10) ? NULL : buf;
      symm_clear_error();
      rc = symm_get_backend(b, cap);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      EXPECT(op, code, b && cap >= 8 ? SYMM_OK : SYMM_ERR_INVALID);
      if (code == SYMM_OK) CHECK(strcmp(buf, "host") == 0, "backend %.16s", buf);
      break;
    }
    case 5:
      op = "symm_has_multicast_support";
      symm_clear_error();
      rc = symm_has_multicast_support(PICK(devs));
      EXPECT(op, answer(op), SYMM_OK);
      CHECK(rc == 0, "multicast %d", rc);
      break;
    case 6: {
      op = "symm_world_within_direct_access";
      int live;
      symm_store_t st = any_store(&live, 0);
      int dev = PICK(devs), rank = chance(80) ? 0 : -1;
      symm_clear_error();
      rc = symm_world_within_direct_access(st, "wwda", rank, 1, dev, &out);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      EXPECT(op, code, live && dev_ok(dev) && rank == 0 ? SYMM_OK : SYMM_ERR_INVALID);
      CHECK(code != SYMM_OK || out == 1, "direct access %d", out);
      break;
    }
    case 7: {
      op = "symm_backend_init";
      int live;
      symm_store_t st = any_store(&live, 0);
      int dev = PICK(devs), rank = chance(70) ? 0 : PICK(devs), world = chance(70) ? 1 : PICK(devs);
      symm_clear_error();
      rc = symm_backend_init(st, rank, world, dev);
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      EXPECT(op, code, live && dev_ok(dev) && rank >= 0 && rank < world ? SYMM_OK : SYMM_ERR_INVALID);
      break;
    }
    case 8:
      op = "symm_nccl_adopt_comm";
      symm_clear_error();
      rc = symm_nccl_adopt_comm(NULL, PICK(devs));
      code = answer(op);
      CHECK(rc == code, "returned %d, code %d", rc, code);
      EXPECT(op, code, SYMM_ERR_INVALID);
      break;
    case 9: {
      op = "symm_copy_last_error";
      char buf[64];
      static const size_t lens[] = {0, 1, 8, 64};
      size_t len = PICK(lens);
      size_t n = symm_copy_last_error(chance(20) ? NULL : buf, len);
      CHECK(n == strlen(symm_last_error()), "length %zu", n);
      CHECK(symm_version()[0] != 0, "version");
      break;
    }
    case 10: {
      int nv = chance(50);
      op = nv ? "symm_nvshmem_available" : "symm_nccl_available";
      symm_clear_error();
      rc = nv ? symm_nvshmem_available() : symm_nccl_available();
      code = answer(op);
      CHECK(rc == 1 ? code == SYMM_OK : code == SYMM_ERR_NO_DEVICE, "available %d, code %d", rc, code);
      break;
    }
    default:
      if (chance(10)) { /* slow-ish (library search): rarely */
        op = "symm_topology";
        size_t len = 0;
        static char buf[1 << 16];
        static const size_t caps[] = {0, 1, 100, sizeof buf};
        size_t cap = PICK(caps);
        size_t *lp = chance(10) ? NULL : &len;
        symm_clear_error();
        rc = symm_topology(NULL, cap ? buf : NULL, cap, lp);
        code = answer(op);
        CHECK(rc == code, "returned %d, code %d", rc, code);
        EXPECT(op, code, lp && (cap == 0 || cap == sizeof buf) ? SYMM_OK : SYMM_ERR_INVALID);
      }
  }
}

/* ---- descriptors, mappings, statistics ---------------------------------------------- */



static int64_t stat_of(int dev, const char *name) {
  symm_stat_t st[256];
  int n = symm_pool_stats(dev, st, 256);
  for (int i = 0; i < n && i < 256; i++)
    if (strcmp(st[i].name, name) == 0) return st[i].value;
  return INT64_MIN;
}

/* The pool's count of live blocks is the model's. */
static void check_counts(void) {
  for (int d = 0; d < NDEV; d++) {
    int want = 0;
    for (int i = 0; i < npool; i++) want += pool[i].dev == d;
    int64_t got = stat_of(d, "allocation.all.current");
    CHECK(got == want, "device %d: %lld blocks allocated, the model has %d", d, (long long)got, want);
  }
}

int main(void) {
  setenv("SYMM_DEVICE", "host", 0);
  setenv("SYMM_HOST_MEMORY", "1GiB", 1);
  setenv("SYMM_HOST_DEVICES", "2", 1);
  setenv("SYMM_TIMEOUT_MS", "2000", 1);
  const char *s = getenv("SYMM_FUZZ_SEED"), *n = getenv("SYMM_FUZZ_ITERS");
  uint64_t seed = s && *s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
  long iters = n && *n ? strtol(n, NULL, 0) : 20000;
  rng = seed;
  printf("test_fuzz_api: seed %llu, %ld iterations (SYMM_FUZZ_SEED=%llu SYMM_FUZZ_ITERS=%ld to replay)\n",
         (unsigned long long)seed, iters, (unsigned long long)seed, iters);
  fflush(stdout);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);

  /* The first successful alloc (and a rendezvous, through a store of its
   * own, closed with the group's link), then the baseline. */
  symm_store_t st_warm;
  char warm_addr[64];
  if (symm_store_server("", "", &st_warm, warm_addr, sizeof warm_addr) != SYMM_OK) {
    fprintf(stderr, "store server: %s\n", symm_last_error());
    return 2;
  }
  void *first = symm_pool_alloc(4096, 0, NULL);
  CHECK(first != NULL, "first alloc");
  symm_pool_free(first, 4096, 0, NULL);
  void *warm = symm_alloc(4096, 0, NULL);
  symm_handle_t wh;
  CHECK(warm && symm_rendezvous(warm, st_warm, "warm", 0, 1, &wh) == SYMM_OK, "warm-up rendezvous");
  symm_free(warm, 0, 0, NULL);
  CHECK(symm_store_close(st_warm) == SYMM_OK, "close the warm-up store");
  symm_pool_empty_cache();
  /* On a machine with a driver, the first symm_topology opens the driver and
   * NVML for good (their descriptors stay open, as they do in any CUDA
   * program): open them before the baseline. */
  size_t warm_len = 0;
  symm_topology(NULL, NULL, 0, &warm_len);
  int fds0 = count_fds(), maps0 = count_maps();
  /* The main store: closed in the teardown, before the count, with the
   * mailboxes of the groups joined through it. */
  if (symm_store_server("", "", &st_main, st_addr, sizeof st_addr) != SYMM_OK) {
    fprintf(stderr, "store server: %s\n", symm_last_error());
    return 2;
  }

  for (iter = 0; iter < iters; iter++) {
    int r = (int)below(100);
    if (r < 22) op_pool_alloc();
    else if (r < 44) op_pool_free();
    else if (r < 49) op_record_stream();
    else if (r < 54) op_symm_alloc();
    else if (r < 59) op_symm_free();
    else if (r < 62) op_rendezvous();
    else if (r < 65) op_handle_info();
    else if (r < 71) op_signal();
    else if (r < 75) op_stats();
    else if (r < 77) op_limits();
    else if (r < 88) op_store();
    else op_misc();
    if (iter % 1000 == 999) check_counts();
  }

  /* Free everything live: each once, each intact. */
  op = "teardown";
  check_counts();
  for (int d = 0; d < NDEV; d++) symm_pool_set_limit(d, 0);
  symm_clear_error();
  while (npool) {
    pblock_t *b = &pool[npool - 1];
    check_tags(b->p, b->size, b->tag, "pool block");
    symm_pool_free(b->p, b->size, b->dev, b->stream);
    npool--;
  }
  while (nsym) {
    sblock_t *b = &sym[nsym - 1];
    check_tags(b->p, b->size, b->tag, "symmetric block");
    symm_free(b->p, b->size, 0, NULL);
    nsym--;
  }
  CHECK(symm_last_error_code() == SYMM_OK, "every live block freed");
  while (nextra) CHECK(symm_store_close(extra[--nextra]) == SYMM_OK, "close");
  CHECK(symm_store_close(st_main) == SYMM_OK, "close the main store");
  symm_pool_empty_cache();
  for (int d = 0; d < NDEV; d++) {
    CHECK(stat_of(d, "allocated_bytes.all.current") == 0, "device %d: %lld bytes still allocated", d,
          (long long)stat_of(d, "allocated_bytes.all.current"));
    CHECK(stat_of(d, "reserved_bytes.all.current") == 0, "device %d: %lld bytes still reserved", d,
          (long long)stat_of(d, "reserved_bytes.all.current"));
  }
  /* Connections of closed stores are closed by goroutines: give them a moment. */
  for (int i = 0; i < 200 && count_fds() != fds0; i++) usleep(5000);
  CHECK(count_fds() == fds0, "descriptors: %d at the baseline, %d at the end", fds0, count_fds());
  CHECK(count_maps() == maps0, "mappings: %d at the baseline, %d at the end", maps0, count_maps());

  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  if (getenv("SYMM_TEST_VERBOSE") && !strcmp(getenv("SYMM_TEST_VERBOSE"), "1"))
    for (int i = 0; i < 48 && tally[i].fn; i++)
      printf("  %-32s %6d calls, %6d succeeded\n", tally[i].fn, tally[i].calls, tally[i].ok);
  printf("codes: OK %d, INVALID %d, OUT_OF_MEMORY %d, NO_DEVICE %d, UNKNOWN_POINTER %d, TIMEOUT %d\n", codes[0],
         codes[1], codes[2], codes[3], codes[4], codes[8]);
  printf("test_fuzz_api: %d passed, %d failed (seed %llu, %ld iterations, %.1f s)\n", checks - failures, failures,
         (unsigned long long)seed, iters, secs);
  return failures != 0;
}
