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
  return (uint32_t)to_bf16(a) | ((uint32_t)to_bf16(b) << 16);
}

/* The sum of every rank's word i, in rank order with float accumulation. */
static uint32_t expected_word(int dtype, int world, size_t i) {
  float lo = 0, hi = 0;
  for (int r = 0; r < world; r++) {
    uint32_t w = input_word(dtype, r, i);
    if (dtype == SYMM_FLOAT32) {
      lo += f32_of(w);
    } else {
      lo += f32_of(w << 16);
      hi += f32_of(w & 0xffff0000u);
    }
  }
  if (dtype == SYMM_FLOAT32) return bits_of(lo);
  return (uint32_t)to_bf16(lo) | ((uint32_t)to_bf16(hi) << 16);
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
  int rc = symm_one_shot_all_reduce(h, offset, count, dtype, SYMM_SUM, out, with_local ? local : NULL, NULL, 20000);
  CHECK(rc == SYMM_OK, "all-reduce of %zu %s at offset %zu%s: %d %s", count, dtype ? "bf16" : "f32", offset,
        with_local ? " (local input)" : "", rc, symm_last_error());
  CHECK(dev_sync() == 0, "sync");
  memset(host, 0xff, nbytes);
  CHECK(from_dev(host, out, nbytes) == 0, "read the output");
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < nwords; i++)
    if (host[i] != expected_word(dtype, world, i) && bad++ == 0) first = i;
  CHECK(bad == 0, "all-reduce of %zu %s at offset %zu%s: %zu of %zu words wrong, first %zu: %#x, want %#x", count,
        dtype ? "bf16" : "f32", offset, with_local ? " (local)" : "", bad, nwords, first, host[first],
        expected_word(dtype, world, first));
  if (with_local) { /* the local input was copied into our buffer */
    CHECK(from_dev(host, (char *)buf + offset, nbytes) == 0 && host[nwords - 1] == input_word(dtype, rank, nwords - 1),
          "local input copied into the symmetric buffer");
  }
}

static int child(int rank, int world, int dev) {
  CHECK(use_device(dev) == 0, "device %d", dev);
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
  for (int dtype = SYMM_FLOAT32; dtype <= SYMM_BFLOAT16; dtype++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      size_t count = sizes[s] / (dtype == SYMM_FLOAT32 ? 4 : 2);
      check_all_reduce(h, p, rank, world, dtype, 0, count, 0, host, out, local);
      if (sizes[s] <= 1 * MiB) {
        check_all_reduce(h, p, rank, world, dtype, 4, count, 0, host, out, local);  /* 4-byte kernel */
        check_all_reduce(h, p, rank, world, dtype, 32, count, 1, host, out, local); /* local input */
        check_all_reduce(h, p, rank, world, dtype, 32, count, 1, host, local, local); /* in place */
      }
    }
  if (rank == 0) printf("rank 0: all-reduce float32 and bfloat16, 4 B to 4 MiB: checked\n");

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
    printf("rank %d (%s backend): %d checks passed, %d failed\n", rank, BACKEND, passes, failures);
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
