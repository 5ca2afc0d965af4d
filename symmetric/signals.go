package symmetric

import (
	"errors"
	"fmt"
	"time"

	"github.com/libsymm/libsymm/kernels"
)

// Signals. A handle's signals run one of two ways, each a signaler:
// memopSignals, stream memory operations through the provider (atomics
// waited for by the caller on the host backend), or kernelSignals, one
// kernel launch per call (kernelsig.go). The public calls below hold the
// block, take the handle's signaler and hand it the call.
//
// Invariants:
//   - a handle's signaler is chosen on its first signal and kept (Handle.sig):
//     calls of one handle never mix the two ways on its pads;
//   - a barrier's channel is checked by Barrier, on every path and in a
//     world of one too (checkChannel, the one bound of a channel);
//   - each signaler checks the handle's failure and the call's other
//     arguments itself, as its path always did: the checks differ between
//     the paths (a barrier of stream operations checks every slot it
//     signals; a kernel checks its one call), and so do the errors;
//   - a put or a wait queued as a kernel without a timeout makes no Go heap
//     allocation: the signaler is an interface value stored once per
//     handle, and its methods call the launches directly (a method value
//     such as h.kernelPut would be allocated on every call); nor does one
//     queued as stream memory operations once the provider has idle events
//     (watchQueued's closure does not escape, and the call's description
//     is formatted only if the watchdog fails it).

// signaler runs a handle's signals. timeout 0 queues the call and leaves it
// to the watchdog (watchdog.go); a positive timeout makes the call wait for
// its outcome and fail with ErrSignalTimeout past it.
type signaler interface {
	put(dst, channel int, stream uintptr, timeout time.Duration) error
	wait(src, channel int, stream uintptr, timeout time.Duration) error
	barrier(channel int, stream uintptr, timeout time.Duration) error
}

// signals returns the handle's signaler, chosen on the first call. A
// failed choice (SYMM_SIGNALS=kernel where kernels cannot run) is not kept:
// every call tries again, and fails the same way (KernelsReady keeps its
// answer per device).
func (h *Handle) signals() (signaler, error) {
	if s := h.sig.Load(); s != nil {
		return *s, nil
	}
	s, err := h.chooseSignaler()
	if err != nil {
		return nil, err
	}
	// Calls racing the first choice choose alike; the first stored is kept.
	h.sig.CompareAndSwap(nil, &s)
	return *h.sig.Load(), nil
}

// chooseSignaler picks the handle's signal path: stream memory operations
// for providers without device kernels and with SYMM_SIGNALS=memop; else
// kernels when they run on the handle's device; where they do not, stream
// memory operations with "auto" and an error with "kernel".
func (h *Handle) chooseSignaler() (signaler, error) {
	if _, ok := h.m.prov.(kernelDevice); !ok || h.m.cfg.Signals == SignalsMemop {
		return memopSignals{h}, nil
	}
	if err := h.m.KernelsReady(h.b.Dev()); err != nil {
		if h.m.cfg.Signals == SignalsKernel {
			return nil, fmt.Errorf("SYMM_SIGNALS=kernel: %w", err)
		}
		return memopSignals{h}, nil
	}
	return kernelSignals{h}, nil
}

// PutSignal sets our slot of channel in rank dst's pad, in stream order,
// once dst has consumed our previous signal on it (the slot is 0 again), so
// that back-to-back signals are never merged into one.
func (h *Handle) PutSignal(dst, channel int, stream uintptr, timeout time.Duration) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	s, err := h.signals()
	if err != nil {
		return err
	}
	return s.put(dst, channel, stream, timeout)
}

// WaitSignal waits for rank src's signal on channel and resets the slot.
func (h *Handle) WaitSignal(src, channel int, stream uintptr, timeout time.Duration) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	s, err := h.signals()
	if err != nil {
		return err
	}
	return s.wait(src, channel, stream, timeout)
}

// Barrier signals every peer on channel and waits for every peer's signal.
// A bad channel is refused first (in a world of one too, where there is no
// peer to signal), then a failed handle, before a signaler is chosen.
func (h *Handle) Barrier(channel int, stream uintptr, timeout time.Duration) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	if err := h.checkChannel(channel); err != nil {
		return err
	}
	if err := h.failed(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	s, err := h.signals()
	if err != nil {
		return err
	}
	return s.barrier(channel, stream, timeout)
}

// slotAddr is the address of slot (channel, src) in rank dst's pad.
func (h *Handle) slotAddr(dst, src, channel int) (uintptr, error) {
	switch {
	case dst < 0 || dst >= h.world:
		return 0, fmt.Errorf("%w: destination rank %d outside [0, %d)", ErrInvalid, dst, h.world)
	case src < 0 || src >= h.world:
		return 0, fmt.Errorf("%w: source rank %d outside [0, %d)", ErrInvalid, src, h.world)
	}
	if err := h.checkChannel(channel); err != nil {
		return 0, err
	}
	return h.PadPtr(dst) + uintptr(4*(channel*h.world+src)), nil
}

