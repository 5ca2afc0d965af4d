/* The README's C example as a whole program: the caching pool from C.
 *
 *   make install PREFIX=$HOME/.local
 *   cc pool_example.c $(pkg-config --cflags --libs symm) -o pool_example
 *   SYMM_DEVICE=host ./pool_example        # or on a GPU without SYMM_DEVICE
 */
#include <stdio.h>
#include <string.h>

#include "symm.h"

int main(void) {
  printf("libsymm %s (header %s)\n", symm_version(), SYMM_VERSION);
  void *p = symm_pool_alloc(1 << 20, /*device*/ 0, /*stream*/ NULL);
  if (p == NULL) {
    fprintf(stderr, "%s\n", symm_last_error());
    return 1;
  }
  symm_pool_free(p, 1 << 20, 0, NULL);

  symm_stat_t st[256];
  int n = symm_pool_stats(0, st, 256); /* PyTorch's memory_stats() names */
  if (n < 0) {
    fprintf(stderr, "%s\n", symm_last_error());
    return 1;
  }
  for (int i = 0; i < n && i < 256; i++)
    if (strcmp(st[i].name, "reserved_bytes.all.current") == 0 || strcmp(st[i].name, "allocation.all.allocated") == 0)
      printf("%s = %lld\n", st[i].name, (long long)st[i].value);
  printf("backend %s\n", symm_pool_backend());
  return 0;
}
