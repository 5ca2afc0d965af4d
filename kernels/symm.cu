// libsymm's device-side signals and collectives, compiled at run time by
// NVRTC (package kernels): no header is included, so that any NVRTC
// compiles it with nothing else installed.
//
// Signal pads follow PyTorch's protocol: slot channel*world+src of rank dst's
// pad is set 0 -> 1 by src (put) and taken 1 -> 0 by dst (wait), both with
// compare-and-swap at system scope, release on put and acquire on wait, so
// that what a rank wrote before its put is visible to the peer after its
// wait. Only the sender sets a slot and only the receiver clears it.
//
// Every wait has a deadline (timeout_ns > 0; 0: none). Past it the waiting
// thread stops, writes one 64-bit report into the caller's status word
// (host-mapped memory) and returns, so that the stream goes on; the host
// turns the report into SYMM_ERR_TIMEOUT naming the peer and channel. The
// report is a single aligned 64-bit store (no atomics: host memory over PCIe
// need not support them); when several threads time out, one report stands.
//
// Multicast is never used: no multimem instruction appears here.

typedef unsigned int u32;
typedef unsigned long long u64;

// Report layout (the host decodes it in package symmetric: kernelReport).
// bit 63: set; bits 56..62: op; bits 32..55: peer rank; bits 0..31: channel.
#define SYMM_OP_PUT 1        // put_signal (or a barrier's put): the peer did not take our previous signal
#define SYMM_OP_WAIT 2       // wait_signal (or a barrier's wait): the peer's signal did not come
#define SYMM_OP_REDUCE_IN 3  // all-reduce: a peer did not arrive before the reads
#define SYMM_OP_REDUCE_OUT 4 // all-reduce: a peer did not finish its reads

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

