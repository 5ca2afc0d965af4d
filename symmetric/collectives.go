package symmetric

import (
	"fmt"
	"math"

	"github.com/libsymm/libsymm/kernels"
)

const (
	reduceScatterName = "reduce_scatter"
	allGatherName     = "all_gather"
)

// ReduceScatter runs a as a reduce-scatter (NCCL's ncclReduceScatter,
// PyTorch's reduce_scatter_tensor) on the handle's group. Every rank's
// buffer holds world shares of Count elements each at Offset (share s:
// elements s×Count .. s×Count+Count-1); rank r sums share r of every rank's
// buffer, in rank order 0..world-1 with float32 accumulation (the same bits
// whichever rank sums the share), into Out (Count elements). Out may be this
// rank's own share r of its buffer (in place) or memory disjoint from the
// world shares. Local, when not 0, holds the whole world × Count input and
// is copied into this rank's buffer first; it may be the buffer itself or
// disjoint from it, and Out may be Local's share r (NCCL's in place) or
// disjoint from Local. Float32, BFloat16 and Float16, op "sum"; Count × element size
// and Offset multiples of 4 bytes. On GPUs it is one kernel with
// OneShotAllReduce's launch shape (over one share) and synchronization
// (block b with block b of every peer on channel b, before the reads and
// after them); on the host backend the calling thread does the same with
// host signals on channel 0.
func (h *Handle) ReduceScatter(a AllReduce) error {
	return h.collective(a, reduceScatterName)
}

// AllGather runs a as an all-gather (NCCL's ncclAllGather, PyTorch's
// all_gather_into_tensor) on the handle's group. Every rank's buffer holds
// world shares of Count elements at Offset; rank r's own share r is its
// input (copied there first from Local, Count elements, when Local is not
// 0). Out (world × Count elements) then receives share s of rank s's
// buffer at share s, for every s. Out may be this rank's buffer at Offset
// itself (in place) or memory disjoint from it; Local may be the buffer's
// share r, Out's share r (NCCL's in place), or disjoint from both. Any
// dtype of 2 or 4 bytes (Float32, BFloat16, Float16: it is a copy); Op is
// not used; Count × element size and Offset multiples of 4 bytes. Launch
// shape, synchronization and the host backend as for ReduceScatter.
func (h *Handle) AllGather(a AllReduce) error {
	return h.collective(a, allGatherName)
}

// collective runs a as fn (one_shot_all_reduce, two_shot_all_reduce,
// reduce_scatter or all_gather): what each of them does around its work,
// in one place. It holds the block, checks a (the size of the message, or
// of one share), refuses a handle that failed, then launches fn's kernel
// on GPUs (the four share a launch shape and words: allReduceShape) or runs
// fn's protocol on the host backend. fn is a constant name, compared
// rather than passed as a function so that the call allocates nothing.
func (h *Handle) collective(a AllReduce, fn string) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	reduce := fn == oneShotName || fn == twoShotName
	var nbytes uint64
	if reduce {
		nbytes, err = h.geometry().checkAllReduce(a, fn)
	} else {
		nbytes, err = h.geometry().checkCollective(a, fn)
	}
	if err != nil || nbytes == 0 {
		return err
	}
	if err := h.failed(); err != nil {
		return fmt.Errorf("%s: %w", fn, err)
	}
	if _, ok := h.m.prov.(kernelDevice); !ok {
		switch fn {
		case oneShotName:
			return h.hostAllReduce(a, nbytes)
		case twoShotName:
			return h.hostTwoShot(a, nbytes)
		}
		return h.hostCollective(a, fn, nbytes)
	}
	if err := h.m.KernelsReady(h.b.Dev()); err != nil {
		return fmt.Errorf("%s on device %d needs the kernels: %w", fn, h.b.Dev(), err)
	}
	v, blocks, threads := allReduceShape(a.Offset, nbytes, h.world, h.maxBlocks)
	words := [...]uint64{uint64(h.BufferPtrsDev()), a.Offset, nbytes / 4, uint64(a.Out), uint64(a.Local), uint64(h.PadPtrsDev()),
		uint64(h.epochsArg()), u32(h.rank), u32(h.world), 0, 0}
	var id, kind int
	switch fn {
	case oneShotName:
		id, kind = allReduceIndex(a.Dtype, v, h.world), kAllReduce
	case twoShotName:
		id, kind = twoShotIndex(a.Dtype, v, h.world), kTwoShot
	case reduceScatterName:
		id, kind = reduceScatterIndex(a.Dtype, v, h.world), kReduceScatter
	default:
		id, kind = allGatherIndex(v), kAllGather
	}
	return h.launch(id, blocks, threads, a.Stream, a.Timeout, words[:], callDesc{kind: kind, count: a.Count, dtype: a.Dtype})
}

