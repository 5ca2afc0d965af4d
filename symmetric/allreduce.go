package symmetric

import (
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/kernels"
)

// AllReduce describes a one-shot all-reduce on a handle: every rank sums the
// Count elements at byte Offset of every rank's buffer and writes the sum to
// its own Out, as PyTorch's symm_mem.one_shot_all_reduce does. Every rank
// of the group calls it with the same Offset, Count and Dtype.
type AllReduce struct {
	Offset uint64        // bytes from the start of each rank's buffer; a multiple of 4
	Count  uint64        // elements; Count × element size a multiple of 4
	Dtype  kernels.Dtype // Float32, BFloat16 or Float16
	Op     string        // "sum" (the only one, as in PyTorch)
	// Out receives the sum (device memory on GPUs, Count elements). It may
	// not overlap this rank's input, which peers read concurrently, nor
	// Local unless it is Local itself (in place).
	Out uintptr
	// Local, when not 0, is copied into this rank's buffer first (PyTorch's
	// one_shot_all_reduce_copy): Count elements of the same dtype.
	Local   uintptr
	Stream  uintptr
	Timeout time.Duration // as for Barrier
}

// OneShotAllReduce runs a on the handle's group. On GPUs it is one kernel
// (kernels/symm.cu): block b meets block b of every peer on channel b (at
// most Handle.maxBlocks channels) before and after reading, so it must not
// run concurrently with signals of the handle on those channels. Sums are
// accumulated in float32 in rank order, so every rank gets the same bits.
// On the host backend the calling thread does the same with host signals on
// channel 0.
func (h *Handle) OneShotAllReduce(a AllReduce) error {
	return h.collective(a, oneShotName)
}

const (
	oneShotName = "one_shot_all_reduce"
	twoShotName = "two_shot_all_reduce"
)

// TwoShotAllReduce runs a as a two-shot all-reduce (PyTorch's
// symm_mem.two_shot_all_reduce_), for large messages: the Count elements at
// Offset are split into one contiguous share per rank; rank s sums share s
// of every rank's buffer (in rank order, float32 accumulation: the same
// bits on every rank) and stores the sum into share s of every rank's
// buffer. So, unlike OneShotAllReduce, it leaves the sum in every rank's
// buffer (in place); Out, when it is not this rank's buffer at Offset, then
// receives a copy of it (out of place). Local, when not 0, is copied in
// first, as for OneShotAllReduce. Each rank moves 1/world of the message
// to and from each peer instead of all of it. On GPUs it is one kernel with
// OneShotAllReduce's launch shape and synchronization (block b with block b
// of every peer on channel b, before the reads and after the stores); on the
// host backend the calling thread does the same with host signals on
// channel 0. Out may be this rank's buffer at Offset exactly, or memory
// disjoint from it; Local likewise, and not shifted against Out.
func (h *Handle) TwoShotAllReduce(a AllReduce) error {
	return h.collective(a, twoShotName)
}

