package symmetric

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
	"github.com/libsymm/libsymm/store"
)

// A group's link: the mailbox through which this process meets the other
// ranks of one group, opened at the group's first rendezvous and kept for
// the process's life (or until Manager.Close). Making it is the only step
// that goes through the store: every rank publishes its pid, uid, host,
// backend and mailbox name once, in one all-gather. Every later step of
// every handshake of the group (a rendezvous's descriptors and outcome, a
// pad reset's agreements) is one note from each rank to each peer's
// mailbox: a Unix datagram, tens of microseconds, with no server between.
//
// Invariants:
//   - a note is taken only from the process that published that rank when
//     the link was made, running as our uid (the kernel attaches the
//     sender's credentials: package ipc); anything else is refused and its
//     descriptors closed;
//   - every note names its handshake (kind and number, which every rank
//     counts alike, as the ranks join a group's blocks in the same order)
//     and its step; one that comes for a later step or handshake waits in
//     the stash, one for an earlier handshake (left over from a failed one)
//     is dropped;
//   - one handshake at a time uses a link (link.mu), so the mailbox has one
//     reader and a group's steps stay in order.

// link is this process's standing mailbox for one group, and what every
// rank published when it was made.
type link struct {
	mu          sync.Mutex // held for a whole handshake
	pid         int        // the process that opened mb: a forked child makes its own
	st          store.Store
	rank, world int
	mb          *ipc.Mailbox // nil until made, or after a failed making
	peers       []meta       // every rank's pid, uid, host, backend and mailbox
	stash       []note       // notes that came for a later step, in arrival order
}

// stashMax bounds the notes kept for later: a peer is at most one step
// ahead, so more than this are strays, dropped oldest first.
const stashMax = 256

// note is one message between the ranks of a link.
type note struct {
	Kind string `json:"k"` // the handshake's counter: "r" rendezvous, "p" pad reset
	Seq  int    `json:"n"` // its number in that counter
	Step string `json:"s"`
	Rank int    `json:"r"`
	Meta *meta  `json:"m,omitempty"` // the sender's block (step "block")
	Err  string `json:"e,omitempty"` // the sender failed this handshake
	fds  []int  // descriptors that came with it; owned by whoever takes it
}

// closeFDs closes the descriptors a note brought.
func (n *note) closeFDs() {
	for _, fd := range n.fds {
		unix.Close(fd)
	}
	n.fds = nil
}

// linkFor returns g's link, making it (one all-gather through the store)
// if this process has none that fits g (made: true), with its mutex held:
// the caller unlocks it when its handshake ends.
func (m *Manager) linkFor(g Group, deadline time.Time) (_ *link, made bool, err error) {
	m.mu.Lock()
	if m.links == nil {
		m.links = map[string]*link{}
	}
	l := m.links[g.Name]
	if l == nil {
		l = &link{}
		m.links[g.Name] = l
	}
	m.mu.Unlock()
	l.mu.Lock()
	if l.mb != nil && !l.fits(g) {
		l.closeLocked()
	}
	if l.mb == nil {
		if err := l.open(m, g, deadline); err != nil {
			l.mu.Unlock()
			return nil, false, err
		}
		made = true
	}
	return l, made, nil
}

// fits reports whether the link was made for g as it is now: the same
// rank, world and store, in this process.
func (l *link) fits(g Group) bool {
	return l.pid == os.Getpid() && l.rank == g.Rank && l.world == g.World && sameStore(l.st, g.Store)
}

