// Launch plans: what a symmetric-memory call needs to launch its kernel
// (the handle's device and context, its arrays and status word, the
// kernels' function handles), made by Go once per handle
// (symmetric.Handle.PublishPlan) and read by C, so that a per-call entry
// point (symm_barrier, symm_put_signal, symm_wait_signal and the
// collectives, without a timeout) launches without entering Go.
//
// The table is a fixed array of slots that is never freed; a slot holds at
// most one handle's plan at a time. Its state is one 64-bit word: the
// handle's id (low 32 bits) in the high half, a LIVE bit, and the number of
// callers inside. Invariants:
//  - A caller counts itself in (plan_enter) before it reads anything, and
//    reads the plan only when the word it incremented was LIVE for its own
//    handle id: the increment and the check are one atomic operation, so no
//    caller reads a plan that is being retired or rewritten.
//  - plan_retire clears LIVE, then waits until nobody is inside: after it
//    returns no caller uses the plan's memory (pads, status word, context),
//    and Go may free them. Whoever publishes a handle's plan must retire
//    it before the handle's block is freed and as soon as the handle fails,
//    so that a plan that can be entered belongs to a live, healthy handle.
//  - plan_publish writes the plan while the slot is not LIVE (a caller that
//    counted itself in meanwhile sees the word without LIVE and leaves
//    without reading), then sets the id and LIVE with release order.
// A handle whose slot holds another live plan gets none: its calls go
// through Go as before (plan_publish says so). Memory is never freed, so a
// stale caller's increment lands on a slot, never on freed memory.
// The functions are internal: their prefix keeps them out of symm.map's
// exported symm_* (include/symm.h is the public ABI).
#ifndef SYMM_PLANS_H
#define SYMM_PLANS_H
#include <stdint.h>

#include "../include/symm.h"

