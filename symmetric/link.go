package symmetric

import (
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
	"github.com/libsymm/libsymm/store"
)

// A group's link: one connection between this process and each other rank
// of a group, made at the group's first rendezvous and kept until the
// group's store is closed (Manager.CloseStore) or Manager.Close. Making it
// is the only step that goes through the store: every rank publishes its
// pid, start time, pid namespace, uid, host, backend and socket name once,
// in one all-gather, then rank i connects to every rank j > i and accepts
// every rank j < i. Every later step of every handshake of the group (a
// rendezvous's descriptors and outcome, a pad reset's agreements) is one
// note on each connection: a Unix seqpacket message, tens of microseconds,
// with no server between.
//
// Invariants:
//   - a connection is checked once, as it is made, and before anything is
//     sent on it: its other end (SO_PEERCRED, fixed by the kernel when that
//     end listened or connected) is the pid that published the rank, with
//     that pid's published start time, in our pid namespace, as our uid.
//     A descriptor leaves this process only on a checked connection: a
//     process that binds a published name later (the rank's process gone,
//     its listener closed) or that wrote a rank's metadata into the store
//     first, reaches no connection and gets nothing. The listener closes
//     once every peer is connected: nobody can connect to a link made.
//   - a note on rank j's connection must say it is from rank j;
//   - every note names its handshake (kind and number, which every rank
//     counts alike, under the link's lock, as the ranks join a group's
//     blocks in the same order) and its step; one that comes for a later
//     step or handshake waits in the stash, one for a handshake that has
//     ended here (link.ended) is dropped and its descriptors closed at
//     once, by the connection's reader: a failed handshake keeps no peer's
//     block open;
//   - one handshake at a time uses a link (link.mu), so a group's steps stay
//     in order.

// hsKind is what a handshake is, each kind numbered on its own per group.
type hsKind uint8

const (
	kindLink       hsKind = iota // making a group's link (store keys symm/<group>/link<n>/)
	kindRendezvous               // a rendezvous (notes "r")
	kindPadReset                 // a signal pad's reset (notes "p")
	kindAccess                   // WorldWithinDirectAccess (store keys symm/<group>/access<n>/)
	nKinds
)

// noteKind is the kind's name in a note, "" for kinds that send none.
func (k hsKind) noteKind() string {
	return [nKinds]string{kindRendezvous: "r", kindPadReset: "p"}[k]
}

// kindOfNote is the kind a note names, and whether it is one.
func kindOfNote(s string) (hsKind, bool) {
	switch s {
	case "r":
		return kindRendezvous, true
	case "p":
		return kindPadReset, true
	}
	return 0, false
}

// seqKey is one counter of handshakes: a group's, of one kind.
type seqKey struct {
	group string
	kind  hsKind
}

// link is this process's connections for one group, and what every rank
// published when it was made.
type link struct {
	mu          sync.Mutex // held for a whole handshake
	pid         int        // the process that made it: a forked child makes its own
	st          store.Store
	rank, world int
	peers       []meta      // every rank's identity, backend and socket name
	conns       []*ipc.Conn // to every other rank (nil at ours), checked
	inbox       chan arrival
	quit        chan struct{} // closed when the link closes: its readers stop
	readers     sync.WaitGroup
	stash       []note // notes that came for a later step, in arrival order
	// ended[k]: the highest number of a handshake of kind k that has ended
	// here; a note of it or of an earlier one is a leftover.
	ended [nKinds]atomic.Int64
}

// arrival is what a connection's reader passes on: a note from rank from,
// a message refused (err, not gone), or the end of the connection (gone).
type arrival struct {
	from int
	n    note
	err  error
	gone bool
}

// note is what an arrival brings to the stash: its note, or for a
// connection that ended a goneStep mark (every later handshake finds it);
// false for a message refused (its descriptors already closed).
func (a arrival) note() (note, bool) {
	switch {
	case a.gone:
		return note{Rank: a.from, Step: goneStep, Err: a.err.Error()}, true
	case a.err != nil:
		return note{}, false
	}
	return a.n, true
}

// stashArrivals moves what the readers have passed on, without waiting, to
// the stash (l.mu held), in arrival order.
func (l *link) stashArrivals() {
	for {
		select {
		case a := <-l.inbox:
			if n, ok := a.note(); ok {
				l.stash = append(l.stash, n)
			}
		default:
			return
		}
	}
}

// stashMax bounds the notes kept for later: a peer is at most one step
// ahead, so more than this are strays, dropped oldest first.
const stashMax = 256

