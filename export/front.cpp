#include "front.h"

#include <atomic>
#include <new>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "liveset.h"
#include "shim_internal.h"
#include "shim.h"

namespace front {
namespace {

// Blocks larger than g_max_block (SYMM_POOL_FRONT_CACHE_MAX, default 1 MiB:
// PyTorch's small-pool sizes) go back to the pool at once, unless the pool's
// best fit would place the next request of their size on them anyway
// (cacheable, below). Why: a hit hands out the parked block without the
// pool's best fit, and a large block cut from a larger segment would break
// up the hole it was to join; with such blocks cached (64 MiB) the GPT-2
// trace reserved 1.164x its peak allocation instead of 1.051
// (bench/RESULTS.md). What is parked costs no peak: a miss hands back the
// parked blocks of its device, stream and pool (small or large) before the
// pool places anything, the pool takes back the rest before it steals,
// collects or grows, or could pass a peak (alloc_miss,
// allocator.AllocAround), and statistics reads drain first. The largest
// block kept (SYMM_POOL_FRONT_CACHE_MAX) and the small pool's bound come
// from Go when the cache is enabled (symmshim_front_enable): export/main.go
// and allocator.SmallMax own them.
constexpr int kEntries = 64;                        // blocks per CPU and pool that a request may reuse
constexpr int kEvict = kEntries / 4;                // oldest blocks of a full list returned with one pool call
constexpr int kDeferred = 32;                       // frees per CPU waiting to reach the pool together
constexpr int kBatch = 2 * kEntries + kDeferred;    // blocks returned with one pool call (what a CPU holds)
constexpr int kCpus = 256;
constexpr int kCountedDevs = 16;                     // devices whose front-served requests are counted per CPU

// ---- per-CPU cache slots ----
// An entry is what the pool needs to take the block back (shim.h), so that
// slots hand their blocks to Go as they are.
using Entry = symmshim_parked;

// e[t] holds blocks of pool t (0 small, 1 large: statistics type t+1) that
// a request of the same size and stream may reuse, oldest first; sizes[t]
// has bit size_bit(req) set for each of them (and maybe more: bits are
// cleared only when e[t] empties), so that a request of a size not parked
// looks no further. d holds frees of blocks none may (cacheable says
// which), deferred so that up to kDeferred of them reach the pool in one
// C->Go call, usually the next miss's. All are allocated as far as the
// pool can see, until taken. served counts the requests a CPU answered
// from e, per device and statistics type: requests, block bytes, requested
// bytes (written under lk, read without it by symmshim_front_served).
// req[t][i] is e[t][i].req, kept apart so that a hit scans 8 bytes a slot.
struct alignas(64) Cpu {
  SpinLock lk;
  int n[2] = {0, 0}, nd = 0;
  uint64_t sizes[2] = {0, 0};
  uint64_t req[2][kEntries];
  Entry e[2][kEntries];
  Entry d[kDeferred];
  uint64_t served[kCountedDevs][SYMMSHIM_STAT_TYPES][3] = {};
};

inline uint64_t size_bit(uint64_t req) { return 1ull << ((req >> 9) & 63); }

// list_of is the index in Cpu.e of a block of statistics type type.
inline int list_of(int type) { return type == SYMMSHIM_STAT_SMALL_POOL ? 0 : 1; }

// count adds one to what c served; with c.lk held. Relaxed load and store,
// not an atomic add: there is one writer (the lock holder), and a reader
// only needs whole values.
inline void count(Cpu &c, const Entry &e) {
  if (e.dev < 0 || e.dev >= kCountedDevs || e.type < SYMMSHIM_STAT_SMALL_POOL || e.type > SYMMSHIM_STAT_LARGE_POOL)
    return;
  uint64_t *s = c.served[e.dev][e.type];
  const uint64_t add[3] = {1, e.bsize, e.req};
  for (int i = 0; i < 3; i++) __atomic_store_n(&s[i], __atomic_load_n(&s[i], __ATOMIC_RELAXED) + add[i], __ATOMIC_RELAXED);
}
Cpu g_cpus[kCpus];

// g_nonempty has bit k set whenever CPU k's slots hold a block, so that the
// scans (take, parked, drain) visit only those CPUs: a host may configure
// hundreds of CPUs, and reading every slot's line on each pool allocation
// cost more than the pool itself (bench/RESULTS.md). Invariant: a list of
// c not empty => its bit is set, at every release of c.lk. The bit is set and cleared only
// under c.lk (a park sets it; a scan that leaves the slots empty clears it);
// a hit that empties the slots leaves it set, so that the cached path does
// not write this shared line.
std::atomic<uint64_t> g_nonempty[kCpus / 64];

inline int cpu_index() {
  int c = sched_getcpu();
  unsigned u = (unsigned)(c < 0 ? 0 : c);
  return (int)(u < (unsigned)kCpus ? u : u % kCpus);  // ids are below kCpus: no division on the cached path
}

// mark_nonempty sets k's bit; called with g_cpus[k].lk held.
inline void mark_nonempty(int k) {
  std::atomic<uint64_t> &w = g_nonempty[k / 64];
  uint64_t bit = 1ull << (k % 64);
  if ((w.load(std::memory_order_relaxed) & bit) == 0) w.fetch_or(bit, std::memory_order_release);
}

inline bool holds_any(const Cpu &c) {
  return __atomic_load_n(&c.n[0], __ATOMIC_RELAXED) > 0 || __atomic_load_n(&c.n[1], __ATOMIC_RELAXED) > 0 ||
         __atomic_load_n(&c.nd, __ATOMIC_RELAXED) > 0;
}

// unmark_if_empty clears k's bit if its slots are empty; with g_cpus[k].lk held.
inline void unmark_if_empty(int k) {
  if (!holds_any(g_cpus[k])) g_nonempty[k / 64].fetch_and(~(1ull << (k % 64)), std::memory_order_relaxed);
}

// for_each_nonempty calls fn(k) for every CPU k whose bit is set.
template <class F>
void for_each_nonempty(F fn) {
  for (int w = 0; w < kCpus / 64; w++)
    for (uint64_t m = g_nonempty[w].load(std::memory_order_acquire); m != 0; m &= m - 1)
      fn(w * 64 + __builtin_ctzll(m));
}

std::atomic<uint64_t> g_max_block{0};  // set before the cache is enabled
std::atomic<uint64_t> g_small_max{0};  // allocator.SmallMax, likewise
// g_small_type is the statistics type the pool gives requests of at most
// g_small_max (1 MiB): 1 (small_pool), or 2 where every request reads the large pool's
// bins (expandable segments). Learned from each miss's placement; the pool
// checks the guess a miss passes (goPoolAllocAfter) and takes everything
// back when it was wrong.
std::atomic<int> g_small_type{SYMMSHIM_STAT_SMALL_POOL};

// type_of guesses the statistics type of the pool that serves a request
// of size bytes: the bins it reads, so the list in Cpu.e it may hit.
inline int type_of(size_t size) {
  return size <= g_small_max.load(std::memory_order_relaxed) ? g_small_type.load(std::memory_order_relaxed)
                                                             : SYMMSHIM_STAT_LARGE_POOL;
}

// unchanged says whether the shard that placed a block has not changed since
// (allocator/epoch.go): the pool would place the next request of the same
// size and stream on that very block if it were freed now.
inline bool unchanged(const uint64_t *epoch, uint64_t mark) {
  return epoch != nullptr && __atomic_load_n(epoch, __ATOMIC_ACQUIRE) == mark;
}

// small says whether a block is parked whatever the pool did since: one of
// at most g_max_block bytes, or a fixed segment of its own at any size. Such
// a segment has no neighbour to merge with and never grows, so handing it to
// the next request of the same size is what the pool's best fit does too (up
// to ties between equal fits).
inline bool small(uint64_t bsize, bool whole) { return whole || bsize <= g_max_block.load(std::memory_order_relaxed); }

// cacheable says whether a block may be parked now: a small one, or one of
// any size whose shard has not changed since it was placed; the latter is
// handed out again only while that still holds (alloc_hit). Either way the
// peaks stay exact, because a miss hands back every parked block before the
// pool places anything (alloc_miss).
inline bool cacheable(const Rec &r) { return small(r.bsize, r.whole) || unchanged(r.epoch, r.mark); }

// ---- stepping aside where the front cache serves few requests ----
// Where it serves few requests, the front cache's work on the others (a
// record per block, a look-up per free, the hand-back before each miss)
// costs more than the calls into Go it saves: on the recorded training
// traces it served 4-7 % of the requests, and through PyTorch libsymm was
// 0.85x native per call with it, 0.74-0.77x with it off (bench/RESULTS.md).
// So the process counts, over every thread, the requests that reach the
// front cache and those it served; past kSample requests with fewer than 1
// in kMinShare served, it steps aside: the next kAside requests go to the
// pool as with the front cache off (front_on, export/routes.cpp), then it
// samples again. Stepping aside and back works as memory history's change
// of mode does: the parked blocks go back and the live set is emptied, so
// no record outlives the mode it was made in (a block handed out before
// has none, and its free goes to the pool, which knows it). What the pool
// places and every peak are the pool's own in both modes.
constexpr uint32_t kFlush = 256;     // a thread's requests counted before they reach the shared counters
constexpr uint64_t kSample = 4096;   // requests judged at a time while in use
constexpr uint64_t kMinShare = 8;    // it steps aside when it served fewer than 1 in kMinShare of them
constexpr uint64_t kAside = 65536;   // requests then left to the pool before it samples again

std::atomic<uint64_t> g_reqs{0}, g_hits{0};  // since the last judgement, flushed by threads
std::atomic<bool> g_judging{false};          // one thread judges and changes mode at a time
// Per thread, not yet flushed: 8 bytes of static TLS (export/shim.cpp says
// why thread_local stays small here).
thread_local uint32_t t_reqs, t_hits;

// judge flushes the calling thread's counts and, once enough requests were
// counted, decides whether the front cache is in use for the next ones.
// Called with no lock held: a change of mode calls into Go (drain).
__attribute__((noinline)) void judge() {
  uint64_t reqs = g_reqs.fetch_add(t_reqs, std::memory_order_relaxed) + t_reqs;
  g_hits.fetch_add(t_hits, std::memory_order_relaxed);
  t_reqs = t_hits = 0;
  bool aside = g_aside.load(std::memory_order_relaxed) != 0;
  if (reqs < (aside ? kAside : kSample) || g_judging.exchange(true, std::memory_order_acquire)) return;
  reqs = g_reqs.exchange(0, std::memory_order_relaxed);
  uint64_t hits = g_hits.exchange(0, std::memory_order_relaxed);
  if (aside) {
    // Back in use. A free that was under way as the cache stepped aside may
    // have parked its block since: it goes back; a record made meanwhile by
    // a miss under way then is dropped.
    drain(-1);
    forget_all();
    g_aside.store(0, std::memory_order_release);
  } else if (hits * kMinShare < reqs) {
    g_aside.store(1, std::memory_order_release);
    drain(-1);
    forget_all();
  }
  g_judging.store(false, std::memory_order_release);
}

}  // namespace

std::atomic<int> g_enabled{0};
std::atomic<int> g_aside{0};

void count_request(bool hit) {
  t_hits += hit;
  if (++t_reqs >= kFlush) judge();
}

// sole_large says whether e[1][i] of c, parked for its shard's being
// unchanged, is the only block of its device, stream and large pool parked
// on c (with the frees deferred there): the pool would have merged another
// one's free, and might place elsewhere. With c.lk held.
bool sole_large(const Cpu &c, int i) {
  const Entry &e = c.e[1][i];
  for (int j = 0; j < c.n[1]; j++)
    if (j != i && c.e[1][j].dev == e.dev && c.e[1][j].stream == e.stream) return false;
  for (int j = 0; j < c.nd; j++)
    if (c.d[j].dev == e.dev && c.d[j].stream == e.stream && c.d[j].type == SYMMSHIM_STAT_LARGE_POOL) return false;
  return true;
}

uintptr_t alloc_hit(size_t size, int dev, uintptr_t stream) {
  Cpu &c = g_cpus[cpu_index()];
  const int t = list_of(type_of(size));
  uintptr_t ptr = 0;
  // A hint read without the lock (bits are set under it before a block of
  // that size can be taken): no block of this size parked, nothing to scan.
  if ((__atomic_load_n(&c.sizes[t], __ATOMIC_RELAXED) & size_bit(size)) == 0) return 0;
  {
    Guard g(c.lk);
    Entry *list = c.e[t];
    uint64_t *req = c.req[t];
    for (int i = c.n[t] - 1; i >= 0; i--) {  // newest first: warm in caches
      if (req[i] != size) continue;
      Entry &e = list[i];
      // An entry with an epoch was parked for its shard's being unchanged:
      // if the shard has changed since, or other frees of its pool wait
      // here (the pool would have merged them, and might now place
      // elsewhere), the entry waits for a miss to go back.
      if (e.req == size && e.dev == dev && e.stream == stream &&
          (e.epoch == nullptr || (unchanged(e.epoch, e.mark) && sole_large(c, i)))) {
        ptr = e.ptr;
        count(c, e);
        memmove(&list[i], &list[i + 1], (c.n[t] - i - 1) * sizeof(Entry));
        memmove(&req[i], &req[i + 1], (c.n[t] - i - 1) * sizeof(uint64_t));
        __atomic_store_n(&c.n[t], c.n[t] - 1, __ATOMIC_RELAXED);  // read without the lock by parked()
        break;
      }
    }
  }
  if (ptr == 0) return 0;
  Stripe &s = stripe_of(ptr);
  Guard g(s.lk);
  if (Rec *r = find(s, ptr)) r->state = kLive;
  return ptr;
}

void on_go_alloc(uintptr_t ptr, size_t size, int dev, uintptr_t stream, const symmshim_placed &pl) {
  // Every block is recorded: one the front cache may not hand out again is
  // still freed through it (deferred, free below), so that its free costs
  // no C->Go call of its own.
  record(Rec{ptr, pl.bsize, size, stream, dev, kLive, 0, (uint8_t)(pl.whole != 0), (uint8_t)pl.type, pl.epoch, pl.mark});
}

// defer queues a free no request may reuse on this CPU; a full queue goes to
// the pool in one call.
void defer(const Entry &mine) {
  Entry out[kDeferred];
  int k = 0;
  {
    int cpu = cpu_index();
    Cpu &c = g_cpus[cpu];
    Guard g(c.lk);
    mark_nonempty(cpu);
    if (c.nd == kDeferred) {
      k = kDeferred;
      memcpy(out, c.d, sizeof out);
      __atomic_store_n(&c.nd, 0, __ATOMIC_RELAXED);
    }
    c.d[c.nd] = mine;
    __atomic_store_n(&c.nd, c.nd + 1, __ATOMIC_RELAXED);
  }
  if (k > 0) {
    for (int i = 0; i < k; i++) forget(out[i].ptr);
    goPoolReturnParked(out, k);
  }
}

// free_parked parks a free of a block LIVE in the live set on the calling
// CPU (its slots, or the deferred list) and returns true; false: the pool's
// to handle, with twice set if the block is parked already. The caller
// holds no lock.
bool free_parked(uintptr_t ptr, size_t size, int dev, bool &twice) {
  Stripe &s = stripe_of(ptr);
  Entry mine;
  bool deferred = false;
  {
    Guard g(s.lk);
    Rec *r = find(s, ptr);
    if (r == nullptr) return false;  // the pool reports unknown pointers
    twice = r->state == kCached;
    // dev -1: the caller knows only the pointer (symm_pool_free).
    if (twice || (size != 0 && size != r->req) || (dev != -1 && dev != r->dev)) return false;  // the pool explains the mismatch
    if (r->rs) {  // its free waits for events: the pool's business, at once
      erase(s, r);
      return false;
    }
    r->state = kCached;
    if (!cacheable(*r)) {
      mine = Entry{ptr, r->req, r->stream, r->dev, nullptr, 0, r->bsize, r->type};
      deferred = true;
    } else {
      bool exact = !small(r->bsize, r->whole);  // parked for the shard's being unchanged
      mine = Entry{ptr, r->req, r->stream, r->dev, exact ? r->epoch : nullptr, exact ? r->mark : 0, r->bsize, r->type};
    }
  }
  if (deferred) {
    defer(mine);
    return true;
  }
  Entry evicted[kEvict];
  bool evict = false;
  {
    int k = cpu_index();
    Cpu &c = g_cpus[k];
    const int t = list_of(mine.type);
    Entry *list = c.e[t];
    Guard g(c.lk);
    mark_nonempty(k);
    if (c.n[t] == kEntries) {  // full: the oldest go back, together
      memcpy(evicted, list, sizeof evicted);
      memmove(&list[0], &list[kEvict], (kEntries - kEvict) * sizeof(Entry));
      memmove(&c.req[t][0], &c.req[t][kEvict], (kEntries - kEvict) * sizeof(uint64_t));
      __atomic_store_n(&c.n[t], c.n[t] - kEvict, __ATOMIC_RELAXED);
      evict = true;
    }
    list[c.n[t]] = mine;
    c.req[t][c.n[t]] = mine.req;
    __atomic_store_n(&c.sizes[t], c.sizes[t] | size_bit(mine.req), __ATOMIC_RELAXED);
    __atomic_store_n(&c.n[t], c.n[t] + 1, __ATOMIC_RELAXED);
  }
  if (evict) {
    for (const Entry &e : evicted) forget(e.ptr);
    goPoolReturnParked(evicted, kEvict);
  }
  return true;
}

// take_if moves up to max parked blocks for which match(list, entry) holds
// (list: 0 or 1, Cpu.e[list]; 2, Cpu.d; only the lists whose bit is set in
// lists are read), from every CPU, into out and returns how many; they are
// no longer in the live set.
template <class Match>
int take_if(Match match, Entry *out, int max, unsigned lists = 7) {
  int k = 0;
  for_each_nonempty([&](int cpu) {
    if (k == max) return;
    Cpu &c = g_cpus[cpu];
    {
      Guard g(c.lk);
      // Moves the matching entries of list (n long) to out, keeping the others.
      // req: the list's req array (Cpu.req), or NULL.
      auto move_out = [&](int which, Entry *list, uint64_t *req, int &n) {
        int keep = 0;
        for (int i = 0; i < n; i++) {
          if (k < max && match(which, list[i])) {
            out[k++] = list[i];
          } else {
            if (req != nullptr) req[keep] = req[i];
            list[keep++] = list[i];
          }
        }
        __atomic_store_n(&n, keep, __ATOMIC_RELAXED);  // read without the lock by parked()
      };
      for (int t = 0; t < 2; t++) {
        if ((lists >> t & 1) == 0) continue;
        move_out(t, c.e[t], c.req[t], c.n[t]);
        if (c.n[t] == 0) __atomic_store_n(&c.sizes[t], 0, __ATOMIC_RELAXED);
      }
      if (lists & 4) move_out(2, c.d, nullptr, c.nd);
      unmark_if_empty(cpu);
    }
  });
  for (int i = 0; i < k; i++) forget(out[i].ptr);
  return k;
}

// take is take_if for the blocks of dev (-1: every device).
int take(int dev, Entry *out, int max) {
  return take_if([dev](int, const Entry &e) { return dev < 0 || e.dev == dev; }, out, max);
}

// take_for_miss is take_if for what a miss on (dev, stream) of pool list t
// hands back first: the blocks of Cpu.e[t] of that device and stream, and
// every deferred free of the device.
int take_for_miss(int dev, uintptr_t stream, int t, Entry *out, int max) {
  return take_if([=](int which, const Entry &e) { return e.dev == dev && (which == 2 || e.stream == stream); }, out, max,
                 1u << t | 4u);
}

// give_back returns ptr to the pool if some CPU holds it parked.
void give_back(uintptr_t ptr) {
  Entry e;
  if (take_if([ptr](int, const Entry &x) { return x.ptr == ptr; }, &e, 1) == 1) goPoolReturnParked(&e, 1);
}

bool free(uintptr_t ptr, size_t size, int dev, uintptr_t stream) {
  (void)stream;  // the block's own stream is its cache key
  bool twice = false;
  if (free_parked(ptr, size, dev, twice)) return true;
  // A free of a parked block is a double free. The pool alone judges it:
  // the block goes back first, and the free follows it to the pool, which
  // answers as it does without the front cache (unknown pointer).
  if (twice) give_back(ptr);
  return false;
}

bool parked(int dev) {
  bool found = false;
  for_each_nonempty([&](int cpu) {
    Cpu &c = g_cpus[cpu];
    if (found || !holds_any(c)) return;
    Guard g(c.lk);
    for (int t = 0; t < 2; t++)
      for (int i = 0; i < c.n[t]; i++)
        if (c.e[t][i].dev == dev) found = true;
    for (int i = 0; i < c.nd; i++)
      if (c.d[i].dev == dev) found = true;
  });
  return found;
}

bool any_cached() {
  bool found = false;
  for_each_nonempty([&](int cpu) { found = found || holds_any(g_cpus[cpu]); });
  return found;
}

void drain(int dev) {
  // What is parked when the drain begins goes back; blocks other threads
  // park meanwhile may stay. Taking until nothing is left would never end
  // while another thread frees steadily (symm top's refresh drains every
  // 250 ms beside such threads). A batch that is not full means take visited
  // every CPU; full ones go on, at most as many as every CPU's slots fill.
  Entry out[kBatch];
  constexpr int kMaxBatches = kCpus * (2 * kEntries + kDeferred) / kBatch + 1;
  for (int i = 0; i < kMaxBatches; i++) {
    int k = take(dev, out, kBatch);
    if (k > 0) goPoolReturnParked(out, k);
    if (k < kBatch) break;
  }
}

uintptr_t alloc_miss(int api, size_t size, int dev, uintptr_t stream) {
  // The pool is about to place a block: first it gets back, in the same
  // call into Go, what the CPUs parked in the bins this request reads (of
  // its device, stream and pool) and the deferred frees of its device.
  // Blocks of other streams and pools stay parked: the best fit never reads
  // their bins. The pool takes them back itself before it steals, collects
  // or grows, or when the request could pass a peak
  // (allocator.AllocAround), so every peak is the pool's own. A miss costs
  // one C->Go call unless more than kBatch blocks go back (several CPUs
  // holding them), when each full batch costs one more.
  const int type = type_of(size), t = list_of(type);
  Entry back[kBatch];
  int k = take_for_miss(dev, stream, t, back, kBatch);
  while (k == kBatch) {  // more than a batch (many CPUs): the full ones go back first
    goPoolReturnParked(back, k);
    k = take_for_miss(dev, stream, t, back, kBatch);
  }
  symmshim_placed pl{};
  pl.type = type;  // the guess; the pool checks it
  uintptr_t p = goPoolAllocAfter(api, back, k, size, dev, stream, &pl);
  if (p != 0) {
    if (size <= g_small_max.load(std::memory_order_relaxed)) g_small_type.store(pl.type, std::memory_order_relaxed);
    on_go_alloc(p, size, dev, stream, pl);
  }
  return p;
}

}  // namespace front

extern "C" {

void symmshim_front_enable(int on, uint64_t max_block, uint64_t small_max) {
  front::g_max_block.store(max_block, std::memory_order_relaxed);
  front::g_small_max.store(small_max, std::memory_order_relaxed);
  front::g_enabled.store(on, std::memory_order_relaxed);
}

void symmshim_front_drain(int dev) { front::drain(dev); }

void symmshim_front_served(int dev, int64_t out[9]) {
  memset(out, 0, 9 * sizeof(int64_t));
  if (dev < 0 || dev >= front::kCountedDevs) return;
  for (front::Cpu &c : front::g_cpus)
    for (int t = SYMMSHIM_STAT_SMALL_POOL; t < SYMMSHIM_STAT_TYPES; t++)
      for (int i = 0; i < 3; i++) out[3 * t + i] += (int64_t)__atomic_load_n(&c.served[dev][t][i], __ATOMIC_RELAXED);
}

int symmshim_front_parked(int dev) { return front::enabled() && (dev < 0 ? front::any_cached() : front::parked(dev)); }

}
