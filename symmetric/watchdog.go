package symmetric

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/libsymm/libsymm/kernels"
)

// A signal on a GPU is a stream memory operation: the stream, not the host,
// waits for the peer's value, and a queued wait cannot be withdrawn or time
// out. So that a lost peer never just freezes a job, every put/wait/barrier
// queued with no explicit timeout is watched in the background for
// SYMM_TIMEOUT_MS: a marker (an event) is recorded after its operations, and
// if the marker has not been passed by the deadline the handle fails. From
// then on every call on the handle returns ErrSignalTimeout naming the
// group, rank, channel and peers, and the message is printed once to
// standard error. The stream itself stays blocked until the signal comes
// (or the process exits): writing the value ourselves would leave a stale
// signal that a later wait would take for a real one. A call with an
// explicit timeout_ms is watched in the calling thread instead, and fails
// at once.

// streamMarker is implemented by providers whose signals are stream
// operations (cuda, and nvshmem and nccl through it).
type streamMarker interface {
	Mark(dev int, stream uintptr) (uintptr, error)
	Passed(dev int, marker uintptr) (bool, error)
	// Forget is done with marker; passed says whether its stream got past it.
	Forget(dev int, marker uintptr, passed bool)
}

type pendingWatch struct {
	h        *Handle
	dev      int
	marker   uintptr
	deadline time.Time
	what     string
}

// timedKernel is a kernel launched with a timeout whose call stopped
// waiting before the stream reached it (awaitKernel): done is marked after
// it, host and st are the call's word.
type timedKernel struct {
	h        *Handle
	dev      int
	done     uintptr
	host, st uintptr
	timeout  time.Duration
	what     string
}

// watchdog polls the markers of a Manager's pending signals, the status
// words of handles whose kernels were launched without a timeout
// (kernelsig.go: those kernels give up at SYMM_TIMEOUT_MS by themselves and
// write a report, so they need no marker), and the words of timed kernels
// whose callers stopped waiting for earlier work (read once the stream has
// passed them; they have no deadline: the kernel's own bounds its wait).
type watchdog struct {
	mu      sync.Mutex
	pending []pendingWatch
	kernels map[*Handle]struct{}
	timed   []timedKernel
	running bool
}

// pollEvery bounds how long a passed marker stays pending (and how late a
// timeout is noticed).
const pollEvery = 2 * time.Millisecond

// watchAsync records a marker after what was just queued on stream and
// watches it for the Manager's timeout. Providers without stream signals
// (host: the caller itself waits, bounded) need none.
func (h *Handle) watchAsync(stream uintptr, what string) error {
	sm, ok := h.m.prov.(streamMarker)
	limit := h.m.cfg.Timeout
	if !ok || limit <= 0 {
		return nil
	}
	dev := h.b.Dev()
	mk, err := sm.Mark(dev, stream)
	if err != nil {
		return fmt.Errorf("%s: recording the watchdog's marker: %w", what, err)
	}
	w := &h.m.dog
	w.mu.Lock()
	w.pending = append(w.pending, pendingWatch{h: h, dev: dev, marker: mk, deadline: time.Now().Add(limit), what: what})
	if !w.running {
		w.running = true
		go h.m.runWatchdog(sm)
	}
	w.mu.Unlock()
	return nil
}

// watchKernels puts the handle in the watchdog's set (once: later calls
// only load a flag).
func (h *Handle) watchKernels() {
	if h.kstat.watched.Load() {
		return
	}
	w := &h.m.dog
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kernels == nil {
		w.kernels = map[*Handle]struct{}{}
	}
	w.kernels[h] = struct{}{}
	h.kstat.watched.Store(true)
	if !w.running {
		w.running = true
		go h.m.runWatchdog(h.m.prov.(streamMarker))
	}
}

// watchTimedKernel hands a timed kernel's word to the watchdog (see
// timedKernel).
func (m *Manager) watchTimedKernel(h *Handle, sm streamMarker, dev int, done, host, st uintptr, timeout time.Duration, what string) {
	w := &m.dog
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timed = append(w.timed, timedKernel{h: h, dev: dev, done: done, host: host, st: st, timeout: timeout, what: what})
	if !w.running {
		w.running = true
		go m.runWatchdog(sm)
	}
}

func (m *Manager) runWatchdog(sm streamMarker) {
	w := &m.dog
	for {
		time.Sleep(pollEvery)
		w.mu.Lock()
		if len(w.pending) == 0 && len(w.kernels) == 0 && len(w.timed) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		// Reports of kernels (read under mu: freeStatus takes a handle out
		// of the set, under mu, before its words go back to the slab).
		for h := range w.kernels {
			if r, ok := kernels.DecodeReport(word(h.kstat.host).Load()); ok {
				h.fail(fmt.Errorf("a signal kernel of group %q (rank %d): %w", h.group, h.rank, h.reportError(r, m.cfg.Timeout)))
				delete(w.kernels, h)
			}
		}
		list, timed := w.pending, w.timed
		w.pending, w.timed = nil, nil
		w.mu.Unlock()
		keepTimed := timed[:0]
		for _, k := range timed {
			passed, err := sm.Passed(k.dev, k.done)
			switch {
			case err != nil: // its word is kept for good
				k.h.fail(fmt.Errorf("%w: %s: the kernel cannot be watched: %v", ErrSignalTimeout, k.what, err))
				sm.Forget(k.dev, k.done, false)
			case passed:
				sm.Forget(k.dev, k.done, true)
				if r, ok := kernels.DecodeReport(word(k.host).Swap(0)); ok {
					k.h.fail(fmt.Errorf("%s: %w", k.what, k.h.reportError(r, k.timeout)))
				}
				m.kern.slab.put(k.host, k.st)
			default:
				keepTimed = append(keepTimed, k)
			}
		}
		now := time.Now()
		keep := list[:0]
		for _, x := range list {
			passed, err := sm.Passed(x.dev, x.marker)
			switch {
			case err == nil && passed:
				sm.Forget(x.dev, x.marker, true)
			case err != nil || now.After(x.deadline):
				cause := fmt.Sprintf("did not complete within %v (SYMM_TIMEOUT_MS); the stream stays blocked until the signal comes", m.cfg.Timeout)
				if err != nil {
					cause = fmt.Sprintf("cannot be watched: %v", err)
				}
				x.h.fail(fmt.Errorf("%w: %s %s", ErrSignalTimeout, x.what, cause))
				sm.Forget(x.dev, x.marker, false)
			default:
				keep = append(keep, x)
			}
		}
		w.mu.Lock()
		w.pending = append(keep, w.pending...)
		w.timed = append(keepTimed, w.timed...)
		w.mu.Unlock()
	}
}

// fail records the handle's first asynchronous failure and prints it once.
func (h *Handle) fail(err error) {
	if h.asyncErr.CompareAndSwap(nil, &err) {
		fmt.Fprintf(os.Stderr, "symm: %v\n", err)
	}
}

// failed returns the handle's asynchronous failure, if any.
func (h *Handle) failed() error {
	if p := h.asyncErr.Load(); p != nil {
		return *p
	}
	return nil
}