// checkCollective validates a for reduce_scatter or all_gather and returns
// the size of one share in bytes.
func (g geometry) checkCollective(a AllReduce, fn string) (uint64, error) {
	size := uint64(a.Dtype.Size())
	gather := fn == allGatherName
	switch {
	case size == 0:
		return 0, fmt.Errorf("%w: %s: dtype %d is not float32 (0), bfloat16 (1) or float16 (2)", ErrInvalid, fn, int(a.Dtype))
	case !gather && a.Op != "sum":
		return 0, fmt.Errorf("%w: %s: op %q: only sum is supported", ErrInvalid, fn, a.Op)
	case a.Timeout < 0:
		return 0, fmt.Errorf("%w: %s: timeout %v is negative (0: no timeout)", ErrInvalid, fn, a.Timeout)
	case a.Count == 0:
		return 0, nil
	case a.Count > math.MaxUint64/size/uint64(g.world):
		return 0, fmt.Errorf("%w: %s: %d elements per rank overflow", ErrInvalid, fn, a.Count)
	}
	nbytes := a.Count * size
	total := nbytes * uint64(g.world)
	switch {
	case a.Offset%4 != 0 || nbytes%4 != 0:
		return 0, fmt.Errorf("%w: %s: offset %d and size per rank %d bytes (%d %s) must be multiples of 4",
			ErrInvalid, fn, a.Offset, nbytes, a.Count, a.Dtype)
	case a.Offset > g.bufSize || total > g.bufSize-a.Offset:
		return 0, fmt.Errorf("%w: %s: %d ranks × %d bytes at offset %d do not fit the %d-byte buffer",
			ErrInvalid, fn, g.world, nbytes, a.Offset, g.bufSize)
	case a.Out == 0:
		return 0, fmt.Errorf("%w: %s: output is NULL", ErrInvalid, fn)
	case a.Out%4 != 0 || a.Local%4 != 0:
		return 0, fmt.Errorf("%w: %s: output %#x and local input %#x must be 4-byte aligned", ErrInvalid, fn, a.Out, a.Local)
	}
	buf := g.buf + uintptr(a.Offset)
	share := buf + uintptr(uint64(g.rank)*nbytes) // this rank's share of its buffer
	outBytes, localBytes, inPlace, localOK := nbytes, total, share, buf
	if gather {
		outBytes, localBytes, inPlace, localOK = total, nbytes, buf, share
	}
	// In place in out: reduce_scatter's out at local's share r; all_gather's
	// local at out's share r (NCCL's in-place calls).
	outInLocal := a.Out == a.Local+uintptr(uint64(g.rank)*nbytes)
	if gather {
		outInLocal = a.Local == a.Out+uintptr(uint64(g.rank)*nbytes)
	}
	switch {
	case a.Out != inPlace && overlapRanges(a.Out, outBytes, buf, total):
		return 0, fmt.Errorf("%w: %s: the output %#x (%d bytes) overlaps this rank's buffer %#x (%d bytes) at a shift of %+d bytes; "+
			"peers read it at the same time: pass %#x (in place) or disjoint memory",
			ErrInvalid, fn, a.Out, outBytes, buf, total, int64(a.Out-buf), inPlace)
	case a.Local != 0 && a.Local != localOK && overlapRanges(a.Local, localBytes, buf, total):
		return 0, fmt.Errorf("%w: %s: local_input %#x (%d bytes) overlaps this rank's buffer %#x (%d bytes) at a shift of %+d bytes; "+
			"blocks would overwrite input other blocks have not copied yet: pass %#x or disjoint memory",
			ErrInvalid, fn, a.Local, localBytes, buf, total, int64(a.Local-buf), localOK)
	case a.Local != 0 && !outInLocal && overlapRanges(a.Out, outBytes, a.Local, localBytes):
		return 0, fmt.Errorf("%w: %s: the output %#x (%d bytes) overlaps local_input %#x (%d bytes) at a shift of %+d bytes; "+
			"blocks would overwrite input other blocks have not copied yet: pass this rank's share of it (in place) or disjoint memory",
			ErrInvalid, fn, a.Out, outBytes, a.Local, localBytes, int64(a.Out-a.Local))
	}
	return nbytes, nil
}

// overlapRanges reports whether the an bytes at a and the bn bytes at b share
// one (without overflow near the top of the address space).
func overlapRanges(a uintptr, an uint64, b uintptr, bn uint64) bool {
	if a >= b {
		return uint64(a-b) < bn
	}
	return uint64(b-a) < an
}

// hostCollective is the kernels' protocol on host memory: copy in, meet
// every peer on channel 0 (hostSync), read, meet again.
func (h *Handle) hostCollective(a AllReduce, fn string, nbytes uint64) error {
	what := fmt.Sprintf("%s of %d %s per rank on group %q (rank %d)", fn, a.Count, a.Dtype, h.group, h.rank)
	timeout := h.hostBound(a.Timeout)
	buf := h.BufferPtr(h.rank) + uintptr(a.Offset)
	total := nbytes * uint64(h.world)
	share := buf + uintptr(uint64(h.rank)*nbytes)
	gather := fn == allGatherName
	switch {
	case a.Local == 0:
	case gather && a.Local != share:
		copy(hostBytes(share, nbytes), hostBytes(a.Local, nbytes))
	case !gather && a.Local != buf:
		copy(hostBytes(buf, total), hostBytes(a.Local, total))
	}
	in, out := kernels.MeetReduceScatIn, kernels.MeetReduceScatOut
	if gather {
		in, out = kernels.MeetAllGatherIn, kernels.MeetAllGatherOut
	}
	if err := h.hostSync(in, a.Stream, timeout); err != nil {
		return fmt.Errorf("%s, before the reads: %w", what, err)
	}
	n := int(nbytes / 4)
	if gather {
		for k := 0; k < h.world; k++ {
			s := (h.rank + k) % h.world
			if a.Out == buf && s == h.rank {
				continue
			}
			src := h.BufferPtr(s) + uintptr(a.Offset) + uintptr(uint64(s)*nbytes)
			copy(hostBytes(a.Out+uintptr(uint64(s)*nbytes), nbytes), hostBytes(src, nbytes))
		}
	} else {
		h.sumWords(a.Offset, n*h.world, a.Dtype, h.rank*n, (h.rank+1)*n, hostWords(a.Out, n))
	}
	if err := h.hostSync(out, a.Stream, timeout); err != nil {
		return fmt.Errorf("%s, after the reads: %w", what, err)
	}
	return nil
}
