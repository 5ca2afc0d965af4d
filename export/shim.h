/* Internal to export/: what the Go side calls in the C++ shim (C; the C++
 * files share shim_internal.h as well). */
#ifndef SYMM_SHIM_H
#define SYMM_SHIM_H
#include <stddef.h>
#include <stdint.h>

#include "../include/symm.h"
#ifdef __cplusplus
extern "C" {
#endif
/* Records code and the len bytes at msg (not NUL-terminated) as the calling
 * thread's last error. Copies: msg may be Go memory. */
void symmshim_set_error(int code, const char *msg, size_t len);
/* The front cache (front.cpp): switch it on, with the largest block it keeps
 * and the small pool's largest request (allocator.SmallMax); hand its blocks
 * back to the pool. */
void symmshim_front_enable(int on, uint64_t max_block, uint64_t small_max);
void symmshim_front_drain(int dev);
/* Remember the path of this process's statistics page (publish.go), unlinked
 * by a destructor when the process exits (the forked child of a process
 * leaves it alone). Copies path. */
void symmshim_publish_path(const char *path);
/* 1 if the front cache holds blocks of device dev. */
int symmshim_front_parked(int dev);
/* A block the front cache parked, as it hands it back to the pool
 * (goPoolReturnParked, goPoolAllocAfter; req: the size it was allocated
 * with; stream: the one it was allocated on). epoch/mark: as in
 * symmshim_placed when the block is parked because its shard had not
 * changed since its allocation (NULL otherwise); the pool ignores them. */
typedef struct {
  uintptr_t ptr;
  uint64_t req;
  uintptr_t stream;
  int32_t dev;
  const uint64_t *epoch;
  uint64_t mark;
  uint64_t bsize; /* the block's bytes */
  int32_t type;   /* its statistics type: SYMMSHIM_STAT_SMALL_POOL or _LARGE_POOL (shim_internal.h) */
} symmshim_parked;
/* Where the pool placed a block (goPoolAllocAfter; allocator.Placement):
 * its size; whole: a fixed segment of its own; epoch: its shard's change
 * count (memory outside Go's heap that lives as long as the process; NULL:
 * none), which read mark right after the allocation. While it still reads
 * mark, the pool would place the next request of the same size and stream
 * on this very block if it were freed. */
typedef struct {
  uint64_t bsize;
  int32_t whole;
  const uint64_t *epoch;
  uint64_t mark;
  int32_t type; /* the block's statistics type (SYMMSHIM_STAT_*, shim_internal.h) */
} symmshim_placed;
/* What the front cache served itself on device dev since the process
 * began: out[3*t + 0/1/2] = requests, their blocks' bytes, their requested
 * bytes, for statistics type t (SYMMSHIM_STAT_*, shim_internal.h; SYMMSHIM_STAT_ALL unused). */
void symmshim_front_served(int dev, int64_t out[9]);
/* The segment hook (snapshot.cpp, seghook.go): call it with n events;
 * 1 while this thread is inside it. */
void symmshim_call_segment_hook(const symm_trace_entry_t *events, int n);
int symmshim_in_segment_hook(void);
#ifdef __cplusplus
}
#endif
#endif
