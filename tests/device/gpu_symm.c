/* Symmetric memory from C on GPUs (CUDA backend), one process per rank:
 *
 *   build/tests/gpu_symm [world]     (default: every GPU, at least 2)
 *
 * With fewer GPUs than ranks, ranks share devices (SYMM_ALLOW_OVERLAPPING_DEVICES=1):
 * the same import-and-map path, one GPU. Each rank: rendezvous through the
 * built-in store; writes a pattern with the driver; every rank reads every
 * peer's buffer through the peer mapping; one GPU writes into the next rank's
 * buffer and that rank reads it back; put/wait signals around the ring with
 * the pads zero afterwards, from the main thread and from a thread with no
 * current context (launched from the handle's plan, they bind the device's
 * context to it); 20 alloc/rendezvous/free cycles leave the
 * descriptor count unchanged. The driver is opened with dlopen, as libsymm
 * does: no CUDA toolkit is needed to build this.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../c/check.h"
#include "symm.h"

#include "cudadrv.h"


/* all_equal reads n uint32 at p (device memory, any rank's mapping) and
 * checks each is want. */
static int all_equal(CUdeviceptr p, size_t n, uint32_t want, uint32_t *host) {
  if (cuMemcpyDtoH(host, p, n * 4) != 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (host[i] != want) {
      fprintf(stderr, "rank %d: word %zu is %#x, expected %#x\n", check_rank, i, host[i], want);
      return 0;
    }
  return 1;
}

/* ring_thread runs put/wait signals around the ring from a thread that has
 * no current context: they launch from the handle's plan, which binds the
 * handle's context to the thread (once: it stays current afterwards). */
struct ring_args {
  symm_handle_t h;
  int next, prev, rc;
  CUcontext before, after;
};

static void *ring_thread(void *p) {
  struct ring_args *a = p;
  a->before = (CUcontext)1;
  if (cuCtxGetCurrent(&a->before) != 0) a->rc = -1;
  for (int i = 0; i < 5 && a->rc == 0; i++) {
    a->rc = symm_put_signal(a->h, a->next, 2, NULL);
    if (a->rc == 0) a->rc = symm_wait_signal(a->h, a->prev, 2, NULL, 0);
  }
  if (cuCtxGetCurrent(&a->after) != 0 && a->rc == 0) a->rc = -2;
  if (a->rc == 0 && a->after != NULL && cuCtxSynchronize() != 0) a->rc = -3; /* in the bound context */
  return NULL;
}

static int child(int rank, int world, int dev, const char *addr) {
  check_rank = rank;
  CUcontext ctx;
  if (cuDevicePrimaryCtxRetain(&ctx, dev) != 0 || cuCtxSetCurrent(ctx) != 0) return 2;
  symm_store_t st;
  if (symm_store_connect(addr, "", 10000, &st) != SYMM_OK) return 2;
  /* NVSHMEM (SYMM_BACKEND=nvshmem) joins its world here; for the CUDA backend this only checks. */
  CHECK(symm_backend_init(st, rank, world, dev) == SYMM_OK, "backend init");
  char backend[32];
  CHECK(symm_get_backend(backend, sizeof backend) == SYMM_OK, "backend name");
  const size_t size = 64 << 20, n = size / 4;
  uint32_t *host = malloc(size);
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;

  CUdeviceptr p = (CUdeviceptr)symm_alloc(size, dev, NULL);
  CHECK(p != 0, "symm_alloc of 64 MiB on device %d", dev);
  if (!p) return 1;
  CHECK(cuMemsetD32(p, 0x1000 + rank, n) == 0, "memset");
  symm_handle_t h = 0;
  CHECK(symm_rendezvous((void *)p, st, "gpu", rank, world, &h) == SYMM_OK, "rendezvous");
  symm_handle_info_t info;
  CHECK(symm_handle_info(h, &info) == SYMM_OK, "info");
  CUdeviceptr *bufs = (CUdeviceptr *)info.buffer_ptrs, *pads = (CUdeviceptr *)info.signal_pad_ptrs;
  CHECK(bufs[rank] == p && info.world_size == world && info.buffer_size == size, "handle fields");
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier");
  CHECK(cuCtxSynchronize() == 0, "sync");
  for (int q = 0; q < world; q++) CHECK(all_equal(bufs[q], n, 0x1000 + q, host), "rank %d's pattern read through the mapping", q);
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier after reading");

  /* This GPU writes the second half of the next rank's buffer. */
  CHECK(cuMemsetD32(bufs[next] + size / 2, 0x2000 + rank, n / 2) == 0, "memset into the peer");
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier after writing");
  CHECK(cuCtxSynchronize() == 0, "sync");
  CHECK(all_equal(p, n / 2, 0x1000 + rank, host) && all_equal(p + size / 2, n / 2, 0x2000 + prev, host),
        "rank %d's write landed in our buffer", prev);

  for (int i = 0; i < 5; i++) {
    CHECK(symm_put_signal(h, next, 1, NULL) == SYMM_OK, "put_signal");
    CHECK(symm_wait_signal(h, prev, 1, NULL, 10000) == SYMM_OK, "wait_signal");
  }
  CHECK(cuCtxSynchronize() == 0, "sync");
  /* The same from a thread without a context (the plan's launches bind it). */
  struct ring_args ra = {h, next, prev, 0, NULL, NULL};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, ring_thread, &ra) == 0 && pthread_join(th, NULL) == 0, "ring thread");
  CHECK(ra.rc == 0, "put/wait from a thread with no context: %d %s", ra.rc, symm_last_error());
  CHECK(cuCtxSynchronize() == 0, "sync after the thread's signals");
  /* Stream memory operations (SYMM_SIGNALS=memop), or every call through Go
   * (SYMM_LAUNCH_THROUGH_GO=1): pushed and popped, the thread keeps none. */
  const char *sig = getenv("SYMM_SIGNALS"), *thru = getenv("SYMM_LAUNCH_THROUGH_GO");
  int plans = symm_kernels_ready(dev) && !(sig && !strcmp(sig, "memop")) && !(thru && !strcmp(thru, "1"));
  CHECK(ra.before == NULL && ra.after == (plans ? ctx : NULL),
        "the thread had no context (%p) and has %s afterwards (%p, want %p)", ra.before,
        plans ? "the device's" : "none", ra.after, plans ? ctx : NULL);
  CHECK(all_equal(pads[rank] + 4 * 2 * world, world, 0, host), "channel 2's slots zero after the thread's signals");
  /* Channel 1's slots only: a faster peer may already be in the next barrier (channel 0). */
  CHECK(all_equal(pads[rank] + 4 * world, world, 0, host), "channel 1's slots zero after the signals");
  CHECK(symm_has_multicast_support(dev) == 0, "never multicast");
  int direct = -1;
  CHECK(symm_world_within_direct_access(st, "gpu", rank, world, dev, &direct) == SYMM_OK && direct == 1,
        "every GPU of the group reaches every other");
  size_t tn = 0;
  CHECK(symm_topology(NULL, NULL, 0, &tn) == SYMM_OK && tn > 0, "topology size");
  char *topo = malloc(tn + 1);
  CHECK(symm_topology(NULL, topo, tn + 1, &tn) == SYMM_OK && strstr(topo, "\"found\":true") && strstr(topo, "\"p2p\":true"),
        "topology sees the driver and peer access: %.200s", topo);
  free(topo);
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier before free");
  CHECK(cuCtxSynchronize() == 0, "sync");
  symm_clear_error();
  symm_free((void *)p, size, dev, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free");

  /* Cycles of one group leave nothing behind (the first one may open lasting
   * descriptors: the group's mailbox, the driver's): 20 by default,
   * SYMM_GPU_CYCLES for a soak; device free memory must come back within
   * 64 MiB of where it was after the first cycle. */
  int fds = -1, cycles = getenv("SYMM_GPU_CYCLES") ? atoi(getenv("SYMM_GPU_CYCLES")) : 20;
  size_t free0 = 0, free1 = 0, total = 0;
  for (int c = 0; c < cycles; c++) {
    const char *group = "cycle";
    if (c > 0 && c % 100 == 0 && rank == 0) fprintf(stderr, "rank 0: cycle %d\n", c);
    CUdeviceptr q = (CUdeviceptr)symm_alloc(2 << 20, dev, NULL);
    symm_handle_t hc = 0;
    CHECK(q && symm_rendezvous((void *)q, st, group, rank, world, &hc) == SYMM_OK, "cycle %d rendezvous", c);
    CHECK(symm_barrier(hc, 0, NULL, 10000) == SYMM_OK, "cycle %d barrier", c);
    CHECK(cuCtxSynchronize() == 0, "sync");
    symm_free((void *)q, 2 << 20, dev, NULL);
    if (c == 0) {
      fds = count_fds();
      cuMemGetInfo(&free0, &total);
    }
  }
  cuMemGetInfo(&free1, &total);
  /* No growth (NCCL opens and closes descriptors of its own as it goes, so
   * the count may also drop). */
  CHECK(count_fds() <= fds, "descriptors after %d cycles: %d, after the first: %d", cycles, count_fds(), fds);
  CHECK(free1 + (64 << 20) >= free0, "device free memory after %d cycles: %zu MiB, after the first: %zu MiB", cycles,
        free1 >> 20, free0 >> 20);
  if (rank == 0)
    printf("rank 0: %d cycles; device free memory %zu MiB after the first, %zu MiB after the last\n", cycles, free0 >> 20,
           free1 >> 20);
  symm_store_close(st);
  free(host);
  if (failures) fprintf(stderr, "rank %d: %d checks failed\n", rank, failures);
  printf("rank %d (device %d, %s backend): %d checks passed, %d failed\n", rank, dev, backend, passes, failures);
  return failures != 0;
}

int main(int argc, char **argv) {
  if (load_driver() != 0) return 2;
  int ndev = 0;
  cuDeviceGetCount(&ndev);
  if (argc == 5 && !strcmp(argv[1], "child")) {
    int rank = atoi(argv[2]), world = atoi(argv[3]);
    return child(rank, world, rank % ndev, argv[4]);
  }
  int world = argc > 1 ? atoi(argv[1]) : (ndev < 2 ? 2 : ndev);
  if (world < 2 || world > 64 || ndev < 1) {
    fprintf(stderr, "usage: %s [world 2..64] (devices: %d)\n", argv[0], ndev);
    return 2;
  }
  if (world > ndev) setenv("SYMM_ALLOW_OVERLAPPING_DEVICES", "1", 1);
  unsetenv("SYMM_DEVICE");
  symm_store_t st;
  char addr[64];
  if (symm_store_server("", "", &st, addr, sizeof addr) != SYMM_OK) {
    fprintf(stderr, "store server: %s\n", symm_last_error());
    return 2;
  }
  int bad = run_ranks(argv[0], world, addr);
  symm_store_close(st);
  printf("gpu_symm: %d ranks on %d devices: %s\n", world, ndev, bad ? "FAILED" : "ok");
  return bad != 0;
}
