/* symm_topology from C (host-backend machine: no driver is an answer, not an
 * error): the size query, the JSON, a buffer too small, bad arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "symm.h"


int main(void) {
  size_t n = 0;
  /* The size query names the same directories: a library not found is
   * reported with every directory looked in. */
  CHECK(symm_topology("/nonexistent:/tmp", NULL, 0, &n) == SYMM_OK && n > 20, "size query: %zu", n);
  char *buf = malloc(n + 1);
  size_t got = 0;
  CHECK(symm_topology("/nonexistent:/tmp", buf, n + 1, &got) == SYMM_OK, "topology");
  CHECK(got == n && strlen(buf) == n, "length %zu vs %zu", got, n);
  CHECK(strstr(buf, "\"schema\":1") != NULL, "schema version in %.80s", buf);
  CHECK(strstr(buf, "\"devices\":") && strstr(buf, "\"links\":") && strstr(buf, "\"backends\":"), "fields");
  CHECK(strstr(buf, "\"name\":\"host\",\"available\":true") != NULL, "the host backend is available");
  if (strstr(buf, "\"driver\":{\"found\":false")) /* no driver here */
    CHECK(strstr(buf, "\"reason\":\"no NVIDIA driver found\"") != NULL, "the cuda backend says why it cannot run");

  char small[8];
  memset(small, 'x', sizeof small);
  CHECK(symm_topology(NULL, small, sizeof small, &got) == SYMM_ERR_INVALID, "a buffer too small");
  CHECK(strstr(symm_last_error(), "needs") != NULL, "the error says how much is needed");
  CHECK(small[0] == 'x', "nothing written into a buffer too small");
  CHECK(symm_topology(NULL, buf, n + 1, NULL) == SYMM_ERR_INVALID, "NULL len");
  int out = -1;
  CHECK(symm_world_within_direct_access(12345, "g", 0, 1, 0, &out) == SYMM_ERR_INVALID, "bogus store");
  CHECK(symm_world_within_direct_access(0, NULL, 0, 1, 0, &out) == SYMM_ERR_INVALID, "NULL group");
  free(buf);
  printf("test_topology: %d passed, %d failed\n", passes, failures);
  return failures != 0;
}
