package symmetric

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/kernels"
)

// Signals as kernels. On GPUs a put, a wait and a barrier are one kernel
// launch each (kernels/symm.cu) instead of 2 × (world − 1) stream memory
// operations, and every wait inside them has a deadline: past it the kernel
// writes a report into a status word, in host-mapped memory, and returns,
// so the stream goes on.
//
// A call without timeout_ms gives the kernel the manager's timeout
// (SYMM_TIMEOUT_MS) and the handle's own word, which the watchdog polls. A
// call with one takes a word of its own from the manager's slab, records an
// event before its kernel and one after it, waits for the second and reads
// that word: no other call can consume its report, and a late report can
// fail no later call. Only the kernel is waited for, never the whole stream:
// work queued after it (by this thread later, or by another) is not the
// peer's delay, and neither is work queued before it. The call's deadline
// starts when the stream reaches the kernel (the first event has passed).
// Earlier work that holds the stream for longer than SYMM_TIMEOUT_MS (and
// at least the call's own deadline) gives ErrSignalTimeout without failing
// the handle: no peer was waited for yet, the kernel stays queued, and the
// watchdog reads its outcome once the stream has passed it (awaitKernel).
// (An event is recorded just before and just after the launch: work that
// another thread queues on the same stream in between counts as the
// kernel's own; the API cannot exclude that.)
//
// Either way a report fails the handle. A kernel that gave up leaves its
// pads in a state no rank can know: a put that did not happen, or a peer's
// signal that arrives after the wait stopped and that the next wait on that
// channel would take as its own, reading the peer's buffer early. So every
// later call on the handle returns the failure (as PyTorch's kernels trap),
// and the block is freed and rendezvoused again to go on.
//
// Invariants: a handle's path (kernels or stream memory operations) is
// decided on its first signal and kept (signals.go); every word comes from
// the manager's slab and is zero while no report is pending; the handle's
// word goes back to the slab only when the block is freed, after the handle
// has left the watchdog's set, and a call's word once its stream has passed
// its kernel (a kernel that never finished keeps its word for good: 16
// bytes).
//
// Without NVRTC (or with SYMM_SIGNALS=memop) signals stay stream memory
// operations; the one-shot all-reduce needs the kernels.

// Signal modes (Config.Signals, SYMM_SIGNALS).
const (
	SignalsAuto   = "auto"
	SignalsKernel = "kernel"
	SignalsMemop  = "memop"
)

// ErrNoKernels marks a call that needs kernels where they cannot run.
var ErrNoKernels = errors.New("kernels cannot run")

// kernelDevice is implemented by providers whose blocks are device memory
// that every rank maps for loads and stores: cuda, and nvshmem and nccl
// through it.
type kernelDevice interface{ kernelDevice() }

func (p *cudaProvider) kernelDevice() {}

// kernelRunner is implemented by a provider that runs kernels itself rather
// than through the CUDA driver (the tests' simulated device): it launches
// them and gives the pinned host words their reports go to. Others use
// cuda.LaunchWords and cuda.HostAllocMapped.
type kernelRunner interface {
	LaunchKernel(dev int, f uintptr, grid, block uint32, stream uintptr, words []uint64) error
	HostMapped(dev int, n uint64) (host, device uintptr, err error)
}

// launchWords launches f on the handle's device. It makes no Go allocation
// with the driver (words do not escape: cuda.LaunchWords is noescape; a
// kernelRunner gets a copy).
func (h *Handle) launchWords(f uintptr, grid, block uint32, stream uintptr, words []uint64) error {
	if r, ok := h.m.prov.(kernelRunner); ok {
		return r.LaunchKernel(h.b.Dev(), f, grid, block, stream, slices.Clone(words))
	}
	return cuda.LaunchWords(h.b.Dev(), f, grid, block, stream, words)
}

// Kernels by index: a handle keeps their function handles.
const (
	kBarrier = iota
	kPut
	kWait
	kAllReduce     // arKernels of them: allReduceIndex
	kPushInit      = kAllReduce + arKernels
	kPush          = kPushInit + 1              // kernels.NumDtypes of them: kPush + int(dtype)
	kTwoShot       = kPush + kernels.NumDtypes  // arKernels of them: twoShotIndex
	kReduceScatter = kTwoShot + arKernels       // arKernels of them: reduceScatterIndex
	kAllGather     = kReduceScatter + arKernels // 2 of them: kAllGather (4 words per thread), kAllGather + 1 (1)
	kPadReset      = kAllGather + 2             // ResetSignalPad's kernel (padreset.go)
	numKernels     = kPadReset + 1
)

