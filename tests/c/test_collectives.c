/* Signals and the one-shot all-reduce through include/symm.h, one process
 * per rank (spawned: Go does not survive fork), a real TCP store.
 *
 *   test_collectives            host backend (SYMM_DEVICE=host): CI
 *   gpu_collectives [world]     the same program built with -DSYMM_GPU: the
 *                               CUDA backend, kernels required
 *                               (SYMM_SIGNALS=kernel); ranks share GPUs when
 *                               there are fewer than world
 *
 * Each rank checks: barriers and a put/wait ring that carries data; the
 * all-reduce of float32 and bfloat16 from 4 bytes to 4 MiB, at offsets that
 * take the 16-byte and the 4-byte kernels, with and without a local input
 * (also in place: out = local_input), bit for bit against a host sum in rank
 * order (what the kernel computes);
 * every bad argument gets SYMM_ERR_INVALID and leaves the handle working; a
 * peer that does not come gives SYMM_ERR_TIMEOUT naming it, with and without
 * timeout_ms, and the stream goes on. The driver is opened with dlopen: no
 * CUDA toolkit is needed to build this. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "symm.h"

#define KiB 1024
#define MiB (1024 * 1024)

/* ---- memory the library's "device" means: GPU memory, or host memory ---- */

#ifdef SYMM_GPU
#include "../device/cudadrv.h"

static int use_device(int dev) {
  CUcontext ctx;
  return cuDevicePrimaryCtxRetain(&ctx, dev) == 0 && cuCtxSetCurrent(ctx) == 0 ? 0 : -1;
}
static void *dev_alloc(size_t n) {
  CUdeviceptr p = 0;
  return cuMemAlloc(&p, n) == 0 ? (void *)p : NULL;
}
static void dev_free(void *p) { cuMemFree((CUdeviceptr)p); }
/* Synchronous copies on the legacy default stream: ordered after the
 * library's work queued on it (stream NULL below). */
static int to_dev(void *dst, const void *src, size_t n) { return cuMemcpyHtoD((CUdeviceptr)dst, src, n); }
static int from_dev(void *dst, const void *src, size_t n) { return cuMemcpyDtoH(dst, (CUdeviceptr)src, n); }
static int dev_sync(void) { return cuCtxSynchronize(); }
#define BACKEND "cuda"
#else
static int use_device(int dev) { return dev >= 0 ? 0 : -1; }
static void *dev_alloc(size_t n) { return aligned_alloc(256, n); }
static void dev_free(void *p) { free(p); }
static int to_dev(void *dst, const void *src, size_t n) { return memcpy(dst, src, n), 0; }
static int from_dev(void *dst, const void *src, size_t n) { return memcpy(dst, src, n), 0; }
static int dev_sync(void) { return 0; }
#define BACKEND "host"
#endif

/* ---- reference ------------------------------------------------------------ */

static float f32_of(uint32_t w) {
  float f;
  memcpy(&f, &w, 4);
  return f;
}
static uint32_t bits_of(float f) {
  uint32_t w;
  memcpy(&w, &f, 4);
  return w;
}
static uint16_t to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* IEEE half precision, as the kernel's cvt.rn.f16.f32 (round to nearest
 * even; no NaN in these tests). */
static uint16_t to_f16(float f) {
  uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {
    uint32_t v = a - (112u << 23);
    return sign | (uint16_t)((v + 0xfffu + ((v >> 13) & 1u)) >> 13);
  }
  uint32_t e = a >> 23;
  if (e < 101) return sign;
  uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) r++;
  return sign | (uint16_t)r;
}
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return f32_of(sign | 0x7f800000u | (man << 13));
  if (exp == 0) return f32_of(sign | bits_of((float)man / 16777216.0f));
  return f32_of(sign | ((exp + 112) << 23) | (man << 13));
}

/* Rank r's input word i: pseudo-random floats (or bf16 pairs) of mixed
 * signs and magnitudes, the same on every rank. */
