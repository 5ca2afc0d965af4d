package kernels

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/libsymm/libsymm/topology"
)

// SymmSource is libsymm's kernel source, one NVRTC program: symm.cu
// (signal-pad put, wait and barrier with in-kernel timeouts, the epoch
// meetings, the one-shot all-reduce and the helpers the others use), then
// symm_collectives.cu (the two-shot all-reduce, reduce-scatter and
// all-gather), then symm_push.cu (the push all-reduce).
var SymmSource = symmCore + symmCollectives + symmPush

//go:embed symm.cu
var symmCore string

//go:embed symm_collectives.cu
var symmCollectives string

//go:embed symm_push.cu
var symmPush string

// SymmName names SymmSource in NVRTC's messages and in the disk cache.
const SymmName = "libsymm-symm.cu"

// Kernel names in SymmSource.
const (
	Barrier    = "symm_barrier"
	PutSignal  = "symm_put_signal"
	WaitSignal = "symm_wait_signal"
	PushInit   = "symm_push_init"
	PadReset   = "symm_pad_reset" // a signal pad's reset: meet, zero, meet
)

// Report operations: what a kernel was doing when its wait timed out (the
// SYMM_OP_* values of symm.cu).
const (
	OpPut       = 1
	OpWait      = 2
	OpReduceIn  = 3
	OpReduceOut = 4
	OpPush      = 5 // push all-reduce: a peer's data did not come (Channel: the call's flag)
	OpPushInit  = 6 // push all-reduce's first call: a peer did not come to set the workspace up
	OpMismatch  = 7 // an epoch meeting met a peer's meeting of another kind (Mine, Theirs)
	OpStopped   = 8 // an earlier meeting on the channel failed on this rank; this one did not meet
	OpPushUnset = 9 // push all-reduce: the workspace was not set up before the call
)

// Meeting kinds: what an epoch meeting is, carried in its slot word beside
// its count (symm.cu's SYMM_MEET_*), so that ranks that disagree on what
// they meet are caught (OpMismatch).
const (
	MeetBarrier       = 1
	MeetReset         = 2 // ResetSignalPad's barriers on GPUs
	MeetOneShotIn     = 3 // one-shot all-reduce, before the reads
	MeetOneShotOut    = 4 // ... after them
	MeetTwoShotIn     = 5
	MeetTwoShotOut    = 6
	MeetReduceScatIn  = 7
	MeetReduceScatOut = 8
	MeetAllGatherIn   = 9
	MeetAllGatherOut  = 10
)

// Report is a failed wait as a kernel wrote it into its status word: the
// op, the peer and the channel; for OpMismatch also the two meetings' kinds
// (Mine: this rank's, Theirs: the peer's; Meet* values).
type Report struct {
	Op            int
	Peer, Channel int
	Mine, Theirs  int
}

// DecodeReport reads a status word: ok is false when nothing was reported.
// An OpMismatch report keeps the channel in bits 0..15 and the kinds in
// bits 16..23 (Mine) and 24..31 (Theirs).
func DecodeReport(w uint64) (r Report, ok bool) {
	if w>>63 == 0 {
		return Report{}, false
	}
	r = Report{Op: int(w>>56) & 0x7f, Peer: int(w>>32) & 0xffffff, Channel: int(uint32(w))}
	if r.Op == OpMismatch {
		r.Channel, r.Mine, r.Theirs = int(w&0xffff), int(w>>16)&0xff, int(w>>24)&0xff
	}
	return r, true
}

// Dtype is an element type of the all-reduce.
type Dtype int

const (
	Float32  Dtype = 0 // SYMM_FLOAT32
	BFloat16 Dtype = 1 // SYMM_BFLOAT16
	Float16  Dtype = 2 // SYMM_FLOAT16
)

