package ipc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mailbox is a datagram socket in the abstract namespace: any process of the
// host may send to it, and each message arrives whole with the sender's pid
// and uid as the kernel saw them (SO_PASSCRED), so the receiver decides whom
// to trust per message. Unlike a connection, a message sent stays queued
// after its sender closes or exits, descriptors included: nothing has to be
// kept open until the receiver has read it.
type Mailbox struct {
	name string
	f    *os.File
	rc   syscall.RawConn
	rmu  sync.Mutex // one Recv at a time: they share the read deadline and the buffers below
	// rbuf and roob receive every message (made at the first Recv): a
	// message is copied out of them, so a Recv allocates only its payload.
	rbuf, roob []byte

	closedMu sync.Mutex
	closed   bool
}

// ErrNoMailbox is wrapped by SendTo's error when nobody holds the name: the
// receiver has exited (or has not opened its mailbox yet).
var ErrNoMailbox = errors.New("no such mailbox")

// ErrBadMessage is wrapped by the error of a Recv that refused one message
// (and closed its descriptors); the mailbox can go on receiving.
var ErrBadMessage = errors.New("message refused")

// Message is what a Mailbox received: the payload, the descriptors (owned
// by the caller) and the sender's credentials, which the sender cannot forge.
type Message struct {
	Payload []byte
	FDs     []int
	PID     int
	UID     int
}

// OpenMailbox binds the abstract datagram socket "\x00"+name.
func OpenMailbox(name string) (*Mailbox, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|socketFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("ipc: mailbox %s: socket: %w", name, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ipc: mailbox %s: SO_PASSCRED: %w", name, err)
	}
	if err := unix.Bind(fd, abstractAddr(name)); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("ipc: mailbox %s: the name is taken by a live process: %w", name, err)
		}
		return nil, fmt.Errorf("ipc: mailbox %s: bind: %w", name, err)
	}
	f, rc, err := pollable(fd, name)
	if err != nil {
		return nil, fmt.Errorf("ipc: mailbox %s: %w", name, err)
	}
	return &Mailbox{name: name, f: f, rc: rc}, nil
}

// Name returns the mailbox's name, without the leading NUL.
func (m *Mailbox) Name() string { return m.name }

// Close unbinds the name; a Recv waiting returns an error at once, and
// descriptors in messages not yet read are closed by the kernel.
func (m *Mailbox) Close() error {
	m.closedMu.Lock()
	m.closed = true
	m.closedMu.Unlock()
	return m.f.Close()
}

func (m *Mailbox) isClosed() bool {
	m.closedMu.Lock()
	defer m.closedMu.Unlock()
	return m.closed
}