static uint32_t input_word(int dtype, int r, size_t i) {
  uint64_t x = (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  float a = (float)((int64_t)(x % 2000001) - 1000000) / 4096.0f;
  float b = (float)((int64_t)((x >> 21) % 2001) - 1000) / 8.0f;
  if (dtype == SYMM_FLOAT32) return bits_of(a);
  if (dtype == SYMM_FLOAT16) return (uint32_t)to_f16(a) | ((uint32_t)to_f16(b) << 16);
  return (uint32_t)to_bf16(a) | ((uint32_t)to_bf16(b) << 16);
}

/* The sum of every rank's word i, in rank order with float accumulation. */
static uint32_t expected_word(int dtype, int world, size_t i) {
  float lo = 0, hi = 0;
  for (int r = 0; r < world; r++) {
    uint32_t w = input_word(dtype, r, i);
    if (dtype == SYMM_FLOAT32) {
      lo += f32_of(w);
    } else if (dtype == SYMM_FLOAT16) {
      lo += f16_to_f32((uint16_t)w);
      hi += f16_to_f32((uint16_t)(w >> 16));
    } else {
      lo += f32_of(w << 16);
      hi += f32_of(w & 0xffff0000u);
    }
  }
  if (dtype == SYMM_FLOAT32) return bits_of(lo);
  if (dtype == SYMM_FLOAT16) return (uint32_t)to_f16(lo) | ((uint32_t)to_f16(hi) << 16);
  return (uint32_t)to_bf16(lo) | ((uint32_t)to_bf16(hi) << 16);
}

/* ---- the push all-reduce's reference -------------------------------------- */

static size_t elem_size(int dtype) { return dtype == SYMM_FLOAT32 ? 4 : 2; }
static const char *dtype_name(int dtype) { return dtype == SYMM_FLOAT32 ? "f32" : dtype == SYMM_FLOAT16 ? "f16" : "bf16"; }

/* Rank r's element i of push call k, as stored (mixed signs and
 * magnitudes, the same on every rank), and its value. */
static uint32_t push_elem(int dtype, int r, int k, size_t i) {
  uint64_t x = ((uint64_t)(r + 1) * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(k + 7) * 0xd1b54a32d192ed03ull) ^
               ((uint64_t)i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  float a = (float)((int64_t)(x % 2000001) - 1000000) / 8192.0f;
  if (dtype == SYMM_FLOAT32) return bits_of(a);
  return dtype == SYMM_BFLOAT16 ? to_bf16(a) : to_f16(a);
}
static float elem_value(int dtype, uint32_t e) {
  if (dtype == SYMM_FLOAT32) return f32_of(e);
  return dtype == SYMM_BFLOAT16 ? f32_of(e << 16) : f16_to_f32((uint16_t)e);
}
static void put_elem(char *p, int dtype, size_t i, uint32_t e) {
  if (dtype == SYMM_FLOAT32) memcpy(p + 4 * i, &e, 4);
  else {
    uint16_t h = (uint16_t)e;
    memcpy(p + 2 * i, &h, 2);
  }
}
/* The sum of element i of call k over world ranks, in rank order with float
 * accumulation, rounded to the dtype (what every rank computes). */
static uint32_t push_sum(int dtype, int world, int k, size_t i) {
  float acc = 0;
  for (int r = 0; r < world; r++) acc += elem_value(dtype, push_elem(dtype, r, k, i));
  if (dtype == SYMM_FLOAT32) return bits_of(acc);
  return dtype == SYMM_BFLOAT16 ? to_bf16(acc) : to_f16(acc);
}

/* ---- the ranks ------------------------------------------------------------ */

static symm_store_t st;

/* Waits until every rank has reached point `name` (through the store, not a
 * barrier: used where signals may be out of step). */
static void store_sync(const char *name, int world) {
  int64_t n = 0;
  char key[64];
  snprintf(key, sizeof key, "sync/%s", name);
  symm_store_add(st, key, 1, &n);
  /* A rank may be waiting out SYMM_TIMEOUT_MS (the lost-signal check). */
  const char *t = getenv("SYMM_TIMEOUT_MS");
  int limit_ms = 3 * (t ? atoi(t) : 3000) + 20000;
  for (int i = 0; i < limit_ms && n < world; i++) {
    usleep(1000);
    symm_store_add(st, key, 0, &n);
  }
  CHECK(n >= world, "store sync %s: %lld of %d ranks", name, (long long)n, world);
}

/* The timeout of the collectives' checked calls, taken in turn: 20000 ms
 * (the call goes through the library's Go core, which waits for the
 * kernel) and 0 (after a handle's first call on a GPU, launched from the
 * handle's plan without entering Go): both ways get every shape. */
static int coll_timeout(void) {
  static int calls;
  return calls++ % 2 ? 0 : 20000;
}

/* One all-reduce of count elements at offset, checked bit for bit. */
static void check_all_reduce(symm_handle_t h, void *buf, int rank, int world, int dtype, size_t offset, size_t count,
                             int with_local, uint32_t *host, void *out, void *local) {
  size_t nbytes = count * (dtype == SYMM_FLOAT32 ? 4 : 2), nwords = nbytes / 4;
  for (size_t i = 0; i < nwords; i++) host[i] = input_word(dtype, rank, i);
  if (with_local) {
    CHECK(to_dev(local, host, nbytes) == 0, "input to the local buffer");
  } else {
    CHECK(to_dev((char *)buf + offset, host, nbytes) == 0, "input to the symmetric buffer");
  }
  int rc = symm_one_shot_all_reduce(h, offset, count, dtype, SYMM_SUM, out, with_local ? local : NULL, NULL, coll_timeout());
  CHECK(rc == SYMM_OK, "all-reduce of %zu %s at offset %zu%s: %d %s", count, dtype_name(dtype), offset,
        with_local ? " (local input)" : "", rc, symm_last_error());
  CHECK(dev_sync() == 0, "sync");
  memset(host, 0xff, nbytes);
  CHECK(from_dev(host, out, nbytes) == 0, "read the output");
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < nwords; i++)
    if (host[i] != expected_word(dtype, world, i) && bad++ == 0) first = i;
  CHECK(bad == 0, "all-reduce of %zu %s at offset %zu%s: %zu of %zu words wrong, first %zu: %#x, want %#x", count,
        dtype_name(dtype), offset, with_local ? " (local)" : "", bad, nwords, first, host[first],
        expected_word(dtype, world, first));
  if (with_local) { /* the local input was copied into our buffer */
    CHECK(from_dev(host, (char *)buf + offset, nbytes) == 0 && host[nwords - 1] == input_word(dtype, rank, nwords - 1),
          "local input copied into the symmetric buffer");
  }
}

/* One two-shot all-reduce of count elements at offset: mode 0 in place in
 * the symmetric buffer, 1 out of place, 2 from local_input in place (out is
 * local), 3 from local_input into the symmetric buffer. The sum checked bit
 * for bit in out and in the symmetric buffer (where the all-gather leaves
 * it in every mode), and the word after out untouched. */
static void check_two_shot(symm_handle_t h, void *buf, int rank, int world, int dtype, size_t offset, size_t count,
                           int mode, uint32_t *host, void *out, void *local) {
  static const char *modes[] = {"in place", "out of place", "local in place", "local to the buffer"};
  size_t nbytes = count * (dtype == SYMM_FLOAT32 ? 4 : 2), nwords = nbytes / 4;
  char *mine = (char *)buf + offset;
  for (size_t i = 0; i < nwords; i++) host[i] = input_word(dtype, rank, i);
  host[nwords] = 0x5a5a5a5au;
  CHECK(to_dev(mode >= 2 ? local : mine, host, nbytes + (mode == 2 ? 4 : 0)) == 0, "two-shot input");
  void *dst = mode == 0 || mode == 3 ? (void *)mine : mode == 2 ? local : out;
  if (mode == 1) CHECK(to_dev((char *)out + nbytes, host + nwords, 4) == 0, "the word after the output");
  int rc = symm_two_shot_all_reduce(h, offset, count, dtype, SYMM_SUM, dst, mode >= 2 ? local : NULL, NULL, coll_timeout());
  CHECK(rc == SYMM_OK, "two-shot all-reduce of %zu %s at offset %zu (%s): %d %s", count, dtype_name(dtype), offset,
        modes[mode], rc, symm_last_error());
  CHECK(dev_sync() == 0, "sync");
  for (int pass = 0; pass < 2; pass++) {
    memset(host, 0xff, nbytes + 4);
    CHECK(from_dev(host, pass ? mine : dst, nbytes + (pass ? 0 : 4)) == 0, "read the two-shot output");
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < nwords; i++)
      if (host[i] != expected_word(dtype, world, i) && bad++ == 0) first = i;
    CHECK(bad == 0, "two-shot all-reduce of %zu %s at offset %zu (%s), %s: %zu of %zu words wrong, first %zu: %#x, want %#x",
          count, dtype_name(dtype), offset, modes[mode], pass ? "symmetric buffer" : "output", bad, nwords, first,
          host[first], expected_word(dtype, world, first));
    if (!pass && (mode == 1 || mode == 2))
      CHECK(host[nwords] == 0x5a5a5a5au, "two-shot (%s): the word after the output written", modes[mode]);
  }
}