var kernelNames = func() (n [numKernels]string) {
	n[kBarrier], n[kPut], n[kWait], n[kPushInit] = kernels.Barrier, kernels.PutSignal, kernels.WaitSignal, kernels.PushInit
	n[kPadReset] = kernels.PadReset
	for _, d := range kernels.Dtypes() {
		n[kPush+int(d)] = kernels.PushAllReduceKernel(d)
	}
	for _, d := range kernels.Dtypes() {
		for _, v := range []int{4, 1} {
			for _, w := range []int{2, 4, 8, 0} {
				n[allReduceIndex(d, v, w)] = kernels.AllReduceKernel(d, v, w)
				n[twoShotIndex(d, v, w)] = kernels.TwoShotAllReduceKernel(d, v, w)
				n[reduceScatterIndex(d, v, w)] = kernels.ReduceScatterKernel(d, v, w)
			}
		}
	}
	n[allGatherIndex(4)], n[allGatherIndex(1)] = kernels.AllGatherKernel(4), kernels.AllGatherKernel(1)
	return n
}()

// allReduceIndex is the index of the all-reduce kernel for dtype d, v words
// per thread and world size w.
func allReduceIndex(d kernels.Dtype, v, w int) int {
	return kAllReduce + arIndex(d, v, w)
}

// twoShotIndex is allReduceIndex for the two-shot kernels.
func twoShotIndex(d kernels.Dtype, v, w int) int {
	return kTwoShot + arIndex(d, v, w)
}

// reduceScatterIndex is allReduceIndex for the reduce-scatter kernels.
func reduceScatterIndex(d kernels.Dtype, v, w int) int {
	return kReduceScatter + arIndex(d, v, w)
}

// allGatherIndex is the all-gather kernel's index for v words per thread.
func allGatherIndex(v int) int {
	if v == 4 {
		return kAllGather
	}
	return kAllGather + 1
}

// arKernels is the size of each reducing family (all-reduce, two-shot,
// reduce-scatter): kernels.NumDtypes (3) dtypes × 2 vector widths × 4
// worlds (2, 4, 8, any).
const arKernels = kernels.NumDtypes * 8

func arIndex(d kernels.Dtype, v, w int) int {
	i := int(d) * 8
	if v != 4 {
		i += 4
	}
	switch w {
	case 2:
	case 4:
		i++
	case 8:
		i += 2
	default:
		i += 3
	}
	return i
}

// kernelState is a Manager's NVRTC and compiled kernels, opened on first use.
type kernelState struct {
	once   sync.Once
	loader *kernels.Loader
	err    error // why NVRTC cannot be used

	mu    sync.Mutex
	ready map[int]error // device -> nil when its module loaded, else why not
	slab  statusSlab    // the handles' status words
}

func (m *Manager) kernelLoader() (*kernels.Loader, error) {
	k := &m.kern
	k.once.Do(func() {
		open := m.cfg.OpenNVRTC
		if open == nil {
			open = func() (*kernels.NVRTC, error) { return kernels.Open(nil) }
		}
		n, err := open()
		if err != nil {
			k.err = err
			return
		}
		k.loader = kernels.NewLoader(n, kernels.SymmName, kernels.SymmSource, m.cfg.KernelCache)
		k.ready = map[int]error{}
	})
	return k.loader, k.err
}

// KernelsReady reports whether the signal kernels run on device dev of this
// manager's provider: nil when they do (compiled, or read from the disk
// cache, and loaded), else why not. The answer is kept per device.
func (m *Manager) KernelsReady(dev int) error {
	if _, ok := m.prov.(kernelDevice); !ok {
		return fmt.Errorf("%w: the %s backend has no device kernels", ErrNoKernels, m.prov.Name())
	}
	l, err := m.kernelLoader()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoKernels, err)
	}
	k := &m.kern
	k.mu.Lock()
	defer k.mu.Unlock()
	if err, ok := k.ready[dev]; ok {
		return err
	}
	_, err = l.Function(dev, kernels.Barrier)
	if err != nil {
		err = fmt.Errorf("%w on device %d: %w", ErrNoKernels, dev, err)
	}
	k.ready[dev] = err
	return err
}