__device__ __forceinline__ u32 cas_release(u32 *a, u32 cmp, u32 val) {
  u32 old;
  asm volatile("atom.release.sys.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(a), "r"(cmp), "r"(val) : "memory");
  return old;
}

__device__ __forceinline__ u32 cas_acquire(u32 *a, u32 cmp, u32 val) {
  u32 old;
  asm volatile("atom.acquire.sys.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(a), "r"(cmp), "r"(val) : "memory");
  return old;
}

__device__ __forceinline__ void report(u64 *status, u32 op, u32 peer, u32 channel) {
  u64 word = (1ull << 63) | ((u64)(op & 0x7f) << 56) | ((u64)(peer & 0xffffff) << 32) | (u64)channel;
  __threadfence_system();
  *(volatile u64 *)status = word;
  __threadfence_system();
}

// flip waits until the slot holds from and swaps it to to: a put (0 -> 1,
// release: our slot in the peer's pad, once the peer has taken the previous
// signal) or a take (1 -> 0, acquire: the peer's signal in our pad). False,
// and a report, past the deadline.
template <u32 From, u32 To>
__device__ __forceinline__ bool flip(u32 *slot, u64 start, u64 timeout_ns, u64 *status, u32 op, u32 peer, u32 channel) {
  while ((From == 0 ? cas_release(slot, From, To) : cas_acquire(slot, From, To)) != From) {
    if (timeout_ns != 0 && now_ns() - start > timeout_ns) {
      report(status, op, peer, channel);
      return false;
    }
  }
  return true;
}
__device__ __forceinline__ bool put(u32 *slot, u64 start, u64 timeout_ns, u64 *status, u32 op, u32 peer, u32 channel) {
  return flip<0, 1>(slot, start, timeout_ns, status, op, peer, channel);
}
__device__ __forceinline__ bool take(u32 *slot, u64 start, u64 timeout_ns, u64 *status, u32 op, u32 peer, u32 channel) {
  return flip<1, 0>(slot, start, timeout_ns, status, op, peer, channel);
}

// ---- epoch sync: a meeting with no round trip ------------------------------
//
// The collectives and the barrier of a handle that owns its block's sync
// area (epochs != 0) meet their peers without the put/take exchange above.
// Each rank's block has, right after its signal pad, SYMM_SYNC_SLOTS u32
// slots: slot channel*world + src holds the number of src's latest meeting
// on that channel, written only by src. The handle keeps its own count per
// channel (epochs[channel], in this rank's device memory, read by no peer).
// A meeting on channel c: e = epochs[c] + 1; thread t stores e into slot
// (c, rank) of rank t (one store, release, system scope: what the block wrote
// before is visible to whoever acquires it) and spins until slot (c, t) of
// this rank holds at least e (acquire); then epochs[c] = e. No slot is ever
// reset. A peer is at most one meeting ahead on a channel (its next meeting
// needs our store of this one), so "at least e" in wrap-around order
// ((int)(v - e) >= 0) is exact for 2^31 meetings of slack. The put/take
// exchange costs a round trip to the peer (the compare-and-swap's reply)
// before the wait; this costs one store's flight.
//
// The area belongs to one group per block (the rendezvous agrees on it), so
// that no other group's meetings write its slots; a handle of any other group
// passes epochs = 0 and meets with put/take on its signal pad. Meetings on
// one channel of a handle are ordered (one stream, or streams ordered by
// events), as the put/take exchange also needs.
#define SYMM_SYNC_SLOTS 512 // after the 512 slots of the signal pad

__device__ __forceinline__ void st_release(u32 *a, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire(const u32 *a) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}

// meet_epoch is thread t's part of meeting e with peer t on channel.
__device__ __forceinline__ bool meet_epoch(u32 **pads, int rank, int world, int channel, int t, u32 e, u64 start,
                                           u64 timeout_ns, u64 *status, u32 op) {
  st_release(pads[t] + SYMM_SYNC_SLOTS + channel * world + rank, e);
  const u32 *in = pads[rank] + SYMM_SYNC_SLOTS + channel * world + t;
  while ((int)(ld_acquire(in) - e) < 0) {
    if (timeout_ns != 0 && now_ns() - start > timeout_ns) {
      report(status, op, t, channel);
      return false;
    }
  }
  return true;
}

// One block of at least world threads: thread t meets rank t (t != rank).
extern "C" __global__ void symm_barrier(u32 **pads, u32 *epochs, int rank, int world, int channel, u64 timeout_ns,
                                        u64 *status) {
  int t = threadIdx.x;
  u64 start = now_ns();
  if (epochs != 0) {
    u32 e = epochs[channel] + 1;
    bool ok = true;
    if (t < world && t != rank) ok = meet_epoch(pads, rank, world, channel, t, e, start, timeout_ns, status, SYMM_OP_WAIT);
    __syncthreads_or(!ok);
    if (t == 0) epochs[channel] = e;
    return;
  }
  if (t >= world || t == rank) return;
  if (!put(pads[t] + channel * world + rank, start, timeout_ns, status, SYMM_OP_PUT, t, channel)) return;
  take(pads[rank] + channel * world + t, start, timeout_ns, status, SYMM_OP_WAIT, t, channel);
}

extern "C" __global__ void symm_put_signal(u32 **pads, int rank, int world, int dst, int channel, u64 timeout_ns,
                                           u64 *status) {
  if (threadIdx.x != 0) return;
  put(pads[dst] + channel * world + rank, now_ns(), timeout_ns, status, SYMM_OP_PUT, dst, channel);
}

extern "C" __global__ void symm_wait_signal(u32 **pads, int rank, int world, int src, int channel, u64 timeout_ns,
                                            u64 *status) {
  if (threadIdx.x == 0) take(pads[rank] + channel * world + src, now_ns(), timeout_ns, status, SYMM_OP_WAIT, src, channel);
  __threadfence_system();
}

// ---- one-shot all-reduce ----------------------------------------------------
//
// Every rank reads the same bytes of every rank's buffer, sums them in rank
// order (so that every rank computes bit-identical results) with float
// accumulation, and writes its own output. Block b synchronizes with block b
// of every peer on channel b, before the reads (every peer's input is
// written) and after them (no peer overwrites its buffer while we read), as
// PyTorch's one_shot_all_reduce_kernel does.

struct W4 {
  u32 w[4];
};

__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u32 to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ float f16_to_f32(u32 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
}

// Round to nearest even (cvt.rn); out of range gives infinity.
__device__ __forceinline__ u32 to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

#define SYMM_DT_F32 0
#define SYMM_DT_BF16 1
#define SYMM_DT_F16 2

template <int NW>
__device__ __forceinline__ void load(const u32 *p, u32 (&v)[NW]) {
  if constexpr (NW == 4) {
    W4 x = *(const W4 *)p;
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = x.w[k];
  } else {
#pragma unroll
    for (int k = 0; k < NW; k++) v[k] = p[k];
  }
}

template <int NW>
__device__ __forceinline__ void store(u32 *p, const u32 (&v)[NW]) {
  if constexpr (NW == 4) {
    W4 x;
#pragma unroll
    for (int k = 0; k < 4; k++) x.w[k] = v[k];
    *(W4 *)p = x;
  } else {
#pragma unroll
    for (int k = 0; k < NW; k++) p[k] = v[k];
  }
}

// The caller's own pointers (out, local) may be aligned differently on each
// rank: they are loaded and stored as vectors only where this rank's pointer
// allows, while NW, and so which words each block handles, comes from values
// every rank shares (offset, size), since block b of every rank must handle
// the same words (see one_shot).
template <int NW>
__device__ __forceinline__ void load_own(const u32 *p, u32 (&v)[NW], bool vec) {
  if (NW == 1 || vec) {
    load<NW>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < NW; k++) v[k] = p[k];
  }
}

template <int NW>
__device__ __forceinline__ void store_own(u32 *p, const u32 (&v)[NW], bool vec) {
  if (NW == 1 || vec) {
    store<NW>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < NW; k++) p[k] = v[k];
  }
}