/* One reduce-scatter and one all-gather of count elements per rank (nbytes
 * each) at offset: mode 0 in place (out: this rank's share of its buffer /
 * its buffer), 1 out of place, 2 from local_input, 3 from local_input in
 * NCCL's in-place layout (reduce-scatter: out at local_input's share r;
 * all-gather: local_input at out's share r). Checked bit for bit (the
 * reduce-scatter against the rank-order float sum of the words of share r),
 * and the word after out untouched. */
static void check_rs_ag(symm_handle_t h, void *buf, int rank, int world, int dtype, size_t offset, size_t count, int mode,
                        uint32_t *host, void *out, void *local) {
  static const char *modes[] = {"in place", "out of place", "local", "local in place"};
  size_t nbytes = count * elem_size(dtype), nw = nbytes / 4, tw = nw * world;
  char *mine = (char *)buf + offset, *share = mine + nbytes * rank;
  /* All-gather: rank r's words are input_word(float32, r, j), copied. */
  for (size_t j = 0; j < nw; j++) host[j] = input_word(SYMM_FLOAT32, rank, j);
  void *ag_out = mode == 0 ? (void *)mine : out;
  const void *ag_local = mode == 2 ? local : mode == 3 ? (char *)out + nbytes * rank : NULL;
  CHECK(to_dev(ag_local ? (void *)ag_local : share, host, nbytes) == 0, "all-gather input");
  uint32_t canary = 0x5a5a5a5au;
  if (mode) CHECK(to_dev((char *)out + nbytes * world, &canary, 4) == 0, "the word after the output");
  int rc = symm_all_gather(h, offset, count, dtype, ag_out, ag_local, NULL, coll_timeout());
  CHECK(rc == SYMM_OK, "all-gather of %zu x %zu bytes at offset %zu (%s): %d %s", (size_t)world, nbytes, offset,
        modes[mode], rc, symm_last_error());
  CHECK(dev_sync() == 0, "sync");
  CHECK(from_dev(host, ag_out, 4 * tw + (mode ? 4 : 0)) == 0, "read the all-gather output");
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < tw; i++)
    if (host[i] != input_word(SYMM_FLOAT32, (int)(i / nw), i % nw) && bad++ == 0) first = i;
  CHECK(bad == 0, "all-gather of %zu bytes per rank at offset %zu (%s): %zu of %zu words wrong, first %zu", nbytes, offset,
        modes[mode], bad, tw, first);
  if (mode) CHECK(host[tw] == canary, "all-gather (%s): the word after the output written", modes[mode]);
  /* No other sync: the call returned after every peer had finished its reads of this rank's buffer. */
  /* Reduce-scatter: rank r's word g of the world shares is input_word(dtype, r, g). */
  for (size_t g = 0; g < tw; g++) host[g] = input_word(dtype, rank, g);
  const void *rs_local = mode >= 2 ? local : NULL;
  void *rs_out = mode == 0 ? (void *)share : mode == 3 ? (char *)local + nbytes * rank : out;
  CHECK(to_dev(rs_local ? (void *)rs_local : mine, host, 4 * tw) == 0, "reduce-scatter input");
  if (mode == 1 || mode == 2) CHECK(to_dev((char *)out + nbytes, &canary, 4) == 0, "the word after the output");
  rc = symm_reduce_scatter(h, offset, count, dtype, SYMM_SUM, rs_out, rs_local, NULL, coll_timeout());
  CHECK(rc == SYMM_OK, "reduce-scatter of %zu bytes per rank of %s at offset %zu (%s): %d %s", nbytes,
        dtype_name(dtype), offset, modes[mode], rc, symm_last_error());
  CHECK(dev_sync() == 0, "sync");
  CHECK(from_dev(host, rs_out, nbytes + 4) == 0, "read the reduce-scatter output");
  bad = first = 0;
  for (size_t j = 0; j < nw; j++)
    if (host[j] != expected_word(dtype, world, nw * rank + j) && bad++ == 0) first = j;
  CHECK(bad == 0, "reduce-scatter of %zu bytes per rank of %s at offset %zu (%s): %zu of %zu words wrong, first %zu: %#x, want %#x",
        nbytes, dtype_name(dtype), offset, modes[mode], bad, nw, first, host[first],
        expected_word(dtype, world, nw * rank + first));
  if (mode == 1 || mode == 2) CHECK(host[nw] == canary, "reduce-scatter (%s): the word after the output written", modes[mode]);
}