// kernelStatus is a handle's kernel state: its function handles and its
// status word (8 bytes of host-mapped memory that its kernels launched
// without a timeout write a kernels.Report into, read by the watchdog). The
// word comes from the manager's slab on the handle's first kernel and goes
// back when the handle is released.
type kernelStatus struct {
	fns [numKernels]atomic.Uintptr

	once      sync.Once
	host, dev uintptr
	err       error
	watched   atomic.Bool // in the watchdog's set (changed under m.dog.mu)
}

// statusSlab hands out status words (16 bytes apart: the word, then a
// spare one, which a handle's push set-up uses as its ready word) from
// pages of pinned, mapped host memory (cuMemHostAlloc costs about a
// millisecond: once per 256 words, not once per handle or call). Portable
// pinned memory: one slab serves every device. Pages stay until the process
// exits.
type statusSlab struct {
	mu   sync.Mutex
	free [][2]uintptr // (host, device) of free words
}

const statusPage, statusPair = 4096, 16

func (s *statusSlab) get(prov Provider, dev int) (host, device uintptr, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) == 0 {
		alloc := cuda.HostAllocMapped
		if r, ok := prov.(kernelRunner); ok {
			alloc = r.HostMapped
		}
		h, d, err := alloc(dev, statusPage)
		if err != nil {
			return 0, 0, err
		}
		for off := uintptr(statusPage - statusPair); ; off -= statusPair {
			s.free = append(s.free, [2]uintptr{h + off, d + off})
			if off == 0 {
				break
			}
		}
	}
	w := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return w[0], w[1], nil
}

func (s *statusSlab) put(host, device uintptr) {
	s.mu.Lock()
	s.free = append(s.free, [2]uintptr{host, device})
	s.mu.Unlock()
}

// statusWord returns the device address of the handle's word.
func (h *Handle) statusWord() (uintptr, error) {
	s := &h.kstat
	s.once.Do(func() { s.host, s.dev, s.err = h.m.kern.slab.get(h.m.prov, h.b.Dev()) })
	return s.dev, s.err
}

// word views the status word at host address p (host-mapped memory outside
// Go's heap).
func word(p uintptr) *atomic.Uint64 {
	return (*atomic.Uint64)(*(*unsafe.Pointer)(unsafe.Pointer(&p)))
}

// freeStatus takes the handle out of the watchdog's set and gives its words
// back, cleared, when its block is freed. (A kernel still queued then could
// write into them; freeing a block with work still queued on it is the
// caller's error, as every use of freed memory is.)
func (h *Handle) freeStatus() error {
	w := &h.m.dog
	w.mu.Lock()
	delete(w.kernels, h)
	h.kstat.watched.Store(false)
	w.mu.Unlock()
	if h.kstat.host == 0 {
		return nil
	}
	word(h.kstat.host).Store(0)
	word(h.kstat.host + 8).Store(0) // the push set-up's ready word (push.go)
	h.m.kern.slab.put(h.kstat.host, h.kstat.dev)
	h.kstat.host, h.kstat.dev = 0, 0
	return nil
}

// function returns kernel id loaded on the handle's device.
func (h *Handle) function(id int) (uintptr, error) {
	if f := h.kstat.fns[id].Load(); f != 0 {
		return f, nil
	}
	f, err := h.m.kern.loader.Function(h.b.Dev(), kernelNames[id]) // KernelsReady has opened it
	if err != nil {
		return 0, err
	}
	h.kstat.fns[id].Store(f)
	return f, nil
}