// acc[2*k], acc[2*k+1]: the two floats of word k (f32 uses acc[2*k] only).
template <int NW, int DT>
__device__ __forceinline__ void accumulate(float (&acc)[2 * NW], const u32 (&v)[NW]) {
#pragma unroll
  for (int k = 0; k < NW; k++) {
    if constexpr (DT == SYMM_DT_BF16) {
      acc[2 * k] += bf16_lo(v[k]);
      acc[2 * k + 1] += bf16_hi(v[k]);
    } else if constexpr (DT == SYMM_DT_F16) {
      acc[2 * k] += f16_to_f32(v[k] & 0xffffu);
      acc[2 * k + 1] += f16_to_f32(v[k] >> 16);
    } else {
      acc[2 * k] += __uint_as_float(v[k]);
    }
  }
}

// Block-wide synchronization with block blockIdx.x of every peer on channel
// blockIdx.x: an epoch meeting when the handle owns its sync area (epochs !=
// 0), else put/take on the signal pad; false in every thread of the block if
// any of its waits timed out.
__device__ __forceinline__ bool sync_peers(u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns, u64 *status,
                                           u32 op) {
  __syncthreads(); // the block's writes come before the release of its store or put
  int t = threadIdx.x;
  int channel = blockIdx.x;
  bool ok = true;
  if (epochs != 0) {
    // Every thread reads the count before the barrier below and thread 0
    // advances it after: the next sync_peers reads it after its own
    // __syncthreads, so it sees the new count.
    u32 e = epochs[channel] + 1;
    if (t < world && t != rank) ok = meet_epoch(pads, rank, world, channel, t, e, now_ns(), timeout_ns, status, op);
    bool failed = __syncthreads_or(!ok) != 0;
    if (t == 0) epochs[channel] = e;
    return !failed;
  }
  if (t < world && t != rank) {
    u64 start = now_ns();
    ok = put(pads[t] + channel * world + rank, start, timeout_ns, status, op, t, channel) &&
         take(pads[rank] + channel * world + t, start, timeout_ns, status, op, t, channel);
  }
  return __syncthreads_or(!ok) == 0;
}

// o: the sum of words i..i+NW-1 (at byte offset) of every rank's buffer, in
// rank order with float accumulation.
template <int NW, int DT, int KW>
__device__ __forceinline__ void reduce_words(u32 **bufs, u64 offset, u64 i, int world, u32 (&o)[NW]) {
  float acc[2 * NW];
#pragma unroll
  for (int k = 0; k < 2 * NW; k++) acc[k] = 0.0f;
  if constexpr (KW > 0) {
    u32 v[KW][NW];
#pragma unroll
    for (int r = 0; r < KW; r++) load<NW>((const u32 *)((const char *)bufs[r] + offset) + i, v[r]);
#pragma unroll
    for (int r = 0; r < KW; r++) accumulate<NW, DT>(acc, v[r]);
  } else {
    for (int r = 0; r < world; r++) {
      u32 v[NW];
      load<NW>((const u32 *)((const char *)bufs[r] + offset) + i, v);
      accumulate<NW, DT>(acc, v);
    }
  }
#pragma unroll
  for (int k = 0; k < NW; k++) {
    if constexpr (DT == SYMM_DT_BF16) {
      o[k] = to_bf16(acc[2 * k]) | (to_bf16(acc[2 * k + 1]) << 16);
    } else if constexpr (DT == SYMM_DT_F16) {
      o[k] = to_f16(acc[2 * k]) | (to_f16(acc[2 * k + 1]) << 16);
    } else {
      o[k] = __float_as_uint(acc[2 * k]);
    }
  }
}

// KW: the world size when known at compile time (loads of every peer are
// issued before the sums), 0 for any.
//
// Block b handles words first + k*stride of every rank's buffer and
// synchronizes only with block b of each peer: the words a block copies in
// from local before the first sync_peers must be the words the same block
// of every peer reads after it. So the grid, the block size and NW are the
// same on every rank (the host derives them from offset, count and world
// only), whatever the alignment of this rank's out and local.
template <int NW, int DT, int KW>
__device__ __forceinline__ void one_shot(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local,
                                         u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns, u64 *status) {
  u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * NW;
  u64 stride = (u64)gridDim.x * blockDim.x * NW;
  u32 *mine = (u32 *)((char *)bufs[rank] + offset);
  bool vec_out = ((u64)out & 15) == 0, vec_local = ((u64)local & 15) == 0;
  if (local != 0) {
    for (u64 i = first; i < nwords; i += stride) {
      u32 v[NW];
      load_own<NW>(local + i, v, vec_local);
      store<NW>(mine + i, v);
    }
  }
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN)) return;
  for (u64 i = first; i < nwords; i += stride) {
    u32 o[NW];
    reduce_words<NW, DT, KW>(bufs, offset, i, world, o);
    store_own<NW>(out + i, o, vec_out);
  }
  sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT);
}