/* Push call k of count elements: the input at in_off elements into din,
 * the output at out_off into dout (or in place), timeout_ms as given; the
 * sum checked bit for bit, and the bytes around the output untouched. */
static void check_push(symm_handle_t ws, int rank, int world, int dtype, size_t count, size_t in_off, size_t out_off,
                       int in_place, int k, int timeout_ms, char *host, char *din, char *dout) {
  size_t es = elem_size(dtype), nbytes = count * es;
  const char *dt = dtype == SYMM_FLOAT32 ? "f32" : dtype == SYMM_BFLOAT16 ? "bf16" : "f16";
  for (size_t i = 0; i < count; i++) put_elem(host, dtype, i, push_elem(dtype, rank, k, i));
  char *in = din + in_off * es, *out = in_place ? in : dout + 8 + out_off * es;
  CHECK(to_dev(in, host, nbytes) == 0, "push input");
  if (!in_place) {
    memset(host, 0x5a, nbytes + 2 * es);
    CHECK(to_dev(out - es, host, nbytes + 2 * es) == 0, "push output sentinels");
  }
  int rc = symm_push_all_reduce(ws, in, out, count, dtype, SYMM_SUM, NULL, timeout_ms);
  CHECK(rc == SYMM_OK, "push call %d: %zu %s (in +%zu, out %s): %d %s", k, count, dt, in_off,
        in_place ? "in place" : "apart", rc, symm_last_error());
  CHECK(dev_sync() == 0, "sync");
  CHECK(from_dev(host, out - es, nbytes + 2 * es) == 0, "read the push output");
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; i++) {
    uint32_t got = 0, want = push_sum(dtype, world, k, i);
    memcpy(&got, host + es + i * es, es);
    if (got != want && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "push call %d: %zu %s (in +%zu, %s): %zu elements wrong, first %zu", k, count, dt, in_off,
        in_place ? "in place" : "apart", bad, first);
  if (!in_place) {
    int touched = 0;
    for (size_t i = 0; i < es; i++) touched |= host[i] != 0x5a || host[es + nbytes + i] != 0x5a;
    CHECK(!touched, "push call %d: bytes next to the output written", k);
  }
}

/* The push all-reduce: every dtype, odd sizes up to the workspace's limit,
 * pointers aligned differently on each rank, in place, 1000 calls in a row
 * (SYMM_PUSH_FIRST_CALL starts them near 2^32, so the 32-bit flags wrap);
 * every bad argument refused; a peer that stays away named. */
