/* Multi-process test of symmetric memory through include/symm.h, on the host
 * backend: real processes (spawned, not forked: Go does not survive fork), a
 * real TCP store, real descriptor passing and mappings.
 *   test_symm                 the parent: starts a store and runs every scenario
 *   test_symm child SCENARIO RANK WORLD ADDR    one rank */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "check.h"
#include "symm.h"

extern char **environ;


#define MiB (1 << 20)



static void check_peers(symm_handle_t h, int world, int (*rank_of)(int), const char *what) {
  symm_handle_info_t info;
  CHECK(symm_handle_info(h, &info) == SYMM_OK, "%s: info", what);
  void **bufs = (void **)info.buffer_ptrs;
  for (int r = 0; r < world; r++) {
    unsigned char *b = bufs[r];
    int want = rank_of(r) + 1;
    CHECK(b[0] == want && b[info.buffer_size - 1] == want, "%s: peer %d's buffer holds %d/%d, want %d", what, r,
          b[0], b[info.buffer_size - 1], want);
  }
}

static int pair_base;
static int identity(int r) { return r; }
static int in_pair(int r) { return pair_base + r; }

static int child_basic(int rank, int world, symm_store_t st) {
  size_t size = MiB;
  unsigned char *p = symm_alloc(size, 0, NULL);
  CHECK(p != NULL, "symm_alloc");
  if (!p) return 1;
  memset(p, rank + 1, size);
  symm_handle_t h = 0, again = 0;
  CHECK(symm_rendezvous(p, st, "world", rank, world, &h) == SYMM_OK, "rendezvous");
  CHECK(symm_rendezvous(p, st, "world", rank, world, &again) == SYMM_OK && again == h, "same block and group: same handle");
  symm_handle_info_t info;
  CHECK(symm_handle_info(h, &info) == SYMM_OK, "info");
  CHECK(info.rank == rank && info.world_size == world && info.buffer_size == size, "info fields");
  CHECK(((void **)info.buffer_ptrs)[rank] == p, "own buffer pointer is the block");
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier");
  check_peers(h, world, identity, "world");
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier after reading");
  /* Write into the next rank's buffer (second half), then signal it. */
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  unsigned char *theirs = ((unsigned char **)info.buffer_ptrs)[next];
  memset(theirs + size / 2, 100 + rank, size / 2);
  CHECK(symm_put_signal(h, next, 1, NULL) == SYMM_OK, "put_signal");
  CHECK(symm_wait_signal(h, prev, 1, NULL, 10000) == SYMM_OK, "wait_signal");
  CHECK(p[size / 2] == 100 + prev && p[size - 1] == 100 + prev, "rank %d wrote into our buffer (%d)", prev, p[size / 2]);
  uint32_t *pad = ((uint32_t **)info.signal_pad_ptrs)[rank];
  CHECK(pad[1 * world + prev] == 0, "the slot is zero again after the wait");
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier 2");
  memset(p, rank + 1, size);
  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier 3");

  /* Subgroups of two over the same block. */
  char name[32];
  snprintf(name, sizeof name, "pair%d", rank / 2);
  symm_handle_t hp = 0;
  pair_base = rank / 2 * 2;
  CHECK(symm_rendezvous(p, st, name, rank % 2, 2, &hp) == SYMM_OK && hp != h, "subgroup rendezvous");
  CHECK(symm_barrier(hp, 0, NULL, 10000) == SYMM_OK, "subgroup barrier");
  check_peers(hp, 2, in_pair, name);

  /* An interior pointer finds its block. */
  symm_handle_t hi = 0;
  CHECK(symm_rendezvous(p + 4096, st, "interior", rank, world, &hi) == SYMM_OK, "rendezvous of an interior pointer");
  CHECK(symm_handle_info(hi, &info) == SYMM_OK && ((void **)info.buffer_ptrs)[rank] == p, "interior -> block");

  /* Bad input. */
  CHECK(symm_put_signal(h, world, 0, NULL) == SYMM_ERR_INVALID, "put_signal to rank world");
  CHECK(symm_wait_signal(h, 0, 1 << 20, NULL, 10) == SYMM_ERR_INVALID, "channel out of range");
  CHECK(symm_wait_signal(h, prev, 3, NULL, 50) == SYMM_ERR_TIMEOUT, "a wait nobody answers times out");
  CHECK(strstr(symm_last_error(), "rank") != NULL, "timeout names the rank");
  CHECK(symm_handle_info(12345, &info) == SYMM_ERR_INVALID, "bogus handle");
  symm_clear_error();
  symm_free((void *)0xdead000, 0, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER, "free of an unknown pointer");
  CHECK(symm_has_multicast_support(0) == 0, "never multicast");
  int direct = -1;
  CHECK(symm_world_within_direct_access(st, "world", rank, world, 0, &direct) == SYMM_OK && direct == 1,
        "every rank reaches every other (host memory)");

  CHECK(symm_barrier(h, 0, NULL, 10000) == SYMM_OK, "barrier before free");
  symm_clear_error();
  symm_free(p, size, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_OK, "free");
  CHECK(symm_handle_info(h, &info) != SYMM_OK, "a handle of a freed block is dead");
  symm_free(p, size, 0, NULL);
  CHECK(symm_last_error_code() == SYMM_ERR_UNKNOWN_POINTER, "double free");
  return 0;
}

