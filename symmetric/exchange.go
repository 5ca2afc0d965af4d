package symmetric

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
)

// Peers' blocks, mapped during a rendezvous (rendezvous.go) in one of two
// ways: by descriptors that change hands through the ranks' mailboxes
// (abstract Unix datagram sockets, SCM_RIGHTS), taken only from the process
// that published a rank's metadata and runs as our uid; or, for providers
// that map peers themselves (PeerMapper: NVSHMEM), as views the provider
// hands out. A mailbox also carries a failing rank's cause to its peers, so
// that none waits for its descriptor until the timeout.

// socketBase starts the names of the mailboxes of one rendezvous of this
// process: the group's name cut to 40 safe characters, within the length of
// a socket's name.
func socketBase(pid int, group string, seq int) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, group)
	if len(clean) > 40 {
		clean = clean[:40]
	}
	return fmt.Sprintf("symm-%d-%s-%d", pid, clean, seq)
}

// openMailbox opens our mailbox and names it in me.Socket. It is opened
// before our metadata is published, so that a peer that reads the metadata
// can send at once. Descriptors in messages still queued when it closes
// are closed by the kernel. The name ends in a random nonce (peers learn it
// from the metadata), so another process cannot take it ahead of us; a
// name taken all the same is replaced by a new one.
func openMailbox(me *meta, g Group, seq int) (mb *ipc.Mailbox, err error) {
	for attempt := 0; ; attempt++ {
		me.Socket = fmt.Sprintf("%s-%d-%s", socketBase(os.Getpid(), g.Name, seq), g.Rank, mailboxNonce())
		if mb, err = ipc.OpenMailbox(me.Socket); err == nil || !errors.Is(err, unix.EADDRINUSE) || attempt == 2 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return mb, nil
}

// exchange sends our block's descriptor fd to every peer's mailbox while
// taking and mapping theirs from our mailbox into r.h.
func (r *handshake) exchange(fd int) error {
	g, metas := r.g, r.metas
	// Send while receiving: a peer's queue may be full until it reads.
	sent := make(chan error, 1)
	gone := make(chan error, g.World) // peers found dead while sending
	go func() {
		var errs []error
		payload := []byte(fmt.Sprint(g.Rank))
		if err := r.m.failAt("send"); err != nil {
			sent <- err
			return
		}
		for j := 0; j < g.World; j++ {
			if j != g.Rank {
				if err := r.mb.SendTo(metas[j].Socket, payload, []int{fd}, time.Until(r.deadline)); err != nil {
					if errors.Is(err, ipc.ErrNoMailbox) { // its process has exited
						err = fmt.Errorf("%w: rank %d (pid %d) is gone: %w", ErrPeerFailed, j, metas[j].PID, err)
						gone <- err
					} else {
						err = fmt.Errorf("sending our block to rank %d (pid %d): %w", j, metas[j].PID, err)
					}
					errs = append(errs, err)
				}
			}
		}
		sent <- errors.Join(errs...)
		r.m.crashAt("sent")
	}()
	rerr := r.receive(gone)
	serr := <-sent
	if serr != nil && errors.Is(serr, ipc.ErrNoMailbox) {
		if rerr != nil {
			return rerr // the same failure, said once
		}
		// A peer whose mailbox is gone either died or failed after telling
		// us why (its message was sent before its mailbox closed): prefer
		// the cause to "gone".
		if cause := r.pendingFailure(100 * time.Millisecond); cause != nil {
			return cause
		}
	}
	return errors.Join(rerr, serr)
}

// failureIn returns the failure a peer reported in msg (tellFailure), or nil
// if msg is not one, or not from the process that published that rank.
func (r *handshake) failureIn(msg ipc.Message) error {
	if !strings.HasPrefix(string(msg.Payload), failurePrefix) {
		return nil
	}
	rank, text, _ := strings.Cut(strings.TrimPrefix(string(msg.Payload), failurePrefix), ":")
	if j, err := strconv.Atoi(rank); err == nil && j >= 0 && j < r.g.World && msg.PID == r.metas[j].PID && msg.UID == os.Getuid() {
		return fmt.Errorf("%w: rank %d (pid %d) failed: %s", ErrPeerFailed, j, msg.PID, text)
	}
	return nil
}

// pendingFailure reads what is left in our mailbox for up to wait and
// returns the first failure a peer reported there, or nil. Descriptors in
// other messages are closed: the rendezvous is failing anyway.
func (r *handshake) pendingFailure(wait time.Duration) error {
	until := time.Now().Add(wait)
	for time.Now().Before(until) {
		msg, err := r.mb.Recv(1, time.Until(until))
		if err != nil && !errors.Is(err, ipc.ErrBadMessage) {
			return nil
		}
		for _, fd := range msg.FDs {
			unix.Close(fd)
		}
		if err == nil {
			if cause := r.failureIn(msg); cause != nil {
				return cause
			}
		}
	}
	return nil
}

// mapViews finds every peer's block through the provider (NVSHMEM's
// nvshmem_ptr on our symmetric address) and puts it in r.h: no descriptor
// changes hands.
func (r *handshake) mapViews(pm PeerMapper) error {
	h := r.h
	for j, p := range r.metas {
		if j == h.rank {
			continue
		}
		ptr, err := pm.PeerPtr(h.b.mem, p.PE)
		if err != nil {
			return fmt.Errorf("rank %d (pid %d, PE %d): %w", j, p.PID, p.PE, err)
		}
		h.peers[j] = &Mem{Ptr: ptr, Size: h.b.mem.Size, Dev: h.b.Dev(), fd: -1, view: true}
	}
	return nil
}

// failurePrefix starts a mailbox message that reports a rank's failure
// instead of carrying its descriptor.
const failurePrefix = "!"

// tellFailure sends err to every peer's mailbox (best effort).
func (r *handshake) tellFailure(err error) {
	msg := []byte(fmt.Sprintf("%s%d:%v", failurePrefix, r.g.Rank, err))
	if len(msg) > 60<<10 {
		msg = msg[:60<<10]
	}
	for j := 0; j < r.g.World; j++ {
		if j != r.g.Rank {
			r.mb.SendTo(r.metas[j].Socket, msg, nil, min(time.Until(r.deadline), time.Second))
		}
	}
}

// receive takes one descriptor from each peer in our mailbox and maps it
// into r.h, until the deadline. A message is taken only from the process
// that published rank j's metadata and runs as our uid; anything else is
// closed and ignored. Peers are mapped as their messages come, in parallel;
// every mapping has ended when receive returns.
func (r *handshake) receive(gone <-chan error) error {
	h, metas, deadline := r.h, r.metas, r.deadline
	var wg sync.WaitGroup
	errs := make([]error, h.world)
	got := make([]bool, h.world)
	missing, ignored := h.world-1, 0
	var lastErr error
	for missing > 0 {
		// Wait in short slices, so that a peer found dead by the sender
		// (its mailbox is gone) ends the wait at once.
		msg, err := r.mb.Recv(1, min(time.Until(deadline), 50*time.Millisecond))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			var stop error // nil: wait on
			if time.Now().Before(deadline) {
				stop = r.peerGone(got, gone)
			} else {
				stop = r.noBlockCame(got, ignored, lastErr, err)
			}
			if stop == nil {
				continue
			}
			wg.Wait()
			return errors.Join(append(errs, stop)...)
		}
		if err != nil && !errors.Is(err, ipc.ErrBadMessage) {
			wg.Wait()
			return err
		}
		if err == nil {
			if cause := r.failureIn(msg); cause != nil {
				wg.Wait()
				return cause
			}
		}
		j, refused := r.senderOf(msg, err, got)
		if refused == nil {
			got[j] = true
			missing--
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[j] = h.mapPeer(j, msg.FDs, metas[j])
			}()
			continue
		}
		lastErr = refused
		ignored++
		strayMessages.Add(1)
		for _, fd := range msg.FDs {
			unix.Close(fd)
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// peerGone returns why a peer that has not sent its block never will: the
// sender found its mailbox gone, or its process has exited; nil if none is
// known gone.
func (r *handshake) peerGone(got []bool, gone <-chan error) error {
	select {
	case e := <-gone:
		return e
	default:
	}
	for j := range got {
		if !got[j] && j != r.g.Rank && !processAlive(r.metas[j].PID) {
			return fmt.Errorf("%w: rank %d (pid %d) exited before sending its block", ErrPeerFailed, j, r.metas[j].PID)
		}
	}
	return nil
}

// noBlockCame is the failure of a receive that reached its deadline (err):
// it names the peers whose block did not come, and the last of the ignored
// stray messages.
func (r *handshake) noBlockCame(got []bool, ignored int, lastErr, err error) error {
	var who []string
	for j := range got {
		if !got[j] && j != r.g.Rank {
			who = append(who, fmt.Sprintf("rank %d (pid %d)", j, r.metas[j].PID))
		}
	}
	more := ""
	if ignored > 0 {
		more = fmt.Sprintf("; %d stray messages ignored, the last: %v", ignored, lastErr)
	}
	return fmt.Errorf("no block came from %s by the deadline (did it die?)%s: %w",
		strings.Join(who, ", "), more, err)
}

// senderOf returns the rank whose first descriptor msg carries, or why msg
// is refused: recvErr (a malformed message, whose descriptors the caller
// closes), a payload that names no peer still expected, or a sender other
// than the process that published that rank's metadata as our uid.
func (r *handshake) senderOf(msg ipc.Message, recvErr error, got []bool) (int, error) {
	j, perr := strconv.Atoi(string(msg.Payload))
	switch {
	case recvErr != nil:
		return j, recvErr
	case perr != nil || j < 0 || j >= r.g.World || j == r.g.Rank || got[j]:
		return j, fmt.Errorf("message %q from pid %d is not a peer's first", msg.Payload, msg.PID)
	case msg.PID != r.metas[j].PID || msg.UID != os.Getuid():
		return j, fmt.Errorf("pid %d uid %d claimed to be rank %d (pid %d)", msg.PID, msg.UID, j, r.metas[j].PID)
	}
	return j, nil
}

// mapPeer imports the one descriptor rank j sent and closes it.
func (h *Handle) mapPeer(j int, fds []int, peer meta) error {
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Errorf("rank %d sent %d descriptors, expected 1", j, len(fds))
	}
	start := time.Now()
	defer func() { h.importTime.Add(int64(time.Since(start))) }()
	defer unix.Close(fds[0])
	mem, err := h.m.prov.Import(h.b.Dev(), fds[0], peer.Block)
	if err != nil {
		return fmt.Errorf("mapping rank %d's block: %w", j, err)
	}
	h.peers[j] = mem
	return nil
}

// mailboxNonce makes the random end of a mailbox name (a variable: tests
// make it predictable).
var mailboxNonce = func() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Sprint(time.Now().UnixNano())
	}
	return hex.EncodeToString(b[:])
}

// strayMessages counts mailbox messages refused over the process's life
// (not from the expected peer process, malformed, or duplicates).
var strayMessages atomic.Int64
