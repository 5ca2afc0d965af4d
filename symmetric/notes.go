package symmetric

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/libsymm/libsymm/ipc"
)

// A handshake's notes on a group's link (link.go): sent to every peer,
// collected from every peer, and agreed on.

// who names rank j and its process.
func (r *handshake) who(j int) string {
	return fmt.Sprintf("rank %d (pid %d)", j, r.ln.peers[j].PID)
}

// end marks the handshake ended on its link: its notes still to come are
// dropped as they arrive, and those already here (stashed or read ahead)
// are dropped now, their descriptors closed.
func (r *handshake) end() {
	l := r.ln
	l.ended[r.kind].Store(r.seq)
	l.stashArrivals()
	keep := l.stash[:0]
	for _, n := range l.stash {
		if n.Kind == r.kind.noteKind() && n.Seq <= r.seq {
			n.closeFDs()
			continue
		}
		keep = append(keep, n)
	}
	l.stash = keep
}

// errPeerGone is a peer failure (it wraps ErrPeerFailed) of a peer whose
// connection has ended: its cause, if it told one, may be on its way.
var errPeerGone = fmt.Errorf("%w", ErrPeerFailed)

// goneStep marks, in the stash, a peer whose connection has ended.
const goneStep = "\x00gone"

// send gives n (and fds, which stay ours) to every peer and returns what
// failed; a peer whose connection has ended is also put in gone.
func (r *handshake) send(n note, fds []int, gone chan<- error) error {
	n.Kind, n.Seq, n.Rank = r.kind.noteKind(), r.seq, r.g.Rank
	raw, err := json.Marshal(n)
	if err != nil {
		return err
	}
	var errs []error
	for j := range r.g.World {
		if j == r.g.Rank {
			continue
		}
		if err := r.ln.conns[j].SendWithin(raw, fds, time.Until(r.deadline)); err != nil {
			if errors.Is(err, ipc.ErrPeerClosed) || errors.Is(err, os.ErrClosed) {
				err = fmt.Errorf("%w: %s is gone (it exited, or closed the group): %w", errPeerGone, r.who(j), err)
				if gone != nil {
					gone <- err
				}
			} else {
				err = fmt.Errorf("sending to %s: %w", r.who(j), err)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxFailureNote bounds a failure note as encoded, below the 64 KiB a
// message carries.
const maxFailureNote = 60 << 10

// failureNote encodes the failure note for msg, cut so that its encoding
// fits a message: JSON escaping can make a byte six.
func (r *handshake) failureNote(msg string) []byte {
	n := note{Kind: r.kind.noteKind(), Seq: r.seq, Step: "fail", Rank: r.g.Rank}
	for {
		n.Err = msg
		raw, err := json.Marshal(n)
		if err != nil || len(raw) <= maxFailureNote {
			return raw
		}
		// Keep the share of msg that fits, as if it encoded evenly; a
		// second round cuts again where it does not.
		cut := len(msg) * (maxFailureNote - 512) / len(raw)
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + " [cut]"
	}
}

// tellFailure sends err to every peer (best effort), so that none waits for
// this rank until the deadline.
func (r *handshake) tellFailure(err error) {
	if r.ln == nil {
		return
	}
	raw := r.failureNote(err.Error())
	if soon := time.Now().Add(time.Second); soon.Before(r.deadline) {
		r.deadline = soon // a peer's full queue delays a failing rank by a second at most
	}
	for j, c := range r.ln.conns {
		if c != nil && j != r.g.Rank {
			c.SendWithin(raw, nil, time.Until(r.deadline))
		}
	}
}

// gather sends out (with fds, which stay ours) to every peer for step and
// returns every rank's note for that step of this handshake (out at our
// rank), calling took for each peer's as it comes. The descriptors of a
// note given to took are took's; those of notes refused are closed. A peer
// that reports a failure ends the wait at once, naming it; so does a peer
// whose connection has ended; otherwise the deadline does. The sending has
// ended when gather returns.
func (r *handshake) gather(step string, out note, fds []int, took func(j int, n note)) ([]note, error) {
	g := r.g
	sent := make(chan error, 1)
	gone := make(chan error, g.World)
	go func() {
		sent <- r.send(note{Step: step, Meta: out.Meta, Err: out.Err, Want: out.Want}, fds, gone)
	}()
	notes := make([]note, g.World)
	notes[g.Rank] = out
	rerr := r.collect(step, notes, gone, took)
	serr := <-sent
	if rerr != nil {
		return nil, r.causeOf(rerr)
	}
	if serr != nil {
		return nil, r.causeOf(serr)
	}
	return notes, nil
}

// causeOf returns, for err saying that a peer is gone, the failure a peer
// reported for this handshake, if one is here or comes within 100 ms: a
// rank that fails tells every peer before it may close the link (a group's
// first rendezvous that fails closes it), and a connection delivers in
// order, so the cause comes before the end. It says more than "gone". Any
// other err is returned as it is.
func (r *handshake) causeOf(err error) error {
	if !errors.Is(err, errPeerGone) {
		return err
	}
	kind := r.kind.noteKind()
	for _, n := range r.ln.stash {
		if n.Kind == kind && n.Seq == r.seq && n.Step == "fail" {
			return fmt.Errorf("%w: %s failed: %s", ErrPeerFailed, r.who(n.Rank), n.Err)
		}
	}
	timer := time.NewTimer(100 * time.Millisecond)
	defer timer.Stop()
	for {
		select {
		case a := <-r.ln.inbox:
			n, ok := a.note()
			if ok && n.Kind == kind && n.Seq == r.seq && n.Step == "fail" {
				n.closeFDs()
				return fmt.Errorf("%w: %s failed: %s", ErrPeerFailed, r.who(n.Rank), n.Err)
			}
			if ok {
				r.ln.stash = append(r.ln.stash, n) // end() sorts out what stays
			}
		case <-timer.C:
			return err
		}
	}
}

// collect fills notes with each peer's note for step, from the stash and
// then the connections (collect's loop: see gather). The deadline is
// checked at every message, so a peer that sends without end cannot hold
// the handshake (and the link) past it.
func (r *handshake) collect(step string, notes []note, gone <-chan error, took func(int, note)) error {
	l := r.ln
	kind := r.kind.noteKind()
	got := make([]bool, len(notes))
	got[r.g.Rank] = true
	missing := len(notes) - 1
	// take files n: nil if taken or set aside, else the failure it reports.
	take := func(n note) error {
		switch {
		case n.Step == goneStep:
			l.stash = append(l.stash, n) // every later handshake finds it too
			if !got[n.Rank] {
				return fmt.Errorf("%w: %s is gone (it exited, or closed the group): %s", errPeerGone, r.who(n.Rank), n.Err)
			}
		case n.Kind == kind && n.Seq == r.seq && n.Err != "":
			n.closeFDs()
			return fmt.Errorf("%w: %s failed: %s", ErrPeerFailed, r.who(n.Rank), n.Err)
		case n.Kind == kind && n.Seq == r.seq && n.Step == step && !got[n.Rank]:
			got[n.Rank], notes[n.Rank] = true, n
			missing--
			if took != nil {
				took(n.Rank, n)
			} else {
				n.closeFDs()
			}
		case n.Kind == kind && n.Seq < r.seq, n.Kind == kind && n.Seq == r.seq && n.Step == step:
			n.closeFDs() // left over from an earlier handshake, or a duplicate
			strayMessages.Add(1)
		default:
			if len(l.stash) == stashMax {
				l.stash[0].closeFDs()
				l.stash = l.stash[1:]
			}
			l.stash = append(l.stash, n)
		}
		return nil
	}
	stash := l.stash
	l.stash = nil
	for i, n := range stash {
		if err := take(n); err != nil {
			l.stash = append(l.stash, stash[i+1:]...)
			return err
		}
	}
	timer := time.NewTimer(time.Until(r.deadline))
	defer timer.Stop()
	var lastStray error
	strays := 0
	for missing > 0 {
		if !time.Now().Before(r.deadline) {
			return r.nothingCame(step, got, strays, lastStray)
		}
		select {
		case a := <-l.inbox:
			n, ok := a.note()
			if !ok {
				lastStray, strays = a.err, strays+1
				strayMessages.Add(1)
			} else if err := take(n); err != nil {
				return err
			}
		case err := <-gone:
			return err
		case <-timer.C:
		}
	}
	return nil
}

// maxNoteFDs is the most descriptors a note carries (a block's).
const maxNoteFDs = 1

// nothingCame is the failure of a wait for step that reached its deadline:
// it names the peers whose note did not come, and the last of the stray
// messages refused meanwhile.
func (r *handshake) nothingCame(step string, got []bool, strays int, lastStray error) error {
	var who []string
	for j := range got {
		if !got[j] {
			who = append(who, r.who(j))
		}
	}
	more := ""
	if strays > 0 {
		more = fmt.Sprintf("; %d stray messages ignored, the last: %v", strays, lastStray)
	}
	what := map[string]string{"block": "no block came", "done": "no outcome of mapping came"}[step]
	if what == "" {
		what = fmt.Sprintf("no agreement on %s came", step)
	}
	return fmt.Errorf("%s from %s by the deadline (did it die?)%s: %w", what, strings.Join(who, ", "), more, os.ErrDeadlineExceeded)
}

// agree all-gathers each rank's outcome of step (nil: success) and returns
// mine, or the first other rank's failure, so that every rank succeeds or
// every rank fails with the same named cause. A rank that failed tells its
// peers at once and does not wait for theirs.
func (r *handshake) agree(step string, mine error) error {
	if mine != nil {
		r.tellFailure(mine)
		return mine
	}
	if _, err := r.gather(step, note{}, nil, nil); err != nil {
		if !errors.Is(err, ErrPeerFailed) {
			r.tellFailure(err)
		}
		return fmt.Errorf("agreeing on %s: %w", step, err)
	}
	return nil
}