static void push_tests(int rank, int world, int dev, char *host) {
  const size_t max_bytes = 1 * MiB;
  size_t size = symm_push_all_reduce_workspace_size(world, max_bytes);
  CHECK(size == 4 * (size_t)world * max_bytes, "workspace size %zu", size);
  CHECK(symm_push_all_reduce_workspace_size(0, 8) == 0 && symm_last_error_code() == SYMM_ERR_INVALID,
        "a workspace for 0 ranks is refused");
  CHECK(symm_push_all_reduce_workspace_size(2, 9) == 128, "9 bytes round up to 16: 4 lines of 16 bytes per rank and half");
  char *w = symm_alloc(size, dev, NULL);
  symm_handle_t ws = 0;
  CHECK(w && symm_rendezvous(w, st, "push", rank, world, &ws) == SYMM_OK, "push workspace: %s", symm_last_error());
  char *din = dev_alloc(max_bytes + 64), *dout = dev_alloc(max_bytes + 64);
  CHECK(din && dout, "push buffers");
  int k = 0;
  const size_t sizes[] = {1, 2, 3, 5, 1023, 4097, 64 * KiB, 256 * KiB + 1, 1 * MiB};
  for (int dtype = SYMM_FLOAT32; dtype <= SYMM_FLOAT16; dtype++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      size_t es = elem_size(dtype), count = sizes[s] >= 64 * KiB ? sizes[s] / es : sizes[s];
      /* 8-byte aligned; then one element or two off, the rank with two
       * changing from call to call (the kernel loads and stores 8 bytes at
       * a time where this rank's pointer allows, else 2), and in place. */
      size_t off = 1 + (rank == k % world);
      check_push(ws, rank, world, dtype, count, 0, 0, 0, k++, 0, host, din, dout);
      check_push(ws, rank, world, dtype, count, off, 2 * off + 1, 0, k++, 20000, host, din, dout);
      check_push(ws, rank, world, dtype, count, off, 0, 1, k++, 0, host, din, dout);
    }
  if (rank == 0) printf("rank 0: push all-reduce float32, bfloat16 and float16, 1 to %zu elements: checked\n", sizes[8] / 2);
  /* The choice of algorithm (symm_all_reduce_algorithm): the push up to the
   * measured crossover (1 MiB on 2 ranks, 128 KiB on 4), the two-shot
   * above it and over the workspace's limit; the push, where chosen, run on
   * this workspace. */
  const size_t crossover = world <= 2 ? 1 * MiB : world == 3 ? 256 * KiB : 128 * KiB;
  const size_t asked[] = {4 * KiB, 128 * KiB, 128 * KiB + 4, 256 * KiB, 512 * KiB, 1 * MiB, 4 * MiB};
  for (size_t s = 0; s < sizeof asked / sizeof asked[0]; s++) {
    int chosen = -1,
        want = asked[s] <= crossover && asked[s] <= max_bytes ? SYMM_ALL_REDUCE_PUSH : SYMM_ALL_REDUCE_TWO_SHOT;
    int rc = symm_all_reduce_algorithm(world, asked[s], max_bytes, SYMM_ALL_REDUCE_AUTO, &chosen);
    CHECK(rc == SYMM_OK && chosen == want, "%d ranks, %zu bytes: algorithm %d, want %d (%d %s)", world, asked[s], chosen,
          want, rc, symm_last_error());
    if (chosen == SYMM_ALL_REDUCE_PUSH) check_push(ws, rank, world, SYMM_BFLOAT16, asked[s] / 2, 0, 0, 0, k++, 0, host, din, dout);
  }
  int chosen = -1;
  CHECK(symm_all_reduce_algorithm(world, 4 * KiB, 2 * KiB, SYMM_ALL_REDUCE_AUTO, &chosen) == SYMM_OK &&
            chosen == SYMM_ALL_REDUCE_TWO_SHOT,
        "over the push workspace's limit: the two-shot (%d)", chosen);
  CHECK(symm_all_reduce_algorithm(world, 2 * MiB, max_bytes, SYMM_ALL_REDUCE_PUSH, &chosen) == SYMM_ERR_INVALID &&
            strstr(symm_last_error(), "over the push workspace's limit of 1048576 bytes"),
        "a forced push over the workspace's limit is refused: %s", symm_last_error());
  if (rank == 0) printf("rank 0: the all-reduce's choice for %d ranks (push up to %zu KiB): checked\n", world, crossover / KiB);
#ifdef SYMM_GPU
  const int calls = 1000;
#else
  const int calls = 200;
#endif
  for (int i = 0; i < calls; i++) check_push(ws, rank, world, i % 3, 64 + i % 7, 4 / elem_size(i % 3), 0, 1, k++, 0, host, din, dout);
  if (rank == 0) printf("rank 0: %d push all-reduce calls in a row, inputs changed each time: checked\n", calls);

  /* Bad input: each refused, the workspace still works. */
  symm_handle_info_t info;
  CHECK(symm_handle_info(ws, &info) == SYMM_OK, "workspace info");
  char *own = ((char **)info.buffer_ptrs)[rank];
  struct {
    const void *in;
    void *out;
    size_t count;
    int dtype, op, timeout_ms;
    const char *what, *says;
  } bad[] = {
      {din, dout, 16, 7, SYMM_SUM, 0, "unknown dtype", "dtype 7"},
      {din, dout, 16, SYMM_FLOAT32, 3, 0, "unknown op", "op 3"},
      {NULL, dout, 16, SYMM_FLOAT32, SYMM_SUM, 0, "NULL input", "NULL"},
      {din, NULL, 16, SYMM_FLOAT32, SYMM_SUM, 0, "NULL output", "NULL"},
      {din + 2, dout, 16, SYMM_FLOAT32, SYMM_SUM, 0, "misaligned float32 input", "aligned to the 4-byte float32 element"},
      {din, dout + 1, 16, SYMM_FLOAT16, SYMM_SUM, 0, "misaligned float16 output", "aligned to the 2-byte float16 element"},
      {din, din + 8, 16, SYMM_FLOAT32, SYMM_SUM, 0, "output 8 bytes past the input", "at a shift of +8 bytes"},
      {own + 64, dout, 16, SYMM_FLOAT32, SYMM_SUM, 0, "input in the workspace", "workspace's own buffer"},
      {din, own, 16, SYMM_BFLOAT16, SYMM_SUM, 0, "output in the workspace", "workspace's own buffer"},
      {din, dout, max_bytes / 4 + 1, SYMM_FLOAT32, SYMM_SUM, 0, "one element over the limit", "exceed the workspace's limit of 1048576 bytes"},
      {din, dout, SIZE_MAX / 2, SYMM_FLOAT32, SYMM_SUM, 0, "a count that overflows", "overflow"},
      {din, dout, 16, SYMM_FLOAT32, SYMM_SUM, -1, "negative timeout", "negative"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = symm_push_all_reduce(ws, bad[i].in, bad[i].out, bad[i].count, bad[i].dtype, bad[i].op, NULL, bad[i].timeout_ms);
    CHECK(rc == SYMM_ERR_INVALID && strstr(symm_last_error(), bad[i].says), "push, %s: %d %s", bad[i].what, rc,
          symm_last_error());
  }
  CHECK(symm_push_all_reduce(777, din, dout, 16, SYMM_FLOAT32, SYMM_SUM, NULL, 0) == SYMM_ERR_INVALID, "push, bogus handle");
  CHECK(symm_push_all_reduce(ws, NULL, NULL, 0, SYMM_FLOAT32, SYMM_SUM, NULL, 0) == SYMM_OK, "push, count 0 does nothing");
  check_push(ws, rank, world, SYMM_BFLOAT16, 1001, 1, 0, 1, k++, 0, host, din, dout); /* still works */

  /* A peer that stays away from a call: the others time out naming it and
   * the call; the stream goes on; their workspace has failed. */
  size_t tsize = symm_push_all_reduce_workspace_size(world, 4 * KiB);
  char *wt = symm_alloc(tsize, dev, NULL);
  symm_handle_t wst = 0;
  CHECK(wt && symm_rendezvous(wt, st, "push-timeouts", rank, world, &wst) == SYMM_OK, "push timeouts rendezvous: %s",
        symm_last_error());
  check_push(wst, rank, world, SYMM_FLOAT32, 100, 0, 0, 0, 0, 20000, host, din, dout); /* set up, every rank */
  int absent = world - 1;
  if (rank == 0) printf("rank 0: a push timeout is provoked on purpose next; libsymm prints it on stderr once\n");
  if (rank != absent) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = symm_push_all_reduce(wst, din, dout, 100, SYMM_FLOAT32, SYMM_SUM, NULL, 300);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
    char want[64];
    snprintf(want, sizeof want, "rank %d's data for push all-reduce call", absent);
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), want), "push without rank %d: %d %s", absent, rc,
          symm_last_error());
    CHECK(ms >= 250 && ms < 20000, "the push gave up after %.0f ms (timeout 300)", ms);
    CHECK(dev_sync() == 0, "the stream is not blocked after the push timeout");
    rc = symm_push_all_reduce(wst, din, dout, 100, SYMM_FLOAT32, SYMM_SUM, NULL, 0);
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), want), "the workspace failed: %d %s", rc, symm_last_error());
    if (rank == 0) printf("rank 0: expected timeout, push without rank %d: %s (%.0f ms)\n", absent, symm_last_error(), ms);
  }
  store_sync("after-push-timeout", world);
  check_push(ws, rank, world, SYMM_FLOAT16, 333, 0, 0, 0, k++, 0, host, din, dout); /* the other workspace still works */
  CHECK(dev_sync() == 0, "sync");
  symm_clear_error();
  symm_free(wt, tsize, dev, NULL);
  symm_free(w, size, dev, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free the workspaces: %s", symm_last_error());
  dev_free(din);
  dev_free(dout);
}