/* Every rank sets its key under name, then waits for every rank's. */
static int store_barrier(symm_store_t st, const char *name, int rank, int world) {
  char key[64];
  snprintf(key, sizeof key, "%s/%d", name, rank);
  if (symm_store_set(st, key, "1", 1) != SYMM_OK) return 1;
  for (int r = 0; r < world; r++) {
    char v[8];
    size_t n = 0;
    snprintf(key, sizeof key, "%s/%d", name, r);
    if (symm_store_get(st, key, v, sizeof v, &n, 10000) != SYMM_OK) return 1;
  }
  return 0;
}

/* 100 alloc/rendezvous/free cycles leave no descriptor and no mapping
 * beyond the first's (which makes the group's link, kept for the next).
 * The first count is taken before this rank lets the others begin the
 * second cycle: a rank that runs ahead sends its next block early, and the
 * link reads it ahead (its descriptor open) for the next rendezvous. */
static int child_cycles(int rank, int world, symm_store_t st) {
  int fds0 = 0, maps0 = 0;
  for (int i = 0; i < 101; i++) {
    if (i == 1) {
      fds0 = count_fds(), maps0 = count_maps();
      if (store_barrier(st, "cycles-first", rank, world) != 0) {
        CHECK(0, "store barrier after the first cycle");
        return 1;
      }
    }
    unsigned char *p = symm_alloc(64 * 1024, 0, NULL);
    symm_handle_t h;
    if (!p || symm_rendezvous(p, st, "cycle", rank, world, &h) != SYMM_OK) {
      CHECK(0, "cycle %d", i);
      return 1;
    }
    if (symm_barrier(h, 0, NULL, 10000) != SYMM_OK) {
      CHECK(0, "cycle %d barrier", i);
      return 1;
    }
    symm_free(p, 0, 0, NULL);
  }
  int fds1 = count_fds(), maps1 = count_maps();
  CHECK(fds1 == fds0, "descriptors: %d before, %d after 100 cycles", fds0, fds1);
  CHECK(maps1 == maps0, "block mappings: %d before, %d after 100 cycles", maps0, maps1);
  return 0;
}

/* Rank 1 allocates a different size: every rank fails, naming a rank. */
static int child_mismatch(int rank, int world, symm_store_t st) {
  size_t size = rank == 1 ? 2 * MiB : MiB;
  void *p = symm_alloc(size, 0, NULL);
  symm_handle_t h;
  int rc = symm_rendezvous(p, st, "mismatch", rank, world, &h);
  CHECK(rc == SYMM_ERR_INVALID || rc != SYMM_OK, "mismatched sizes refused (rc %d)", rc);
  CHECK(strstr(symm_last_error(), "rank 1") != NULL || rank == 1, "the message names rank 1");
  symm_free(p, 0, 0, NULL);
  return 0;
}

