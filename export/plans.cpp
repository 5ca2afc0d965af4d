// Launch plans: plans.h states the table's invariants.
#include "plans.h"

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace {

constexpr uint64_t kCount = (uint64_t{1} << 31) - 1;  // callers inside
constexpr uint64_t kLive = uint64_t{1} << 31;

struct Slot {
  std::atomic<uint64_t> word{0};  // hid (low 32 bits) << 32 | kLive | callers inside
  symm_plan_t plan{};
};

Slot g_slots[SYMM_PLAN_SLOTS];

bool fits(int64_t hid) { return hid >= 0 && hid <= int64_t{0xffffffff}; }
Slot &slot_of(int64_t hid) { return g_slots[static_cast<uint64_t>(hid) % SYMM_PLAN_SLOTS]; }
uint64_t tag(int64_t hid) { return static_cast<uint64_t>(hid) << 32; }
bool holds(uint64_t w, int64_t hid) { return (w & kLive) != 0 && (w & ~(kLive | kCount)) == tag(hid); }

}  // namespace

extern "C" {

int libsymm_plan_publish(const symm_plan_t *p) {
  if (p == nullptr || !fits(p->hid)) return 0;
  Slot &s = slot_of(p->hid);
  uint64_t w = s.word.load(std::memory_order_acquire);
  if (w & kLive) {
    if (!holds(w, p->hid)) return 0;  // another handle's
    libsymm_plan_retire(p->hid);         // rewritten below
  }
  // Not LIVE: a caller counting itself in meanwhile leaves without reading.
  s.plan = *p;
  w = s.word.load(std::memory_order_relaxed);
  while (!s.word.compare_exchange_weak(w, tag(p->hid) | kLive | (w & kCount), std::memory_order_release,
                                       std::memory_order_relaxed)) {
  }
  return 1;
}

int libsymm_plan_retire(int64_t hid) {
  if (!fits(hid)) return 0;
  Slot &s = slot_of(hid);
  uint64_t w = s.word.load(std::memory_order_acquire);
  do {
    if (!holds(w, hid)) return 0;
  } while (!s.word.compare_exchange_weak(w, w & ~kLive, std::memory_order_acq_rel, std::memory_order_acquire));
  // Callers inside finish their launch (microseconds); a caller that counted
  // itself in after the change leaves at once.
  while ((s.word.load(std::memory_order_acquire) & kCount) != 0) sched_yield();
  return 1;
}

const symm_plan_t *libsymm_plan_enter(int64_t hid) {
  if (!fits(hid)) return nullptr;
  Slot &s = slot_of(hid);
  uint64_t w = s.word.fetch_add(1, std::memory_order_acquire);
  if (!holds(w, hid)) {
    s.word.fetch_sub(1, std::memory_order_release);
    return nullptr;
  }
  return &s.plan;
}

void libsymm_plan_leave(const symm_plan_t *p) {
  // p is the plan of one of the slots (libsymm_plan_enter gave it).
  auto i = static_cast<size_t>(reinterpret_cast<const char *>(p) - reinterpret_cast<const char *>(g_slots)) / sizeof(Slot);
  g_slots[i].word.fetch_sub(1, std::memory_order_release);
}

}  // extern "C"
