// Launch plans: plans.h states the table's invariants.
#include "plans.h"

#include "../include/symm.h"

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

// ---- the per-call launches ---------------------------------------------------------

namespace {

// The driver's functions, with their CUDA signatures in plain types
// (CUresult is an int; CUcontext, CUfunction and CUstream are pointers).
typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shmem, void *stream, void **params, void **extra);
typedef int (*ctx_get_fn)(void **ctx);
typedef int (*ctx_set_fn)(void *ctx);
typedef int (*ctx_pop_fn)(void **ctx);

std::atomic<launch_fn> g_launch{nullptr};
std::atomic<ctx_get_fn> g_ctx_get{nullptr};
std::atomic<ctx_set_fn> g_ctx_set{nullptr};
std::atomic<ctx_set_fn> g_ctx_push{nullptr};
std::atomic<ctx_pop_fn> g_ctx_pop{nullptr};

constexpr int kMaxWords = 11;
constexpr uintptr_t kStreamLegacy = 1;  // CU_STREAM_LEGACY: stream 0 as Go passes it

uint64_t u32(int v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); }

// launch queues p's kernel fi on stream with n words (the last two, the
// deadline and the status word, filled here), in p's context. The thread
// keeps that context when it had none (bound once: later calls find it
// current); over another context it is pushed and popped. Returns
// SYMM_PLAN_PASS, having queued nothing, where the driver refuses.
int launch(const symm_plan_t *p, int fi, unsigned grid, unsigned block, void *stream, uint64_t *w, int n) {
  launch_fn lf = g_launch.load(std::memory_order_acquire);
  if (lf == nullptr || p->fn[fi] == 0) return SYMM_PLAN_PASS;
  w[n - 2] = p->timeout_ns;
  w[n - 1] = p->status;
  void *params[kMaxWords];
  for (int i = 0; i < n; i++) params[i] = &w[i];
  void *ctx = reinterpret_cast<void *>(p->ctx);
  void *cur = nullptr;
  if (g_ctx_get.load(std::memory_order_relaxed)(&cur) != 0) return SYMM_PLAN_PASS;
  bool pushed = false;
  if (cur != ctx) {
    if (cur == nullptr) {
      if (g_ctx_set.load(std::memory_order_relaxed)(ctx) != 0) return SYMM_PLAN_PASS;
    } else {
      if (g_ctx_push.load(std::memory_order_relaxed)(ctx) != 0) return SYMM_PLAN_PASS;
      pushed = true;
    }
  }
  if (stream == nullptr) stream = reinterpret_cast<void *>(kStreamLegacy);
  int r = lf(reinterpret_cast<void *>(p->fn[fi]), grid, 1, 1, block, 1, 1, 0, stream, params, nullptr);
  if (pushed) {
    void *popped = nullptr;
    g_ctx_pop.load(std::memory_order_relaxed)(&popped);
  }
  return r == 0 ? SYMM_PLAN_DONE : SYMM_PLAN_PASS;
}

// Plan is a plan entered for one call: left when it goes out of scope.
struct Plan {
  const symm_plan_t *p;
  explicit Plan(int64_t hid) : p(libsymm_plan_enter(hid)) {}
  ~Plan() {
    if (p != nullptr) libsymm_plan_leave(p);
  }
  Plan(const Plan &) = delete;
  Plan &operator=(const Plan &) = delete;
};

// peer_ok is symmetric's kernelCheck: the peer and the channel in range.
bool peer_ok(const symm_plan_t *p, int peer, int channel) {
  return peer >= 0 && peer < p->world && channel >= 0 && channel < p->channels;
}

// signal launches the put or wait kernel (fi) naming peer.
int signal(int fi, int64_t hid, int peer, int channel, void *stream) {
  Plan e(hid);
  const symm_plan_t *p = e.p;
  if (p == nullptr || !peer_ok(p, peer, channel)) return SYMM_PLAN_PASS;
  uint64_t w[] = {p->pads, u32(p->rank), u32(p->world), u32(peer), u32(channel), 0, 0};
  return launch(p, fi, 1, 32, stream, w, 7);
}

bool overlap(uint64_t a, uint64_t b, uint64_t n) { return (a > b ? a - b : b - a) < n; }

bool overlap_ranges(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) { return a >= b ? a - b < bn : b - a < an; }

uint64_t dtype_size(int dtype) {
  switch (dtype) {
#define SYMM_PLAN_SIZE_CASE_(name, code, size) \
  case name:                                   \
    return size;
    SYMM_DTYPES(SYMM_PLAN_SIZE_CASE_)
#undef SYMM_PLAN_SIZE_CASE_
  }
  return 0;
}