#ifdef __cplusplus
extern "C" {
#endif

// SYMM_PLAN_DTYPES is the number of dtypes (lines of symm.h's SYMM_DTYPES,
// whose codes are 0 to SYMM_PLAN_DTYPES-1).
#define SYMM_PLAN_ONE_DTYPE_(name, code, size) +1
enum { SYMM_PLAN_DTYPES = 0 SYMM_DTYPES(SYMM_PLAN_ONE_DTYPE_) };

// Kernels a plan holds, by index into symm_plan_t.fn. The reducing families
// hold 2 per dtype each: + 2 × dtype + (0 for 4 words per thread, 1 for
// one); the all-gather 2 (4 words, one); the push all-reduce 1 per dtype,
// + dtype.
enum {
  SYMM_PLAN_BARRIER = 0,
  SYMM_PLAN_PUT = 1,
  SYMM_PLAN_WAIT = 2,
  SYMM_PLAN_ONE_SHOT = 3,
  SYMM_PLAN_TWO_SHOT = SYMM_PLAN_ONE_SHOT + 2 * SYMM_PLAN_DTYPES,
  SYMM_PLAN_REDUCE_SCATTER = SYMM_PLAN_TWO_SHOT + 2 * SYMM_PLAN_DTYPES,
  SYMM_PLAN_ALL_GATHER = SYMM_PLAN_REDUCE_SCATTER + 2 * SYMM_PLAN_DTYPES,
  SYMM_PLAN_PUSH = SYMM_PLAN_ALL_GATHER + 2,
  SYMM_PLAN_KERNELS = SYMM_PLAN_PUSH + SYMM_PLAN_DTYPES
};

// The collectives a plan launches (libsymm_plan_collective's kind).
enum { SYMM_PLAN_COLL_ONE_SHOT = 0, SYMM_PLAN_COLL_TWO_SHOT = 1, SYMM_PLAN_COLL_REDUCE_SCATTER = 2, SYMM_PLAN_COLL_ALL_GATHER = 3 };

typedef struct {
  int64_t hid;                         // the handle's id, as the C API names it
  int32_t device, rank, world, channels;  // channels: signal-pad channels per rank
  uint32_t max_blocks;                 // the collectives' grid cap
  int32_t meet_barrier;                // the barrier kernel's meeting kind
  uint64_t buffers, pads;              // device arrays of the peers' buffers and signal pads
  uint64_t epochs;                     // the kernels' epochs argument (0: none)
  uint64_t status;                     // the handle's status word (device address)
  uint64_t buffer, buffer_size;        // this rank's buffer as mapped here, its size
  uint64_t timeout_ns;                 // the kernels' deadline (SYMM_TIMEOUT_MS)
  uint64_t ctx;                        // the CUcontext the kernels were loaded into
  uint64_t push_state, push_lines;     // a push workspace's state (device) and slot lines
  uint64_t push_ready;                 // host address of its ready word (non-zero once set up)
  uint32_t push_max_blocks, reserved;  // the push kernel's grid cap
  uint64_t fn[SYMM_PLAN_KERNELS];      // CUfunction of each kernel
} symm_plan_t;

// Slots in the table: handle ids that agree modulo this share a slot.
#define SYMM_PLAN_SLOTS 1024

// libsymm_plan_publish stores *p as handle p->hid's plan. Returns 1, or 0 when
// the slot holds another handle's live plan (the handle gets none) or the id
// does not fit 32 bits.
int libsymm_plan_publish(const symm_plan_t *p);
// libsymm_plan_retire withdraws hid's plan, if it has one, and returns once no
// caller is inside it. Returns 1 if there was one.
int libsymm_plan_retire(int64_t hid);
// libsymm_plan_enter returns hid's plan, counted as in use until
// libsymm_plan_leave, or NULL when it has none (the caller goes through Go).
const symm_plan_t *libsymm_plan_enter(int64_t hid);
void libsymm_plan_leave(const symm_plan_t *p);

// The driver functions the launches call (cuLaunchKernel, cuCtxGetCurrent,
// cuCtxSetCurrent, cuCtxPushCurrent, cuCtxPopCurrent), set by Go before it
// publishes the first plan.
void libsymm_plan_set_driver(void *launch, void *ctx_get, void *ctx_set, void *ctx_push, void *ctx_pop);

// The per-call launches. Each returns SYMM_PLAN_DONE when it queued the
// kernel (or, for a barrier in a world of one, had nothing to queue), else
// SYMM_PLAN_PASS and queued nothing: the handle has no plan, or an
// argument is one the plan does not take (Go checks it and words the
// error), or the launch failed (Go launches again and reports). A call with
// a timeout always goes through Go. The checks are Go's (symmetric's
// kernelCheck, checkAllReduce, checkCollective); where they pass here they
// pass there.
enum { SYMM_PLAN_DONE = 0, SYMM_PLAN_PASS = 1 };
int libsymm_plan_barrier(int64_t hid, int channel, void *stream);
int libsymm_plan_put(int64_t hid, int dst, int channel, void *stream);
int libsymm_plan_wait(int64_t hid, int src, int channel, void *stream);
// op: SYMM_SUM (0), or -1 for the all-gather, which has none.
int libsymm_plan_collective(int kind, int64_t hid, uint64_t offset, uint64_t count, int dtype, int op, uint64_t out,
                            uint64_t local, void *stream);
// The push all-reduce on workspace hid, once the workspace is set up (its
// first call, through Go, sets it up; until its set-up kernel has run the
// calls pass).
int libsymm_plan_push(int64_t hid, uint64_t in, uint64_t out, uint64_t count, int dtype, int op, void *stream);

// libsymm_plan_shape is the collectives' launch shape for nbytes at offset
// in a world of world ranks with channels signal-pad channels (the plan's)
// and grid cap max_blocks (Go's allReduceShape): v is the words per
// thread, 4 or 1.
void libsymm_plan_shape(uint64_t offset, uint64_t nbytes, int world, int channels, uint32_t max_blocks, int *v,
                        uint32_t *blocks, uint32_t *threads);
// libsymm_plan_push_shape is the push kernel's (kernels.PushLaunch) over
// nbytes, at most max_blocks blocks.
void libsymm_plan_push_shape(uint64_t nbytes, uint32_t max_blocks, uint32_t *blocks, uint32_t *threads);

#ifdef __cplusplus
}
#endif
#endif