// symm_ar_<dtype>_v<words per thread>_w<world or any>: offset is in bytes,
// nwords counts 32-bit words (a multiple of the words per thread).
#define SYMM_AR(NAME, NW, DT, KW)                                                                                  \
  extern "C" __global__ void __launch_bounds__(512)                                                                \
      NAME(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local, u32 **pads, u32 *epochs, int rank,      \
           int world, u64 timeout_ns, u64 *status) {                                                               \
    one_shot<NW, DT, KW>(bufs, offset, nwords, out, local, pads, epochs, rank, world, timeout_ns, status);               \
  }
#define SYMM_AR_WORLDS(NAME, NW, DT)             \
  SYMM_AR(symm_ar_##NAME##_v##NW##_w2, NW, DT, 2) \
  SYMM_AR(symm_ar_##NAME##_v##NW##_w4, NW, DT, 4) \
  SYMM_AR(symm_ar_##NAME##_v##NW##_w8, NW, DT, 8) \
  SYMM_AR(symm_ar_##NAME##_v##NW##_wany, NW, DT, 0)

SYMM_AR_WORLDS(f32, 4, SYMM_DT_F32)
SYMM_AR_WORLDS(f32, 1, SYMM_DT_F32)
SYMM_AR_WORLDS(bf16, 4, SYMM_DT_BF16)
SYMM_AR_WORLDS(f16, 4, SYMM_DT_F16)
SYMM_AR_WORLDS(bf16, 1, SYMM_DT_BF16)
SYMM_AR_WORLDS(f16, 1, SYMM_DT_F16)

// ---- two-shot all-reduce (large messages) -----------------------------------
//
// Reduce-scatter then all-gather over the mapped buffers, both in the same
// kernel and through the symmetric buffers themselves: the nwords words are
// split into world contiguous shares (share s: words s*share .. , share a
// multiple of NW, the last share taking the rest); rank s reads share s of
// every rank's buffer, sums in rank order 0..world-1 with float
// accumulation (the same bits whichever rank sums, as in one_shot), and
// stores the sum into share s of every rank's buffer, its own included. So
// after the call every rank's buffer holds the whole sum; out, when it is
// not this rank's buffer at offset, then gets a copy of it. Each rank reads
// and writes 1/world of the message per peer instead of all of it.
//
// Synchronization is one_shot's: block b meets block b of every peer on
// channel b before the reads (every peer's input is in its buffer) and after
// the stores (every share has landed in this rank's buffer; no peer still
// reads it). Block b handles, in every share, the same words on every rank
// (the shape comes from offset, count and world only), so the words it
// copies in from local, the words of its share it reads and stores, and the
// words it copies out to out are met by block b of every peer. Share s of
// rank p is read and written only by rank s (each word by one thread,
// read before written), so the stores need no other ordering.

// for_share_words runs body(i) over the words of the share of len words at
// word lo that this thread handles.
template <typename F>
__device__ __forceinline__ void for_share_words(u64 lo, u64 len, u64 first, u64 stride, F body) {
  for (u64 j = first; j < len; j += stride) body(lo + j);
}

__device__ __forceinline__ u64 share_len(u64 share, u64 nwords, int s, int world) {
  return s == world - 1 ? nwords - share * (u64)s : share;
}

template <int NW, int DT, int KW>
__device__ __forceinline__ void two_shot(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local,
                                         u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns, u64 *status) {
  u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * NW;
  u64 stride = (u64)gridDim.x * blockDim.x * NW;
  u64 share = nwords / (u64)world / NW * NW;
  u32 *mine = (u32 *)((char *)bufs[rank] + offset);
  bool vec_out = ((u64)out & 15) == 0, vec_local = ((u64)local & 15) == 0;
  if (local != 0 && local != mine) {
    for (int s = 0; s < world; s++) {
      for_share_words(share * s, share_len(share, nwords, s, world), first, stride, [&](u64 i) {
        u32 v[NW];
        load_own<NW>(local + i, v, vec_local);
        store<NW>(mine + i, v);
      });
    }
  }
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN)) return;
  for_share_words(share * rank, share_len(share, nwords, rank, world), first, stride, [&](u64 i) {
    u32 o[NW];
    reduce_words<NW, DT, KW>(bufs, offset, i, world, o);
    for (int k = 1; k <= world; k++) {
      int p = rank + k < world ? rank + k : rank + k - world; // peers first, this rank last
      store<NW>((u32 *)((char *)bufs[p] + offset) + i, o);
    }
  });
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT)) return;
  if (out != mine) {
    for (int s = 0; s < world; s++) {
      for_share_words(share * s, share_len(share, nwords, s, world), first, stride, [&](u64 i) {
        u32 v[NW];
        load<NW>(mine + i, v);
        store_own<NW>(out + i, v, vec_out);
      });
    }
  }
}

// symm_ts_<dtype>_v<words per thread>_w<world or any>: the two-shot kernels,
// with symm_ar_'s parameters.
#define SYMM_TS(NAME, NW, DT, KW)                                                                                  \
  extern "C" __global__ void __launch_bounds__(512)                                                                \
      NAME(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local, u32 **pads, u32 *epochs, int rank,      \
           int world, u64 timeout_ns, u64 *status) {                                                               \
    two_shot<NW, DT, KW>(bufs, offset, nwords, out, local, pads, epochs, rank, world, timeout_ns, status);               \
  }