// checkAllReduce validates a for fn (one_shot_all_reduce or
// two_shot_all_reduce) and returns its size in bytes.
func (g geometry) checkAllReduce(a AllReduce, fn string) (uint64, error) {
	size := uint64(a.Dtype.Size())
	switch {
	case size == 0:
		return 0, fmt.Errorf("%w: %s: dtype %d is not float32 (0), bfloat16 (1) or float16 (2)", ErrInvalid, fn, int(a.Dtype))
	case a.Op != "sum":
		return 0, fmt.Errorf("%w: %s: op %q: only sum is supported", ErrInvalid, fn, a.Op)
	case a.Timeout < 0:
		return 0, fmt.Errorf("%w: %s: timeout %v is negative (0: no timeout)", ErrInvalid, fn, a.Timeout)
	case a.Count == 0:
		return 0, nil
	case a.Count > math.MaxUint64/size:
		return 0, fmt.Errorf("%w: %s: %d elements overflow", ErrInvalid, fn, a.Count)
	}
	nbytes := a.Count * size
	switch {
	case a.Offset%4 != 0 || nbytes%4 != 0:
		return 0, fmt.Errorf("%w: %s: offset %d and size %d bytes (%d %s) must be multiples of 4",
			ErrInvalid, fn, a.Offset, nbytes, a.Count, a.Dtype)
	case a.Offset > g.bufSize || nbytes > g.bufSize-a.Offset:
		return 0, fmt.Errorf("%w: %s: %d bytes at offset %d do not fit the %d-byte buffer",
			ErrInvalid, fn, nbytes, a.Offset, g.bufSize)
	case a.Out == 0:
		return 0, fmt.Errorf("%w: %s: output is NULL", ErrInvalid, fn)
	case a.Out%4 != 0 || a.Local%4 != 0:
		return 0, fmt.Errorf("%w: %s: output %#x and local input %#x must be 4-byte aligned", ErrInvalid, fn, a.Out, a.Local)
	}
	in := g.buf + uintptr(a.Offset)
	twoShot := fn == twoShotName
	switch {
	case twoShot && a.Out != in && overlap(a.Out, in, nbytes):
		return 0, fmt.Errorf("%w: %s: the output %#x overlaps this rank's buffer %#x (%d bytes) at a shift of %+d bytes; "+
			"peers read and write the buffer at the same time: pass the buffer itself (in place) or disjoint memory",
			ErrInvalid, fn, a.Out, in, nbytes, int64(a.Out-in))
	case twoShot && a.Local != 0 && a.Local != in && overlap(a.Local, in, nbytes):
		return 0, fmt.Errorf("%w: %s: local_input %#x overlaps this rank's buffer %#x (%d bytes) at a shift of %+d bytes; "+
			"blocks would overwrite input other blocks have not copied yet: pass the buffer itself or disjoint memory",
			ErrInvalid, fn, a.Local, in, nbytes, int64(a.Local-in))
	case !twoShot && overlap(a.Out, in, nbytes):
		return 0, fmt.Errorf("%w: %s: the output %#x overlaps this rank's input %#x (%d bytes), which peers read at the same time",
			ErrInvalid, fn, a.Out, in, nbytes)
	}
	// Block b copies its words of local_input in before it writes its words
	// of out: with out shifted against local_input, one block overwrites
	// input that another has not copied yet. The same address (in place)
	// is safe: each thread reads its words before it writes them.
	if a.Local != 0 && a.Local != a.Out && overlap(a.Out, a.Local, nbytes) {
		shift := int64(a.Out - a.Local)
		return 0, fmt.Errorf("%w: %s: the output %#x overlaps local_input %#x (%d bytes each) at a shift of %+d bytes; "+
			"blocks would overwrite input other blocks have not copied yet: pass the same pointer (in place) or disjoint buffers",
			ErrInvalid, fn, a.Out, a.Local, nbytes, shift)
	}
	return nbytes, nil
}

// overlap reports whether the n bytes at a and the n bytes at b share one
// (without overflow near the top of the address space).
func overlap(a, b uintptr, n uint64) bool {
	d := a - b
	if b > a {
		d = b - a
	}
	return uint64(d) < n
}

// allReduceShape is the all-reduce kernel's words per thread and launch
// shape for nbytes at offset in a world of world ranks. Block b of every
// rank synchronizes with block b of its peers and must handle the same
// words, so the shape depends only on what every rank passes alike: never
// on this rank's out or local pointers (the kernel loads and stores those
// as vectors only where their alignment allows). 16-byte vectors need the
// offset and size to be multiples of 16; every rank's buffer starts on a
// multiple of the allocation granularity.
// maxBlocks is the handle's cap (Handle.maxBlocks: agreed by every rank).
func allReduceShape(offset, nbytes uint64, world int, maxBlocks uint32) (v int, blocks, threads uint32) {
	v = 1
	if offset%16 == 0 && nbytes%16 == 0 {
		v = 4
	}
	blocks, threads = kernels.AllReduceLaunch(nbytes/4, v, maxBlocks)
	// Block b uses channel b: no more blocks than channels; enough threads
	// for one per peer.
	blocks = min(blocks, uint32(padChannels(world)))
	threads = max(threads, uint32((world+31)/32*32))
	return v, blocks, threads
}

// hostAllReduce is the kernel's protocol on host memory: copy, meet every
// peer on channel 0 (hostSync), sum in rank order, meet again.
func (h *Handle) hostAllReduce(a AllReduce, nbytes uint64) error {
	what := fmt.Sprintf("one_shot_all_reduce of %d %s on group %q (rank %d)", a.Count, a.Dtype, h.group, h.rank)
	timeout := h.hostBound(a.Timeout)
	in := h.BufferPtr(h.rank) + uintptr(a.Offset)
	if a.Local != 0 && a.Local != in {
		copy(hostBytes(in, nbytes), hostBytes(a.Local, nbytes))
	}
	if err := h.hostSync(kernels.MeetOneShotIn, a.Stream, timeout); err != nil {
		return fmt.Errorf("%s, before the reads: %w", what, err)
	}
	n := int(nbytes / 4)
	h.sumWords(a.Offset, n, a.Dtype, 0, n, hostWords(a.Out, n))
	if err := h.hostSync(kernels.MeetOneShotOut, a.Stream, timeout); err != nil {
		return fmt.Errorf("%s, after the reads: %w", what, err)
	}
	return nil
}

