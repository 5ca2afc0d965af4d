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

// Report layout (the host decodes it: kernels.DecodeReport).
// bit 63: set; bits 56..62: op; bits 32..55: peer rank; bits 0..31: channel.
// The ops (SYMM_OP_*: what a kernel was doing when its wait timed out), the
// meeting kinds (SYMM_MEET_*), SYMM_SYNC_SLOTS, SYMM_PUSH_MAX_BLOCKS and the
// dtype codes (SYMM_FLOAT32, ...) are not defined in these files: package
// kernels owns them (symm.go's sourceConstants; the dtypes come from
// include/symm.h) and writes them as #defines at the head of the source.
// SYMM_OP_MISMATCH's report keeps the channel in bits 0..15, this rank's
// kind in bits 16..23 and the peer's in bits 24..31.

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

// report keeps a report already in the word: the first failure is the
// cause (a mismatched meeting), what follows (peers' blocks timing out, the
// stopped meetings of kernels queued behind) its consequence. Two reports at
// once may still race; one of them stands.
__device__ __forceinline__ void report(u64 *status, u32 op, u32 peer, u32 channel) {
  u64 word = (1ull << 63) | ((u64)(op & 0x7f) << 56) | ((u64)(peer & 0xffffff) << 32) | (u64)channel;
  if (*(volatile u64 *)status >> 63) return;
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
// slots: slot channel*world + src holds src's latest meeting on that
// channel, written only by src, as a word (kind << 24) | (count mod 2^24):
// count numbers the meetings of src on the channel, kind says what the
// meeting is (SYMM_MEET_*: a barrier, a pad reset's barrier, or which phase
// of which collective). The handle keeps its own count per channel
// (epochs[channel], in this rank's device memory, read by no peer). A
// meeting of kind k on channel c: e = epochs[c] + 1; thread t stores
// (k, e) into slot (c, rank) of rank t (one store, release, system scope:
// what the block wrote before is visible to whoever acquires it) and spins
// (acquire) until slot (c, t) of this rank holds a count of at least e; then
// epochs[c] = e. No slot is ever reset. The put/take exchange costs a round
// trip to the peer (the compare-and-swap's reply) before the wait; this
// costs one store's flight.
//
// Counts: while this rank is in its meeting e, the peer's slot holds e - 1,
// e or e + 1: the peer finished e - 1 (we did, which needed its store of
// e - 1) and cannot be past e + 1 (its meeting e + 1 needs our store of
// e + 1). So 24 bits, compared in wrap-around order (the sign of the 24-bit
// difference, (int)((v - e) << 8)), are exact with 2^23 of slack. A count of
// 0 is a slot never written (zeroed pad and counts start at 0; after 2^24
// meetings a count of 0 is met like any other).
//
// Kinds: a meeting passes only when the peer's slot holds the same count
// with the same kind, or a later count. At least one of the two ranks of a
// meeting sees the other's store of that very meeting: the first to pass
// meeting e saw the other's slot at e or beyond, and the other cannot be
// beyond e before it has passed e itself. So ranks that disagree on what
// meeting e is are caught by whichever sees the other's (k', e) with
// k' != k: it reports SYMM_OP_MISMATCH naming both kinds, which fails the
// handle (SYMM_ERR_MISMATCH), and stops the channel: thread 0 sets bit 31
// of epochs[c], and every later meeting on c (kernels queued behind this one
// before the host saw the report) stops at once with SYMM_OP_STOPPED,
// storing nothing. So this rank's slot in the peer stays (k, e), and the
// peer, whose meeting e cannot pass on it, reports the mismatch too (or
// times out if it reached another meeting). Without that stop a kernel
// queued behind would store e + 1, and the peer would pass its meeting e on
// it, the mismatch seen on one rank only. A timed-out meeting stops its
// channel alike: its late peer would otherwise pass on our next store.
//
// The area belongs to one group per block (the rendezvous agrees on it), so
// that no other group's meetings write its slots; a handle of any other group
// passes epochs = 0 and meets with put/take on its signal pad (whose 0/1
// slots carry no kind). Meetings on one channel of a handle are ordered (one
// stream, or streams ordered by events), as the put/take exchange also
// needs. The host backend runs the same protocol in Go (symmetric/meeting.go).
// SYMM_SYNC_SLOTS (kernels.PadSlots): the sync area starts after the signal
// pad's slots. The meeting kinds SYMM_MEET_* (kernels.Meet*) are the slot
// word's bits 24..31.

// SYMM_EPOCH_STOPPED (kernels.EpochStopped) in epochs[c]: a meeting on c
// failed here.

__device__ __forceinline__ void st_release(u32 *a, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

__device__ __forceinline__ u32 ld_acquire(const u32 *a) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}

// meet_epoch is thread t's part of meeting e of kind meet with peer t on
// channel; false, and a report (op on a timeout, SYMM_OP_MISMATCH on a peer
// meeting of another kind), when it fails.
__device__ __forceinline__ bool meet_epoch(u32 **pads, int rank, int world, int channel, int t, u32 e, u32 meet,
                                           u64 start, u64 timeout_ns, u64 *status, u32 op) {
  st_release(pads[t] + SYMM_SYNC_SLOTS + channel * world + rank, (meet << 24) | (e & 0xffffffu));
  const u32 *in = pads[rank] + SYMM_SYNC_SLOTS + channel * world + t;
  u32 v;
  while ((int)(((v = ld_acquire(in)) - e) << 8) < 0) {
    if (timeout_ns != 0 && now_ns() - start > timeout_ns) {
      report(status, op, t, channel);
      return false;
    }
  }
  if (((v ^ e) & 0xffffffu) == 0 && (v >> 24) != meet) {
    report(status, SYMM_OP_MISMATCH, t, (u32)channel | (meet << 16) | ((v >> 24) << 24));
    return false;
  }
  return true;
}

// meet_block is a block's meeting of kind meet on channel with every peer
// (thread t with rank t): false in every thread if it failed here, or if an
// earlier one on the channel did (SYMM_OP_STOPPED; nothing stored). Every
// thread reads the count before the barrier inside and thread 0 writes it
// after: the block's next meeting reads it after a barrier of its own (the
// kernel's next sync, or a later kernel), so it sees the new count.
__device__ __forceinline__ bool meet_block(u32 **pads, u32 *epochs, int rank, int world, int channel, u32 meet,
                                           u64 start, u64 timeout_ns, u64 *status, u32 op) {
  int t = threadIdx.x;
  u32 c = epochs[channel];
  if (c & SYMM_EPOCH_STOPPED) {
    if (t == 0) report(status, SYMM_OP_STOPPED, rank, (u32)channel);
    return false;
  }
  u32 e = c + 1;
  bool ok = true;
  if (t < world && t != rank) ok = meet_epoch(pads, rank, world, channel, t, e, meet, start, timeout_ns, status, op);
  bool failed = __syncthreads_or(!ok) != 0;
  if (t == 0) epochs[channel] = failed ? SYMM_EPOCH_STOPPED : (e & ~SYMM_EPOCH_STOPPED);
  return !failed;
}

// One block of at least world threads: thread t meets rank t (t != rank).
// meet: SYMM_MEET_BARRIER, or SYMM_MEET_RESET for a pad reset's barriers
// (used only with epochs != 0).
extern "C" __global__ void symm_barrier(u32 **pads, u32 *epochs, int rank, int world, int channel, u32 meet,
                                        u64 timeout_ns, u64 *status) {
  int t = threadIdx.x;
  u64 start = now_ns();
  if (epochs != 0) {
    meet_block(pads, epochs, rank, world, channel, meet, start, timeout_ns, status, SYMM_OP_WAIT);
    return;
  }
  if (t >= world || t == rank) return;
  if (!put(pads[t] + channel * world + rank, start, timeout_ns, status, SYMM_OP_PUT, t, channel)) return;
  take(pads[rank] + channel * world + t, start, timeout_ns, status, SYMM_OP_WAIT, t, channel);
}

// A signal pad's reset on GPUs (symmetric/padreset.go's resetOnDevice),
// in one block of at least world threads, once every rank's host has
// waited for its device: meet every peer (kind SYMM_MEET_RESET, channel 0 of
// the sync area): every peer's device was idle before its meeting, so none
// of its signals is still on the way into this rank's pad; zero this rank's
// pad (its 512 slots; the sync area and the counts stay: every rank met as
// often); meet again: no rank goes on before every pad is clean. The zeroing
// stores are ordered before the second meeting's release by each thread's
// system fence and the block's barrier (release is cumulative), so a peer
// that passes the meeting sees the pad zeroed. The block's barrier also
// orders thread 0's count from the first meeting before the second reads it.
extern "C" __global__ void symm_pad_reset(u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns, u64 *status) {
  u64 start = now_ns();
  if (!meet_block(pads, epochs, rank, world, 0, SYMM_MEET_RESET, start, timeout_ns, status, SYMM_OP_WAIT)) return;
  volatile u32 *pad = pads[rank];
  for (int i = threadIdx.x; i < SYMM_SYNC_SLOTS; i += blockDim.x) pad[i] = 0;  // the pad's slots, before the sync area
  __threadfence_system();
  __syncthreads();
  meet_block(pads, epochs, rank, world, 0, SYMM_MEET_RESET, start, timeout_ns, status, SYMM_OP_WAIT);
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
    if constexpr (DT == SYMM_BFLOAT16) {
      acc[2 * k] += bf16_lo(v[k]);
      acc[2 * k + 1] += bf16_hi(v[k]);
    } else if constexpr (DT == SYMM_FLOAT16) {
      acc[2 * k] += f16_to_f32(v[k] & 0xffffu);
      acc[2 * k + 1] += f16_to_f32(v[k] >> 16);
    } else {
      acc[2 * k] += __uint_as_float(v[k]);
    }
  }
}