static int child(int rank, int world, int dev) {
  CHECK(use_device(dev) == 0, "device %d", dev);
  /* NVSHMEM and NCCL (SYMM_BACKEND) join their world here; the others only check. */
  CHECK(symm_backend_init(st, rank, world, dev) == SYMM_OK, "backend init: %s", symm_last_error());
  const size_t size = 4 * MiB + 64;
  char *p = symm_alloc(size, dev, NULL);
  CHECK(p != NULL, "symm_alloc: %s", symm_last_error());
  if (!p) return 1;
  symm_handle_t h = 0;
  CHECK(symm_rendezvous(p, st, "coll", rank, world, &h) == SYMM_OK, "rendezvous: %s", symm_last_error());
  symm_handle_info_t info;
  CHECK(symm_handle_info(h, &info) == SYMM_OK, "info");

  int ready = symm_kernels_ready(dev);
#ifdef SYMM_GPU
  CHECK(ready == 1, "kernels run on device %d: %s", dev, symm_last_error());
#else
  CHECK(ready == 0 && symm_last_error_code() == SYMM_ERR_NO_DEVICE && strstr(symm_last_error(), "host"),
        "no kernels on the host backend: %d, %s", ready, symm_last_error());
#endif

  /* Barriers on every channel an all-reduce uses, then a ring of put/wait
   * that carries data into the next rank's buffer. */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int nbar = 200;
  for (int i = 0; i < nbar; i++) CHECK(symm_barrier(h, i % 24, NULL, 0) == SYMM_OK, "barrier %d: %s", i, symm_last_error());
  CHECK(dev_sync() == 0, "sync after barriers");
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rank == 0)
    printf("rank 0: %d barriers in %.1f ms (%d ranks)\n", nbar,
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6, world);
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  uint32_t *host = malloc(4 * MiB + 64);
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 1024; i++) host[i] = (uint32_t)(rank * 100000 + round * 1000 + i);
    char *theirs = ((char **)info.buffer_ptrs)[next];
    CHECK(to_dev(theirs + 3 * MiB, host, 4 * KiB) == 0, "write into rank %d's buffer", next);
    CHECK(symm_put_signal(h, next, 30, NULL) == SYMM_OK, "put_signal round %d: %s", round, symm_last_error());
    CHECK(symm_wait_signal(h, prev, 30, NULL, 10000) == SYMM_OK, "wait_signal round %d: %s", round, symm_last_error());
    CHECK(from_dev(host, p + 3 * MiB, 4 * KiB) == 0, "read our buffer");
    CHECK(host[0] == (uint32_t)(prev * 100000 + round * 1000) && host[1023] == (uint32_t)(prev * 100000 + round * 1000 + 1023),
          "round %d: rank %d's data arrived before its signal (%u)", round, prev, host[0]);
    CHECK(symm_barrier(h, 30, NULL, 10000) == SYMM_OK, "barrier after round %d", round);
  }
  /* Channel 30's slots (faster ranks may already be signalling on the
   * all-reduce's channels). */
  uint32_t pad[16];
  CHECK(from_dev(pad, ((char **)info.signal_pad_ptrs)[rank] + 4 * 30 * world, 4 * world) == 0, "read our pad");
  int dirty = 0;
  for (int i = 0; i < world; i++) dirty += pad[i] != 0;
  CHECK(dirty == 0, "channel 30 of the signal pad is zero after balanced signals (%d slots set)", dirty);

  /* The all-reduce. */
  void *out = dev_alloc(4 * MiB + 64), *local = dev_alloc(4 * MiB + 64);
  CHECK(out && local, "output buffers");
  const size_t sizes[] = {4, 16, 4 * KiB, 4 * KiB + 12, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB};
  for (int dtype = SYMM_FLOAT32; dtype <= SYMM_FLOAT16; dtype++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      size_t count = sizes[s] / (dtype == SYMM_FLOAT32 ? 4 : 2);
      check_all_reduce(h, p, rank, world, dtype, 0, count, 0, host, out, local);
      if (sizes[s] <= 1 * MiB) {
        check_all_reduce(h, p, rank, world, dtype, 4, count, 0, host, out, local);  /* 4-byte kernel */
        check_all_reduce(h, p, rank, world, dtype, 32, count, 1, host, out, local); /* local input */
        check_all_reduce(h, p, rank, world, dtype, 32, count, 1, host, local, local); /* in place */
      }
    }
  if (rank == 0) printf("rank 0: all-reduce float32, bfloat16 and float16, 4 B to 4 MiB: checked\n");
  for (int dtype = SYMM_FLOAT32; dtype <= SYMM_FLOAT16; dtype++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      size_t count = sizes[s] / (dtype == SYMM_FLOAT32 ? 4 : 2);
      check_two_shot(h, p, rank, world, dtype, 0, count, 0, host, out, local);
      check_two_shot(h, p, rank, world, dtype, 0, count, 1, host, out, local);
      if (sizes[s] <= 1 * MiB) {
        check_two_shot(h, p, rank, world, dtype, 4, count, 1, host, (char *)out + 4, local); /* 4-byte kernel */
        check_two_shot(h, p, rank, world, dtype, 32, count, 2, host, out, local);
        check_two_shot(h, p, rank, world, dtype, 32, count, 3, host, out, (char *)local + 4);
      }
    }
  if (rank == 0) printf("rank 0: two-shot all-reduce float32, bfloat16 and float16, 4 B to 4 MiB, in place and out of place: checked\n");
  const size_t per_rank[] = {4, 12, 4 * KiB + 12, 64 * KiB, 256 * KiB};
  for (int dtype = SYMM_FLOAT32; dtype <= SYMM_FLOAT16; dtype++)
    for (size_t s = 0; s < sizeof per_rank / sizeof per_rank[0]; s++)
      for (int mode = 0; mode < 4; mode++) {
        size_t count = per_rank[s] / elem_size(dtype);
        check_rs_ag(h, p, rank, world, dtype, mode == 1 ? 4 : 32, count, mode, host, out, local);
        check_rs_ag(h, p, rank, world, dtype, 0, count, mode, host, out, local);
      }
  if (rank == 0) printf("rank 0: reduce-scatter and all-gather, 4 B to 256 KiB per rank, in place and not: checked\n");

  /* A second group on the same blocks: the first group owns the blocks'
   * sync area, so this one meets through the signal pad. Calls of the two
   * groups alternate and neither disturbs the other. */
  symm_handle_t h2 = 0;
  CHECK(symm_rendezvous(p, st, "coll-second", rank, world, &h2) == SYMM_OK, "second rendezvous: %s", symm_last_error());
  for (int round = 0; round < 3; round++)
    for (int dtype = SYMM_FLOAT32; dtype <= SYMM_FLOAT16; dtype++) {
      symm_handle_t hh = round % 2 ? h : h2;
      CHECK(symm_barrier(hh, round, NULL, 10000) == SYMM_OK, "barrier of group %d: %s", round % 2, symm_last_error());
      check_all_reduce(hh, p, rank, world, dtype, 32, 64 * KiB / elem_size(dtype), 1, host, out, local);
      check_two_shot(hh, p, rank, world, dtype, 0, 256 * KiB / elem_size(dtype), 1, host, out, local);
      check_rs_ag(hh, p, rank, world, dtype, 32, 4 * KiB / elem_size(dtype), round % 4, host, out, local);
    }
  if (rank == 0) printf("rank 0: a second group on the same blocks, alternating with the first: checked\n");

  /* Bad input: each refused, nothing lost. */
  struct {
    size_t offset, count;
    int dtype, op;
    void *out, *local;
    const char *what, *says;
  } bad[] = {
      {0, 16, 7, SYMM_SUM, out, NULL, "unknown dtype", "dtype"},
      {0, 16, SYMM_FLOAT32, 3, out, NULL, "unknown op", "op"},
      {2, 16, SYMM_FLOAT32, SYMM_SUM, out, NULL, "offset not a multiple of 4", "multiples of 4"},
      {0, 3, SYMM_BFLOAT16, SYMM_SUM, out, NULL, "6 bytes of bf16", "multiples of 4"},
      {0, 16, SYMM_FLOAT32, SYMM_SUM, NULL, NULL, "NULL output", "NULL"},
      {0, 16, SYMM_FLOAT32, SYMM_SUM, p + 32, NULL, "output overlapping the input", "overlaps"},
      {0, 16, SYMM_FLOAT32, SYMM_SUM, (char *)local + 4, local, "output 4 bytes past local_input",
       "overlaps local_input"},
      {0, 16, SYMM_FLOAT32, SYMM_SUM, out, (char *)out + 32, "local_input 32 bytes past the output",
       "shift of -32 bytes"},
      {4 * MiB, 64, SYMM_FLOAT32, SYMM_SUM, out, NULL, "past the buffer's end", "do not fit"},
      {0, SIZE_MAX / 2, SYMM_FLOAT32, SYMM_SUM, out, NULL, "a count that overflows", "overflow"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = symm_one_shot_all_reduce(h, bad[i].offset, bad[i].count, bad[i].dtype, bad[i].op, bad[i].out, bad[i].local,
                                      NULL, 0);
    CHECK(rc == SYMM_ERR_INVALID && strstr(symm_last_error(), bad[i].says), "%s: %d %s", bad[i].what, rc,
          symm_last_error());
  }
  CHECK(symm_one_shot_all_reduce(h, 0, 16, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, -1) == SYMM_ERR_INVALID,
        "negative timeout");
  CHECK(symm_one_shot_all_reduce(777, 0, 16, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0) == SYMM_ERR_INVALID, "bogus handle");
  CHECK(symm_one_shot_all_reduce(h, 0, 0, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 0) == SYMM_OK, "count 0 does nothing");
  check_all_reduce(h, p, rank, world, SYMM_FLOAT32, 0, 1024, 0, host, out, local); /* still works */

  push_tests(rank, world, dev, (char *)host);

  /* Peers that do not come, each case on a handle of its own: a kernel that
   * gave up leaves its handle's pads out of step, and fails the handle. The
   * last rank stays away. */
  char *q = symm_alloc(64 * KiB, dev, NULL), *qw = symm_alloc(64 * KiB, dev, NULL), *qd = symm_alloc(64 * KiB, dev, NULL);
  symm_handle_t ht = 0, hw = 0, hd = 0;
  CHECK(q && symm_rendezvous(q, st, "timeouts", rank, world, &ht) == SYMM_OK, "timeouts rendezvous: %s", symm_last_error());
  CHECK(qw && symm_rendezvous(qw, st, "timed-wait", rank, world, &hw) == SYMM_OK, "timed-wait rendezvous: %s",
        symm_last_error());
  CHECK(qd && symm_rendezvous(qd, st, "watched", rank, world, &hd) == SYMM_OK, "watched rendezvous: %s", symm_last_error());
  int absent = world - 1;
  if (rank == 0)
    printf("rank 0: the timeouts below are provoked on purpose; libsymm prints each on stderr once (\"symm: ... timed out\")\n");
  if (rank != absent) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = symm_one_shot_all_reduce(ht, 0, 1024, SYMM_FLOAT32, SYMM_SUM, out, NULL, NULL, 300);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
    char want[32];
    snprintf(want, sizeof want, "rank %d", absent);
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), want), "all-reduce without rank %d: %d %s", absent, rc,
          symm_last_error());
    CHECK(ms >= 250 && ms < 20000, "the all-reduce gave up after %.0f ms (timeout 300)", ms);
    /* The stream goes on: work queued after it completes. */
    CHECK(dev_sync() == 0, "the stream is not blocked after the timeout");
