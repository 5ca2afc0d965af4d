/* check.h: what the C test programs share (tests/c/ and tests/device/).
 *
 *   CHECK(cond, fmt, ...)  counts a pass, or a failure printed with the
 *                          condition, the file and line, check_rank when it
 *                          is set (>= 0), and the library's last error;
 *   count_fds()            open descriptors of this process;
 *   count_maps()           mappings of the library's memory: pool segments
 *                          ("symm-pool") and symmetric blocks ("symm-block");
 *   run_ranks(self, world, addr)  spawns world copies of the program as
 *                          `self child RANK WORLD ADDR` (spawned: Go does not
 *                          survive fork), waits, returns how many failed;
 *   private_publish_dir()  this program and what it spawns publish their
 *                          statistics pages (symm top's) in a directory of
 *                          their own, removed at exit with the pages that
 *                          killed children could not remove.
 *
 * A program with its own CHECK defines SYMM_TEST_OWN_CHECK first and gets
 * only the counters. */
#ifndef SYMM_TEST_CHECK_H
#define SYMM_TEST_CHECK_H

#include <dirent.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "symm.h"

#ifndef SYMM_TEST_OWN_CHECK
static int failures = 0, passes = 0;
static int check_rank = -1; /* the rank failures are printed with; -1: none */
#define CHECK(cond, ...)                                                                     \
  do {                                                                                       \
    if (cond) {                                                                              \
      passes++;                                                                              \
    } else {                                                                                 \
      failures++;                                                                            \
      if (check_rank >= 0) fprintf(stderr, "FAIL rank %d ", check_rank);                    \
      else fprintf(stderr, "FAIL ");                                                         \
      fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                             \
      fprintf(stderr, __VA_ARGS__);                                                          \
      fprintf(stderr, " (last error %d: %s)\n", symm_last_error_code(), symm_last_error()); \
    }                                                                                        \
  } while (0)
#endif

static inline int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static inline int count_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int n = 0;
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) n += strstr(line, "symm-pool") != NULL || strstr(line, "symm-block") != NULL;
  fclose(f);
  return n;
}

static inline int run_ranks(const char *self, int world, const char *addr) {
  extern char **environ;
  pid_t pids[64];
  char r[16], w[16];
  if (world < 1 || world > 64) return world;
  snprintf(w, sizeof w, "%d", world);
  int started = 0, bad = 0;
  for (; started < world; started++) {
    snprintf(r, sizeof r, "%d", started);
    char *args[] = {(char *)self, (char *)"child", r, w, (char *)addr, NULL};
    if (posix_spawn(&pids[started], self, NULL, NULL, args, environ) != 0) break;
  }
  bad = world - started;
  for (int i = 0; i < started; i++) {
    int status;
    waitpid(pids[i], &status, 0);
    bad += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  return bad;
}

/* A process that dies without exiting (SIGKILL, _exit) leaves its page
 * behind: a program whose children die so publishes in a directory of its
 * own (SYMM_PUBLISH_DIR, read by the library at its first allocation), and
 * removes it at exit. Call it first in main. */
static char symm_test_publish_dir[256];

static inline void remove_publish_dir(void) {
  DIR *d = opendir(symm_test_publish_dir);
  struct dirent *e;
  if (d == NULL) return;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
  rmdir(symm_test_publish_dir);
}

static inline void private_publish_dir(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(symm_test_publish_dir, sizeof symm_test_publish_dir, "%s/symm-test-pages-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(symm_test_publish_dir) == NULL) {
    perror("private_publish_dir: mkdtemp");
    exit(2);
  }
  setenv("SYMM_PUBLISH_DIR", symm_test_publish_dir, 1);
  atexit(remove_publish_dir);
}

#endif
