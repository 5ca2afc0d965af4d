package ipc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	maxNameLen   = 100
	maxPayload   = 64 << 10
	maxFDsPerMsg = 253 // SCM_MAX_FD
	backlog      = 64
	sendTimeout  = 30 * time.Second

	// Every message starts with this byte, so an empty payload is not
	// mistaken for the end of the connection (both read as 0 bytes), and a
	// stranger's message is told apart.
	msgVersion byte = 1
)

// socketFlags: every socket is close-on-exec and non-blocking (the runtime
// poller waits for it).
const socketFlags = unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK

func checkName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("ipc: socket name %q must be 1 to %d bytes, not %d", name, maxNameLen, len(name))
	}
	return nil
}

func abstractAddr(name string) *unix.SockaddrUnix { return &unix.SockaddrUnix{Name: "\x00" + name} }

// pollable hands fd to the runtime poller. From here on the file owns fd.
func pollable(fd int, name string) (*os.File, syscall.RawConn, error) {
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err == nil {
		err = f.SetDeadline(time.Time{}) // fails unless the poller took it
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}

// ErrPeerClosed is wrapped by the error of a Send or Recv on a connection
// whose peer has closed it (or exited): nothing more will come or go.
var ErrPeerClosed = errors.New("the peer closed the connection")

// errTimeout is a wait that ran out; it wraps os.ErrDeadlineExceeded.
type errTimeout struct{ msg string }

func (e *errTimeout) Error() string { return e.msg }
func (e *errTimeout) Unwrap() error { return os.ErrDeadlineExceeded }
func (e *errTimeout) Timeout() bool { return true }

// errWouldBlock ends a wait with timeout <= 0 that found nothing.
var errWouldBlock = errors.New("would block")

// wait runs op (a non-blocking syscall that returns false for EAGAIN) until
// it returns true, waiting for f to be readable at most timeout; timeout <= 0
// tries once. A timeout returns os.ErrDeadlineExceeded or errWouldBlock.
func wait(f *os.File, rc syscall.RawConn, timeout time.Duration, op func(fd int) bool) error {
	if timeout <= 0 {
		done := false
		if err := rc.Control(func(fd uintptr) { done = op(int(fd)) }); err != nil {
			return err
		}
		if !done {
			return errWouldBlock
		}
		return nil
	}
	if err := f.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool { return op(int(fd)) })
}

// recvmsg receives one message into buf and oob (descriptors arrive
// close-on-exec), waiting at most timeout.
func recvmsg(f *os.File, rc syscall.RawConn, timeout time.Duration, buf, oob []byte) (n, oobn, flags int, err error) {
	var rerr error
	err = wait(f, rc, timeout, func(fd int) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = rerr
	}
	return n, oobn, flags, err
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errWouldBlock)
}

// Listener accepts connections on an abstract-namespace Unix socket (Linux: name starts with NUL, no filesystem entry, gone when the process dies).
type Listener struct {
	name     string
	uid      int
	f        *os.File
	rc       syscall.RawConn
	acceptMu sync.Mutex // one Accept at a time: they share the read deadline
	rejected atomic.Int64
	closed   atomic.Bool
}

// Listen binds the abstract socket "\x00"+name. name must be non-empty, <= 100 bytes.
func Listen(name string) (*Listener, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|socketFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("ipc: listen on %s: socket: %w", name, err)
	}
	if err := unix.Bind(fd, abstractAddr(name)); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("ipc: listen on %s: the name is taken by a live process: %w", name, err)
		}
		return nil, fmt.Errorf("ipc: listen on %s: bind: %w", name, err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ipc: listen on %s: %w", name, err)
	}
	f, rc, err := pollable(fd, name)
	if err != nil {
		return nil, fmt.Errorf("ipc: listen on %s: %w", name, err)
	}
	return &Listener{name: name, uid: os.Getuid(), f: f, rc: rc}, nil
}

// Name returns the socket's name, without the leading NUL.
func (l *Listener) Name() string { return l.name }

// Rejected returns how many connections Accept has closed because they came
// from another process than the one expected, over the listener's life.
func (l *Listener) Rejected() int { return int(l.rejected.Load()) }

