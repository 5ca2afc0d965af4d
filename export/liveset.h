// The front cache's live set (front.cpp): which blocks it handed out and
// what it needs to park each one's free without asking the pool (its size,
// request, device, stream, statistics type and placement). Open addressing
// with linear probing, in 256 stripes of their own spin lock, so that frees
// on different threads rarely meet.
//
// Invariants:
//  - A record is LIVE (its caller has the block) or CACHED (parked in one
//    CPU's slots); a block the pool handed out while the front cache was on
//    has at most one record, and one it handed out again replaces the old
//    (record): the pool is the authority.
//  - A stripe's table is at most half full, and grows by a table allocated
//    with no lock held (nothing that can block or allocate runs under a
//    SpinLock).
//  - find, erase and any change of a record happen with the stripe's lock
//    held.
// Internal to export/ (front.cpp, liveset.cpp).
#ifndef SYMM_LIVESET_H
#define SYMM_LIVESET_H
#include <atomic>
#include <sched.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)
namespace front {

// cpu_relax tells the core a spin-wait is under way (x86 PAUSE, Arm YIELD),
// so that the other hyperthread or the lock holder gets on.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  sched_yield();
#endif
}

// Nothing that can block or allocate runs under a SpinLock (malloc may take
// its own locks, page in, or call into the kernel).
struct SpinLock {
  std::atomic<bool> v{false};
  void lock() {
    while (v.exchange(true, std::memory_order_acquire)) {
      while (v.load(std::memory_order_relaxed)) cpu_relax();
    }
  }
  void unlock() { v.store(false, std::memory_order_release); }
};

struct Guard {
  SpinLock &l;
  explicit Guard(SpinLock &l) : l(l) { l.lock(); }
  ~Guard() { l.unlock(); }
};

enum : uint8_t { kEmpty = 0, kLive = 1, kCached = 2 };

struct Rec {
  uintptr_t ptr;
  uint64_t bsize, req;
  uintptr_t stream;
  int32_t dev;
  uint8_t state, rs;
  uint8_t whole;  // a fixed segment of its own: kept at any size (cacheable)
  uint8_t type;   // statistics type: 1 small_pool, 2 large_pool
  // The block's shard's change count and what it read right after the
  // allocation (shim.h symmshim_placed); epoch NULL: none.
  const uint64_t *epoch;
  uint64_t mark;
};

struct alignas(64) Stripe {
  SpinLock lk;
  Rec *tab = nullptr;
  uint32_t cap = 0, n = 0;
};
constexpr int kStripes = 256;
extern Stripe g_stripes[kStripes];

inline uint64_t hash(uintptr_t p) { return (uint64_t)(p >> 9) * 0x9E3779B97F4A7C15ull; }
inline Stripe &stripe_of(uintptr_t p) { return g_stripes[hash(p) >> 56]; }
inline uint32_t home(const Stripe &s, uintptr_t p) { return (uint32_t)(hash(p) >> 16) & (s.cap - 1); }

// find returns p's record in s, or nullptr; with s.lk held. Inline: every
// cached alloc and free looks a block up.
inline Rec *find(Stripe &s, uintptr_t p) {
  if (s.n == 0) return nullptr;
  for (uint32_t i = home(s, p);; i = (i + 1) & (s.cap - 1)) {
    Rec &r = s.tab[i];
    if (r.state == kEmpty) return nullptr;
    if (r.ptr == p) return &r;
  }
}

// erase removes r from s; with s.lk held.
void erase(Stripe &s, Rec *r);

// record enters rec, replacing any record of its pointer (a stale one); the
// caller holds no lock. Without memory to grow the table, the block is not
// recorded: its free goes to the pool, bypassing the front cache.
void record(const Rec &rec);

// forget drops ptr's record, if any: the block goes back to the pool.
void forget(uintptr_t ptr);

}  // namespace front
#pragma GCC visibility pop
#endif