#define SYMM_TS_WORLDS(NAME, NW, DT)             \
  SYMM_TS(symm_ts_##NAME##_v##NW##_w2, NW, DT, 2) \
  SYMM_TS(symm_ts_##NAME##_v##NW##_w4, NW, DT, 4) \
  SYMM_TS(symm_ts_##NAME##_v##NW##_w8, NW, DT, 8) \
  SYMM_TS(symm_ts_##NAME##_v##NW##_wany, NW, DT, 0)

SYMM_TS_WORLDS(f32, 4, SYMM_DT_F32)
SYMM_TS_WORLDS(f32, 1, SYMM_DT_F32)
SYMM_TS_WORLDS(bf16, 4, SYMM_DT_BF16)
SYMM_TS_WORLDS(f16, 4, SYMM_DT_F16)
SYMM_TS_WORLDS(bf16, 1, SYMM_DT_BF16)
SYMM_TS_WORLDS(f16, 1, SYMM_DT_F16)

// ---- reduce-scatter and all-gather ------------------------------------------
//
// NCCL's semantics over the mapped buffers; nwords counts the words of ONE
// share (one rank's part), and every rank's buffer holds world shares at
// offset (share s: words s*nwords ..). Block b handles words first +
// k*stride of every share, the shape coming from offset, nwords and world
// only, so it meets block b of every peer on channel b (sync_peers, as
// one_shot) over the same words: before the reads (every peer's input is in
// its buffer) and after them (no peer still reads this rank's buffer when
// the call ends, so the next call may overwrite it).
//
// reduce_scatter: rank r sums share r of every rank's buffer in rank order
// 0..world-1 with float accumulation (reduce_words: the same bits whichever
// rank sums) into out (nwords words). local (world shares) is copied into
// this rank's buffer first. out may be this rank's own share r (in place:
// each word is read by its thread before it writes it, and peers read only
// their own share p != r of this buffer) or local's share r (the words that
// the same thread copied in).
template <int NW, int DT, int KW>
__device__ __forceinline__ void reduce_scatter(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local,
                                               u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns,
                                               u64 *status) {
  u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * NW;
  u64 stride = (u64)gridDim.x * blockDim.x * NW;
  u32 *mine = (u32 *)((char *)bufs[rank] + offset);
  bool vec_out = ((u64)out & 15) == 0, vec_local = ((u64)local & 15) == 0;
  if (local != 0 && local != mine) {
    for (int s = 0; s < world; s++) {
      for (u64 j = first; j < nwords; j += stride) {
        u32 v[NW];
        load_own<NW>(local + nwords * s + j, v, vec_local);
        store<NW>(mine + nwords * s + j, v);
      }
    }
  }
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN)) return;
  for (u64 j = first; j < nwords; j += stride) {
    u32 o[NW];
    reduce_words<NW, DT, KW>(bufs, offset, nwords * rank + j, world, o);
    store_own<NW>(out + j, o, vec_out);
  }
  sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT);
}

// all_gather: share r of this rank's buffer is its input (local, nwords
// words, copied there first); out (world shares) gets share s of rank s's
// buffer at share s. out may be this rank's buffer itself (in place: it
// writes shares s != r, which no peer reads from this rank) and local may
// be out's share r (the words the same thread copied in).
template <int NW>
__device__ __forceinline__ void all_gather(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local,
                                           u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns,
                                           u64 *status) {
  u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * NW;
  u64 stride = (u64)gridDim.x * blockDim.x * NW;
  u32 *mine = (u32 *)((char *)bufs[rank] + offset);
  bool vec_out = ((u64)out & 15) == 0, vec_local = ((u64)local & 15) == 0;
  if (local != 0 && local != mine + nwords * rank) {
    for (u64 j = first; j < nwords; j += stride) {
      u32 v[NW];
      load_own<NW>(local + j, v, vec_local);
      store<NW>(mine + nwords * rank + j, v);
    }
  }
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN)) return;
  for (int k = 0; k < world; k++) {
    int s = rank + k < world ? rank + k : rank + k - world; // this rank first, then the peers
    if (out == mine && s == rank) continue;
    const u32 *src = (const u32 *)((const char *)bufs[s] + offset) + nwords * s;
    for (u64 j = first; j < nwords; j += stride) {
      u32 v[NW];
      load<NW>(src + j, v);
      store_own<NW>(out + nwords * s + j, v, vec_out);
    }
  }
  sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT);
}

