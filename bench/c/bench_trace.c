/* CPU time of the allocator on a real allocation sequence, from C, without
 * PyTorch: replays the alloc and free_completed rows of a trace CSV
 * (action,addr,size,stream; what bench/workloads.py --record-trace writes
 * and symm replay reads; plain, not gzip) through symm_pool_alloc and
 * symm_pool_free, REPS times, and prints ns per call of the last REPS-1
 * passes (the first fills the pool). Runs on any backend; SYMM_DEVICE=host
 * without a GPU. Compare settings in one run, e.g.
 *   for e in 0 1; do SYMM_POOL_EXPANDABLE=$e build/bench/bench_trace t.csv; done
 * Blocks still live at the end of a pass are freed before the next. A second
 * line gives device 0's peak allocated and reserved bytes over the run (the
 * statistics PyTorch's memory_stats() names allocated_bytes.all.peak and
 * reserved_bytes.all.peak), so that a setting's bytes are read beside its
 * time, and how many allocations the front cache served itself. With --serve in place of REPS it times passes on request, for a
 * parent that alternates settings (serve() below). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "symm.h"

typedef struct {
  int alloc; /* 1 alloc, 0 free_completed */
  uint64_t addr, size, stream;
} Row;

typedef struct {
  uint64_t addr;
  void *ptr;
  uint64_t size, stream;
} Slot;

static Slot *tab;
static size_t cap;