// reportError words a kernel's report: which peer did not come, on which
// channel, after how long; or which meetings did not match.
func (h *Handle) reportError(r kernels.Report, after time.Duration) error {
	var what string
	switch r.Op {
	case kernels.OpMismatch:
		return h.mismatchError(r.Channel, r.Peer, r.Mine, r.Theirs)
	case kernels.OpStopped:
		return fmt.Errorf("%w: the meetings on channel %d of group %q (rank %d) stopped at an earlier failure on this rank "+
			"(a kernel queued before this one; the handle's first error says which)", ErrSignalTimeout, r.Channel, h.group, h.rank)
	case kernels.OpPushUnset:
		return fmt.Errorf("%w: push_all_reduce on group %q (rank %d): the workspace was not set up before the call "+
			"(its set-up ran on no stream ordered before it: calls on one workspace must be ordered)", ErrInvalid, h.group, h.rank)
	case kernels.OpPut:
		what = fmt.Sprintf("rank %d has not taken rank %d's previous signal on channel %d", r.Peer, h.rank, r.Channel)
	case kernels.OpWait:
		what = fmt.Sprintf("rank %d's signal on channel %d did not come", r.Peer, r.Channel)
	case kernels.OpReduceIn:
		what = fmt.Sprintf("rank %d did not arrive before the reads (channel %d)", r.Peer, r.Channel)
	case kernels.OpReduceOut:
		what = fmt.Sprintf("rank %d did not finish its reads (channel %d)", r.Peer, r.Channel)
	case kernels.OpPush:
		what = fmt.Sprintf("rank %d's data for push all-reduce call %d (mod 2^32) did not come", r.Peer, uint32(r.Channel))
	case kernels.OpPushInit:
		what = fmt.Sprintf("rank %d did not come to set the push all-reduce workspace up (its first call; signal-pad channel 0)", r.Peer)
	default:
		what = fmt.Sprintf("a wait on rank %d, channel %d, op %d", r.Peer, r.Channel, r.Op)
	}
	return fmt.Errorf("%w: %s within %v (group %q, rank %d; in-kernel timeout: the stream goes on)",
		ErrSignalTimeout, what, after, h.group, h.rank)
}

// kernelTimeout is the deadline given to a kernel: the call's, else the
// manager's (so that a lost peer never blocks a stream for good).
func (h *Handle) kernelTimeout(timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	return h.m.cfg.Timeout
}

// callDesc names a call in error messages, which are built only when needed.
type callDesc struct {
	kind          int // kBarrier, kPut, kWait, kAllReduce, kTwoShot, kReduceScatter, kAllGather, kPushInit, kPush or kPadReset
	peer, channel int
	count         uint64
	dtype         kernels.Dtype
}

func (h *Handle) describe(c callDesc) string {
	switch c.kind {
	case kBarrier:
		return fmt.Sprintf("barrier on channel %d of group %q (rank %d)", c.channel, h.group, h.rank)
	case kPut:
		return fmt.Sprintf("put_signal to rank %d on channel %d of group %q (rank %d)", c.peer, c.channel, h.group, h.rank)
	case kWait:
		return fmt.Sprintf("wait_signal from rank %d on channel %d of group %q (rank %d)", c.peer, c.channel, h.group, h.rank)
	case kPushInit:
		return fmt.Sprintf("push_all_reduce's workspace set-up on group %q (rank %d)", h.group, h.rank)
	case kPadReset:
		return fmt.Sprintf("the signal pad's reset kernel on group %q (rank %d)", h.group, h.rank)
	case kPush:
		return fmt.Sprintf("push_all_reduce of %d %s on group %q (rank %d)", c.count, c.dtype, h.group, h.rank)
	case kTwoShot:
		return fmt.Sprintf("two_shot_all_reduce of %d %s on group %q (rank %d)", c.count, c.dtype, h.group, h.rank)
	case kReduceScatter:
		return fmt.Sprintf("reduce_scatter of %d %s per rank on group %q (rank %d)", c.count, c.dtype, h.group, h.rank)
	case kAllGather:
		return fmt.Sprintf("all_gather of %d %s per rank on group %q (rank %d)", c.count, c.dtype, h.group, h.rank)
	}
	return fmt.Sprintf("one_shot_all_reduce of %d %s on group %q (rank %d)", c.count, c.dtype, h.group, h.rank)
}