// checkChannel refuses a channel whose slots (channel × world + src, for
// every rank src) do not all fit in the signal pad: the channels of a world
// are [0, SignalPadSize/4/world).
func (h *Handle) checkChannel(channel int) error {
	if n := padChannels(h.world); channel < 0 || channel >= n {
		return fmt.Errorf("%w: channel %d outside [0, %d) for world size %d", ErrInvalid, channel, n, h.world)
	}
	return nil
}

// memopSignals runs a handle's signals as the provider's stream memory
// operations: a put or a wait is one operation, a barrier 2 × (world − 1).
// Calls queued without a timeout are handed to the watchdog (watchQueued),
// which fails the handle if the stream has not passed them within
// SYMM_TIMEOUT_MS of reaching them.
type memopSignals struct{ h *Handle }

func (s memopSignals) put(dst, channel int, stream uintptr, timeout time.Duration) error {
	h := s.h
	if timeout > 0 {
		return h.putSignal(dst, channel, stream, timeout)
	}
	if err := h.failed(); err != nil {
		return err
	}
	return h.watchQueued(stream, callDesc{kind: kPut, peer: dst, channel: channel}, func() error {
		return h.putSignal(dst, channel, stream, 0)
	})
}

func (s memopSignals) wait(src, channel int, stream uintptr, timeout time.Duration) error {
	h := s.h
	if timeout > 0 {
		return h.waitSignal(src, channel, stream, timeout)
	}
	if err := h.failed(); err != nil {
		return err
	}
	return h.watchQueued(stream, callDesc{kind: kWait, peer: src, channel: channel}, func() error {
		return h.waitSignal(src, channel, stream, 0)
	})
}

// barrier of a handle that meets through the sync area on the host
// (hostMeets) is a meeting there, as the kernels' barrier is.
func (s memopSignals) barrier(channel int, stream uintptr, timeout time.Duration) error {
	h := s.h
	if h.hostMeets() {
		if err := h.hostMeet(channel, kernels.MeetBarrier, h.hostBound(timeout)); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
		return nil
	}
	if timeout > 0 || h.world == 1 {
		if err := h.signalPeers(channel, stream, timeout); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
		return nil
	}
	return h.watchQueued(stream, callDesc{kind: kBarrier, channel: channel}, func() error {
		if err := h.signalPeers(channel, stream, 0); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
		return nil
	})
}

// hostBound turns "no timeout" into the manager's timeout for providers
// whose signals are not stream operations (not a streamMarker: the host
// backend's atomics): there a signal is waited for by the calling thread,
// not queued on a stream, so waiting for ever would hang the caller.
func (h *Handle) hostBound(timeout time.Duration) time.Duration {
	if _, queued := h.m.prov.(streamMarker); timeout <= 0 && !queued {
		return h.m.cfg.Timeout
	}
	return timeout
}

// putSignal queues one put as a stream memory operation; the handle's
// failure and the call's arguments are checked first, on every call (the
// host all-reduce's signalPeers relies on it).
func (h *Handle) putSignal(dst, channel int, stream uintptr, timeout time.Duration) error {
	if err := h.failed(); err != nil {
		return err
	}
	timeout = h.hostBound(timeout)
	a, err := h.slotAddr(dst, h.rank, channel)
	if err != nil {
		return err
	}
	if err := h.streamSignal(true, stream, a, timeout); err != nil {
		if peerLate(err) {
			return fmt.Errorf("put_signal to rank %d on channel %d of group %q (rank %d): rank %d has not taken our previous signal: %w",
				dst, channel, h.group, h.rank, dst, err)
		}
		return fmt.Errorf("put_signal to rank %d on channel %d of group %q (rank %d): %w", dst, channel, h.group, h.rank, err)
	}
	return nil
}

// waitSignal queues one wait as a stream memory operation, checked as
// putSignal is.
func (h *Handle) waitSignal(src, channel int, stream uintptr, timeout time.Duration) error {
	if err := h.failed(); err != nil {
		return err
	}
	timeout = h.hostBound(timeout)
	a, err := h.slotAddr(h.rank, src, channel)
	if err != nil {
		return err
	}
	if err := h.streamSignal(false, stream, a, timeout); err != nil {
		return fmt.Errorf("wait_signal from rank %d on channel %d of group %q (rank %d): %w", src, channel, h.group, h.rank, err)
	}
	return nil
}

// earlierWorkError is the ErrSignalTimeout of a timed put or wait whose
// stream did not reach its operations in time: work queued before them
// still held the stream, and no peer was waited for.
type earlierWorkError struct {
	op     string // "put" or "wait"
	within time.Duration
}

