package symmetric

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
	"github.com/libsymm/libsymm/store"
)

// Making a group's link (link.go): the identities gathered through the
// store, the connections checked, and their readers.

// open publishes our identity, gathers every rank's through the store,
// checks that the ranks can meet (one host, one uid, one pid namespace, one
// backend), then connects to every peer. On failure nothing stays open.
func (l *link) open(m *Manager, g Group, deadline time.Time) error {
	host, _ := os.Hostname()
	start, err := ipc.ProcessStart(os.Getpid())
	if err != nil {
		return err
	}
	me := meta{PID: os.Getpid(), UID: os.Getuid(), Host: host, Provider: m.prov.Name(), Start: start, PIDNS: ipc.PIDNamespace()}
	seq := m.nextSeq(g.Name, kindLink)
	ln, err := listen(&me, g, seq)
	if err != nil {
		return err
	}
	defer ln.Close() // once every peer is connected, or on failure
	raw, _ := json.Marshal(me)
	vals, err := store.AllGather(g.Store, fmt.Sprintf("symm/%s/link%d/", g.Name, seq), g.Rank, g.World, raw, time.Until(deadline))
	if err != nil {
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
			return fmt.Errorf("rank %d published unreadable metadata: %w", j, err)
		}
	}
	if err := sameKind(g.Rank, peers); err != nil {
		return err
	}
	conns, err := connect(ln, g, peers, deadline)
	if err != nil {
		return err
	}
	l.pid, l.st, l.rank, l.world, l.peers, l.conns = os.Getpid(), g.Store, g.Rank, g.World, peers, conns
	l.inbox, l.quit = make(chan arrival, inboxPerPeer*g.World), make(chan struct{})
	for j, c := range conns {
		if c != nil {
			l.readers.Add(1)
			go l.read(j, c)
		}
	}
	return nil
}

