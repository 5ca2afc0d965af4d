package symmetric

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/kernels"
)

// Epoch meetings carry what they are. A handle whose group owns its
// block's sync area (Handle.epochSync) meets its peers there, in its
// barriers and in every phase of its collectives: kernels/symm.cu has the
// protocol and why it is exact. Each slot word holds the meeting's kind
// (kernels.Meet*: a barrier, a pad reset's barrier, which phase of which
// collective) beside its count, so that ranks that disagree on what their
// n-th meeting on a channel is (one rank's barrier against another's
// all-reduce, as a pad reset decided by one rank alone did) get
// ErrMeetingMismatch naming both meetings, on both ranks, rather than
// pairing the wrong phases and summing inputs that are not in yet. A
// failed meeting stops its channel (no later meeting there stores
// anything) and fails the handle.
//
// On the host backend the calling thread runs the same protocol on the
// same memory (hostMeet): the barrier and the host collectives of such a
// handle meet through the sync area, the others through the signal pad.

// ErrMeetingMismatch marks ranks whose meetings did not match: one rank's
// barrier met another's collective, or one collective another (SYMM_ERR_MISMATCH).
// The message names both sides; the handle has failed.
var ErrMeetingMismatch = errors.New("mismatched meeting")

// epochStopped, set in a channel's count, says a meeting on it failed here:
// later meetings on the channel fail at once, storing nothing.
const epochStopped = kernels.EpochStopped

// meetCount is the 24-bit count a slot word carries beside its kind.
const meetCount = 1<<24 - 1

// meetName names a meeting kind in error messages.
func meetName(kind int) string {
	switch kind {
	case kernels.MeetBarrier:
		return "barrier"
	case kernels.MeetReset:
		return "reset_signal_pad (its barrier)"
	case kernels.MeetOneShotIn:
		return "one_shot_all_reduce (before the reads)"
	case kernels.MeetOneShotOut:
		return "one_shot_all_reduce (after the reads)"
	case kernels.MeetTwoShotIn:
		return "two_shot_all_reduce (before the reads)"
	case kernels.MeetTwoShotOut:
		return "two_shot_all_reduce (after the stores)"
	case kernels.MeetReduceScatIn:
		return "reduce_scatter (before the reads)"
	case kernels.MeetReduceScatOut:
		return "reduce_scatter (after the reads)"
	case kernels.MeetAllGatherIn:
		return "all_gather (before the reads)"
	case kernels.MeetAllGatherOut:
		return "all_gather (after the reads)"
	}
	return fmt.Sprintf("meeting of kind %d", kind)
}

// mismatchError is the error of a meeting of kind mine on channel that met
// rank peer's meeting of kind theirs.
func (h *Handle) mismatchError(channel, peer, mine, theirs int) error {
	return fmt.Errorf("%w: rank %d's %s met rank %d's %s on channel %d of group %q: the ranks did not make the same "+
		"calls in the same order (a decision one rank took alone?); the handle has failed",
		ErrMeetingMismatch, h.rank, meetName(mine), peer, meetName(theirs), channel, h.group)
}

// hostMeets reports whether the handle's barriers and collectives meet
// through the sync area on the calling thread: the group owns the area and
// the provider's memory is the host's, waited for by the caller (neither
// device kernels nor stream operations).
func (h *Handle) hostMeets() bool {
	if !h.epochSync {
		return false
	}
	_, dev := h.m.prov.(kernelDevice)
	_, queued := h.m.prov.(streamMarker)
	return !dev && !queued
}

// u32At views the uint32 at host address p (memory outside Go's heap).
func u32At(p uintptr) *atomic.Uint32 {
	return (*atomic.Uint32)(*(*unsafe.Pointer)(unsafe.Pointer(&p)))
}

// syncSlot is slot (channel, src) of the sync area after rank dst's pad.
func (h *Handle) syncSlot(dst, src, channel int) *atomic.Uint32 {
	return u32At(h.PadPtr(dst) + SignalPadSize + uintptr(4*(channel*h.world+src)))
}

// hostMeet is symm.cu's meet_block run by the calling thread: meeting kind
// on channel with every peer, within timeout. A peer's meeting of another
// kind gives ErrMeetingMismatch, a peer that does not come ErrSignalTimeout
// naming it; either stops the channel and fails the handle.
func (h *Handle) hostMeet(channel, kind int, timeout time.Duration) error {
	count := u32At(h.epochsArg() + uintptr(4*channel))
	c := count.Load()
	if c&epochStopped != 0 {
		if err := h.failed(); err != nil {
			return err
		}
		return fmt.Errorf("%w: the meetings of group %q (rank %d) on channel %d stopped at an earlier failure",
			ErrSignalTimeout, h.group, h.rank, channel)
	}
	e := c + 1
	w := uint32(kind)<<24 | e&meetCount
	for t := 0; t < h.world; t++ {
		if t != h.rank {
			h.syncSlot(t, h.rank, channel).Store(w)
		}
	}
	deadline := time.Now().Add(timeout)
	for t := 0; t < h.world; t++ {
		if t == h.rank {
			continue
		}
		if err := h.hostAwait(t, channel, kind, e, timeout, deadline); err != nil {
			count.Store(epochStopped)
			h.fail(err)
			return err
		}
	}
	count.Store(e &^ epochStopped)
	return nil
}

// hostAwait waits until peer t's slot of channel holds meeting e or a later
// one (in 24-bit wrap-around order), and checks the kind of e.
func (h *Handle) hostAwait(t, channel, kind int, e uint32, timeout time.Duration, deadline time.Time) error {
	in := h.syncSlot(h.rank, t, channel)
	for spins := 0; ; spins++ {
		v := in.Load()
		if int32((v-e)<<8) >= 0 {
			if (v^e)&meetCount == 0 && int(v>>24) != kind {
				return h.mismatchError(channel, t, kind, int(v>>24))
			}
			return nil
		}
		if spins >= 64 {
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: rank %d did not come to this rank's %s on channel %d of group %q (rank %d) within %v; "+
					"the handle has failed", ErrSignalTimeout, t, meetName(kind), channel, h.group, h.rank, timeout)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// hostSync is the synchronization of a host collective: a meeting of kind
// on channel 0 when the handle meets through the sync area, else a put to
// and a wait for every peer on signal-pad channel 0.
func (h *Handle) hostSync(kind int, stream uintptr, timeout time.Duration) error {
	if h.hostMeets() {
		return h.hostMeet(0, kind, h.hostBound(timeout))
	}
	return h.signalPeers(0, stream, timeout)
}
