/* Host time per call of the C API's signals and collectives on one GPU
 * (world 1), launched from the handle's plan (the default) and through the
 * library's Go core (SYMM_LAUNCH_THROUGH_GO=1), side by side:
 *
 *   build/bench/bench_launch [rounds]      (default 3)
 *
 * Each round runs one process per way (this program again, with --child),
 * in turn, so that both see the same machine. A process: its own store, a
 * 4 MiB symmetric block joined in a group of one, one call of each op
 * first (the first call of a handle goes through Go and makes the plan),
 * then for each op 30 batches of 100 calls on the legacy stream, the
 * device synchronized between batches: host ns per call is the batch's
 * time / 100 (the GPU is not waited for). The median over batches and
 * rounds is printed beside the anchor, the driver's own launch of an empty
 * kernel of the same shape: what is left above it is the entry point's.
 * The driver is opened with dlopen; no CUDA toolkit is needed to build
 * this.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/device/cudadrv.h"
#include "symm.h"

enum { OPS = 8, BATCHES = 30, CALLS = 100, MAXROUNDS = 20 };
static const char *op_names[OPS] = {
    "put_signal + wait_signal (per pair)", "barrier (world 1: checks only)", "one_shot_all_reduce f32 4 KiB",
    "one_shot_all_reduce bf16 256 KiB",    "two_shot_all_reduce f32 64 KiB",  "reduce_scatter f32 4 KiB",
    "all_gather f32 4 KiB",                "anchor: cuLaunchKernel of an empty kernel, 11 parameters"};

/* The anchor: the driver's own cost of one launch of the collectives' shape
 * (11 eight-byte parameters, one block) on the same stream, from PTX the
 * driver compiles: what no entry point can go below. */
static const char empty_ptx[] =
    ".version 7.8\n.target sm_80\n.address_size 64\n"
    ".visible .entry symm_bench_empty(.param .u64 a0, .param .u64 a1, .param .u64 a2, .param .u64 a3, "
    ".param .u64 a4, .param .u64 a5, .param .u64 a6, .param .u64 a7, .param .u64 a8, .param .u64 a9, "
    ".param .u64 a10) { ret; }\n";
typedef void *CUmodule;
typedef void *CUfunction;
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  void *, void **, void **);
static CUfunction empty_fn;

static int load_empty(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CUmodule mod;
  if (!lib || !(*(void **)&cuModuleLoadData = dlsym(lib, "cuModuleLoadData")) ||
      !(*(void **)&cuModuleGetFunction = dlsym(lib, "cuModuleGetFunction")) ||
      !(*(void **)&cuLaunchKernel = dlsym(lib, "cuLaunchKernel")))
    return -1;
  if (cuModuleLoadData(&mod, empty_ptx) != 0 || cuModuleGetFunction(&empty_fn, mod, "symm_bench_empty") != 0) return -1;
  return 0;
}

