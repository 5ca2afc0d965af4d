package symmetric

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/kernels"
)

// The push all-reduce: one kernel per call, with no barrier phase, for
// small messages inside CUDA graphs (kernels/symm_push.cu has the protocol and
// why it is safe). Its handle is a workspace: a symmetric block of its own,
// rendezvoused once with one group, that holds no user data. Each rank's
// buffer is 2 halves × world slots × lines 16-byte lines, a line carrying 8
// bytes of a rank's message with the call's flag; so a workspace of S bytes
// takes messages up to 8 × ⌊S / (32 × world)⌋ bytes (PushMaxBytes), and
// PushWorkspaceSize is the size for a given limit. The call counter lives
// in the handle's own memory (its pointer arrays' tail, zero at the
// rendezvous), read and advanced by the kernel: nothing on the host changes
// from call to call, so a captured CUDA graph replays the calls as they are.
//
// The first call on a handle sets the workspace up (symm_push_init: both
// halves cleared, every peer met once on signal-pad channel 0), launched
// before each call's kernel until it has run, and a no-op once it has: it
// then writes 1 into the handle's ready word (the spare half of its status
// word, host-mapped), which the host reads with no CUDA call. A set-up
// that is only queued does not count: a first call captured in a CUDA graph
// runs its set-up at the graph's replay, so an eager call before that
// replay queues the set-up again rather than reading a workspace never
// cleared (zeroed memory would pass for lines of flag 0). A call that still
// finds no set-up (its stream not ordered after one) fails with a report.
// Calls on one workspace must be ordered (one stream, or streams ordered by
// events) and every rank makes the same calls, with the same sizes, in the
// same order. A peer that does not come gives ErrSignalTimeout naming it and
// fails the handle, as the signal kernels do: its late data would otherwise
// meet calls it does not belong to.
//
// On the host backend the calling thread does the same with the same layout
// (8-byte atomic stores and loads on the shared memory), each call bounded
// by its timeout (else SYMM_TIMEOUT_MS).

// pushStateWords is the size, in 8-byte words, of a handle's push state
// (symm.cu's PushState): the next call's number (0: not set up), a copy per
// block of the largest grid (the kernels keep them equal between calls; the
// host backend uses the first), then the count of the set-up's blocks that
// are done.
const pushStateWords = kernels.PushMaxBlocks + 1

// pushLine is the workspace's bytes per line (8 bytes of message, with two
// flags).
const pushLine = 16

// pushSetUp is a handle's workspace set-up: ready once the set-up kernel
// has run (its ready word reads 1; on the host, the state is set); mu
// serializes the set-up's launch, and each host call.
type pushSetUp struct {
	ready atomic.Bool
	mu    sync.Mutex
}

// PushAllReduce describes one push all-reduce on a workspace handle: every
// rank sums the Count elements at In of every rank and writes the sum to
// its Out. Every rank of the group calls it with the same Count and Dtype.
type PushAllReduce struct {
	// In and Out are any device memory on GPUs (host memory on the host
	// backend), aligned to the element; Out may be In (in place) but may not
	// overlap it otherwise, and neither may lie in the workspace itself.
	In, Out uintptr
	Count   uint64        // elements: any number up to the workspace's limit
	Dtype   kernels.Dtype // Float32, BFloat16 or Float16
	Op      string        // "sum"
	Stream  uintptr
	Timeout time.Duration // as for Barrier
}

// PushWorkspaceSize is the buffer size, in bytes, of a workspace for a
// group of world ranks that takes messages of up to maxBytes bytes.
func PushWorkspaceSize(world int, maxBytes uint64) (uint64, error) {
	if world < 1 || maxBytes == 0 {
		return 0, fmt.Errorf("%w: push all-reduce workspace for %d ranks and messages of up to %d bytes: want at least 1 of each",
			ErrInvalid, world, maxBytes)
	}
	lines := maxBytes/8 + min(maxBytes%8, 1)
	per := uint64(2 * pushLine * world)
	if lines > math.MaxUint64/per {
		return 0, fmt.Errorf("%w: push all-reduce workspace for %d ranks and messages of up to %d bytes overflows", ErrInvalid, world, maxBytes)
	}
	return lines * per, nil
}