// symm_rs_<dtype>_v<words per thread>_w<world or any> and
// symm_ag_v<words per thread>: with symm_ar_'s parameters, nwords being the
// words of one share.
#define SYMM_RS(NAME, NW, DT, KW)                                                                                  \
  extern "C" __global__ void __launch_bounds__(512)                                                                \
      NAME(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local, u32 **pads, u32 *epochs, int rank,      \
           int world, u64 timeout_ns, u64 *status) {                                                               \
    reduce_scatter<NW, DT, KW>(bufs, offset, nwords, out, local, pads, epochs, rank, world, timeout_ns, status);         \
  }
#define SYMM_RS_WORLDS(NAME, NW, DT)             \
  SYMM_RS(symm_rs_##NAME##_v##NW##_w2, NW, DT, 2) \
  SYMM_RS(symm_rs_##NAME##_v##NW##_w4, NW, DT, 4) \
  SYMM_RS(symm_rs_##NAME##_v##NW##_w8, NW, DT, 8) \
  SYMM_RS(symm_rs_##NAME##_v##NW##_wany, NW, DT, 0)

SYMM_RS_WORLDS(f32, 4, SYMM_DT_F32)
SYMM_RS_WORLDS(f32, 1, SYMM_DT_F32)
SYMM_RS_WORLDS(bf16, 4, SYMM_DT_BF16)
SYMM_RS_WORLDS(f16, 4, SYMM_DT_F16)
SYMM_RS_WORLDS(bf16, 1, SYMM_DT_BF16)
SYMM_RS_WORLDS(f16, 1, SYMM_DT_F16)

#define SYMM_AG(NW)                                                                                                  \
  extern "C" __global__ void __launch_bounds__(512)                                                                \
      symm_ag_v##NW(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local, u32 **pads, u32 *epochs,      \
                    int rank, int world, u64 timeout_ns, u64 *status) {                                            \
    all_gather<NW>(bufs, offset, nwords, out, local, pads, epochs, rank, world, timeout_ns, status);                       \
  }
SYMM_AG(4)
SYMM_AG(1)

// ---- push all-reduce: one kernel, no barrier (LL protocol) ------------------
//
// The workspace is a symmetric block of its own, rendezvoused once. Each
// rank's buffer holds 2 alternating halves (b = 0, 1), each with one slot per
// source rank of `lines` 16-byte lines; line l of a slot carries the bytes
// 8l..8l+7 of that source's input as {data0, flag, data1, flag}: two 8-byte
// halves, each written by one 8-byte store, so a reader that sees the flag in
// a half sees that half's data (NCCL's LL line). A call has a number e (the
// epoch, 64 bits, in the handle's own device memory, never in a peer's):
// it uses half b = e & 1 and flag (u32)e.
//
//   1. every thread loads its lines of `in` (any device pointer) and stores
//      them, with the flag, into slot[rank] of half b of every peer's buffer;
//   2. it then reads its lines of slot[r] of half b of its own buffer for
//      every peer r, spinning on the line itself until both flags are the
//      call's (relaxed, system-scope loads; the deadline writes the status
//      report naming r), and sums in rank order 0..world-1 with float
//      accumulation (its own input read from `in` again), so every rank gets
//      the same bits, into `out` (which may be `in`: a thread reads its lines
//      before it writes them, and no other thread touches them);
//   3. each block, once all its threads are done, advances e: the handle's
//      memory keeps one copy of e per block of the largest grid
//      (SYMM_PUSH_MAX_BLOCKS), equal between calls, and block b of a grid
//      of G blocks writes e + 1 into copies b, b + G, b + 2G, ..., so that
//      every copy moves on without a counter shared by the blocks. The next
//      call, later on the same stream, reads its block's copy at entry: no
//      host state per call, so a CUDA graph replays it as it is.
//
// Why half b of a peer is never overwritten (call e+2) before that peer has
// read call e: rank q writes half b of rank p only in calls of b's parity.
// q starts call e+2 only after finishing call e+1, and finishing e+1 needs
// p's data of e+1, which p pushes only in its call e+1, which starts after
// its call e has ended (stream order), reads included. So between two uses
// of a half every rank has read it, and a reader can never see a newer
// call's data there; nor an older one's, since the flags of one half's
// consecutive uses differ (e and e+2).
//
// Flags and stale lines: a line of half b last written in call e' < e looks
// current only if (u32)e' == (u32)e, i.e. e - e' >= 2^32 (a line beyond the
// messages of all the calls in between). So whenever the next use of half b
// reaches a multiple of 2^32 ((u32)(e+2) < 2), call e clears its own half b
// once it has read it, to flag b ^ 1: of the other parity, it matches no call
// that uses half b. The workspace's first call (symm_push_init, launched once
// per handle before it) clears both halves the same way and meets every peer
// on channel 0 of the signal pads before any rank pushes, so no garbage left
// in the buffer can pass for data either.

#define SYMM_OP_PUSH 5      // push all-reduce: a peer's data did not come (channel: the call's flag)
#define SYMM_OP_PUSH_INIT 6 // push all-reduce's first call: a peer did not come to set the workspace up

#define SYMM_PUSH_MAX_BLOCKS 128 // kernels.PushMaxBlocks: the most blocks of a push grid

struct PushState {
  u64 epoch[SYMM_PUSH_MAX_BLOCKS]; // the next call's number, a copy per block; 0: not set up yet
  u32 done;                        // blocks of the set-up that have finished
  u32 unused;
};

struct U2 {
  u32 x, y;
};

__device__ __forceinline__ void st_line(u32 *p, u32 d0, u32 d1, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1), "r"(flag)
               : "memory");
}

__device__ __forceinline__ void ld_line(const u32 *p, u32 &d0, u32 &f0, u32 &d1, u32 &f1) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(p)
               : "memory");
}