// Block-wide synchronization with block blockIdx.x of every peer on channel
// blockIdx.x: an epoch meeting of kind meet when the handle owns its sync
// area (epochs != 0), else put/take on the signal pad; false in every thread
// of the block if any of its waits failed.
__device__ __forceinline__ bool sync_peers(u32 **pads, u32 *epochs, int rank, int world, u64 timeout_ns, u64 *status,
                                           u32 op, u32 meet) {
  __syncthreads(); // the block's writes come before the release of its store or put
  int t = threadIdx.x;
  int channel = blockIdx.x;
  if (epochs != 0) return meet_block(pads, epochs, rank, world, channel, meet, now_ns(), timeout_ns, status, op);
  bool ok = true;
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
    if constexpr (DT == SYMM_BFLOAT16) {
      o[k] = to_bf16(acc[2 * k]) | (to_bf16(acc[2 * k + 1]) << 16);
    } else if constexpr (DT == SYMM_FLOAT16) {
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
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN, SYMM_MEET_ONE_SHOT_IN)) return;
  for (u64 i = first; i < nwords; i += stride) {
    u32 o[NW];
    reduce_words<NW, DT, KW>(bufs, offset, i, world, o);
    store_own<NW>(out + i, o, vec_out);
  }
  sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT, SYMM_MEET_ONE_SHOT_OUT);
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

// Every dtype (SYMM_KERNEL_DTYPES: the host's list), 4 words per thread and 1.
#define SYMM_AR_DTYPE(NAME, DT) SYMM_AR_WORLDS(NAME, 4, DT) SYMM_AR_WORLDS(NAME, 1, DT)
SYMM_KERNEL_DTYPES(SYMM_AR_DTYPE)