#ifdef SYMM_GPU
    rc = symm_barrier(ht, 0, NULL, 0);
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), want), "the timed-out all-reduce failed its handle: %d %s", rc,
          symm_last_error());
#endif
    check_all_reduce(h, p, rank, world, SYMM_FLOAT32, 0, 1024, 0, host, out, local);
    if (rank == 0) printf("rank 0: expected timeout, all-reduce without rank %d: %s (%.0f ms)\n", absent, symm_last_error(), ms);
  } else {
    /* Only the ranks that came synchronize through h meanwhile; the
     * absent rank joins them here. */
    check_all_reduce(h, p, rank, world, SYMM_FLOAT32, 0, 1024, 0, host, out, local);
  }
  store_sync("after-allreduce-timeout", world);
  if (rank == 0) {
    /* A wait nobody answers, with a timeout: the call says who. */
    int rc = symm_wait_signal(hw, 1, 31, NULL, 200);
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "rank 1") && strstr(symm_last_error(), "channel 31"),
          "wait without a signal: %d %s", rc, symm_last_error());
    CHECK(dev_sync() == 0, "the stream goes on after a timed-out wait");
#ifdef SYMM_GPU
    /* A late signal would now sit in the pad: the handle refuses every call. */
    rc = symm_put_signal(hw, 1, 3, NULL);
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "channel 31"), "the timed-out wait failed its handle: %d %s",
          rc, symm_last_error());