// connect connects rank g.Rank to every peer: it dials every higher rank
// at the name it published, then accepts every lower rank on ln, each
// checked (checkPeer) before anything is sent on it. Dials never wait for
// the peer to accept (the kernel queues them on the listener, whose
// credentials are fixed when it listens), so no rank waits for another in
// a cycle. On failure every connection made is closed.
func connect(ln *ipc.Listener, g Group, peers []meta, deadline time.Time) (conns []*ipc.Conn, err error) {
	conns = make([]*ipc.Conn, g.World)
	defer func() {
		if err != nil {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}
	}()
	raw, _ := json.Marshal(hello{Rank: g.Rank})
	for j := g.Rank + 1; j < g.World; j++ {
		c, err := ipc.Dial(peers[j].Socket, peers[j].PID, time.Until(deadline))
		if err != nil {
			return nil, fmt.Errorf("connecting to rank %d (pid %d) at the name it published: %w", j, peers[j].PID, err)
		}
		conns[j] = c
		if err := checkPeer(c, j, peers[j]); err != nil {
			return nil, err
		}
		if err := c.SendWithin(raw, nil, time.Until(deadline)); err != nil {
			return nil, fmt.Errorf("greeting rank %d (pid %d): %w", j, peers[j].PID, err)
		}
	}
	lower := map[int]bool{}
	for j := range g.Rank {
		lower[peers[j].PID] = true
	}
	for missing := g.Rank; missing > 0; {
		c, err := ln.AcceptFrom(func(pid int) bool { return lower[pid] }, describeMissing(conns[:g.Rank], peers), time.Until(deadline))
		if err != nil {
			return nil, fmt.Errorf("waiting for the lower ranks to connect: %w", err)
		}
		j, err := readHello(c, g.Rank, peers, deadline)
		if err == nil && conns[j] != nil {
			err = fmt.Errorf("rank %d (pid %d) connected twice", j, peers[j].PID)
		}
		if err == nil {
			err = checkPeer(c, j, peers[j])
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		conns[j] = c
		missing--
	}
	return conns, nil
}

// describeMissing names the lower ranks not yet connected.
func describeMissing(conns []*ipc.Conn, peers []meta) string {
	var who []string
	for j, c := range conns {
		if c == nil {
			who = append(who, fmt.Sprintf("rank %d (pid %d)", j, peers[j].PID))
		}
	}
	return strings.Join(who, ", ")
}

// readHello reads the rank a connection says it is from: a lower rank than
// ours, whose published pid is the one that connected.
func readHello(c *ipc.Conn, rank int, peers []meta, deadline time.Time) (int, error) {
	payload, fds, err := c.Recv(0, time.Until(deadline))
	if err != nil {
		return 0, fmt.Errorf("reading the greeting of pid %d: %w", c.PeerPID(), err)
	}
	closeAll(fds)
	var h hello
	switch err := json.Unmarshal(payload, &h); {
	case err != nil:
		return 0, fmt.Errorf("pid %d sent an unreadable greeting: %w", c.PeerPID(), err)
	case h.Rank < 0 || h.Rank >= rank:
		return 0, fmt.Errorf("pid %d says it is rank %d; only ranks below %d connect to it", c.PeerPID(), h.Rank, rank)
	case peers[h.Rank].PID != c.PeerPID():
		return 0, fmt.Errorf("pid %d says it is rank %d, which pid %d published", c.PeerPID(), h.Rank, peers[h.Rank].PID)
	}
	return h.Rank, nil
}

// checkPeer checks that connection c's other end is the process that
// published rank j: its pid and uid were checked as it was made (package
// ipc); its start time must be the one published, or the pid is another
// process's now.
func checkPeer(c *ipc.Conn, j int, p meta) error {
	start, err := ipc.ProcessStart(c.PeerPID())
	if err != nil {
		return fmt.Errorf("rank %d (pid %d): %w", j, p.PID, err)
	}
	if start != p.Start {
		return fmt.Errorf("rank %d's pid %d is another process now (started at tick %d, the one that published started at %d)",
			j, p.PID, start, p.Start)
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// listen opens our listener for the link and names it in me.Socket. It is
// opened before our metadata is published, so that a peer that reads the
// metadata can connect at once. The name ends in a random nonce; a name
// taken all the same is replaced by a new one.
func listen(me *meta, g Group, seq int64) (ln *ipc.Listener, err error) {
	for attempt := 0; ; attempt++ {
		me.Socket = fmt.Sprintf("%s-%d-%s", socketBase(os.Getpid(), g.Name, seq), g.Rank, listenerNonce())
		if ln, err = ipc.Listen(me.Socket); err == nil || !errors.Is(err, unix.EADDRINUSE) || attempt == 2 {
			return ln, err
		}
	}
}

// read passes what rank j's connection brings to the inbox, in order, until
// the connection or the link closes. A note of a handshake that has ended
// here is dropped at once, descriptors closed.
func (l *link) read(j int, c *ipc.Conn) {
	defer l.readers.Done()
	for {
		payload, fds, err := c.Recv(maxNoteFDs, time.Hour)
		var a arrival
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case err != nil && (errors.Is(err, ipc.ErrPeerClosed) || errors.Is(err, os.ErrClosed)):
			a = arrival{from: j, gone: true, err: err}
		case err != nil: // a message refused, its descriptors closed
			a = arrival{from: j, err: err}
		default:
			a = arrival{from: j}
			a.n, a.err = l.parse(j, payload, fds)
			if a.err == nil {
				if k, _ := kindOfNote(a.n.Kind); a.n.Seq <= l.ended[k].Load() {
					a.n.closeFDs() // left over from a handshake that has ended here
					strayMessages.Add(1)
					continue
				}
			}
		}
		select {
		case l.inbox <- a:
		case <-l.quit:
			a.n.closeFDs()
			return
		}
		if a.gone {
			return
		}
	}
}

// parse reads a note from rank j's connection, refusing (and closing the
// descriptors of) one that is malformed or says it is from another rank.
func (l *link) parse(j int, payload []byte, fds []int) (note, error) {
	var n note
	err := json.Unmarshal(payload, &n)
	_, known := kindOfNote(n.Kind)
	switch {
	case err != nil:
		err = fmt.Errorf("an unreadable message from rank %d (pid %d): %w", j, l.peers[j].PID, err)
	case n.Rank != j:
		err = fmt.Errorf("rank %d (pid %d) sent a message that says it is from rank %d", j, l.peers[j].PID, n.Rank)
	case !known:
		err = fmt.Errorf("rank %d (pid %d) sent a message of unknown kind %q", j, l.peers[j].PID, n.Kind)
	}
	n.fds = fds
	if err != nil {
		n.closeFDs()
	}
	return n, err
}