// DefaultPushMaxBytes is a push workspace's largest message when
// SYMM_PUSH_MAX_BYTES is unset.
const DefaultPushMaxBytes = 1 << 20

// PushMaxBytesFromEnv is the largest message of a push workspace made now:
// SYMM_PUSH_MAX_BYTES (a positive number of bytes), else
// DefaultPushMaxBytes, rounded up to 8 as the workspace takes it. A bad
// value is ErrInvalid naming the variable. It is read at each call (a
// workspace is sized when it is made), through getenv.
func PushMaxBytesFromEnv(getenv func(string) string) (uint64, error) {
	n, set, err := settings.PushMaxBytes.Uint(getenv, 10, 1, math.MaxUint64-7)
	if err != nil {
		return 0, refused(err)
	}
	if !set {
		n = DefaultPushMaxBytes
	}
	return (n + 7) / 8 * 8, nil
}

// pushSlotLines is the lines per slot of a workspace buffer of bufSize bytes.
func pushSlotLines(bufSize uint64, world int) uint64 {
	return bufSize / uint64(2*pushLine*world)
}

// PushMaxBytes is the largest message, in bytes, the handle takes as a push
// all-reduce workspace.
func (h *Handle) PushMaxBytes() uint64 { return 8 * pushSlotLines(h.b.bufSize, h.world) }

// pushStateDev and pushStateHost are the handle's push state in its device
// arrays and its host arrays (the same memory on the host backend).
func (h *Handle) pushStateDev() uintptr  { return h.devArr + uintptr(16*h.world) }
func (h *Handle) pushStateHost() uintptr { return h.hostArr + uintptr(16*h.world) }

// pushFirstCall is the number of a workspace's first call.
func (h *Handle) pushFirstCall() uint64 { return max(h.m.cfg.PushFirstCall, 1) }

// PushAllReduce runs a on the workspace handle's group (see the top of this
// file). On GPUs it queues one kernel on a.Stream (two on the handle's
// first call) and, without a timeout, returns at once; the watchdog fails
// the handle if the kernel reports a late peer. Sums are accumulated in
// float32 in rank order, so every rank gets the same bits.
func (h *Handle) PushAllReduce(a PushAllReduce) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	nbytes, err := h.geometry().checkPush(a)
	if err != nil || nbytes == 0 {
		return err
	}
	if err := h.failed(); err != nil {
		return fmt.Errorf("push_all_reduce on a workspace that failed earlier: %w", err)
	}
	if _, ok := h.m.prov.(kernelDevice); ok {
		if err := h.m.KernelsReady(h.b.Dev()); err != nil {
			return fmt.Errorf("push_all_reduce on device %d needs the kernels: %w", h.b.Dev(), err)
		}
		return h.kernelPush(a, nbytes)
	}
	return h.hostPush(a, nbytes)
}