#endif
    /* Without a timeout: on GPUs queued and watched (SYMM_TIMEOUT_MS),
     * the handle fails once the kernel has given up; on the host the call
     * itself waits at most SYMM_TIMEOUT_MS. */
    rc = symm_wait_signal(hd, 1, 7, NULL, 0);
#ifdef SYMM_GPU
    CHECK(rc == SYMM_OK, "a wait without timeout is queued: %d %s", rc, symm_last_error());
    CHECK(dev_sync() == 0, "the kernel gives up at SYMM_TIMEOUT_MS and the stream goes on");
    usleep(200 * 1000); /* the watchdog polls every 2 ms */
    rc = symm_barrier(hd, 0, NULL, 0);
#endif
    CHECK(rc == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "rank 1") && strstr(symm_last_error(), "channel 7"),
          "a lost signal fails the handle, naming the peer and channel: %d %s", rc, symm_last_error());
    printf("rank 0: expected timeout, lost signal: %s\n", symm_last_error());
  }
  store_sync("after-waits", world);
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "the main handle still works: %s", symm_last_error());
  CHECK(dev_sync() == 0, "sync");

  symm_clear_error();
  symm_free(q, 64 * KiB, dev, NULL);
  symm_free(qw, 64 * KiB, dev, NULL);
  symm_free(qd, 64 * KiB, dev, NULL);
  symm_free(p, size, dev, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free: %s", symm_last_error());
  dev_free(out);
  dev_free(local);
  free(host);
  return 0;
}

int main(int argc, char **argv) {
  int ndev = 1;
#ifdef SYMM_GPU
  if (load_driver() != 0) return 2;
  cuDeviceGetCount(&ndev);
#endif
  if (argc == 5 && !strcmp(argv[1], "child")) {
    int rank = atoi(argv[2]), world = atoi(argv[3]);
    check_rank = rank;
    if (symm_store_connect(argv[4], "", 10000, &st) != SYMM_OK) {
      fprintf(stderr, "rank %d: connect: %s\n", rank, symm_last_error());
      return 2;
    }
    int rc = child(rank, world, rank % ndev);
    symm_store_close(st);
    if (failures) fprintf(stderr, "rank %d: %d checks failed\n", rank, failures);
    char used[32] = BACKEND; /* the backend the library ran on (SYMM_BACKEND may choose nccl or nvshmem) */
    symm_get_backend(used, sizeof used);
    printf("rank %d (%s backend): %d checks passed, %d failed\n", rank, used, passes, failures);
    return rc || failures;
  }
#ifdef SYMM_GPU
  unsetenv("SYMM_DEVICE");
  setenv("SYMM_SIGNALS", "kernel", 0);
#else
  setenv("SYMM_DEVICE", "host", 1);
#endif
  /* Kept when set (a compute-sanitizer run slows every rank's start). */
  setenv("SYMM_TIMEOUT_MS", "3000", 0);
  /* The push all-reduce's calls cross a multiple of 2^32 (the flags wrap). */
  setenv("SYMM_PUSH_FIRST_CALL", "4294967200", 0);
  int worlds[2] = {2, 4}, nworlds = 2;
  if (argc > 1) worlds[0] = atoi(argv[1]), nworlds = 1;
  if (worlds[0] < 2 || worlds[0] > 16) {
    fprintf(stderr, "usage: %s [world 2..16]\n", argv[0]);
    return 2;
  }
  int bad = 0;
  for (int k = 0; k < nworlds; k++) {
    int world = worlds[k];
    if (world > ndev) setenv("SYMM_ALLOW_OVERLAPPING_DEVICES", "1", 1);
    char addr[64];
    if (symm_store_server("", "", &st, addr, sizeof addr) != SYMM_OK) {
      fprintf(stderr, "store server: %s\n", symm_last_error());
      return 2;
    }
    int failed = run_ranks(argv[0], world, addr);
    symm_store_close(st);
    printf("%s: %d ranks on %d device(s), %s backend: %s\n", argv[0], world, ndev, BACKEND, failed ? "FAILED" : "ok");
    bad += failed;
  }
  return bad != 0;
}