/* Rank 2 dies before the rendezvous: the others fail, naming it, in time. */
static int child_killed(int rank, int world, symm_store_t st) {
  void *p = symm_alloc(MiB, 0, NULL);
  if (rank == 2) _exit(0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  symm_handle_t h;
  int rc = symm_rendezvous(p, st, "killed", rank, world, &h);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  CHECK(rc == SYMM_ERR_TIMEOUT, "rendezvous without rank 2 fails with a timeout (rc %d)", rc);
  CHECK(strstr(symm_last_error(), "rank 2") != NULL, "the message names rank 2");
  CHECK(secs < 10, "failed within the timeout (%.1f s)", secs);
  symm_free(p, 0, 0, NULL);
  return 0;
}

/* A peer killed (SIGKILL) at a phase of the rendezvous (SYMM_FAULT_CRASH_AT
 * in rank 2's environment): the survivors fail within the timeout with an
 * error naming rank 2, and their descriptors and mappings are back where
 * they were. */
static int child_crash(int rank, int world, symm_store_t st, const char *phase) {
  int fds0 = count_fds(), maps0 = count_maps();
  void *p = symm_alloc(MiB, 0, NULL);
  CHECK(p != NULL, "alloc");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  symm_handle_t h;
  char group[64];
  snprintf(group, sizeof group, "crash-%s", phase);
  int rc = symm_rendezvous(p, st, group, rank, world, &h);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  CHECK(rank != world - 1, "rank %d lived through SYMM_FAULT_CRASH_AT=%s", rank, phase);
  CHECK(rc == SYMM_ERR_TIMEOUT || rc == SYMM_ERR_PEER, "a peer killed at %s: rc %d", phase, rc);
  CHECK(strstr(symm_last_error(), "rank 2") != NULL, "the message names rank 2: %s", symm_last_error());
  CHECK(secs < 3.0 + 2.0, "failed within the timeout (%.2f s)", secs);
  symm_free(p, 0, 0, NULL);
  CHECK(count_fds() == fds0, "descriptors back to %d (now %d)", fds0, count_fds());
  CHECK(count_maps() == maps0, "mappings back to %d (now %d)", maps0, count_maps());
  printf("  expected failure, crash at %-8s rank %d: rc %d after %.2f s: %.90s\n", phase, rank, rc, secs, symm_last_error());
  return 0;
}

static int child_main(char **argv) {
  const char *scenario = argv[2];
  int rank = atoi(argv[3]), world = atoi(argv[4]);
  check_rank = rank;
  if (!strncmp(scenario, "crash-", 6) && rank == world - 1) setenv("SYMM_FAULT_CRASH_AT", scenario + 6, 1);
  symm_store_t st;
  if (symm_store_connect(argv[5], "", 10000, &st) != SYMM_OK) {
    fprintf(stderr, "rank %d: connect: %s\n", rank, symm_last_error());
    return 2;
  }
  int rc = 1;
  if (!strcmp(scenario, "basic")) rc = child_basic(rank, world, st);
  if (!strcmp(scenario, "cycles")) rc = child_cycles(rank, world, st);
  if (!strcmp(scenario, "mismatch")) rc = child_mismatch(rank, world, st);
  if (!strcmp(scenario, "killed")) rc = child_killed(rank, world, st);
  if (!strncmp(scenario, "crash-", 6)) rc = child_crash(rank, world, st, scenario + 6);
  symm_store_close(st);
  if (failures) fprintf(stderr, "rank %d: %d checks failed\n", rank, failures);
  return rc || failures;
}

static int run(const char *self, const char *scenario, int world, const char *addr) {
  pid_t pids[8];
  char r[16], w[16];
  snprintf(w, sizeof w, "%d", world);
  for (int i = 0; i < world; i++) {
    snprintf(r, sizeof r, "%d", i);
    char *args[] = {(char *)self, "child", (char *)scenario, r, w, (char *)addr, NULL};
    if (posix_spawn(&pids[i], self, NULL, NULL, args, environ) != 0) return -1;
  }
  int bad = 0;
  for (int i = 0; i < world; i++) {
    int status;
    waitpid(pids[i], &status, 0);
    /* In a crash scenario the last rank is meant to die of SIGKILL. */
    int crashed = !strncmp(scenario, "crash-", 6) && i == world - 1;
    if (crashed ? !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) : (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
      bad++;
  }
  return bad;
}

int main(int argc, char **argv) {
  if (argc >= 6 && !strcmp(argv[1], "child")) return child_main(argv);
  private_publish_dir(); /* ranks are killed: their pages go with this directory */
  setenv("SYMM_DEVICE", "host", 0);
  setenv("SYMM_TIMEOUT_MS", "3000", 1);
  symm_store_t st;
  char addr[64];
  if (symm_store_server("", "", &st, addr, sizeof addr) != SYMM_OK) {
    fprintf(stderr, "store server: %s\n", symm_last_error());
    return 2;
  }
  const struct { const char *name; int world; } sc[] = {
      {"basic", 4},         {"cycles", 4},         {"mismatch", 3},    {"killed", 3},      {"crash-publish", 3},
      {"crash-gathered", 3}, {"crash-sent", 3}, {"crash-mapped", 3}};
  for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
    int bad = run(argv[0], sc[i].name, sc[i].world, addr);
    CHECK(bad == 0, "scenario %s: %d of %d ranks failed", sc[i].name, bad, sc[i].world);
    printf("scenario %-8s %d ranks: %s\n", sc[i].name, sc[i].world, bad == 0 ? "ok" : "FAILED");
  }
  symm_store_close(st);
  printf("test_symm: %d passed, %d failed\n", passes, failures);
  return failures != 0;
}