// SendTo sends payload (<= 64 KiB) and fds (duplicated for the receiver; ours
// stay open) to the mailbox named to. A receiver whose queue is full is
// waited for until timeout; a name nobody holds fails at once (the process
// is gone or never opened it).
func (m *Mailbox) SendTo(to string, payload []byte, fds []int, timeout time.Duration) error {
	if err := checkName(to); err != nil {
		return err
	}
	if len(payload) > maxPayload {
		return fmt.Errorf("ipc: send to %s: payload of %d bytes exceeds %d", to, len(payload), maxPayload)
	}
	if len(fds) > maxFDsPerMsg {
		return fmt.Errorf("ipc: send to %s: %d descriptors exceed the %d a message carries", to, len(fds), maxFDsPerMsg)
	}
	for _, fd := range fds {
		if fd < 0 {
			return fmt.Errorf("ipc: send to %s: invalid descriptor %d", to, fd)
		}
	}
	msg := append([]byte{msgVersion}, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	deadline := time.Now().Add(timeout)
	backoff := 50 * time.Microsecond
	for {
		var serr error
		if err := m.rc.Control(func(fd uintptr) {
			for {
				serr = unix.Sendmsg(int(fd), msg, oob, abstractAddr(to), unix.MSG_NOSIGNAL)
				if serr != unix.EINTR {
					return
				}
			}
		}); err != nil {
			return fmt.Errorf("ipc: send to %s: %w", to, err)
		}
		switch {
		case serr == nil:
			return nil
		case errors.Is(serr, unix.ECONNREFUSED):
			return fmt.Errorf("ipc: send to %s: %w: no process holds that mailbox (gone, or not opened yet): %v", to, ErrNoMailbox, serr)
		case errors.Is(serr, unix.EAGAIN): // the receiver's queue is full
			if time.Now().Add(backoff).After(deadline) {
				return &errTimeout{fmt.Sprintf("ipc: send to %s: its queue stayed full for %v", to, max(timeout, 0))}
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, 10*time.Millisecond)
		default:
			return fmt.Errorf("ipc: send to %s: %w", to, serr)
		}
	}
}

// Recv receives one message, waiting at most timeout. A message with more
// than maxFDs descriptors, truncated data or control data, or not of this
// package is an error, and every descriptor that did arrive is closed first.
func (m *Mailbox) Recv(maxFDs int, timeout time.Duration) (Message, error) {
	if maxFDs < 0 || maxFDs > maxFDsPerMsg {
		return Message{}, fmt.Errorf("ipc: recv on %s: maxFDs %d outside [0, %d]", m.name, maxFDs, maxFDsPerMsg)
	}
	m.rmu.Lock()
	defer m.rmu.Unlock()
	if m.rbuf == nil {
		m.rbuf = make([]byte, 1+maxPayload+1)
		m.roob = make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4*maxFDsPerMsg))
	}
	// Room for maxFDs descriptors only: more is MSG_CTRUNC, refused below.
	buf, oob := m.rbuf, m.roob[:unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4*max(maxFDs, 1))]
	n, oobn, flags, err := recvmsg(m.f, m.rc, timeout, buf, oob)
	if err != nil {
		if m.isClosed() {
			return Message{}, fmt.Errorf("ipc: recv on %s: mailbox closed: %w", m.name, os.ErrClosed)
		}
		if isTimeout(err) {
			return Message{}, &errTimeout{fmt.Sprintf("ipc: recv on %s: nothing came within %v", m.name, max(timeout, 0))}
		}
		return Message{}, fmt.Errorf("ipc: recv on %s: %w", m.name, err)
	}
	fds, cred, perr := parseControl(oob[:oobn])
	msg := Message{FDs: fds}
	if cred != nil {
		msg.PID, msg.UID = int(cred.Pid), int(cred.Uid)
	}
	fail := func(format string, args ...any) (Message, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return Message{}, fmt.Errorf("ipc: recv on %s from pid %d: %w: "+format, append([]any{m.name, msg.PID, ErrBadMessage}, args...)...)
	}
	switch {
	case perr != nil:
		return fail("%v (%d descriptors that arrived are closed)", perr, len(fds))
	case cred == nil:
		return fail("the message carries no credentials; its %d descriptors are closed", len(fds))
	case flags&unix.MSG_CTRUNC != 0:
		return fail("more control data than the %d descriptors expected; the %d that fit are closed", maxFDs, len(fds))
	case len(fds) > maxFDs:
		return fail("%d descriptors, more than the %d expected; all are closed", len(fds), maxFDs)
	case flags&unix.MSG_TRUNC != 0 || n > 1+maxPayload:
		return fail("message larger than %d bytes; its %d descriptors are closed", 1+maxPayload, len(fds))
	case n == 0 || buf[0] != msgVersion:
		return fail("not a message of this package (%d bytes); its %d descriptors are closed", n, len(fds))
	}
	msg.Payload = bytes.Clone(buf[1:n])
	return msg, nil
}

// parseControl returns the descriptors and the credentials in control data.
// Descriptors found before anything unreadable are returned (to be closed)
// along with the error.
func parseControl(oob []byte) ([]int, *unix.Ucred, error) {
	var fds []int
	var cred *unix.Ucred
	var errs []error
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return fds, cred, errors.Join(append(errs, fmt.Errorf("unreadable control data: %w", err))...)
		}
		switch {
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_RIGHTS:
			more, err := parseRights(oob[:len(oob)-len(rest)])
			fds = append(fds, more...)
			if err != nil {
				errs = append(errs, err)
			}
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_CREDENTIALS:
			c, err := unix.ParseUnixCredentials(&unix.SocketControlMessage{Header: h, Data: data})
			if err != nil {
				errs = append(errs, fmt.Errorf("unreadable credentials: %w", err))
				break
			}
			cred = c
		default:
			errs = append(errs, fmt.Errorf("unexpected control message (level %d, type %d)", h.Level, h.Type))
		}
		oob = rest
	}
	return fds, cred, errors.Join(errs...)
}