// sameStore reports whether a and b are the same store. A store whose type
// cannot be compared is never the same: the group's link is made again.
func sameStore(a, b store.Store) bool {
	ta := reflect.TypeOf(a)
	return ta != nil && ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// closeLocked closes the link's mailbox and drops its stash.
func (l *link) closeLocked() {
	if l.mb != nil {
		l.mb.Close() // in a forked child: its copy of the descriptor only
	}
	for i := range l.stash {
		l.stash[i].closeFDs()
	}
	l.mb, l.peers, l.stash, l.st = nil, nil, nil, nil
}

// open opens our mailbox and gathers every rank's link metadata through
// the store, then checks that the ranks can meet: one host, one uid, one
// backend. On failure nothing stays open.
func (l *link) open(m *Manager, g Group, deadline time.Time) error {
	host, _ := os.Hostname()
	me := meta{PID: os.Getpid(), UID: os.Getuid(), Host: host, Provider: m.prov.Name()}
	seq := m.nextSeq(g.Name + "/link")
	mb, err := openMailbox(&me, g, seq)
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(me)
	vals, err := store.AllGather(g.Store, fmt.Sprintf("symm/%s/link%d/", g.Name, seq), g.Rank, g.World, raw, time.Until(deadline))
	if err != nil {
		mb.Close()
		var ge *store.GatherError
		switch {
		case errors.Is(err, store.ErrClosed):
			return fmt.Errorf("the store went away while gathering the ranks' metadata: %w", err)
		case errors.As(err, &ge):
			return fmt.Errorf("rank %d did not publish its metadata within %v (did it die, or not call rendezvous?): %w",
				ge.Rank, m.cfg.Timeout, ge.Err)
		}
		return fmt.Errorf("publishing metadata: %w", err)
	}
	peers := make([]meta, g.World)
	for j, v := range vals {
		if err := json.Unmarshal(v, &peers[j]); err != nil {
			mb.Close()
			return fmt.Errorf("rank %d published unreadable metadata: %w", j, err)
		}
	}
	if err := sameKind(g.Rank, peers); err != nil {
		mb.Close()
		return err
	}
	l.pid, l.st, l.rank, l.world, l.mb, l.peers = os.Getpid(), g.Store, g.Rank, g.World, mb, peers
	return nil
}

// sameKind refuses ranks that cannot share memory with rank me: another
// host, another uid or another backend.
func sameKind(me int, metas []meta) error {
	mine := metas[me]
	for j, p := range metas {
		switch {
		case p.Host != mine.Host:
			return fmt.Errorf("rank %d is on host %q, rank %d on %q: symmetric memory joins processes of one host", j, p.Host, me, mine.Host)
		case p.UID != mine.UID:
			return fmt.Errorf("rank %d runs as uid %d, rank %d as uid %d", j, p.UID, me, mine.UID)
		case p.Provider != mine.Provider:
			return fmt.Errorf("rank %d uses the %s backend, rank %d the %s backend", j, p.Provider, me, mine.Provider)
		}
	}
	return nil
}

// Close closes the mailboxes of the manager's groups. Handles stay usable
// for their signals and collectives; the next rendezvous or pad reset of a
// group makes its link again (every rank of the group must then do the
// same, as at the group's first rendezvous).
func (m *Manager) Close() { m.closeLinks(func(*link) bool { return true }) }

// CloseStore closes the mailboxes of the groups whose links were made
// through st (symm_store_close: the store's groups go with it), as Close
// does.
func (m *Manager) CloseStore(st store.Store) {
	m.closeLinks(func(l *link) bool { return sameStore(l.st, st) })
}

// closeLinks closes the links that match, each once its handshake (if
// any) has ended.
func (m *Manager) closeLinks(match func(*link) bool) {
	m.mu.Lock()
	links := make([]*link, 0, len(m.links))
	for _, l := range m.links {
		links = append(links, l)
	}
	m.mu.Unlock()
	for _, l := range links {
		l.mu.Lock()
		if l.mb != nil && match(l) {
			l.closeLocked()
		}
		l.mu.Unlock()
	}
}

// who names rank j and its process.
func (r *handshake) who(j int) string {
	return fmt.Sprintf("rank %d (pid %d)", j, r.ln.peers[j].PID)
}

// send gives n (and fds, which stay ours) to every peer's mailbox and
// returns what failed; a peer whose mailbox is gone is also put in gone.
func (r *handshake) send(n note, fds []int, gone chan<- error) error {
	n.Kind, n.Seq, n.Rank = r.kind, r.seq, r.g.Rank
	raw, err := json.Marshal(n)
	if err != nil {
		return err
	}
	var errs []error
	for j := range r.g.World {
		if j == r.g.Rank {
			continue
		}
		if err := r.ln.mb.SendTo(r.ln.peers[j].Socket, raw, fds, time.Until(r.deadline)); err != nil {
			if errors.Is(err, ipc.ErrNoMailbox) { // its process has exited
				err = fmt.Errorf("%w: %s is gone: %w", ErrPeerFailed, r.who(j), err)
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

// tellFailure sends err to every peer (best effort), so that none waits for
// this rank until the deadline.
func (r *handshake) tellFailure(err error) {
	if r.ln == nil {
		return
	}
	msg := err.Error()
	if len(msg) > 60<<10 {
		msg = msg[:60<<10]
	}
	if soon := time.Now().Add(time.Second); soon.Before(r.deadline) {
		r.deadline = soon // a peer's full queue delays a failing rank by a second at most
	}
	r.send(note{Step: "fail", Err: msg}, nil, nil)
}

// gather sends out (with fds, which stay ours) to every peer for step and
// returns every rank's note for that step of this handshake (out at our
// rank), calling took for each peer's as it comes. The descriptors of a
// note given to took are took's; those of notes refused are closed. A peer
// that reports a failure ends the wait at once, naming it; so does a peer
// whose process has exited; otherwise the deadline does. The sending has
// ended when gather returns.
func (r *handshake) gather(step string, out note, fds []int, took func(j int, n note)) ([]note, error) {
	g := r.g
	sent := make(chan error, 1)
	gone := make(chan error, g.World)
	go func() {
		sent <- r.send(note{Step: step, Meta: out.Meta, Err: out.Err}, fds, gone)
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

// causeOf returns, for err saying that a peer's mailbox is gone, the
// failure a peer reported for this handshake, if one comes within 100 ms:
// a rank that fails tells every peer before its mailbox may close (a
// group's first rendezvous that fails closes it), so the cause is already
// on its way, and it says more than "gone". Any other err is returned as
// it is.
func (r *handshake) causeOf(err error) error {
	if !errors.Is(err, ipc.ErrNoMailbox) {
		return err
	}
	for until := time.Now().Add(100 * time.Millisecond); time.Now().Before(until); {
		msg, rerr := r.ln.mb.Recv(maxNoteFDs, time.Until(until))
		if errors.Is(rerr, ipc.ErrBadMessage) {
			continue
		} else if rerr != nil {
			break
		}
		n, perr := r.parse(msg)
		if perr != nil {
			continue
		}
		n.closeFDs() // this handshake is failing: nothing it brings is mapped
		if n.Kind == r.kind && n.Seq == r.seq && n.Err != "" {
			return fmt.Errorf("%w: %s failed: %s", ErrPeerFailed, r.who(n.Rank), n.Err)
		}
	}
	return err
}

// collect fills notes with each peer's note for step, from the stash and
// then the mailbox (collect's loop: see gather).
func (r *handshake) collect(step string, notes []note, gone <-chan error, took func(int, note)) error {
	l := r.ln
	got := make([]bool, len(notes))
	got[r.g.Rank] = true
	missing := len(notes) - 1
	// take files n: nil if taken or set aside, else the failure it reports.
	take := func(n note) error {
		switch {
		case n.Kind == r.kind && n.Seq == r.seq && n.Err != "":
			n.closeFDs()
			return fmt.Errorf("%w: %s failed: %s", ErrPeerFailed, r.who(n.Rank), n.Err)
		case n.Kind == r.kind && n.Seq == r.seq && n.Step == step && !got[n.Rank]:
			got[n.Rank], notes[n.Rank] = true, n
			missing--
			if took != nil {
				took(n.Rank, n)
			} else {
				n.closeFDs()
			}
		case n.Kind == r.kind && n.Seq < r.seq, n.Kind == r.kind && n.Seq == r.seq && n.Step == step:
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
	var lastStray error
	strays := 0
	for missing > 0 {
		// Wait in short slices, so that a peer found gone ends the wait at
		// once. (Polling first, yielding between polls, was no faster on a
		// 32-core GPU host and slower on 2 cores: BenchmarkRendezvous.)
		msg, err := l.mb.Recv(maxNoteFDs, min(time.Until(r.deadline), 50*time.Millisecond))
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if time.Now().Before(r.deadline) {
				if stop := r.peerGone(got, gone); stop != nil {
					return stop
				}
				continue
			}
			return r.nothingCame(step, got, strays, lastStray, err)
		case errors.Is(err, ipc.ErrBadMessage):
			lastStray, strays = err, strays+1
			strayMessages.Add(1)
			continue
		case err != nil:
			return err
		}
		n, err := r.parse(msg)
		if err != nil {
			lastStray, strays = err, strays+1
			strayMessages.Add(1)
			continue
		}
		if err := take(n); err != nil {
			return err
		}
	}
	return nil
}

// maxNoteFDs is the most descriptors a note carries (a block's).
const maxNoteFDs = 1

// parse reads a note from msg, refusing (and closing the descriptors of)
// one that is malformed, or not from the process that published the rank
// it names, as our uid.
func (r *handshake) parse(msg ipc.Message) (note, error) {
	var n note
	err := json.Unmarshal(msg.Payload, &n)
	switch {
	case err != nil:
		err = fmt.Errorf("an unreadable message from pid %d: %w", msg.PID, err)
	case n.Rank < 0 || n.Rank >= r.g.World || n.Rank == r.g.Rank:
		err = fmt.Errorf("a message from pid %d names rank %d", msg.PID, n.Rank)
	case msg.PID != r.ln.peers[n.Rank].PID || msg.UID != os.Getuid():
		err = fmt.Errorf("pid %d uid %d claimed to be %s", msg.PID, msg.UID, r.who(n.Rank))
	}
	n.fds = msg.FDs
	if err != nil {
		n.closeFDs()
	}
	return n, err
}

// peerGone returns why a peer whose note has not come never will: the
// sender found its mailbox gone, or its process has exited; nil if none is
// known gone.
func (r *handshake) peerGone(got []bool, gone <-chan error) error {
	select {
	case e := <-gone:
		return e
	default:
	}
	for j := range got {
		if !got[j] && !processAlive(r.ln.peers[j].PID) {
			return fmt.Errorf("%w: %s exited before finishing", ErrPeerFailed, r.who(j))
		}
	}
	return nil
}

// nothingCame is the failure of a wait for step that reached its deadline
// (err): it names the peers whose note did not come, and the last of the
// stray messages refused meanwhile.
func (r *handshake) nothingCame(step string, got []bool, strays int, lastStray, err error) error {
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
	return fmt.Errorf("%s from %s by the deadline (did it die?)%s: %w", what, strings.Join(who, ", "), more, err)
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