func (d Dtype) String() string {
	switch d {
	case Float32:
		return "float32"
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Size is the element size in bytes (0 for an unknown dtype).
func (d Dtype) Size() int {
	switch d {
	case Float32:
		return 4
	case BFloat16, Float16:
		return 2
	}
	return 0
}

// AllReduceKernel names the one-shot all-reduce kernel for dtype d, words
// (32-bit) per thread (4: 16-byte aligned, else 1) and world size (2, 4 and
// 8 have their own unrolled kernels).
func AllReduceKernel(d Dtype, wordsPerThread, world int) string {
	return arKernel("ar", d, wordsPerThread, world)
}

// TwoShotAllReduceKernel names the two-shot all-reduce kernel, chosen as
// for AllReduceKernel (it takes the same parameters and launch shape).
func TwoShotAllReduceKernel(d Dtype, wordsPerThread, world int) string {
	return arKernel("ts", d, wordsPerThread, world)
}

// ReduceScatterKernel names the reduce-scatter kernel, chosen as for
// AllReduceKernel (the same parameters, nwords being one rank's share).
func ReduceScatterKernel(d Dtype, wordsPerThread, world int) string {
	return arKernel("rs", d, wordsPerThread, world)
}

// AllGatherKernel names the all-gather kernel (a copy: any dtype of 2 or 4
// bytes) for wordsPerThread words per thread (4: 16-byte aligned, else 1).
func AllGatherKernel(wordsPerThread int) string {
	return fmt.Sprintf("symm_ag_v%d", wordsPerThread)
}

func arKernel(kind string, d Dtype, wordsPerThread, world int) string {
	dt := "f32"
	switch d {
	case BFloat16:
		dt = "bf16"
	case Float16:
		dt = "f16"
	}
	w := "any"
	switch world {
	case 2, 4, 8:
		w = fmt.Sprint(world)
	}
	return fmt.Sprintf("symm_%s_%s_v%d_w%s", kind, dt, wordsPerThread, w)
}

// DefaultCollectiveBlocks is the most blocks a collective that meets its
// peers (one-shot, two-shot, reduce-scatter, all-gather) launches by
// default. PyTorch launches at most 24; on 2 × H200 (2026-11-26,
// tests/device/symm_bench.py 2 with SYMM_COLLECTIVE_BLOCKS=96 beside 24)
// 96 took the two-shot from 10.3 to 9.7 µs at 1 MiB and from 1044 to
// 833 µs at 256 MiB, the reduce-scatter from 1.66× to 0.77× NCCL's time
// at 256 MiB and the all-gather from 2.16× to 0.98×, and changed nothing
// up to 512 KiB (a grid never has more blocks than 512-thread rows of
// the message). Groups of more than 5 ranks get fewer: no more blocks than
// channels (512 / world).
const DefaultCollectiveBlocks = 96

// AllReduceLaunch is the launch shape of the one-shot all-reduce over nwords
// 32-bit words: blocks of at most 512 threads, at most maxBlocks of them
// (the kernel synchronizes block b with block b of every peer on channel b,
// so a grid uses as many channels as blocks).
func AllReduceLaunch(nwords uint64, wordsPerThread int, maxBlocks uint32) (blocks, threads uint32) {
	const maxThreads = 512
	items := (nwords + uint64(wordsPerThread) - 1) / uint64(wordsPerThread)
	if items <= maxThreads {
		return 1, uint32(max((items+31)/32*32, 32))
	}
	return uint32(min((items+maxThreads-1)/maxThreads, uint64(max(maxBlocks, 1)))), maxThreads
}

// PushAllReduceKernel names the push all-reduce kernel for dtype d.
func PushAllReduceKernel(d Dtype) string {
	switch d {
	case BFloat16:
		return "symm_push_ar_bf16"
	case Float16:
		return "symm_push_ar_f16"
	}
	return "symm_push_ar_f32"
}

// PushLaunch is the launch shape of the push all-reduce over nlines 16-byte
// lines (8 bytes of the message each): a thread per line, in blocks of 256
// threads over at most 128 blocks (512 KiB in one pass; larger messages
// loop). Any grid is correct (a line's reader waits for whichever thread of
// the peer writes it), but every rank derives it from the message size
// alone, so that block k handles the same lines everywhere and the blocks a
// busy GPU runs first are the ones the peers' first blocks wait for.
// Blocks of 256 rather than 512 spread a small message over more SMs, so
// that more of them issue stores to the peers at once.
func PushLaunch(nlines uint64) (blocks, threads uint32) {
	const perBlock = 256
	if nlines <= perBlock {
		return 1, uint32(max((nlines+31)/32*32, 32))
	}
	return uint32(min((nlines+perBlock-1)/perBlock, PushMaxBlocks)), perBlock
}

// PushMaxBlocks is the most blocks of a push all-reduce's grid: the state
// keeps a copy of the call number per block (symm.cu's SYMM_PUSH_MAX_BLOCKS).
const PushMaxBlocks = 128

// PushInitLaunch is the launch shape of the push workspace's set-up over
// slots of lines lines each.
func PushInitLaunch(lines uint64) (blocks, threads uint32) {
	const maxBlocks, perBlock = 128, 512
	return uint32(max(min((lines+perBlock-1)/perBlock, maxBlocks), 1)), perBlock
}

// Probe fills t.Kernels: whether NVRTC opens (dirs: site-packages to look
// in) and, for every device of t, whether SymmSource compiles for its
// architecture (or comes from the disk cache at cacheDir) and, with load,
// whether its module loads there. Loading creates the device's CUDA context
// (hundreds of MiB of device memory): `symm info` does, the library's
// symm_topology, which a job may call on every rank, does not.
func Probe(t *topology.Topology, dirs []string, cacheDir string, load bool) {
	k := &topology.Kernels{Devices: []topology.KernelDevice{}}
	t.Kernels = k
	n, err := Open(dirs)
	if err != nil {
		k.Error = err.Error()
		return
	}
	k.NVRTC = n.Version()
	l := NewLoader(n, SymmName, SymmSource, cacheDir)
	for _, d := range t.Devices {
		kd := topology.KernelDevice{Index: d.Index, Arch: "sm_" + strings.ReplaceAll(d.ComputeCapability, ".", "")}
		var err error
		if load {
			_, err = l.Function(d.Index, Barrier)
			kd.Loaded = err == nil
		} else {
			err = l.Compiles(d.ComputeCapability)
		}
		if err != nil {
			kd.Reason = err.Error()
		} else {
			kd.Ready = true
		}
		k.Devices = append(k.Devices, kd)
	}
}
