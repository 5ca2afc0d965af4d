package symmetric

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/kernels"
)

// Signals as kernels (issue 15). On GPUs a put, a wait and a barrier are one
// kernel launch each (kernels/symm.cu) instead of 2 × (world − 1) stream
// memory operations, and every wait inside them has a deadline: past it the
// kernel writes a report into the handle's status word, in host-mapped
// memory, and returns, so the stream goes on. A call with timeout_ms waits
// for its stream and turns a report into ErrSignalTimeout naming the peer
// and channel; a call without one is watched by the watchdog, which reads
// the word once the stream has passed the kernel (the kernel's deadline is
// then SYMM_TIMEOUT_MS).
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

// kernelState is a Manager's NVRTC and compiled kernels, opened on first use.
type kernelState struct {
	once   sync.Once
	loader *kernels.Loader
	err    error // why NVRTC cannot be used

	mu    sync.Mutex
	ready map[int]error // device -> nil when its module loaded, else why not
	fns   sync.Map      // kernelKey -> function handle
}

type kernelKey struct {
	dev  int
	name string
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

// function returns a loaded kernel (KernelsReady(dev) must have passed).
func (m *Manager) function(dev int, name string) (uintptr, error) {
	key := kernelKey{dev, name}
	if f, ok := m.kern.fns.Load(key); ok {
		return f.(uintptr), nil
	}
	f, err := m.kern.loader.Function(dev, name)
	if err != nil {
		return 0, err
	}
	m.kern.fns.Store(key, f)
	return f, nil
}

// useKernels says whether this handle's signals run as kernels: false for
// providers without device kernels and with SYMM_SIGNALS=memop; with
// "auto", false when the kernels cannot run; with "kernel", an error then.
func (h *Handle) useKernels() (bool, error) {
	if _, ok := h.m.prov.(kernelDevice); !ok || h.m.cfg.Signals == SignalsMemop {
		return false, nil
	}
	if err := h.m.KernelsReady(h.b.Dev()); err != nil {
		if h.m.cfg.Signals == SignalsKernel {
			return false, fmt.Errorf("SYMM_SIGNALS=kernel: %w", err)
		}
		return false, nil
	}
	return true, nil
}

// kernelStatus is a handle's status word: 8 bytes of host-mapped memory
// that its kernels write a kernels.Report into.
type kernelStatus struct {
	once      sync.Once
	host, dev uintptr
	err       error
}

func (h *Handle) statusWord() (uintptr, error) {
	s := &h.kstat
	s.once.Do(func() { s.host, s.dev, s.err = cuda.HostAllocMapped(h.b.Dev(), 64) })
	return s.dev, s.err
}

// word views the status word (host-mapped memory outside Go's heap).
func (s *kernelStatus) word() *atomic.Uint64 {
	return (*atomic.Uint64)(*(*unsafe.Pointer)(unsafe.Pointer(&s.host)))
}

// takeReport reads and clears the status word.
func (h *Handle) takeReport() (kernels.Report, bool) {
	if h.kstat.host == 0 {
		return kernels.Report{}, false
	}
	return kernels.DecodeReport(h.kstat.word().Swap(0))
}

// peekReport reads the status word and leaves it (the watchdog: the handle
// fails for good, and every later call reports it).
func (h *Handle) peekReport() (kernels.Report, bool) {
	if h.kstat.host == 0 {
		return kernels.Report{}, false
	}
	return kernels.DecodeReport(h.kstat.word().Load())
}

func (h *Handle) freeStatus() error {
	if h.kstat.host == 0 {
		return nil
	}
	err := cuda.HostFree(h.b.Dev(), h.kstat.host)
	h.kstat.host, h.kstat.dev = 0, 0
	return err
}

// reportError words a kernel's report: which peer did not come, on which
// channel, after how long.
func (h *Handle) reportError(r kernels.Report, after time.Duration) error {
	var what string
	switch r.Op {
	case kernels.OpPut:
		what = fmt.Sprintf("rank %d has not taken rank %d's previous signal on channel %d", r.Peer, h.rank, r.Channel)
	case kernels.OpWait:
		what = fmt.Sprintf("rank %d's signal on channel %d did not come", r.Peer, r.Channel)
	case kernels.OpReduceIn:
		what = fmt.Sprintf("rank %d did not arrive before the reads (channel %d)", r.Peer, r.Channel)
	case kernels.OpReduceOut:
		what = fmt.Sprintf("rank %d did not finish its reads (channel %d)", r.Peer, r.Channel)
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

// launchSignal launches one of the signal kernels and, with a timeout,
// waits for it; without one, leaves it to the watchdog.
func (h *Handle) launchSignal(name string, grid, block cuda.Dim3, stream uintptr, timeout time.Duration, what string, args ...any) error {
	dev := h.b.Dev()
	st, err := h.statusWord()
	if err != nil {
		return fmt.Errorf("%s: the status word: %w", what, err)
	}
	f, err := h.m.function(dev, name)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	kt := h.kernelTimeout(timeout)
	args = append(args, uint64(kt.Nanoseconds()), st)
	if err := cuda.Launch(dev, f, grid, block, 0, stream, args...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return h.finishKernel(stream, timeout, kt, what)
}

// finishKernel waits for a kernel with an explicit timeout (the stream must
// get past it within twice the timeout plus a second: the kernel itself
// gives up at the timeout, earlier work on the stream may delay it) and
// reports what it wrote; without one, hands it to the watchdog.
func (h *Handle) finishKernel(stream uintptr, timeout, kt time.Duration, what string) error {
	if timeout <= 0 {
		return h.watchKernel(stream, what, kt)
	}
	dev := h.b.Dev()
	deadline := time.Now().Add(2*timeout + time.Second)
	for {
		done, err := cuda.StreamQuery(dev, stream)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w: the stream did not get past the kernel within %v (earlier work on it is still running)",
				what, ErrSignalTimeout, 2*timeout+time.Second)
		}
		time.Sleep(10 * time.Microsecond)
	}
	if r, ok := h.takeReport(); ok {
		return fmt.Errorf("%s: %w", what, h.reportError(r, kt))
	}
	return nil
}

func (h *Handle) kernelBarrier(channel int, stream uintptr, timeout time.Duration) error {
	what := fmt.Sprintf("barrier on channel %d of group %q (rank %d)", channel, h.group, h.rank)
	threads := uint32((h.world + 31) / 32 * 32)
	return h.launchSignal(kernels.Barrier, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, stream, timeout, what,
		h.PadPtrsDev(), int32(h.rank), int32(h.world), int32(channel))
}

func (h *Handle) kernelPut(dst, channel int, stream uintptr, timeout time.Duration) error {
	what := fmt.Sprintf("put_signal to rank %d on channel %d of group %q (rank %d)", dst, channel, h.group, h.rank)
	return h.launchSignal(kernels.PutSignal, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, stream, timeout, what,
		h.PadPtrsDev(), int32(h.rank), int32(h.world), int32(dst), int32(channel))
}

func (h *Handle) kernelWait(src, channel int, stream uintptr, timeout time.Duration) error {
	what := fmt.Sprintf("wait_signal from rank %d on channel %d of group %q (rank %d)", src, channel, h.group, h.rank)
	return h.launchSignal(kernels.WaitSignal, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, stream, timeout, what,
		h.PadPtrsDev(), int32(h.rank), int32(h.world), int32(src), int32(channel))
}
