// Launch plans: what a symmetric-memory call needs to launch its kernel
// (the handle's device and context, its pads and status word, the kernels'
// function handles), made by Go once per handle and read by C, so that a
// per-call entry point can launch without entering Go.
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

#ifdef __cplusplus
extern "C" {
#endif

// Kernels a plan holds, by index into symm_plan_t.fn.
enum { SYMM_PLAN_BARRIER = 0, SYMM_PLAN_PUT = 1, SYMM_PLAN_WAIT = 2, SYMM_PLAN_KERNELS = 3 };

typedef struct {
  int64_t hid;                         // the handle's id, as the C API names it
  int32_t device, rank, world, channels;
  uint64_t pads;                       // the device array of the peers' signal pads
  uint64_t epochs;                     // the epochs argument of the barrier (0: none)
  uint64_t status;                     // the handle's status word (device address)
  uint64_t timeout_ns;                 // the kernels' deadline (SYMM_TIMEOUT_MS)
  uint64_t ctx;                        // the device's CUcontext
  uint64_t fn[SYMM_PLAN_KERNELS];      // CUfunction of each kernel
  uint32_t barrier_threads, reserved;  // the barrier's block size
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

#ifdef __cplusplus
}
#endif
#endif
