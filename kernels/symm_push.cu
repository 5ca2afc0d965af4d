// libsymm's push all-reduce: compiled with symm.cu and symm_collectives.cu
// (appended after them, in package kernels), whose helpers it uses.

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
//
// The host queues the set-up before each call until the set-up has run:
// once it has (or finds the workspace set up already), thread 0 writes 1
// into the handle's ready word (host-mapped memory, read by the host with
// no CUDA call, so also while a graph is being captured). A set-up captured
// in a graph runs only at the replay; an eager call before it queues the
// set-up again. A call that finds no call number (0: the set-up has not run
// before it on this stream) reports SYMM_OP_PUSH_UNSET and stops, rather
// than taking zeroed memory for lines of flag 0.

// Its report ops are SYMM_OP_PUSH (a peer's data did not come; channel: the
// call's flag), SYMM_OP_PUSH_INIT (a peer did not come to set the workspace
// up) and SYMM_OP_PUSH_UNSET (the workspace was not set up before the call);
// SYMM_PUSH_MAX_BLOCKS (kernels.PushMaxBlocks) is the most blocks of a push
// grid. Package kernels defines them (symm.cu's head says how).

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
  if constexpr (DT == SYMM_FLOAT32) {
    acc[0] += __uint_as_float(d0);
    acc[1] += __uint_as_float(d1);
  } else if constexpr (DT == SYMM_BFLOAT16) {
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
  if constexpr (DT == SYMM_FLOAT32) {
    d0 = __float_as_uint(acc[0]);
    d1 = __float_as_uint(acc[1]);
  } else if constexpr (DT == SYMM_BFLOAT16) {
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
  if (e == 0) { // the set-up has not run (the first call's numbers start at 1)
    if (threadIdx.x == 0) report(status, SYMM_OP_PUSH_UNSET, rank, 0);
    return;
  }
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
#define SYMM_PUSH_DTYPE(NAME, DT) SYMM_PUSH_AR(symm_push_ar_##NAME, DT)
SYMM_KERNEL_DTYPES(SYMM_PUSH_DTYPE)

// Sets a workspace up, once, before its first call (a no-op once done, so a
// CUDA graph that captured it replays it harmlessly): clears both halves of
// this rank's buffer, then, once every block has, meets every peer on
// channel 0 of the signal pads (their halves are clear too before anyone
// pushes), and sets the first call's number; then, or at once when the
// workspace was set up already, writes 1 into ready (host-mapped).
extern "C" __global__ void __launch_bounds__(512)
    symm_push_init(u32 **bufs, u64 *state, u64 lines, u32 **pads, int rank, int world, u64 first_epoch, u64 *ready,
                   u64 timeout_ns, u64 *status) {
  PushState *st = (PushState *)state;
  if (*(volatile u64 *)&st->epoch[0] != 0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *(volatile u64 *)ready = 1;
    return;
  }
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
    __threadfence_system(); // the numbers are in before the host reads ready
    *(volatile u64 *)ready = 1;
  }
}
