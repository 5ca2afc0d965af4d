// libsymm's two-shot all-reduce, reduce-scatter and all-gather: compiled
// with symm.cu (appended to it, in package kernels), whose helpers they use
// (loads, stores, sums, sync_peers).

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
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN, SYMM_MEET_TWO_SHOT_IN)) return;
  for_share_words(share * rank, share_len(share, nwords, rank, world), first, stride, [&](u64 i) {
    u32 o[NW];
    reduce_words<NW, DT, KW>(bufs, offset, i, world, o);
    for (int k = 1; k <= world; k++) {
      int p = rank + k < world ? rank + k : rank + k - world; // peers first, this rank last
      store<NW>((u32 *)((char *)bufs[p] + offset) + i, o);
    }
  });
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT, SYMM_MEET_TWO_SHOT_OUT)) return;
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

#define SYMM_TS_DTYPE(NAME, DT) SYMM_TS_WORLDS(NAME, 4, DT) SYMM_TS_WORLDS(NAME, 1, DT)
SYMM_KERNEL_DTYPES(SYMM_TS_DTYPE)

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
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN, SYMM_MEET_RS_IN)) return;
  for (u64 j = first; j < nwords; j += stride) {
    u32 o[NW];
    reduce_words<NW, DT, KW>(bufs, offset, nwords * rank + j, world, o);
    store_own<NW>(out + j, o, vec_out);
  }
  sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT, SYMM_MEET_RS_OUT);
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
  if (!sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_IN, SYMM_MEET_AG_IN)) return;
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
  sync_peers(pads, epochs, rank, world, timeout_ns, status, SYMM_OP_REDUCE_OUT, SYMM_MEET_AG_OUT);
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

#define SYMM_RS_DTYPE(NAME, DT) SYMM_RS_WORLDS(NAME, 4, DT) SYMM_RS_WORLDS(NAME, 1, DT)
SYMM_KERNEL_DTYPES(SYMM_RS_DTYPE)

#define SYMM_AG(NW)                                                                                                  \
  extern "C" __global__ void __launch_bounds__(512)                                                                \
      symm_ag_v##NW(u32 **bufs, u64 offset, u64 nwords, u32 *out, const u32 *local, u32 **pads, u32 *epochs,      \
                    int rank, int world, u64 timeout_ns, u64 *status) {                                            \
    all_gather<NW>(bufs, offset, nwords, out, local, pads, epochs, rank, world, timeout_ns, status);                       \
  }
SYMM_AG(4)
SYMM_AG(1)
