package kernels

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/libsymm/libsymm/topology"
)

// SymmSource is libsymm's kernel source, one NVRTC program: the numbers
// the host owns as #defines (sourceDefines), then symm.cu (signal-pad put,
// wait and barrier with in-kernel timeouts, the epoch meetings, the
// one-shot all-reduce and the helpers the others use), then
// symm_collectives.cu (the two-shot all-reduce, reduce-scatter and
// all-gather), then symm_push.cu (the push all-reduce). Whatever compiles
// it (the loader, Probe, the tests) and the disk cache's key see the
// #defines with the rest: one string.
var SymmSource = sourceDefines() + symmCore + symmCollectives + symmPush

// sourceConstants are the numbers that the kernels and the host share,
// owned by this package (the dtypes by include/symm.h's SYMM_DTYPES, read
// through cgo) and given to the CUDA source as #defines: symm*.cu uses
// these names and never types their values.
func sourceConstants() []sourceConstant {
	cs := []sourceConstant{
		{"SYMM_OP_PUT", OpPut}, {"SYMM_OP_WAIT", OpWait}, {"SYMM_OP_REDUCE_IN", OpReduceIn},
		{"SYMM_OP_REDUCE_OUT", OpReduceOut}, {"SYMM_OP_PUSH", OpPush}, {"SYMM_OP_PUSH_INIT", OpPushInit},
		{"SYMM_OP_MISMATCH", OpMismatch}, {"SYMM_OP_STOPPED", OpStopped}, {"SYMM_OP_PUSH_UNSET", OpPushUnset},
		{"SYMM_MEET_BARRIER", MeetBarrier}, {"SYMM_MEET_RESET", MeetReset},
		{"SYMM_MEET_ONE_SHOT_IN", MeetOneShotIn}, {"SYMM_MEET_ONE_SHOT_OUT", MeetOneShotOut},
		{"SYMM_MEET_TWO_SHOT_IN", MeetTwoShotIn}, {"SYMM_MEET_TWO_SHOT_OUT", MeetTwoShotOut},
		{"SYMM_MEET_RS_IN", MeetReduceScatIn}, {"SYMM_MEET_RS_OUT", MeetReduceScatOut},
		{"SYMM_MEET_AG_IN", MeetAllGatherIn}, {"SYMM_MEET_AG_OUT", MeetAllGatherOut},
		{"SYMM_SYNC_SLOTS", PadSlots}, {"SYMM_PUSH_MAX_BLOCKS", PushMaxBlocks},
		{"SYMM_EPOCH_STOPPED", EpochStopped}, // u32: literal() writes it unsigned
	}
	for _, d := range Dtypes() {
		cs = append(cs, sourceConstant{d.info().cname, int(d)})
	}
	return cs
}

// kernelDtypes is the X-macro SYMM_KERNEL_DTYPES(X): X(short name, code
// name) for every dtype, so that each kernel family instantiates every
// dtype from one list, under the names Go asks for (arKernel,
// PushAllReduceKernel).
func kernelDtypes() string {
	var b strings.Builder
	b.WriteString("#define SYMM_KERNEL_DTYPES(X)")
	for _, d := range Dtypes() {
		fmt.Fprintf(&b, " X(%s, %s)", d.short(), d.info().cname)
	}
	b.WriteString("\n")
	return b.String()
}

type sourceConstant struct {
	Name  string
	Value int
}

// literal is the constant as C writes it: unsigned from bit 31 up (a
// 32-bit word's bits, as SYMM_EPOCH_STOPPED), else a plain int.
func (c sourceConstant) literal() string {
	if c.Value >= 1<<31 {
		return fmt.Sprintf("%du", c.Value)
	}
	return fmt.Sprint(c.Value)
}

func sourceDefines() string {
	var b strings.Builder
	b.WriteString("// Defined by package kernels (symm.go: sourceConstants), not typed in the .cu files.\n")
	for _, c := range sourceConstants() {
		fmt.Fprintf(&b, "#define %s %s\n", c.Name, c.literal())
	}
	b.WriteString(kernelDtypes())
	return b.String()
}

// PadSlots is the number of uint32 slots of a signal pad, so channels ×
// world size ≤ PadSlots (PyTorch's pad has as many), and of the sync area
// after it (SYMM_SYNC_SLOTS: a meeting's slot is channel × world + src).
// Package symmetric sizes both from it (SignalPadSize, SyncAreaSize) and
// caps a group's channels, and so the collectives' grids, at
// PadSlots / world.
const PadSlots = 512

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
// kernels see them as SYMM_OP_*: sourceConstants).
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
// its count, so that ranks that disagree on what they meet are caught
// (OpMismatch). The kernels see them as SYMM_MEET_* (sourceConstants).
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

// EpochStopped, set in a channel's epoch count, says a meeting on the
// channel failed on this rank: later meetings on it fail at once, storing
// nothing (the kernels' SYMM_EPOCH_STOPPED; package symmetric reads it back).
const EpochStopped = 1 << 31

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
	w := "any"
	switch world {
	case 2, 4, 8:
		w = fmt.Sprint(world)
	}
	return fmt.Sprintf("symm_%s_%s_v%d_w%s", kind, d.short(), wordsPerThread, w)
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
func PushAllReduceKernel(d Dtype) string { return "symm_push_ar_" + d.short() }

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
// keeps a copy of the call number per block (the kernels'
// SYMM_PUSH_MAX_BLOCKS: sourceConstants).
const PushMaxBlocks = 128

// PushInitLaunch is the launch shape of the push workspace's set-up over
// slots of lines lines each: as many blocks at most as the push itself
// (PushMaxBlocks; any grid would be correct).
func PushInitLaunch(lines uint64) (blocks, threads uint32) {
	const perBlock = 512
	return uint32(max(min((lines+perBlock-1)/perBlock, PushMaxBlocks), 1)), perBlock
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