// launch runs kernel id with words, whose last two are filled in here (the
// timeout in ns and the status word). Without a timeout it leaves the
// kernel to the watchdog; with one, it waits for the kernel and returns
// what it reported in a word of the call's own. It makes no Go allocation
// on success without a timeout.
func (h *Handle) launch(id int, grid, block uint32, stream uintptr, timeout time.Duration, words []uint64, c callDesc) error {
	f, err := h.function(id)
	if err != nil {
		return fmt.Errorf("%s: %w", h.describe(c), err)
	}
	dev := h.b.Dev()
	var (
		host, st, ready uintptr
		sm              streamMarker
	)
	if timeout > 0 {
		var ok bool
		if sm, ok = h.m.prov.(streamMarker); !ok {
			return fmt.Errorf("%s: the %s backend records no events to wait for a kernel with", h.describe(c), h.m.prov.Name())
		}
		host, st, err = h.m.kern.slab.get(h.m.prov, dev)
		if err == nil {
			// Passed when the stream reaches the kernel: work queued
			// before it is not the peer's delay.
			if ready, err = sm.Mark(dev, stream); err != nil {
				h.m.kern.slab.put(host, st)
				return fmt.Errorf("%s: recording the event before the kernel: %w", h.describe(c), err)
			}
		}
	} else {
		st, err = h.statusWord()
	}
	if err != nil {
		return fmt.Errorf("%s: the status word: %w", h.describe(c), err)
	}
	kt := h.kernelTimeout(timeout)
	n := len(words)
	words[n-2], words[n-1] = uint64(kt.Nanoseconds()), uint64(st)
	if err := h.launchWords(f, grid, block, stream, words); err != nil {
		if host != 0 {
			sm.Forget(dev, ready, false)
			h.m.kern.slab.put(host, st)
		}
		return fmt.Errorf("%s: %w", h.describe(c), err)
	}
	if timeout <= 0 {
		h.watchKernels()
		return nil
	}
	return h.awaitKernel(sm, stream, ready, timeout, host, st, c)
}

// pollSpin is how long a wait that polls an event yields the processor
// between polls (runtime.Gosched) before it sleeps: a kernel of a few
// microseconds is seen done within microseconds. A Go sleep of 10 µs can
// last a millisecond once the scheduler parks in epoll with millisecond
// granularity, which made every timed call a millisecond or more.
const pollSpin = 500 * time.Microsecond

// pollPause waits a little before the next poll of a wait that began at
// start: a yield during the first pollSpin, then 10 µs sleeps.
func pollPause(start time.Time) {
	if time.Since(start) < pollSpin {
		runtime.Gosched()
		return
	}
	time.Sleep(10 * time.Microsecond)
}

// awaitKernel waits for a kernel launched with a timeout on stream after
// event ready (sm's marker) and returns what it reported in the call's word
// (host, st: its host and device addresses); a report, or a kernel that
// cannot be waited for, fails the handle. It records an event right after
// the kernel and waits for that event, not for the stream: work queued
// after the kernel does not delay the call. The deadline (twice the timeout
// plus a second: the kernel itself gives up at the timeout) starts when
// ready has passed, so work queued before the kernel does not count
// against the peer. Earlier work still running after SYMM_TIMEOUT_MS (at
// least the deadline) gives ErrSignalTimeout without failing the handle:
// the kernel has not run, and the watchdog takes over its word and reads
// its report when the stream has passed it. The word goes back to the
// slab, cleared, once the stream is past the kernel (one that never
// finishes keeps it for good).
func (h *Handle) awaitKernel(sm streamMarker, stream, ready uintptr, timeout time.Duration, host, st uintptr, c callDesc) error {
	dev := h.b.Dev()
	fail := func(err error) error {
		h.fail(err)
		return err
	}
	done, err := sm.Mark(dev, stream)
	if err != nil {
		sm.Forget(dev, ready, false)
		return fail(fmt.Errorf("%s: recording the event after the kernel (its outcome cannot be read): %w", h.describe(c), err))
	}
	limit := 2*timeout + time.Second
	behind := max(h.m.cfg.Timeout, limit)
	start := time.Now()
	for {
		passed, err := sm.Passed(dev, ready)
		if err != nil {
			sm.Forget(dev, ready, false)
			sm.Forget(dev, done, false)
			return fail(fmt.Errorf("%s: %w", h.describe(c), err))
		}
		if passed {
			break
		}
		if time.Since(start) > behind {
			sm.Forget(dev, ready, false)
			h.m.watchTimedKernel(h, sm, dev, done, host, st, timeout, h.describe(c))
			return fmt.Errorf("%s: %w: the stream has not reached the kernel within %v: earlier work on it is still running "+
				"(no peer was waited for and the handle stays usable; the kernel stays queued, and a late peer it reports fails the handle then)",
				h.describe(c), ErrSignalTimeout, behind)
		}
		pollPause(start)
	}
	sm.Forget(dev, ready, true)
	reached := time.Now()
	deadline := reached.Add(limit)
	for {
		passed, err := sm.Passed(dev, done)
		if err != nil {
			sm.Forget(dev, done, false)
			return fail(fmt.Errorf("%s: %w", h.describe(c), err))
		}
		if passed {
			break
		}
		if time.Now().After(deadline) {
			sm.Forget(dev, done, false)
			return fail(fmt.Errorf("%s: %w: the kernel did not finish within %v of the stream reaching it",
				h.describe(c), ErrSignalTimeout, limit))
		}
		pollPause(reached)
	}
	sm.Forget(dev, done, true)
	r, ok := kernels.DecodeReport(word(host).Swap(0))
	h.m.kern.slab.put(host, st)
	if ok {
		return fail(fmt.Errorf("%s: %w", h.describe(c), h.reportError(r, timeout)))
	}
	return nil
}

