package symmetric

import (
	"fmt"
	"os"
	"sync"
	"time"
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
	// check, when set, runs once the stream has passed the marker (a
	// kernel's report: kernelsig.go); its error fails the handle.
	check func() error
}

// watchdog polls the markers of a Manager's pending signals.
type watchdog struct {
	mu      sync.Mutex
	pending []pendingWatch
	running bool
}

// pollEvery bounds how long a passed marker stays pending (and how late a
// timeout is noticed).
const pollEvery = 2 * time.Millisecond

// watchAsync records a marker after what was just queued on stream and
// watches it for the Manager's timeout. Providers without stream signals
// (host: the caller itself waits, bounded) need none.
func (h *Handle) watchAsync(stream uintptr, what string) error {
	return h.watch(stream, what, h.m.cfg.Timeout, nil)
}

// watchKernel watches a signal kernel whose own deadline is kt: once the
// stream has passed it, a report in the status word fails the handle. The
// watchdog's deadline is later (kt plus a quarter, at least a second), so
// that the kernel's precise report comes first.
func (h *Handle) watchKernel(stream uintptr, what string, kt time.Duration) error {
	check := func() error {
		if r, ok := h.peekReport(); ok {
			return fmt.Errorf("%s: %w", what, h.reportError(r, kt))
		}
		return nil
	}
	return h.watch(stream, what, kt+max(kt/4, time.Second), check)
}

func (h *Handle) watch(stream uintptr, what string, limit time.Duration, check func() error) error {
	sm, ok := h.m.prov.(streamMarker)
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
	w.pending = append(w.pending, pendingWatch{h: h, dev: dev, marker: mk, deadline: time.Now().Add(limit), what: what, check: check})
	if !w.running {
		w.running = true
		go h.m.runWatchdog(sm)
	}
	w.mu.Unlock()
	return nil
}

func (m *Manager) runWatchdog(sm streamMarker) {
	w := &m.dog
	for {
		time.Sleep(pollEvery)
		w.mu.Lock()
		if len(w.pending) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		list := w.pending
		w.pending = nil
		w.mu.Unlock()
		now := time.Now()
		keep := list[:0]
		for _, x := range list {
			passed, err := sm.Passed(x.dev, x.marker)
			switch {
			case err == nil && passed:
				sm.Forget(x.dev, x.marker, true)
				if x.check != nil {
					if cerr := x.check(); cerr != nil {
						x.h.fail(cerr)
					}
				}
			case err != nil || now.After(x.deadline):
				cause := fmt.Sprintf("did not complete within %v (SYMM_TIMEOUT_MS); the stream stays blocked until the signal comes", m.cfg.Timeout)
				if x.check != nil {
					cause = "was not reached by its stream in time (earlier work on the stream is still running)"
				}
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