// checkPush validates a and returns its size in bytes (0: nothing to do).
func (g geometry) checkPush(a PushAllReduce) (uint64, error) {
	size := uint64(a.Dtype.Size())
	switch {
	case size == 0:
		return 0, fmt.Errorf("%w: push_all_reduce: dtype %d is not float32 (0), bfloat16 (1) or float16 (2)", ErrInvalid, int(a.Dtype))
	case a.Op != "sum":
		return 0, fmt.Errorf("%w: push_all_reduce: op %q: only sum is supported", ErrInvalid, a.Op)
	case a.Timeout < 0:
		return 0, fmt.Errorf("%w: push_all_reduce: timeout %v is negative (0: no timeout)", ErrInvalid, a.Timeout)
	case a.Count == 0:
		return 0, nil
	case a.Count > math.MaxUint64/size:
		return 0, fmt.Errorf("%w: push_all_reduce: %d elements overflow", ErrInvalid, a.Count)
	}
	nbytes := a.Count * size
	limit := 8 * pushSlotLines(g.bufSize, g.world)
	switch {
	case nbytes > limit:
		need, _ := PushWorkspaceSize(g.world, nbytes)
		return 0, fmt.Errorf("%w: push_all_reduce: %d bytes (%d %s) exceed the workspace's limit of %d bytes per call "+
			"(a %d-byte buffer for %d ranks); a workspace of %d bytes takes them (symm_push_all_reduce_workspace_size)",
			ErrInvalid, nbytes, a.Count, a.Dtype, limit, g.bufSize, g.world, need)
	case a.In == 0 || a.Out == 0:
		return 0, fmt.Errorf("%w: push_all_reduce: the input %#x or the output %#x is NULL", ErrInvalid, a.In, a.Out)
	case uint64(a.In)%size != 0 || uint64(a.Out)%size != 0:
		return 0, fmt.Errorf("%w: push_all_reduce: the input %#x and the output %#x must be aligned to the %d-byte %s element",
			ErrInvalid, a.In, a.Out, size, a.Dtype)
	case a.In != a.Out && overlap(a.In, a.Out, nbytes):
		// A thread writes its lines of out after reading its lines of in;
		// shifted, it would overwrite lines another has not read yet.
		return 0, fmt.Errorf("%w: push_all_reduce: the output %#x overlaps the input %#x (%d bytes each) at a shift of %+d bytes; "+
			"pass the same pointer (in place) or disjoint buffers", ErrInvalid, a.Out, a.In, nbytes, int64(a.Out-a.In))
	}
	ws, n := g.buf, g.bufSize
	if intersects(a.In, nbytes, ws, n) || intersects(a.Out, nbytes, ws, n) {
		return 0, fmt.Errorf("%w: push_all_reduce: the input %#x or the output %#x (%d bytes) lies in the workspace's own buffer "+
			"(%#x, %d bytes), which the call overwrites", ErrInvalid, a.In, a.Out, nbytes, ws, n)
	}
	return nbytes, nil
}

// intersects reports whether [a, a+n) and [b, b+m) share a byte.
func intersects(a uintptr, n uint64, b uintptr, m uint64) bool {
	if a <= b {
		return uint64(b-a) < n
	}
	return uint64(a-b) < m
}

// checkPushBlock refuses a workspace whose block is joined with several
// groups: its buffer holds one group's slots.
func (h *Handle) checkPushBlock() error {
	h.b.mu.Lock()
	n := len(h.b.handles)
	h.b.mu.Unlock()
	if n > 1 {
		return fmt.Errorf("%w: push_all_reduce: the workspace's block %#x is joined with %d groups; a workspace serves one group",
			ErrInvalid, h.b.Ptr(), n)
	}
	return nil
}

func (h *Handle) kernelPush(a PushAllReduce, nbytes uint64) error {
	lines := pushSlotLines(h.b.bufSize, h.world)
	if !h.pushReady() {
		if err := h.kernelPushSetUp(lines, a.Stream, a.Timeout); err != nil {
			return err
		}
	}
	blocks, threads := kernels.PushLaunch((nbytes + 7) / 8)
	words := [...]uint64{uint64(h.BufferPtrsDev()), uint64(h.pushStateDev()), uint64(a.In), uint64(a.Out), nbytes, lines,
		u32(h.rank), u32(h.world), 0, 0}
	return h.launch(kPush+int(a.Dtype), blocks, threads, a.Stream, a.Timeout, words[:],
		callDesc{kind: kPush, count: a.Count, dtype: a.Dtype})
}

// pushReady reports whether the workspace's set-up kernel has run: its
// ready word reads 1 (kept in push.ready once seen).
func (h *Handle) pushReady() bool {
	if h.push.ready.Load() {
		return true
	}
	// statusWord's once orders the read of kstat.host after its write.
	if _, err := h.statusWord(); err == nil && word(h.kstat.host+8).Load() != 0 {
		h.push.ready.Store(true)
		return true
	}
	return false
}

