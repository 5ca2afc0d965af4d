package symmetric

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// Resetting a handle's signal pad. A block that a caching allocator
// (PyTorch's MemPool) hands out again keeps its handles, and its pad keeps
// what the last user left there: a slot set by a put that nobody waited
// for lets the next wait on it pass early, a slot left at 1 makes the next
// put wait for ever. ResetSignalPad starts the handle's signals over on
// every rank of its group at once:
//
//  1. each rank waits for the work queued on its device (Quiescer): none of
//     its signals to a peer is still on the way;
//  2. the ranks agree ("quiet"): from here no peer can be signalling into
//     any pad of the group;
//  3. each rank zeroes its own signal pad and, when the group meets through
//     the block's sync area (Handle.epochSync), that area and its own epoch
//     counts, so that the group's next meeting is its first on every rank
//     (zeroing one without the other would let a meeting pass early);
//  4. the ranks agree ("zeroed"): no rank signals into a pad that is not
//     clean yet.
//
// A rank that fails a step, or does not come by the timeout, fails every
// rank, which names it (handshake.agree). On GPUs, a group that meets
// through its block's sync area agrees by the meetings of one kernel instead
// (resetOnDevice), with no store round trip. Which way is agreed at the
// rendezvous (Handle.resetOnGPU): kernel barriers only where the kernels
// run on every rank's device, since a rank that took the store's way would
// never meet the others' barriers, and the two ways leave the sync area
// in different states (zeroed, or met twice more). A rank that resets while
// its peers do not meets their next collective with barriers of kind
// MeetReset, which they refuse (ErrMeetingMismatch), on GPUs as on the
// host (where the reset waits in the store for peers that do not come).
// Every rank of the group calls it,
// in the same order per group (the keys are numbered per group, as
// rendezvous' are), with no call of the handle's signals or collectives
// under way.

// ResetSignalPad zeroes this rank's signal pad of h's block, once no peer
// can still be signalling into it, and returns once every rank of h's
// group has done the same (the steps above). timeout bounds each wait for
// the peers (0: the manager's, SYMM_TIMEOUT_MS).
func (h *Handle) ResetSignalPad(timeout time.Duration) error {
	_, err := h.resetSignalPad(timeout, nil)
	return err
}

// ResetSignalPadIfAny is ResetSignalPad decided by every rank together:
// each says whether it wants the reset (want), over the group's link, and
// if any does, every rank resets (and reports true); else none does. A
// caller that decides from what only it can see (PyTorch: whether the
// tensors it rendezvoused on the block are still alive, which a reference
// cycle can delay on one rank) calls it on every rank where any might want
// a reset, so that no rank resets alone: a reset decided by one rank would
// meet a peer's next collective (ErrMeetingMismatch at best).
func (h *Handle) ResetSignalPadIfAny(want bool, timeout time.Duration) (bool, error) {
	return h.resetSignalPad(timeout, &want)
}

// resetSignalPad runs ResetSignalPad, first agreeing on it when want is
// not nil.
func (h *Handle) resetSignalPad(timeout time.Duration, want *bool) (reset bool, err error) {
	release, err := h.Acquire()
	if err != nil {
		return false, err
	}
	defer release()
	defer func() {
		if err != nil {
			err = fmt.Errorf("resetting the signal pad of group %q (rank %d of %d): %w", h.group, h.rank, h.world, err)
		}
	}()
	if timeout <= 0 {
		timeout = h.m.cfg.Timeout
	}
	if h.resetOnGPU && want == nil {
		return true, h.resetOnDevice(timeout)
	}
	g := Group{Name: h.group, Rank: h.rank, World: h.world, Store: h.store}
	r := &handshake{m: h.m, b: h.b, g: g, kind: kindPadReset,
		deadline: time.Now().Add(timeout), tr: newTracer(false, g), metas: h.metas, h: h}
	if r.ln, _, err = h.m.linkFor(g, r.deadline); err != nil {
		return false, err
	}
	r.seq = h.m.nextSeq(h.group, kindPadReset) // under the link's lock
	endHandshake := sync.OnceFunc(func() { r.end(); r.ln.mu.Unlock() })
	defer endHandshake()
	if want != nil {
		if reset, err = r.anyWants(*want); err != nil || !reset {
			return false, err
		}
	}
	if h.resetOnGPU { // the kernels' barriers agree from here, not the link
		endHandshake()
		return true, h.resetOnDevice(timeout)
	}
	if err = r.agree("quiet", h.quiesce()); err == nil {
		err = r.agree("zeroed", h.zeroSignals())
	}
	return err == nil, err
}