static int launch_empty(void) {
  uint64_t w[11] = {0};
  void *params[11];
  for (int i = 0; i < 11; i++) params[i] = &w[i];
  return cuLaunchKernel(empty_fn, 1, 1, 1, 32, 1, 1, 0, (void *)1 /* CU_STREAM_LEGACY */, params, NULL);
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* call runs op i once; non-zero on failure. */
static int call(int i, symm_handle_t h, CUdeviceptr buf, CUdeviceptr out) {
  switch (i) {
    case 0:
      return symm_put_signal(h, 0, 1, NULL) || symm_wait_signal(h, 0, 1, NULL, 0);
    case 1:
      return symm_barrier(h, 0, NULL, 0);
    case 2:
      return symm_one_shot_all_reduce(h, 0, 1024, SYMM_FLOAT32, SYMM_SUM, (void *)out, NULL, NULL, 0);
    case 3:
      return symm_one_shot_all_reduce(h, 0, 128 * 1024, SYMM_BFLOAT16, SYMM_SUM, (void *)out, NULL, NULL, 0);
    case 4:
      return symm_two_shot_all_reduce(h, 0, 16 * 1024, SYMM_FLOAT32, SYMM_SUM, (void *)buf, NULL, NULL, 0);
    case 5:
      return symm_reduce_scatter(h, 0, 1024, SYMM_FLOAT32, SYMM_SUM, (void *)out, NULL, NULL, 0);
    case 6:
      return symm_all_gather(h, 0, 1024, SYMM_FLOAT32, (void *)out, NULL, NULL, 0);
    default:
      return launch_empty();
  }
}

/* child measures every op and writes BATCHES ns-per-call figures per op to fd. */
static int child(int fd) {
  CUcontext ctx;
  if (load_driver() != 0 || cuDevicePrimaryCtxRetain(&ctx, 0) != 0 || cuCtxSetCurrent(ctx) != 0) return 2;
  symm_store_t st;
  char bound[64];
  if (symm_store_server("", "", &st, bound, sizeof bound) != SYMM_OK) {
    fprintf(stderr, "bench_launch: store: %s\n", symm_last_error());
    return 3;
  }
  const size_t size = 4 << 20;
  CUdeviceptr buf = (CUdeviceptr)symm_alloc(size, 0, NULL), out = 0;
  symm_handle_t h = 0;
  if (buf == 0 || cuMemAlloc(&out, size) != 0 || symm_rendezvous((void *)buf, st, "bench", 0, 1, &h) != SYMM_OK) {
    fprintf(stderr, "bench_launch: set-up: %s\n", symm_last_error());
    return 4;
  }
  if (load_empty() != 0) {
    fprintf(stderr, "bench_launch: the empty kernel for the anchor did not load\n");
    return 4;
  }
  double res[OPS][BATCHES];
  for (int i = 0; i < OPS; i++) {
    if (call(i, h, buf, out) != 0) {
      fprintf(stderr, "bench_launch: %s: %s\n", op_names[i], symm_last_error());
      return 5;
    }
    for (int b = 0; b < BATCHES; b++) {
      if (cuCtxSynchronize() != 0) return 6;
      double t0 = now_ns();
      int bad = 0;
      for (int c = 0; c < CALLS; c++) bad |= call(i, h, buf, out);
      res[i][b] = (now_ns() - t0) / CALLS;
      if (bad) {
        fprintf(stderr, "bench_launch: %s: %s\n", op_names[i], symm_last_error());
        return 5;
      }
    }
  }
  if (cuCtxSynchronize() != 0) return 6;
  if (write(fd, res, sizeof res) != (ssize_t)sizeof res) return 7;
  return 0;
}

/* run forks a child with SYMM_LAUNCH_THROUGH_GO=through_go and reads its figures. */
static int run(int through_go, double res[OPS][BATCHES]) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    /* A fresh process: the library's runtime does not survive fork. */
    close(p[0]);
    setenv("SYMM_LAUNCH_THROUGH_GO", through_go ? "1" : "0", 1);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", p[1]);
    execl("/proc/self/exe", "bench_launch", "--child", fd, (char *)NULL);
    _exit(8);
  }
  close(p[1]);
  size_t got = 0, want = sizeof(double) * OPS * BATCHES;
  ssize_t n;
  while (got < want && (n = read(p[0], (char *)res + got, want - got)) > 0) got += (size_t)n;
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != want || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "bench_launch: the %s child failed (status %d)\n", through_go ? "through-Go" : "plan", status);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(atoi(argv[2]));
  int rounds = argc > 1 ? atoi(argv[1]) : 3;
  if (rounds < 1 || rounds > MAXROUNDS) {
    fprintf(stderr, "usage: bench_launch [rounds 1..%d]\n", MAXROUNDS);
    return 2;
  }
  static double all[2][OPS][MAXROUNDS * BATCHES];
  for (int r = 0; r < rounds; r++)
    for (int way = 0; way < 2; way++) {
      double res[OPS][BATCHES];
      if (run(way, res) != 0) return 1;
      for (int i = 0; i < OPS; i++) memcpy(&all[way][i][r * BATCHES], res[i], sizeof res[i]);
    }
  printf("## C entry points, host ns per call, 1 GPU, world 1 (median of %d × %d batches of %d calls)\n\n", rounds,
         BATCHES, CALLS);
  double med[OPS][2];
  for (int i = 0; i < OPS; i++)
    for (int way = 0; way < 2; way++) {
      qsort(all[way][i], (size_t)(rounds * BATCHES), sizeof(double), cmp);
      med[i][way] = all[way][i][rounds * BATCHES / 2];
    }
  double anchor = med[OPS - 1][0];
  printf("| op | from the plan | through Go | plan / Go | plan − anchor |\n| --- | --- | --- | --- | --- |\n");
  for (int i = 0; i < OPS; i++) {
    printf("| %s | %.0f | %.0f | %.2f |", op_names[i], med[i][0], med[i][1], med[i][0] / med[i][1]);
    if (i == OPS - 1 || i == 1)
      printf(" – |\n");
    else /* a pair launches two kernels */
      printf(" %.0f |\n", med[i][0] - (i == 0 ? 2 : 1) * anchor);
  }
  return 0;
}