// kernelPushSetUp queues the set-up kernel before a call, while the set-up
// has not run (pushReady). It is a no-op once the workspace is set up, so
// queuing it again (behind a set-up still queued or captured in a graph) is
// harmless: it only writes the ready word again.
func (h *Handle) kernelPushSetUp(lines uint64, stream uintptr, timeout time.Duration) error {
	h.push.mu.Lock()
	defer h.push.mu.Unlock()
	if h.pushReady() {
		return nil
	}
	if err := h.checkPushBlock(); err != nil {
		return err
	}
	if _, err := h.statusWord(); err != nil {
		return fmt.Errorf("%s: the status word: %w", h.describe(callDesc{kind: kPushInit}), err)
	}
	blocks, threads := kernels.PushInitLaunch(lines)
	words := [...]uint64{uint64(h.BufferPtrsDev()), uint64(h.pushStateDev()), lines, uint64(h.PadPtrsDev()),
		u32(h.rank), u32(h.world), h.pushFirstCall(), uint64(h.kstat.dev + 8), 0, 0}
	return h.launch(kPushInit, blocks, threads, stream, timeout, words[:], callDesc{kind: kPushInit})
}

// hostPush is the kernel's protocol run by the calling thread on host
// memory.
func (h *Handle) hostPush(a PushAllReduce, nbytes uint64) error {
	h.push.mu.Lock()
	defer h.push.mu.Unlock()
	timeout := h.hostBound(a.Timeout)
	if timeout <= 0 {
		timeout = h.m.cfg.Timeout
	}
	lines := pushSlotLines(h.b.bufSize, h.world)
	state := word(h.pushStateHost())
	if state.Load() == 0 {
		if err := h.checkPushBlock(); err != nil {
			return err
		}
		h.hostClearHalf(0, lines)
		h.hostClearHalf(1, lines)
		if err := h.signalPeers(0, a.Stream, timeout); err != nil {
			err = fmt.Errorf("%s: %w", h.describe(callDesc{kind: kPushInit}), err)
			h.fail(err)
			return err
		}
		state.Store(h.pushFirstCall())
	}
	e := state.Load()
	b, flag := int(e&1), uint32(e)
	nl := (nbytes + 7) / 8
	src := make([]byte, 8*nl)
	copy(src, hostBytes(a.In, nbytes))
	for k := 1; k < h.world; k++ {
		p := (h.rank + k) % h.world
		slot := h.pushLineAddr(h.BufferPtr(p), lines, b, h.rank, 0)
		for l := uint64(0); l < nl; l++ {
			at := slot + uintptr(pushLine*l)
			word(at).Store(uint64(binary.LittleEndian.Uint32(src[8*l:])) | uint64(flag)<<32)
			word(at + 8).Store(uint64(binary.LittleEndian.Uint32(src[8*l+4:])) | uint64(flag)<<32)
		}
	}
	dst := make([]byte, 8*nl)
	deadline := time.Now().Add(timeout)
	mine := h.BufferPtr(h.rank)
	for l := uint64(0); l < nl; l++ {
		var acc [4]float32
		for r := 0; r < h.world; r++ {
			d0, d1 := binary.LittleEndian.Uint32(src[8*l:]), binary.LittleEndian.Uint32(src[8*l+4:])
			if r != h.rank {
				var ok bool
				if d0, d1, ok = hostWaitLine(h.pushLineAddr(mine, lines, b, r, l), flag, deadline); !ok {
					err := fmt.Errorf("%s: %w: rank %d's data for push all-reduce call %d did not come within %v",
						h.describe(callDesc{kind: kPush, count: a.Count, dtype: a.Dtype}), ErrSignalTimeout, r, e, timeout)
					h.fail(err)
					return err
				}
			}
			accumulateLine(a.Dtype, &acc, d0, d1)
		}
		o0, o1 := packLine(a.Dtype, &acc)
		binary.LittleEndian.PutUint32(dst[8*l:], o0)
		binary.LittleEndian.PutUint32(dst[8*l+4:], o1)
	}
	copy(hostBytes(a.Out, nbytes), dst)
	if uint32(e+2) < 2 {
		h.hostClearHalf(b, lines)
	}
	state.Store(e + 1)
	return nil
}