// Close stops listening; an Accept waiting returns an error at once.
func (l *Listener) Close() error {
	l.closed.Store(true)
	return l.f.Close()
}

// Accept waits (at most timeout) for a connection from a process with the given pid and the same uid as ours (SO_PEERCRED);
// connections from any other process are closed and counted (Rejected()) and Accept keeps waiting for the expected one.
func (l *Listener) Accept(pid int, timeout time.Duration) (*Conn, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("ipc: accept on %s: expected pid must be positive, not %d", l.name, pid)
	}
	return l.AcceptFrom(func(p int) bool { return p == pid }, fmt.Sprintf("pid %d", pid), timeout)
}

// AcceptFrom waits (at most timeout) for a connection from a process of our
// uid whose pid (as SO_PEERCRED gives it, fixed when the peer connected)
// wanted accepts; what names the expected processes in errors. Connections
// from any other process are closed and counted (Rejected()), and
// AcceptFrom keeps waiting.
func (l *Listener) AcceptFrom(wanted func(pid int) bool, what string, timeout time.Duration) (*Conn, error) {
	l.acceptMu.Lock()
	defer l.acceptMu.Unlock()
	deadline := time.Now().Add(timeout)
	rejected := 0
	var last string // the last process rejected, for the error
	for {
		var nfd int
		var aerr error
		err := wait(l.f, l.rc, time.Until(deadline), func(fd int) bool {
			for {
				nfd, _, aerr = unix.Accept4(fd, socketFlags)
				if aerr != unix.EINTR && aerr != unix.ECONNABORTED {
					return aerr != unix.EAGAIN
				}
			}
		})
		if err == nil {
			err = aerr
		}
		if err != nil {
			others := ""
			if rejected > 0 {
				others = fmt.Sprintf(" (%d other %s rejected, the last %s)", rejected, plural(rejected, "process", "processes"), last)
			}
			switch {
			case l.closed.Load():
				return nil, fmt.Errorf("ipc: accept on %s: listener closed while waiting for %s%s: %w", l.name, what, others, os.ErrClosed)
			case isTimeout(err):
				return nil, &errTimeout{fmt.Sprintf("ipc: accept on %s: waited %v for %s, none came%s",
					l.name, max(timeout, 0), what, others)}
			}
			return nil, fmt.Errorf("ipc: accept on %s (waiting for %s): %w", l.name, what, err)
		}
		cred, err := unix.GetsockoptUcred(nfd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			unix.Close(nfd)
			return nil, fmt.Errorf("ipc: accept on %s: reading the peer's credentials: %w", l.name, err)
		}
		if int(cred.Uid) != l.uid || cred.Pid <= 0 || !wanted(int(cred.Pid)) {
			unix.Close(nfd)
			l.rejected.Add(1)
			rejected++
			last = fmt.Sprintf("pid %d uid %d", cred.Pid, cred.Uid)
			continue
		}
		return newConn(nfd, l.name, int(cred.Pid))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Dial connects to the abstract socket name, retrying until timeout (the peer may not be listening yet),
// and checks the server is process pid with our uid (SO_PEERCRED) — else closes and returns an error naming the pid found.
func Dial(name string, pid int, timeout time.Duration) (*Conn, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if pid <= 0 {
		return nil, fmt.Errorf("ipc: dial %s: expected pid must be positive, not %d", name, pid)
	}
	start := time.Now()
	deadline := start.Add(timeout)
	backoff := 2 * time.Millisecond
	for attempt := 1; ; attempt++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|socketFlags, 0)
		if err != nil {
			return nil, fmt.Errorf("ipc: dial %s: socket: %w", name, err)
		}
		err = unix.Connect(fd, abstractAddr(name))
		if err == nil {
			return checkServer(fd, name, pid)
		}
		unix.Close(fd)
		// ECONNREFUSED: nobody has the name yet; EAGAIN: its backlog is full.
		if err != unix.ECONNREFUSED && err != unix.EAGAIN && err != unix.EINTR {
			return nil, fmt.Errorf("ipc: dial %s (pid %d): %w", name, pid, err)
		}
		if time.Now().Add(backoff).After(deadline) {
			return nil, &errTimeout{fmt.Sprintf("ipc: dial %s: pid %d was not listening within %v (%d attempts; last: %v)",
				name, pid, time.Since(start).Round(time.Millisecond), attempt, err)}
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// checkServer makes a Conn of connected fd if the listener is pid with our uid.
func checkServer(fd int, name string, pid int) (*Conn, error) {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ipc: dial %s: reading the listener's credentials: %w", name, err)
	}
	if uid := os.Getuid(); int(cred.Pid) != pid || int(cred.Uid) != uid {
		unix.Close(fd)
		return nil, fmt.Errorf("ipc: dial %s: the listener is pid %d (uid %d), expected pid %d (uid %d)",
			name, cred.Pid, cred.Uid, pid, uid)
	}
	return newConn(fd, name, pid)
}

// Conn is a connection to a process whose pid was checked.
type Conn struct {
	name string
	pid  int
	f    *os.File
	rc   syscall.RawConn
	rmu  sync.Mutex // one Recv at a time: they share the read deadline and rbuf
	wmu  sync.Mutex // one Send at a time: they share the write deadline
	// rbuf receives every message (made at the first Recv): a message is
	// copied out of it, so a Recv allocates only its payload.
	rbuf []byte

	closed atomic.Bool
}

func newConn(fd int, name string, pid int) (*Conn, error) {
	f, rc, err := pollable(fd, name)
	if err != nil {
		return nil, fmt.Errorf("ipc: %s: %w", name, err)
	}
	return &Conn{name: name, pid: pid, f: f, rc: rc}, nil
}

// PeerPID returns the pid of the process at the other end, as checked.
func (c *Conn) PeerPID() int { return c.pid }

// Close closes the connection; a Send or Recv waiting returns an error at once.
func (c *Conn) Close() error {
	c.closed.Store(true)
	return c.f.Close()
}

// Send sends payload (<= 64 KiB) and fds in one message (SCM_RIGHTS),
// waiting at most 30 s for the peer to make room. The fds stay ours: the
// peer receives duplicates.
func (c *Conn) Send(payload []byte, fds []int) error { return c.SendWithin(payload, fds, sendTimeout) }

// SendWithin is Send waiting at most timeout for the peer to make room.
func (c *Conn) SendWithin(payload []byte, fds []int, timeout time.Duration) error {
	if len(payload) > maxPayload {
		return fmt.Errorf("ipc: send to pid %d on %s: payload of %d bytes exceeds %d", c.pid, c.name, len(payload), maxPayload)
	}
	if len(fds) > maxFDsPerMsg {
		return fmt.Errorf("ipc: send to pid %d on %s: %d descriptors exceed the %d a message carries", c.pid, c.name, len(fds), maxFDsPerMsg)
	}
	for _, fd := range fds {
		if fd < 0 {
			return fmt.Errorf("ipc: send to pid %d on %s: invalid descriptor %d", c.pid, c.name, fd)
		}
	}
	msg := append([]byte{msgVersion}, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.f.SetWriteDeadline(time.Now().Add(max(timeout, time.Nanosecond))); err != nil {
		return fmt.Errorf("ipc: send to pid %d on %s: %w", c.pid, c.name, err)
	}
	var n int
	var serr error
	err := c.rc.Write(func(fd uintptr) bool {
		for {
			n, serr = unix.SendmsgN(int(fd), msg, oob, nil, unix.MSG_NOSIGNAL)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = serr
	}
	switch {
	case err != nil && c.closed.Load():
		return fmt.Errorf("ipc: send to pid %d on %s: connection closed: %w", c.pid, c.name, os.ErrClosed)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &errTimeout{fmt.Sprintf("ipc: send to pid %d on %s: the peer took nothing for %v", c.pid, c.name, max(timeout, 0))}
	case errors.Is(err, unix.EPIPE), errors.Is(err, unix.ECONNRESET):
		return fmt.Errorf("ipc: send to pid %d on %s: %w: %w", c.pid, c.name, ErrPeerClosed, err)
	case err != nil:
		return fmt.Errorf("ipc: send to pid %d on %s: %w", c.pid, c.name, err)
	case n != len(msg):
		return fmt.Errorf("ipc: send to pid %d on %s: sent %d of %d bytes", c.pid, c.name, n, len(msg))
	}
	return nil
}

// Recv receives one message, waiting at most timeout; returns the payload and the received fds (the caller owns them).
// More fds than maxFDs, a truncated message or control data (MSG_CTRUNC) is an error, and every fd that did arrive is closed first (never leak).
func (c *Conn) Recv(maxFDs int, timeout time.Duration) ([]byte, []int, error) {
	if maxFDs < 0 || maxFDs > maxFDsPerMsg {
		return nil, nil, fmt.Errorf("ipc: recv from pid %d on %s: maxFDs %d outside [0, %d]", c.pid, c.name, maxFDs, maxFDsPerMsg)
	}
	var oob []byte
	if maxFDs > 0 {
		oob = make([]byte, unix.CmsgSpace(4*maxFDs))
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rbuf == nil {
		// One byte more than a message may hold, so an oversized one shows
		// as such even where the kernel does not flag it.
		c.rbuf = make([]byte, 1+maxPayload+1)
	}
	buf := c.rbuf
	n, oobn, flags, err := recvmsg(c.f, c.rc, timeout, buf, oob)
	if errors.Is(err, unix.ECONNRESET) {
		// The peer closed with messages of ours unread. The kernel reports
		// that once, before what the peer sent us first: read on, down to
		// the end of the connection.
		n, oobn, flags, err = recvmsg(c.f, c.rc, timeout, buf, oob)
	}
	if err != nil {
		if c.closed.Load() {
			return nil, nil, fmt.Errorf("ipc: recv from pid %d on %s: connection closed: %w", c.pid, c.name, os.ErrClosed)
		}
		if isTimeout(err) {
			return nil, nil, &errTimeout{fmt.Sprintf("ipc: recv from pid %d on %s: nothing came within %v", c.pid, c.name, max(timeout, 0))}
		}
		if errors.Is(err, unix.ECONNRESET) {
			return nil, nil, fmt.Errorf("ipc: recv from pid %d on %s: %w: %w", c.pid, c.name, ErrPeerClosed, err)
		}
		return nil, nil, fmt.Errorf("ipc: recv from pid %d on %s: %w", c.pid, c.name, err)
	}
	fds, perr := parseRights(oob[:oobn])
	fail := func(format string, args ...any) ([]byte, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, fmt.Errorf("ipc: recv from pid %d on %s: "+format, append([]any{c.pid, c.name}, args...)...)
	}
	switch {
	case perr != nil:
		return fail("%v (%d descriptors that arrived are closed)", perr, len(fds))
	case flags&unix.MSG_CTRUNC != 0:
		return fail("the peer sent more than the %d descriptors expected; the %d that fit are closed, the kernel dropped the rest", maxFDs, len(fds))
	case len(fds) > maxFDs:
		return fail("the peer sent %d descriptors, more than the %d expected; all are closed", len(fds), maxFDs)
	case flags&unix.MSG_TRUNC != 0 || n > 1+maxPayload:
		return fail("message larger than %d bytes; its %d descriptors are closed", 1+maxPayload, len(fds))
	case n == 0 && len(fds) == 0: // every message holds at least its version byte
		return nil, nil, fmt.Errorf("ipc: recv from pid %d on %s: %w", c.pid, c.name, ErrPeerClosed)
	case n == 0 || buf[0] != msgVersion:
		return fail("not a message of this package (%d bytes, first %#x); its %d descriptors are closed", n, buf[:min(n, 1)], len(fds))
	}
	return bytes.Clone(buf[1:n]), fds, nil
}

// parseRights returns the descriptors in control data, message by message,
// so that those found before anything unreadable are returned (to be closed)
// along with the error.
func parseRights(oob []byte) ([]int, error) {
	var fds []int
	var errs []error
	for len(oob) >= unix.CmsgLen(0) {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return fds, errors.Join(append(errs, fmt.Errorf("unreadable control data: %w", err))...)
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_RIGHTS {
			for i := 0; i+4 <= len(data); i += 4 {
				fds = append(fds, int(int32(binary.NativeEndian.Uint32(data[i:]))))
			}
		} else {
			errs = append(errs, fmt.Errorf("unexpected control message (level %d, type %d)", h.Level, h.Type))
		}
		oob = rest
	}
	return fds, errors.Join(errs...)
}