static Slot *slot(uint64_t addr) {
  size_t i = (size_t)((addr >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1);
  while (tab[i].addr != 0 && tab[i].addr != addr) i = (i + 1) & (cap - 1);
  return &tab[i];
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void erase(Slot *s) {
  size_t i = (size_t)(s - tab);
  for (size_t j = (i + 1) & (cap - 1); tab[j].addr != 0; j = (j + 1) & (cap - 1)) {
    size_t h = (size_t)((tab[j].addr >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1);
    if (((j - h) & (cap - 1)) >= ((j - i) & (cap - 1))) {
      tab[i] = tab[j];
      i = j;
    }
  }
  tab[i].addr = 0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One pass; returns the number of calls made, -1 on an allocation failure. */
static long pass(const Row *rows, size_t n) {
  long calls = 0;
  for (size_t i = 0; i < n; i++) {
    const Row *r = &rows[i];
    Slot *s = slot(r->addr);
    if (r->alloc) {
      if (s->addr != 0) { /* its free was lost: free it now */
        symm_pool_free(s->ptr, s->size, 0, (void *)(uintptr_t)s->stream);
        erase(s);
        calls++;
        s = slot(r->addr);
      }
      void *p = symm_pool_alloc(r->size, 0, (void *)(uintptr_t)r->stream);
      if (p == NULL) {
        fprintf(stderr, "bench_trace: alloc of %llu bytes: %s\n", (unsigned long long)r->size, symm_last_error());
        return -1;
      }
      *s = (Slot){r->addr, p, r->size, r->stream};
      calls++;
    } else if (s->addr != 0) {
      symm_pool_free(s->ptr, s->size, 0, (void *)(uintptr_t)s->stream);
      erase(s);
      calls++;
    }
  }
  for (size_t i = 0; i < cap; i++) /* what the trace left live */
    if (tab[i].addr != 0) {
      symm_pool_free(tab[i].ptr, tab[i].size, 0, (void *)(uintptr_t)tab[i].stream);
      tab[i].addr = 0;
    }
  return calls;
}

/* stat_of returns device 0's statistic name, or -1 if the library has none. */
static long long stat_of(const char *name) {
  int n = symm_pool_stats(0, NULL, 0);
  if (n <= 0) return -1;
  symm_stat_t *st = calloc((size_t)n, sizeof *st);
  long long v = -1;
  if (st != NULL && symm_pool_stats(0, st, n) == n)
    for (int i = 0; i < n; i++)
      if (strcmp(st[i].name, name) == 0) v = st[i].value;
  free(st);
  return v;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The run's peaks, and how many of its allocations the front cache served
 * from blocks it held (num_front_cache_hits), the rest going to the pool. */
static void print_peaks(const char *prefix) {
  printf("%speak allocated %lld bytes, peak reserved %lld bytes, front cache hits %lld of %lld allocations\n", prefix,
         stat_of("allocated_bytes.all.peak"), stat_of("reserved_bytes.all.peak"), stat_of("num_front_cache_hits"),
         stat_of("allocation.all.allocated"));
}

/* --serve: one pass to fill the pool, then READY; each request line "N"
 * (1 to 1000) is answered, after N passes, with
 *   SLICE {"median_ns": M, "min_ns": B, "passes": N}
 * (ns per call of the median and the best pass). A bad request is answered
 * with an ERROR line and changes nothing. At the end of stdin, a PEAKS line
 * with the run's peaks. bench/front_paired.py alternates two of these. */
static int serve(const Row *rows, size_t n) {
  if (pass(rows, n) < 0) return 1;
  printf("READY\n");
  fflush(stdout);
  char req[64];
  double dt[1000];
  while (fgets(req, sizeof req, stdin)) {
    char *end;
    long k = strtol(req, &end, 10);
    if (end == req || (*end != '\n' && *end != '\0') || k < 1 || k > 1000) {
      printf("ERROR request %.*s: want a number of passes from 1 to 1000\n", (int)strcspn(req, "\n"), req);
      fflush(stdout);
      continue;
    }
    for (long i = 0; i < k; i++) {
      double t0 = now();
      long c = pass(rows, n);
      if (c < 0) return 1;
      dt[i] = (now() - t0) / c * 1e9;
    }
    qsort(dt, (size_t)k, sizeof dt[0], cmp_double);
    printf("SLICE {\"median_ns\": %.1f, \"min_ns\": %.1f, \"passes\": %ld}\n", dt[k / 2], dt[0], k);
    fflush(stdout);
  }
  print_peaks("PEAKS ");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_trace TRACE.csv [REPS=5 | --serve]\n");
    return 2;
  }
  int serving = argc > 2 && strcmp(argv[2], "--serve") == 0;
  int reps = serving ? 2 : argc > 2 ? atoi(argv[2]) : 5;
  FILE *f = fopen(argv[1], "r");
  if (f == NULL || reps < 2) {
    fprintf(stderr, "bench_trace: cannot open %s (or REPS < 2)\n", argv[1]);
    return 2;
  }
  size_t n = 0, rcap = 1 << 16;
  Row *rows = malloc(rcap * sizeof *rows);
  char line[512], action[64];
  unsigned long long addr, size, stream;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%63[^,],%llu,%llu,%llu", action, &addr, &size, &stream) != 4 || size == 0 || addr == 0) continue;
    int a = strcmp(action, "alloc") == 0;
    if (!a && strcmp(action, "free_completed") != 0) continue;
    if (n == rcap) rows = realloc(rows, (rcap *= 2) * sizeof *rows);
    rows[n++] = (Row){a, addr, size, stream};
  }
  fclose(f);
  for (cap = 1024; cap < 4 * n; cap *= 2) {
  }
  tab = calloc(cap, sizeof *tab);
  if (serving) return serve(rows, n);
  double best = 1e30, total = 0;
  long calls = 0;
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    long c = pass(rows, n);
    double dt = now() - t0;
    if (c < 0) return 1;
    if (r > 0) {
      total += dt;
      calls += c;
      if (dt / c < best) best = dt / c;
    }
  }
  const char *fc = getenv("SYMM_POOL_FRONT_CACHE"), *ex = getenv("SYMM_POOL_EXPANDABLE");
  printf("%s: %zu rows, front cache %s, expandable %s: %.0f ns per call (mean of %d passes), best pass %.0f ns\n",
         argv[1], n, fc ? fc : "0", ex ? ex : "0", total / calls * 1e9, reps - 1, best * 1e9);
  print_peaks("");
  return 0;
}