// inboxPerPeer bounds the notes read ahead of the handshake per peer: a
// reader waits (and its peer's sends with it) when the inbox is full.
const inboxPerPeer = 64

// note is one message between the ranks of a link.
type note struct {
	Kind string `json:"k"` // the handshake's kind (hsKind.noteKind)
	Seq  int64  `json:"n"` // its number in that kind's counter
	Step string `json:"s"`
	Rank int    `json:"r"`
	Meta *meta  `json:"m,omitempty"` // the sender's block (step "block")
	Err  string `json:"e,omitempty"` // the sender failed this handshake
	Want bool   `json:"w,omitempty"` // the sender wants a pad reset (step "want")
	fds  []int  // descriptors that came with it; owned by whoever takes it
}

// closeFDs closes the descriptors a note brought.
func (n *note) closeFDs() {
	for _, fd := range n.fds {
		unix.Close(fd)
	}
	n.fds = nil
}

// hello is the first message on a connection: the rank that made it.
type hello struct {
	Rank int `json:"rank"`
}

// linkFor returns g's link, making it (one all-gather through the store,
// then the connections) if this process has none that fits g (made: true),
// with its mutex held: the caller unlocks it when its handshake ends.
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
	if l.conns != nil && !l.fits(g) {
		l.closeLocked()
	}
	if l.conns == nil {
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

// closeLocked closes the link's connections, stops its readers and closes
// every descriptor that came and was not taken.
func (l *link) closeLocked() {
	if l.conns == nil {
		return
	}
	close(l.quit)
	for _, c := range l.conns {
		if c != nil {
			c.Close() // in a forked child: its copy of the descriptor only
		}
	}
	l.readers.Wait()
	l.stashArrivals()
	for i := range l.stash {
		l.stash[i].closeFDs()
	}
	l.conns, l.peers, l.stash, l.st, l.inbox, l.quit = nil, nil, nil, nil, nil, nil
}

// sameKind refuses ranks that cannot share memory with rank me: another
// host, another uid, another pid namespace or another backend.
func sameKind(me int, metas []meta) error {
	mine := metas[me]
	for j, p := range metas {
		switch {
		case p.Host != mine.Host:
			return fmt.Errorf("rank %d is on host %q, rank %d on %q: symmetric memory joins processes of one host", j, p.Host, me, mine.Host)
		case p.UID != mine.UID:
			return fmt.Errorf("rank %d runs as uid %d, rank %d as uid %d", j, p.UID, me, mine.UID)
		case p.PIDNS != mine.PIDNS:
			return fmt.Errorf("rank %d runs in pid namespace %q, rank %d in %q: the ranks of a group must share one "+
				"(their processes are checked by pid; containers of one pod can share theirs, e.g. shareProcessNamespace)",
				j, p.PIDNS, me, mine.PIDNS)
		case p.Provider != mine.Provider:
			return fmt.Errorf("rank %d uses the %s backend, rank %d the %s backend", j, p.Provider, me, mine.Provider)
		}
	}
	return nil
}

// Close closes the links of the manager's groups. Handles stay usable for
// their signals and collectives; the next rendezvous or pad reset of a
// group makes its link again (every rank of the group must then do the
// same, as at the group's first rendezvous).
func (m *Manager) Close() { m.closeLinks(func(*link) bool { return true }, false) }

// CloseStore closes and forgets the links of the groups made through st
// (symm_store_close: the store's groups go with it), and their handshake
// counters: a group of the same name made later over another store starts
// from its first handshake on every rank.
func (m *Manager) CloseStore(st store.Store) {
	m.closeLinks(func(l *link) bool { return sameStore(l.st, st) }, true)
}

// closeLinks closes the links that match, each once its handshake (if
// any) has ended; forget also drops them and their groups' counters.
func (m *Manager) closeLinks(match func(*link) bool, forget bool) {
	m.mu.Lock()
	links := make(map[string]*link, len(m.links))
	for name, l := range m.links {
		links[name] = l
	}
	m.mu.Unlock()
	for name, l := range links {
		l.mu.Lock()
		hit := l.conns != nil && match(l)
		if hit {
			l.closeLocked()
		}
		l.mu.Unlock()
		if hit && forget {
			m.mu.Lock()
			if m.links[name] == l {
				delete(m.links, name)
			}
			for k := range nKinds {
				delete(m.seq, seqKey{name, k})
			}
			m.mu.Unlock()
		}
	}
}