// sumWords sums words lo..hi-1 of the n-word arrays at byte offset of every
// rank's buffer into out, in rank order with float32 accumulation, as the
// kernels do.
func (h *Handle) sumWords(offset uint64, n int, d kernels.Dtype, lo, hi int, out []uint32) {
	acc := make([]float32, 2*(hi-lo))
	for r := 0; r < h.world; r++ {
		words := hostWords(h.BufferPtr(r)+uintptr(offset), n)[lo:hi]
		for i, w := range words {
			switch d {
			case kernels.BFloat16:
				acc[2*i] += math.Float32frombits(w << 16)
				acc[2*i+1] += math.Float32frombits(w & 0xffff0000)
			case kernels.Float16:
				acc[2*i] += F16ToF32(uint16(w))
				acc[2*i+1] += F16ToF32(uint16(w >> 16))
			default:
				acc[2*i] += math.Float32frombits(w)
			}
		}
	}
	for i := range out {
		switch d {
		case kernels.BFloat16:
			out[i] = uint32(ToBF16(acc[2*i])) | uint32(ToBF16(acc[2*i+1]))<<16
		case kernels.Float16:
			out[i] = uint32(ToF16(acc[2*i])) | uint32(ToF16(acc[2*i+1]))<<16
		default:
			out[i] = math.Float32bits(acc[2*i])
		}
	}
}

// hostTwoShot is the two-shot kernel's protocol on host memory: copy in,
// meet every peer on channel 0 (hostSync), sum this rank's share and store
// it into every rank's buffer, meet again, copy out.
func (h *Handle) hostTwoShot(a AllReduce, nbytes uint64) error {
	what := fmt.Sprintf("two_shot_all_reduce of %d %s on group %q (rank %d)", a.Count, a.Dtype, h.group, h.rank)
	timeout := h.hostBound(a.Timeout)
	in := h.BufferPtr(h.rank) + uintptr(a.Offset)
	if a.Local != 0 && a.Local != in {
		copy(hostBytes(in, nbytes), hostBytes(a.Local, nbytes))
	}
	if err := h.hostSync(kernels.MeetTwoShotIn, a.Stream, timeout); err != nil {
		return fmt.Errorf("%s, before the reads: %w", what, err)
	}
	n := int(nbytes / 4)
	v, _, _ := allReduceShape(a.Offset, nbytes, h.world, h.maxBlocks)
	lo, hi := twoShotShare(n, v, h.rank, h.world)
	sum := make([]uint32, hi-lo)
	h.sumWords(a.Offset, n, a.Dtype, lo, hi, sum)
	for k := 1; k <= h.world; k++ {
		copy(hostWords(h.BufferPtr((h.rank+k)%h.world)+uintptr(a.Offset), n)[lo:hi], sum)
	}
	if err := h.hostSync(kernels.MeetTwoShotOut, a.Stream, timeout); err != nil {
		return fmt.Errorf("%s, after the stores: %w", what, err)
	}
	if a.Out != in {
		copy(hostBytes(a.Out, nbytes), hostBytes(in, nbytes))
	}
	return nil
}

// twoShotShare is rank s's share of n words, [lo, hi), as the kernel splits
// them: world contiguous shares of a multiple of v words, the last taking
// the rest.
func twoShotShare(n, v, s, world int) (lo, hi int) {
	share := n / world / v * v
	lo, hi = s*share, (s+1)*share
	if s == world-1 {
		hi = n
	}
	return lo, hi
}

// ToBF16 rounds f to bfloat16 bits, to nearest even, as the kernel does (a
// NaN stays a quiet NaN).
func ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// hostBytes and hostWords view memory outside Go's heap (host blocks and
// the caller's buffers).
func hostBytes(p uintptr, n uint64) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

func hostWords(p uintptr, n int) []uint32 {
	return unsafe.Slice((*uint32)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}
