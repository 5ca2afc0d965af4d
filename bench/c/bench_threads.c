/* Scaling of libsymm's cached path with threads, from C, without PyTorch:
 * where does multi-thread throughput go? Runs on any backend (the cached path
 * never reaches it); use SYMM_DEVICE=host without a GPU.
 *   cgo-noop      symm_pool_device_count(): one C->Go call, no pool work
 *   same-stream   1 MiB alloc+free pairs, every thread on one stream
 *   own-stream    the same, each thread on its own stream (its own shard)
 * Prints total millions of operations per second for 1, 4 and 16 threads.
 * Run it with SYMM_POOL_FRONT_CACHE=0 (the default: every alloc and free
 * enters Go) and =1 (the front cache: a hit stays in C, on each CPU). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "symm.h"

static atomic_int stop;
static const char *mode;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  void *stream = strcmp(mode, "own-stream") == 0 ? (void *)((id + 1) << 12) : (void *)0;
  long n = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    for (int i = 0; i < 256; i++) {
      if (strcmp(mode, "cgo-noop") == 0) {
        if (symm_pool_device_count() < 1) abort();
      } else {
        void *p = symm_pool_alloc(1 << 20, 0, stream);
        if (p == NULL) {
          fprintf(stderr, "alloc failed: %s\n", symm_last_error());
          abort();
        }
        symm_pool_free(p, 1 << 20, 0, stream);
      }
    }
    n += 256;
  }
  return (void *)n;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0.5;
  const char *modes[] = {"cgo-noop", "same-stream", "own-stream"};
  int threads[] = {1, 4, 16};
  printf("| mode | 1 thread | 4 threads | 16 threads |\n| --- | ---: | ---: | ---: |\n");
  for (int m = 0; m < 3; m++) {
    mode = modes[m];
    printf("| %s (M ops/s)", mode);
    for (int k = 0; k < 3; k++) {
      pthread_t t[16];
      atomic_store(&stop, 0);
      double t0 = now();
      for (int i = 0; i < threads[k]; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
      struct timespec d = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
      nanosleep(&d, NULL);
      atomic_store(&stop, 1);
      long total = 0;
      for (int i = 0; i < threads[k]; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
      }
      printf(" | %.3f", total / (now() - t0) / 1e6);
      fflush(stdout);
    }
    printf(" |\n");
  }
  return 0;
}