// anyWants all-gathers each rank's wish for a reset and reports whether
// any rank wants one: every rank gets the same answer, or every rank fails.
func (r *handshake) anyWants(want bool) (bool, error) {
	notes, err := r.gather("want", note{Want: want}, nil, nil)
	if err != nil {
		if !errors.Is(err, ErrPeerFailed) {
			r.tellFailure(err)
		}
		return false, fmt.Errorf("agreeing on whether to reset: %w", err)
	}
	for _, n := range notes {
		want = want || n.Want
	}
	return want, nil
}

// resetOnDevice is ResetSignalPad for a group that meets through its
// block's sync area on GPUs: one kernel (kernels.PadReset) agrees, zeroes
// and agrees again, meeting through the sync area (one store per peer over
// NVLink, a few microseconds), which the reset never touches; the store is
// not used. Step by step:
//
//  1. quiesce: every stream of this device is idle;
//  2. the kernel meets every peer on channel 0: when it passes here, every
//     peer has reached it on its GPU, after its own step 1, so no signal of
//     a peer is on the way into this rank's pad;
//  3. it zeroes this rank's signal pad (the sync area and the epoch counts
//     stay: the meetings never need a reset, every rank having met as
//     often);
//  4. it meets every peer again: every rank's pad is clean before any
//     returns;
//  5. the host waits for the kernel (one wait, with the timeout).
//
// A peer that does not come fails the handle, as a barrier's timeout does.
func (h *Handle) resetOnDevice(timeout time.Duration) error {
	if err := h.quiesce(); err != nil {
		return err
	}
	words := [...]uint64{uint64(h.PadPtrsDev()), uint64(h.epochsArg()), u32(h.rank), u32(h.world), 0, 0}
	threads := uint32(max((h.world+31)/32*32, 128)) // a thread per peer; the pad's 512 slots zeroed 4 at a time
	if err := h.launch(kPadReset, 1, threads, 0, timeout, words[:], callDesc{kind: kPadReset}); err != nil {
		return fmt.Errorf("the reset kernel (meet, zero, meet): %w", err)
	}
	return nil
}

// kernelsForReset is what this rank publishes at a rendezvous of b
// (meta.Kernels): whether it could reset the pad by kernel barriers, i.e.
// the provider runs device kernels, the block's sync area is free (only its
// owner group meets there) and the kernels run on the block's device.
// KernelsReady keeps its answer per device: only a device's first
// rendezvous compiles (or reads from the disk cache) and loads them. b.mu
// is held.
func (m *Manager) kernelsForReset(b *Block) bool {
	if _, ok := m.prov.(kernelDevice); !ok || b.syncOwner != "" {
		return false
	}
	return m.KernelsReady(b.Dev()) == nil
}

// quiesce waits for the work queued on the handle's device.
func (h *Handle) quiesce() error {
	if q, ok := h.m.prov.(Quiescer); ok {
		if err := q.Quiesce(h.b.Dev()); err != nil {
			return fmt.Errorf("waiting for device %d: %w", h.b.Dev(), err)
		}
	}
	return nil
}

// zeroSignals zeroes this rank's signal pad, and the block's sync area with
// the handle's epoch counts when the group meets there.
func (h *Handle) zeroSignals() error {
	n := uint64(SignalPadSize)
	if h.epochSync {
		n += SyncAreaSize // it follows the pad
	}
	if err := h.zero(h.b.PadPtr(), n, true); err != nil {
		return fmt.Errorf("zeroing the signal pad: %w", err)
	}
	if h.epochSync {
		if err := h.zero(h.epochsArg(), 8*epochWords, h.freeDev != nil); err != nil {
			return fmt.Errorf("zeroing the epoch counts: %w", err)
		}
	}
	return nil
}

// zero clears n bytes at ptr: through the provider (Zeroer) when ptr is
// memory it made (made: a block, or the device arrays of DeviceArrays),
// else in place (host memory: memfd blocks, host arrays).
func (h *Handle) zero(ptr uintptr, n uint64, made bool) error {
	if z, ok := h.m.prov.(Zeroer); ok && made {
		return z.Zero(h.b.Dev(), ptr, n)
	}
	clear(unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&ptr))), n))
	return nil
}