// u32 is an int kernel parameter in a launch word.
func u32(v int) uint64 { return uint64(uint32(int32(v))) }

// kernelSignals runs a handle's signals as kernels (signals.go's
// signaler): each call checks the handle and its slot (kernelCheck), then
// launches one kernel.
type kernelSignals struct{ h *Handle }

func (s kernelSignals) put(dst, channel int, stream uintptr, timeout time.Duration) error {
	if err := s.h.kernelCheck(dst, channel); err != nil {
		return err
	}
	return s.h.kernelPut(dst, channel, stream, timeout)
}

func (s kernelSignals) wait(src, channel int, stream uintptr, timeout time.Duration) error {
	if err := s.h.kernelCheck(src, channel); err != nil {
		return err
	}
	return s.h.kernelWait(src, channel, stream, timeout)
}

// barrier in a world of one checks its channel and launches nothing.
func (s kernelSignals) barrier(channel int, stream uintptr, timeout time.Duration) error {
	h := s.h
	if err := h.kernelCheck(h.rank, channel); err != nil || h.world == 1 {
		return err
	}
	return h.kernelBarrier(channel, kernels.MeetBarrier, stream, timeout)
}

// kernelCheck refuses a kernel call on a failed handle, or whose peer or
// channel is out of range: slot (channel, our rank) of peer's pad must
// exist, for a wait as for a put (so a wait names a peer out of range
// "destination rank").
func (h *Handle) kernelCheck(peer, channel int) error {
	if err := h.failed(); err != nil {
		return err
	}
	_, err := h.slotAddr(peer, h.rank, channel)
	return err
}

// kernelBarrier launches the barrier kernel; meet is the kind of its
// meeting through the sync area (kernels.MeetBarrier, or MeetReset for
// ResetSignalPad's), so that a peer's other meeting there is caught.
func (h *Handle) kernelBarrier(channel, meet int, stream uintptr, timeout time.Duration) error {
	words := [...]uint64{uint64(h.PadPtrsDev()), uint64(h.epochsArg()), u32(h.rank), u32(h.world), u32(channel), u32(meet), 0, 0}
	return h.launch(kBarrier, 1, uint32((h.world+31)/32*32), stream, timeout, words[:], callDesc{kind: kBarrier, channel: channel})
}

func (h *Handle) kernelPut(dst, channel int, stream uintptr, timeout time.Duration) error {
	words := [...]uint64{uint64(h.PadPtrsDev()), u32(h.rank), u32(h.world), u32(dst), u32(channel), 0, 0}
	return h.launch(kPut, 1, 32, stream, timeout, words[:], callDesc{kind: kPut, peer: dst, channel: channel})
}

func (h *Handle) kernelWait(src, channel int, stream uintptr, timeout time.Duration) error {
	words := [...]uint64{uint64(h.PadPtrsDev()), u32(h.rank), u32(h.world), u32(src), u32(channel), 0, 0}
	return h.launch(kWait, 1, 32, stream, timeout, words[:], callDesc{kind: kWait, peer: src, channel: channel})
}