// pushLineAddr is line l of slot (half b, source r) of the workspace buffer
// at base.
func (h *Handle) pushLineAddr(base uintptr, lines uint64, b, r int, l uint64) uintptr {
	return base + uintptr(((uint64(b*h.world+r))*lines+l)*pushLine)
}

// hostClearHalf sets every line of half b of this rank's buffer to flag
// b ^ 1, as the kernels' clear_half does.
func (h *Handle) hostClearHalf(b int, lines uint64) {
	v := uint64(b^1) << 32
	base := h.pushLineAddr(h.BufferPtr(h.rank), lines, b, 0, 0)
	for i := uint64(0); i < 2*lines*uint64(h.world); i++ {
		word(base + uintptr(8*i)).Store(v)
	}
}

// hostWaitLine waits for both flags of the line at p to be flag, until
// deadline.
func hostWaitLine(p uintptr, flag uint32, deadline time.Time) (d0, d1 uint32, ok bool) {
	for spins := 0; ; spins++ {
		w0, w1 := word(p).Load(), word(p+8).Load()
		if uint32(w0>>32) == flag && uint32(w1>>32) == flag {
			return uint32(w0), uint32(w1), true
		}
		if spins >= 64 {
			if time.Now().After(deadline) {
				return 0, 0, false
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// accumulateLine adds the elements of one line (words d0, d1) to acc, as
// symm.cu's accumulate_line does.
func accumulateLine(d kernels.Dtype, acc *[4]float32, d0, d1 uint32) {
	switch d {
	case kernels.Float32:
		acc[0] += math.Float32frombits(d0)
		acc[1] += math.Float32frombits(d1)
	case kernels.BFloat16:
		acc[0] += math.Float32frombits(d0 << 16)
		acc[1] += math.Float32frombits(d0 & 0xffff0000)
		acc[2] += math.Float32frombits(d1 << 16)
		acc[3] += math.Float32frombits(d1 & 0xffff0000)
	default:
		acc[0] += F16ToF32(uint16(d0))
		acc[1] += F16ToF32(uint16(d0 >> 16))
		acc[2] += F16ToF32(uint16(d1))
		acc[3] += F16ToF32(uint16(d1 >> 16))
	}
}

func packLine(d kernels.Dtype, acc *[4]float32) (d0, d1 uint32) {
	switch d {
	case kernels.Float32:
		return math.Float32bits(acc[0]), math.Float32bits(acc[1])
	case kernels.BFloat16:
		return uint32(ToBF16(acc[0])) | uint32(ToBF16(acc[1]))<<16, uint32(ToBF16(acc[2])) | uint32(ToBF16(acc[3]))<<16
	}
	return uint32(ToF16(acc[0])) | uint32(ToF16(acc[1]))<<16, uint32(ToF16(acc[2])) | uint32(ToF16(acc[3]))<<16
}

// F16ToF32 is the value of IEEE half-precision bits h.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp, man := uint32(h>>10)&0x1f, uint32(h)&0x3ff
	switch {
	case exp == 0x1f: // infinity, NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0: // zero, subnormal: man × 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(f))
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// ToF16 rounds f to IEEE half-precision bits, to nearest even, as the
// kernel's cvt.rn.f16.f32 does (beyond the largest half: infinity; a NaN
// stays a quiet NaN).
func ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	case a >= 0x477ff000: // 65520 and above round to infinity
		return sign | 0x7c00
	case a >= 0x38800000: // 2^-14 and above: normal
		v := a - 112<<23
		return sign | uint16((v+0xfff+(v>>13)&1)>>13)
	}
	e := a >> 23
	if e < 101 { // below 2^-26: zero
		return sign
	}
	m, shift := a&0x7fffff|0x800000, 126-e // in units of 2^-24
	r, rem, half := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
	if rem > half || rem == half && r&1 == 1 {
		r++
	}
	return sign | uint16(r)
}