// Line l of slot (b, r) of the workspace buffer at base.
__device__ __forceinline__ u32 *ws_line(u32 *base, u64 lines, int world, int b, int r, u64 l) {
  return base + (((u64)b * world + r) * lines + l) * 4;
}

// The 8 bytes of line l of p (nbytes long): one 8-byte load when p is 8-byte
// aligned and the line whole, else 2-byte loads (p is aligned to its element,
// 2 or 4 bytes), zero past the end.
__device__ __forceinline__ void load_line(const char *p, u64 nbytes, u64 l, bool vec, u32 &d0, u32 &d1) {
  u64 at = l * 8;
  if (vec && at + 8 <= nbytes) {
    U2 v = *(const U2 *)(p + at);
    d0 = v.x;
    d1 = v.y;
    return;
  }
  u32 h[4];
#pragma unroll
  for (int k = 0; k < 4; k++) h[k] = at + 2 * k + 2 <= nbytes ? (u32)((const unsigned short *)(p + at))[k] : 0u;
  d0 = h[0] | (h[1] << 16);
  d1 = h[2] | (h[3] << 16);
}

__device__ __forceinline__ void store_line(char *p, u64 nbytes, u64 l, bool vec, u32 d0, u32 d1) {
  u64 at = l * 8;
  if (vec && at + 8 <= nbytes) {
    U2 v;
    v.x = d0;
    v.y = d1;
    *(U2 *)(p + at) = v;
    return;
  }
  u32 h[4] = {d0 & 0xffffu, d0 >> 16, d1 & 0xffffu, d1 >> 16};
#pragma unroll
  for (int k = 0; k < 4; k++)
    if (at + 2 * k + 2 <= nbytes) ((unsigned short *)(p + at))[k] = (unsigned short)h[k];
}

// acc[0..3]: the elements of one line (f32: acc[0], acc[1]).
template <int DT>
__device__ __forceinline__ void accumulate_line(float (&acc)[4], u32 d0, u32 d1) {
  if constexpr (DT == SYMM_DT_F32) {
    acc[0] += __uint_as_float(d0);
    acc[1] += __uint_as_float(d1);
  } else if constexpr (DT == SYMM_DT_BF16) {
    acc[0] += bf16_lo(d0);
    acc[1] += bf16_hi(d0);
    acc[2] += bf16_lo(d1);
    acc[3] += bf16_hi(d1);
  } else {
    acc[0] += f16_to_f32(d0 & 0xffffu);
    acc[1] += f16_to_f32(d0 >> 16);
    acc[2] += f16_to_f32(d1 & 0xffffu);
    acc[3] += f16_to_f32(d1 >> 16);
  }
}

template <int DT>
__device__ __forceinline__ void pack_line(const float (&acc)[4], u32 &d0, u32 &d1) {
  if constexpr (DT == SYMM_DT_F32) {
    d0 = __float_as_uint(acc[0]);
    d1 = __float_as_uint(acc[1]);
  } else if constexpr (DT == SYMM_DT_BF16) {
    d0 = to_bf16(acc[0]) | (to_bf16(acc[1]) << 16);
    d1 = to_bf16(acc[2]) | (to_bf16(acc[3]) << 16);
  } else {
    d0 = to_f16(acc[0]) | (to_f16(acc[1]) << 16);
    d1 = to_f16(acc[2]) | (to_f16(acc[3]) << 16);
  }
}

// Spins on line p until both its flags are flag; false, and a report naming
// peer, past the deadline.
__device__ __forceinline__ bool wait_line(const u32 *p, u32 flag, u64 start, u64 timeout_ns, u64 *status, int peer,
                                          u32 &d0, u32 &d1) {
  u32 f0, f1;
  ld_line(p, d0, f0, d1, f1);
  while (f0 != flag || f1 != flag) {
    if (timeout_ns != 0 && now_ns() - start > timeout_ns) {
      report(status, SYMM_OP_PUSH, peer, flag);
      return false;
    }
    ld_line(p, d0, f0, d1, f1);
  }
  return true;
}

// Clears half b of every slot of this rank's buffer to flag b ^ 1, line l
// by the thread that handles it.
__device__ __forceinline__ void clear_half(u32 *mine, u64 lines, int world, int b, u64 first, u64 stride) {
  for (u64 l = first; l < lines; l += stride)
    for (int r = 0; r < world; r++) st_line(ws_line(mine, lines, world, b, r, l), 0, 0, (u32)(b ^ 1));
}