// reduce_ok is symmetric's checkAllReduce for the one-shot (two_shot
// false) and the two-shot all-reduce, for a count above 0: the size in
// bytes, or 0 where Go must check.
uint64_t reduce_ok(const symm_plan_t *p, bool two_shot, uint64_t offset, uint64_t count, uint64_t size, uint64_t out,
                   uint64_t local) {
  if (count > UINT64_MAX / size) return 0;
  uint64_t nbytes = count * size;
  if (offset % 4 != 0 || nbytes % 4 != 0 || offset > p->buffer_size || nbytes > p->buffer_size - offset) return 0;
  if (out == 0 || out % 4 != 0 || local % 4 != 0) return 0;
  uint64_t in = p->buffer + offset;
  if (two_shot) {
    if (out != in && overlap(out, in, nbytes)) return 0;
    if (local != 0 && local != in && overlap(local, in, nbytes)) return 0;
  } else if (overlap(out, in, nbytes)) {
    return 0;
  }
  if (local != 0 && local != out && overlap(out, local, nbytes)) return 0;
  return nbytes;
}

// share_ok is symmetric's checkCollective for the reduce-scatter and the
// all-gather (gather), for a count above 0: one share's bytes, or 0 where Go
// must check.
uint64_t share_ok(const symm_plan_t *p, bool gather, uint64_t offset, uint64_t count, uint64_t size, uint64_t out,
                  uint64_t local) {
  uint64_t world = static_cast<uint64_t>(p->world);
  if (count > UINT64_MAX / size / world) return 0;
  uint64_t nbytes = count * size, total = nbytes * world;
  if (offset % 4 != 0 || nbytes % 4 != 0 || offset > p->buffer_size || total > p->buffer_size - offset) return 0;
  if (out == 0 || out % 4 != 0 || local % 4 != 0) return 0;
  uint64_t buf = p->buffer + offset, mine = static_cast<uint64_t>(p->rank) * nbytes;
  uint64_t share = buf + mine;
  uint64_t out_bytes = gather ? total : nbytes, local_bytes = gather ? nbytes : total;
  uint64_t in_place = gather ? buf : share, local_ok = gather ? share : buf;
  bool out_in_local = gather ? local == out + mine : out == local + mine;
  if (out != in_place && overlap_ranges(out, out_bytes, buf, total)) return 0;
  if (local != 0 && local != local_ok && overlap_ranges(local, local_bytes, buf, total)) return 0;
  if (local != 0 && !out_in_local && overlap_ranges(out, out_bytes, local, local_bytes)) return 0;
  return nbytes;
}

}  // namespace