func (e *earlierWorkError) Error() string {
	return fmt.Sprintf("%v: the stream has not reached the %s within %v: earlier work on it is still running "+
		"(no peer was waited for; the %s stays queued and runs once that work is done)", ErrSignalTimeout, e.op, e.within, e.op)
}

func (e *earlierWorkError) Unwrap() error { return ErrSignalTimeout }

// peerLate reports whether err is a signal timeout in which a peer was
// waited for (not one behind earlier work).
func peerLate(err error) bool {
	var ew *earlierWorkError
	return errors.Is(err, ErrSignalTimeout) && !errors.As(err, &ew)
}

// queueSignal hands a put (put) or a wait at slot a to the provider.
func queueSignal(prov Provider, put bool, dev int, stream, a uintptr, timeout time.Duration) error {
	if put {
		return prov.PutSignal(dev, stream, a, timeout)
	}
	return prov.WaitSignal(dev, stream, a, timeout)
}

// streamSignal runs a put (put) or a wait at slot a on stream through the
// provider. A provider whose signals are stream operations (a streamMarker:
// cuda, and nvshmem and nccl through it) only queues them; with a timeout
// the call then waits for its own operations, never for the whole stream:
// an event is recorded before them and one after, the call waits for the
// one after, and its timeout starts when the one before has passed. Work
// queued after the operations (by this thread later, or by another) is not
// the peer's delay, and neither is work queued before them. A peer late
// past the timeout gives ErrSignalTimeout; the stream stays blocked until
// its signal comes (a queued stream wait cannot be withdrawn). Earlier work
// that holds the stream for longer than SYMM_TIMEOUT_MS (and at least the
// timeout) gives an *earlierWorkError (ErrSignalTimeout too) saying so; the
// operations stay queued. Neither fails the handle: the queued operations
// still take the late signal themselves, in order. (Work another thread
// queues between the two events counts as the operations' own; the API
// cannot exclude that.) Other providers (host) wait themselves, bounded by
// the timeout. Without a timeout nothing is recorded, waited for or
// allocated here.
func (h *Handle) streamSignal(put bool, stream, a uintptr, timeout time.Duration) error {
	prov, dev := h.m.prov, h.b.Dev()
	sm, ok := prov.(streamMarker)
	if timeout <= 0 || !ok {
		return queueSignal(prov, put, dev, stream, a, timeout)
	}
	op := "wait"
	if put {
		op = "put"
	}
	// Passed when the stream reaches the operations.
	ready, err := sm.Mark(dev, stream)
	if err != nil {
		return fmt.Errorf("recording the event before the %s: %w", op, err)
	}
	if err := queueSignal(prov, put, dev, stream, a, 0); err != nil {
		sm.Forget(dev, ready, false)
		return err
	}
	done, err := sm.Mark(dev, stream)
	if err != nil {
		sm.Forget(dev, ready, false)
		return fmt.Errorf("recording the event after the %s (it is queued, but cannot be waited for): %w", op, err)
	}
	forget := func(passed bool) {
		sm.Forget(dev, ready, passed)
		sm.Forget(dev, done, passed)
	}
	behind := max(h.m.cfg.Timeout, timeout)
	start := time.Now()
	var (
		reached  bool
		deadline time.Time
	)
	for {
		passed, err := sm.Passed(dev, done)
		if err != nil {
			forget(false)
			return fmt.Errorf("waiting for the %s: %w", op, err)
		}
		if passed {
			forget(true)
			return nil
		}
		if !reached {
			if reached, err = sm.Passed(dev, ready); err != nil {
				forget(false)
				return fmt.Errorf("waiting for the stream to reach the %s: %w", op, err)
			}
			if reached {
				deadline = time.Now().Add(timeout)
			} else if time.Since(start) > behind {
				forget(false)
				return &earlierWorkError{op: op, within: behind}
			}
		} else if time.Now().After(deadline) {
			sm.Forget(dev, ready, true)
			sm.Forget(dev, done, false)
			return fmt.Errorf("%w: the %s did not complete within %v of the stream reaching it (the stream stays blocked until the signal comes)",
				ErrSignalTimeout, op, timeout)
		}
		pollPause(start)
	}
}

// signalPeers signals every peer on channel, then waits for each (a barrier
// of stream memory operations; the host all-reduce's synchronization).
func (h *Handle) signalPeers(channel int, stream uintptr, timeout time.Duration) error {
	for r := 0; r < h.world; r++ {
		if r != h.rank {
			if err := h.putSignal(r, channel, stream, timeout); err != nil {
				return err
			}
		}
	}
	for r := 0; r < h.world; r++ {
		if r != h.rank {
			if err := h.waitSignal(r, channel, stream, timeout); err != nil {
				return err
			}
		}
	}
	return nil
}