// Thread 0 of the last block to get here (every block's work before it done)
// returns true (the set-up's count of finished blocks).
__device__ __forceinline__ bool last_block(PushState *st) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&st->done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  return last;
}

template <int DT>
__device__ __forceinline__ void push_all_reduce(u32 **bufs, u64 *state, const char *in, char *out, u64 nbytes, u64 lines,
                                                int rank, int world, u64 timeout_ns, u64 *status) {
  PushState *st = (PushState *)state;
  u64 start = now_ns();
  u64 e = *(volatile u64 *)&st->epoch[blockIdx.x];
  int b = (int)(e & 1);
  u32 flag = (u32)e;
  u64 nlines = (nbytes + 7) / 8;
  u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u64 stride = (u64)gridDim.x * blockDim.x;
  bool vin = ((u64)in & 7) == 0, vout = ((u64)out & 7) == 0;
  for (u64 l = first; l < nlines; l += stride) {
    u32 d0, d1;
    load_line(in, nbytes, l, vin, d0, d1);
    for (int k = 1; k < world; k++) {
      int p = rank + k < world ? rank + k : rank + k - world;
      st_line(ws_line(bufs[p], lines, world, b, rank, l), d0, d1, flag);
    }
  }
  u32 *mine = bufs[rank];
  bool ok = true;
  for (u64 l = first; ok && l < nlines; l += stride) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < world; r++) {
      u32 d0, d1;
      if (r == rank) {
        load_line(in, nbytes, l, vin, d0, d1);
      } else if (!wait_line(ws_line(mine, lines, world, b, r, l), flag, start, timeout_ns, status, r, d0, d1)) {
        ok = false;
        break;
      }
      accumulate_line<DT>(acc, d0, d1);
    }
    if (ok) {
      u32 o0, o1;
      pack_line<DT>(acc, o0, o1);
      store_line(out, nbytes, l, vout, o0, o1);
    }
  }
  if (ok && (u32)(e + 2) < 2u) {
    clear_half(mine, lines, world, b, first, stride);
    __threadfence_system();
  }
  __syncthreads(); // every thread of the block read e at entry
  if (threadIdx.x == 0)
    for (u32 j = blockIdx.x; j < SYMM_PUSH_MAX_BLOCKS; j += gridDim.x) *(volatile u64 *)&st->epoch[j] = e + 1;
}

// symm_push_ar_<dtype>: bufs are the workspace's buffers as mapped here,
// state the handle's PushState, nbytes the message (at most 8 * lines).
#define SYMM_PUSH_AR(NAME, DT)                                                                                    \
  extern "C" __global__ void __launch_bounds__(512)                                                             \
      NAME(u32 **bufs, u64 *state, const char *in, char *out, u64 nbytes, u64 lines, int rank, int world,       \
           u64 timeout_ns, u64 *status) {                                                                       \
    push_all_reduce<DT>(bufs, state, in, out, nbytes, lines, rank, world, timeout_ns, status);                  \
  }
SYMM_PUSH_AR(symm_push_ar_f32, SYMM_DT_F32)
SYMM_PUSH_AR(symm_push_ar_bf16, SYMM_DT_BF16)
SYMM_PUSH_AR(symm_push_ar_f16, SYMM_DT_F16)

// Sets a workspace up, once, before its first call (a no-op once done, so a
// CUDA graph that captured it replays it harmlessly): clears both halves of
// this rank's buffer, then, once every block has, meets every peer on
// channel 0 of the signal pads (their halves are clear too before anyone
// pushes), and sets the first call's number.
extern "C" __global__ void __launch_bounds__(512)
    symm_push_init(u32 **bufs, u64 *state, u64 lines, u32 **pads, int rank, int world, u64 first_epoch, u64 timeout_ns,
                   u64 *status) {
  PushState *st = (PushState *)state;
  if (*(volatile u64 *)&st->epoch[0] != 0) return;
  u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u64 stride = (u64)gridDim.x * blockDim.x;
  clear_half(bufs[rank], lines, world, 0, first, stride);
  clear_half(bufs[rank], lines, world, 1, first, stride);
  __threadfence_system();
  if (!last_block(st)) return;
  bool ok = true;
  u64 start = now_ns();
  for (int t = threadIdx.x; ok && t < world; t += blockDim.x) {
    if (t == rank) continue;
    ok = put(pads[t] + rank, start, timeout_ns, status, SYMM_OP_PUSH_INIT, t, 0) &&
         take(pads[rank] + t, start, timeout_ns, status, SYMM_OP_PUSH_INIT, t, 0);
  }
  if (__syncthreads_or(!ok) == 0 && threadIdx.x == 0) {
    *(volatile u32 *)&st->done = 0;
    for (int j = 0; j < SYMM_PUSH_MAX_BLOCKS; j++) *(volatile u64 *)&st->epoch[j] = first_epoch;
    __threadfence();
  }
}