extern "C" {

void libsymm_plan_set_driver(void *launch, void *ctx_get, void *ctx_set, void *ctx_push, void *ctx_pop) {
  g_ctx_get.store(reinterpret_cast<ctx_get_fn>(ctx_get), std::memory_order_relaxed);
  g_ctx_set.store(reinterpret_cast<ctx_set_fn>(ctx_set), std::memory_order_relaxed);
  g_ctx_push.store(reinterpret_cast<ctx_set_fn>(ctx_push), std::memory_order_relaxed);
  g_ctx_pop.store(reinterpret_cast<ctx_pop_fn>(ctx_pop), std::memory_order_relaxed);
  // Last, with release order: a launch that sees it sees the others.
  g_launch.store(reinterpret_cast<launch_fn>(launch), std::memory_order_release);
}

int libsymm_plan_barrier(int64_t hid, int channel, void *stream) {
  Plan e(hid);
  const symm_plan_t *p = e.p;
  if (p == nullptr || !peer_ok(p, p->rank, channel)) return SYMM_PLAN_PASS;
  if (p->world == 1) return SYMM_PLAN_DONE;  // no peer to meet: nothing is queued, as in Go
  uint64_t w[] = {p->pads, p->epochs, u32(p->rank), u32(p->world), u32(channel), u32(p->meet_barrier), 0, 0};
  return launch(p, SYMM_PLAN_BARRIER, 1, static_cast<unsigned>((p->world + 31) / 32 * 32), stream, w, 8);
}

int libsymm_plan_put(int64_t hid, int dst, int channel, void *stream) {
  return signal(SYMM_PLAN_PUT, hid, dst, channel, stream);
}

int libsymm_plan_wait(int64_t hid, int src, int channel, void *stream) {
  return signal(SYMM_PLAN_WAIT, hid, src, channel, stream);
}

void libsymm_plan_shape(uint64_t offset, uint64_t nbytes, int world, int channels, uint32_t max_blocks, int *v,
                        uint32_t *blocks, uint32_t *threads) {
  // kernels.AllReduceLaunch over nbytes/4 words, then capped by the
  // channels (block b meets on channel b) and given a thread per peer.
  constexpr uint64_t kMaxThreads = 512;
  *v = offset % 16 == 0 && nbytes % 16 == 0 ? 4 : 1;
  uint64_t items = (nbytes / 4 + static_cast<uint64_t>(*v) - 1) / static_cast<uint64_t>(*v);
  uint64_t b = 1, t = kMaxThreads;
  if (items <= kMaxThreads) {
    t = (items + 31) / 32 * 32;
    if (t < 32) t = 32;
  } else {
    uint64_t cap = max_blocks > 0 ? max_blocks : 1;
    b = (items + kMaxThreads - 1) / kMaxThreads;
    if (b > cap) b = cap;
  }
  if (b > static_cast<uint64_t>(channels)) b = static_cast<uint64_t>(channels);
  uint64_t per_peer = (static_cast<uint64_t>(world) + 31) / 32 * 32;
  if (t < per_peer) t = per_peer;
  *blocks = static_cast<uint32_t>(b);
  *threads = static_cast<uint32_t>(t);
}

int libsymm_plan_collective(int kind, int64_t hid, uint64_t offset, uint64_t count, int dtype, int op, uint64_t out,
                            uint64_t local, void *stream) {
  uint64_t size = dtype_size(dtype);
  bool gather = kind == SYMM_PLAN_COLL_ALL_GATHER;
  if (size == 0 || count == 0 || (gather ? op != -1 : op != SYMM_SUM)) return SYMM_PLAN_PASS;
  if (kind < SYMM_PLAN_COLL_ONE_SHOT || kind > SYMM_PLAN_COLL_ALL_GATHER) return SYMM_PLAN_PASS;
  Plan e(hid);
  const symm_plan_t *p = e.p;
  if (p == nullptr) return SYMM_PLAN_PASS;
  // The kernels of kind, by SYMM_PLAN_COLL_* (the all-reduces check the
  // message, the others one share).
  static constexpr int kFamily[] = {SYMM_PLAN_ONE_SHOT, SYMM_PLAN_TWO_SHOT, SYMM_PLAN_REDUCE_SCATTER,
                                    SYMM_PLAN_ALL_GATHER};
  int family = kFamily[kind];
  uint64_t nbytes = kind <= SYMM_PLAN_COLL_TWO_SHOT
                        ? reduce_ok(p, kind == SYMM_PLAN_COLL_TWO_SHOT, offset, count, size, out, local)
                        : share_ok(p, gather, offset, count, size, out, local);
  if (nbytes == 0) return SYMM_PLAN_PASS;
  int v;
  uint32_t blocks, threads;
  libsymm_plan_shape(offset, nbytes, p->world, p->channels, p->max_blocks, &v, &blocks, &threads);
  int fi = family + (v == 4 ? 0 : 1) + (gather ? 0 : 2 * dtype);
  uint64_t w[] = {p->buffers, offset,     nbytes / 4,   out, local, p->pads, p->epochs, u32(p->rank), u32(p->world),
                  0,          0};
  return launch(p, fi, blocks, threads, stream, w, 11);
}

void libsymm_plan_push_shape(uint64_t nbytes, uint32_t max_blocks, uint32_t *blocks, uint32_t *threads) {
  // A thread per 8-byte line, blocks of 256 threads.
  constexpr uint64_t kPerBlock = 256;
  uint64_t lines = (nbytes + 7) / 8;
  if (lines <= kPerBlock) {
    uint64_t t = (lines + 31) / 32 * 32;
    *blocks = 1;
    *threads = static_cast<uint32_t>(t < 32 ? 32 : t);
    return;
  }
  uint64_t b = (lines + kPerBlock - 1) / kPerBlock;
  *blocks = static_cast<uint32_t>(b < max_blocks ? b : max_blocks);
  *threads = kPerBlock;
}

int libsymm_plan_push(int64_t hid, uint64_t in, uint64_t out, uint64_t count, int dtype, int op, void *stream) {
  uint64_t size = dtype_size(dtype);
  if (size == 0 || count == 0 || op != SYMM_SUM || count > UINT64_MAX / size) return SYMM_PLAN_PASS;
  Plan e(hid);
  const symm_plan_t *p = e.p;
  if (p == nullptr || p->push_lines == 0) return SYMM_PLAN_PASS;
  // symmetric's checkPush.
  uint64_t nbytes = count * size;
  if (nbytes > 8 * p->push_lines || in == 0 || out == 0 || in % size != 0 || out % size != 0) return SYMM_PLAN_PASS;
  if (in != out && overlap(in, out, nbytes)) return SYMM_PLAN_PASS;
  if (overlap_ranges(in, nbytes, p->buffer, p->buffer_size) || overlap_ranges(out, nbytes, p->buffer, p->buffer_size))
    return SYMM_PLAN_PASS;
  // Set up (its set-up kernel has run): else Go queues the set-up first.
  if (p->push_ready == 0 || __atomic_load_n(reinterpret_cast<const uint64_t *>(p->push_ready), __ATOMIC_ACQUIRE) == 0)
    return SYMM_PLAN_PASS;
  uint32_t blocks, threads;
  libsymm_plan_push_shape(nbytes, p->push_max_blocks, &blocks, &threads);
  uint64_t w[] = {p->buffers, p->push_state, in, out, nbytes, p->push_lines, u32(p->rank), u32(p->world), 0, 0};
  return launch(p, SYMM_PLAN_PUSH + dtype, blocks, threads, stream, w, 10);
}

}  // extern "C"
