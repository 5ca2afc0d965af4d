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
// SYMM_TIMEOUT_MS: a marker (an event) is recorded before its operations and
// one after them; the clock starts when the stream has passed the first
// (reached the operations: work queued before them is not a late peer), and
// if the second has not been passed SYMM_TIMEOUT_MS later the handle fails
// (work queued after the operations is never waited for). From then on
// every call on the handle returns ErrSignalTimeout naming the group, rank,
// channel and peers, and the message is printed once to standard error. The
// stream itself stays blocked until the signal comes (or the process
// exits): writing the value ourselves would leave a stale signal that a
// later wait would take for a real one. Earlier work that never lets the
// stream reach the operations fails nothing: no peer was waited for (the
// watch stays until the stream gets there). A call with an explicit
// timeout_ms is watched in the calling thread instead (streamSignal).

// streamMarker is implemented by providers whose signals are stream
// operations (cuda, and nvshmem and nccl through it).
type streamMarker interface {
	Mark(dev int, stream uintptr) (uintptr, error)
	Passed(dev int, marker uintptr) (bool, error)
	// Forget is done with marker; passed says whether its stream got past it.
	Forget(dev int, marker uintptr, passed bool)
}

// pendingWatch is an untimed call's operations (watchQueued): ready is
// marked before them, marker after them; deadline is set once the watchdog
// has seen ready passed (reached). The call's description is built only if
// it fails.
type pendingWatch struct {
	h        *Handle
	dev      int
	ready    uintptr
	marker   uintptr
	reached  bool
	deadline time.Time
	call     callDesc
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

// watchQueued queues an untimed call's operations on stream (queue) and
// hands them to the watchdog (see the top of this file): a marker is
// recorded before them and one after them. Providers without stream signals
// (host: the caller itself waits, bounded), or a manager without a timeout,
// only queue. It makes no Go heap allocation once the provider has idle
// markers (queue does not escape, and the description c is formatted only
// on failure).
func (h *Handle) watchQueued(stream uintptr, c callDesc, queue func() error) error {
	sm, ok := h.m.prov.(streamMarker)
	if !ok || h.m.cfg.Timeout <= 0 {
		return queue()
	}
	dev := h.b.Dev()
	ready, err := sm.Mark(dev, stream)
	if err != nil {
		return fmt.Errorf("%s: recording the watchdog's marker before it (nothing was queued): %w", h.watchedCall(c), err)
	}
	if err := queue(); err != nil {
		sm.Forget(dev, ready, false)
		return err
	}
	done, err := sm.Mark(dev, stream)
	if err != nil {
		sm.Forget(dev, ready, false)
		return fmt.Errorf("%s: recording the watchdog's marker (the operations are queued but not watched): %w", h.watchedCall(c), err)
	}
	w := &h.m.dog
	w.mu.Lock()
	w.pending = append(w.pending, pendingWatch{h: h, dev: dev, ready: ready, marker: done, call: c})
	if !w.running {
		w.running = true
		go h.m.runWatchdog(sm)
	}
	w.mu.Unlock()
	return nil
}

// watchedCall names a watched call in its failure (a barrier: with the
// peers it signals and waits for).
func (h *Handle) watchedCall(c callDesc) string {
	if c.kind != kBarrier {
		return h.describe(c)
	}
	peers := make([]int, 0, h.world-1)
	for r := 0; r < h.world; r++ {
		if r != h.rank {
			peers = append(peers, r)
		}
	}
	return fmt.Sprintf("%s: a signal from or to rank(s) %v", h.describe(c), peers)
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
			if err == nil && passed {
				if !x.reached {
					sm.Forget(x.dev, x.ready, true)
				}
				sm.Forget(x.dev, x.marker, true)
				continue
			}
			if err == nil && !x.reached {
				// The clock starts when the stream reaches the operations.
				if x.reached, err = sm.Passed(x.dev, x.ready); err == nil {
					if !x.reached {
						keep = append(keep, x) // earlier work still holds the stream
						continue
					}
					sm.Forget(x.dev, x.ready, true)
					x.deadline = now.Add(m.cfg.Timeout)
				}
			}
			if err == nil && !now.After(x.deadline) {
				keep = append(keep, x)
				continue
			}
			cause := fmt.Sprintf("did not complete within %v (SYMM_TIMEOUT_MS) of the stream reaching it; the stream stays blocked until the signal comes", m.cfg.Timeout)
			if err != nil {
				cause = fmt.Sprintf("cannot be watched: %v", err)
			}
			x.h.fail(fmt.Errorf("%w: %s %s", ErrSignalTimeout, x.h.watchedCall(x.call), cause))
			if !x.reached {
				sm.Forget(x.dev, x.ready, false)
			}
			sm.Forget(x.dev, x.marker, false)
		}
		w.mu.Lock()
		w.pending = append(keep, w.pending...)
		w.timed = append(keepTimed, w.timed...)
		w.mu.Unlock()
	}
}

// fail records the handle's first asynchronous failure and prints it once,
// and withdraws the handle's launch plan: its later calls go through Go,
// which returns the failure.
func (h *Handle) fail(err error) {
	if h.asyncErr.CompareAndSwap(nil, &err) {
		fmt.Fprintf(os.Stderr, "symm: %v\n", err)
		h.retirePlan()
	}
}

// failed returns the handle's asynchronous failure, if any.
func (h *Handle) failed() error {
	if p := h.asyncErr.Load(); p != nil {
		return *p
	}
	return nil
}
