package store

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/libsymm/libsymm/internal/errs"
)

// Client is a Store served by a Server in this or another process.
//
// Calls are pipelined on one connection: each request carries an id, one
// goroutine reads the replies and hands each to the call waiting for its id,
// and a mutex keeps the frames of concurrent calls whole. So calls from many
// goroutines are safe, and one waiting Get does not delay the others.
type Client struct {
	addr   string
	conn   net.Conn
	br     *bufio.Reader
	margin time.Duration // how long past its own wait a call waits for its reply

	wmu sync.Mutex // one request written at a time

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan result // calls waiting for their reply, by id
	err     error                  // once set, the client is finished: every call returns it
	done    chan struct{}          // closed when the reply reader has ended
}

var _ Store = (*Client)(nil)

type result struct {
	f   frame
	err error
}

// replyMargin is how long a Client waits for a reply beyond the call's own
// wait (a Get's timeout; nothing for the other calls). It is generous: it
// only has to tell a hung or unreachable server from a busy one.
const replyMargin = 10 * time.Second

// Dial connects to a server (retrying until timeout, since ranks start in any order) and authenticates with token.
// A server that answers but refuses the token ends the retrying at once.
// timeout <= 0 tries once.
func Dial(addr, token string, timeout time.Duration) (*Client, error) {
	if addr == "" {
		return nil, errors.New("store: dial: no server address given")
	}
	// A malformed address is refused at once: no server will ever answer
	// at it, however long the ranks wait for each other.
	if err := checkAddr(addr); err != nil {
		return nil, err
	}
	if len(token) > maxTokenLen {
		return nil, fmt.Errorf("store: dial %s: token of %d bytes exceeds the %d-byte limit", addr, len(token), maxTokenLen)
	}
	start := time.Now()
	deadline := start.Add(timeout)
	backoff := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		c, err := dialOnce(addr, token, deadline)
		if err == nil {
			return c, nil
		}
		var ae *authError
		if errors.As(err, &ae) {
			return nil, fmt.Errorf("store: dial %s: authentication failed: %w", addr, err)
		}
		if time.Now().Add(backoff).After(deadline) {
			return nil, fmt.Errorf("store: dial %s: no store server answered within %v (%d attempts): %w",
				addr, time.Since(start).Round(time.Millisecond), attempt, err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

// checkAddr refuses an address that is not host:port with a port from 1 to
// 65535 (a host may be empty: this machine), as ErrInvalid.
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: store: dial %q: want host:port (e.g. 127.0.0.1:29500): %v", errs.ErrInvalid, addr, err)
	}
	if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: store: dial %q: port %q is not a number from 1 to 65535", errs.ErrInvalid, addr, port)
	}
	return nil
}

// authError is the server's refusal of our Auth frame.
type authError struct{ msg string }

func (e *authError) Error() string { return e.msg }

// dialOnce connects and authenticates; each attempt gets at least a second,
// so that a zero timeout still tries once.
func dialOnce(addr, token string, deadline time.Time) (*Client, error) {
	attemptDeadline := deadline
	if time.Until(attemptDeadline) < time.Second {
		attemptDeadline = time.Now().Add(time.Second)
	}
	conn, err := net.DialTimeout("tcp", addr, time.Until(attemptDeadline))
	if err != nil {
		return nil, err
	}
	c := &Client{
		addr:    addr,
		conn:    conn,
		br:      bufio.NewReader(conn),
		margin:  replyMargin,
		pending: map[uint64]chan result{},
		done:    make(chan struct{}),
	}
	if err := c.handshake(token, attemptDeadline); err != nil {
		conn.Close()
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

func (c *Client) handshake(token string, deadline time.Time) error {
	c.conn.SetDeadline(deadline)
	req := appendFrame(nil, frame{op: opAuth, num: protocolVersion, value: []byte(token)})
	if _, err := c.conn.Write(req); err != nil {
		return err
	}
	f, err := c.readReply()
	if err != nil {
		return fmt.Errorf("reading the answer to our auth: %w", err)
	}
	switch f.status {
	case statusOK:
	case statusAuth:
		return &authError{string(f.value)}
	default:
		return fmt.Errorf("server refused our auth: %s", f.value)
	}
	return c.conn.SetDeadline(time.Time{})
}

func (c *Client) readReply() (frame, error) {
	n, err := readFrameLen(c.br, maxFrame)
	if err != nil {
		return frame{}, err
	}
	body, err := readFrameBody(c.br, n)
	if err != nil {
		return frame{}, err
	}
	f, err := decodeFrame(body)
	if err == nil && f.op != opReply {
		err = badFrame("server sent a %s request", opNames[f.op])
	}
	return f, err
}

// readLoop hands each reply to its call until the connection ends.
func (c *Client) readLoop() {
	defer close(c.done)
	for {
		f, err := c.readReply()
		if err != nil {
			c.fail(&lostError{addr: c.addr, cause: err})
			return
		}
		if f.id == 0 { // about the connection as a whole: it is over
			c.fail(&lostError{addr: c.addr, cause: errors.New(string(f.value))})
			return
		}
		c.mu.Lock()
		ch := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if ch != nil { // nil: the call gave up already
			ch <- result{f: f}
		}
	}
}

// lostError is a connection that ended under the client.
type lostError struct {
	addr  string
	cause error
}

func (e *lostError) Error() string {
	return fmt.Sprintf("connection to store server %s lost (server closed or died): %v", e.addr, e.cause)
}
func (e *lostError) Unwrap() []error { return []error{ErrClosed, e.cause} }

// fail finishes the client with err (the first reason wins), answers every
// pending call with it and closes the connection.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	pending := c.pending
	c.pending = map[uint64]chan result{}
	err = c.err
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- result{err: err}
	}
	c.conn.Close()
}

// call sends f and waits for its reply, at most wait plus the margin.
func (c *Client) call(f frame, wait time.Duration) (frame, error) {
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return frame{}, c.callError(f, err)
	}
	c.nextID++
	f.id = c.nextID
	c.pending[f.id] = ch
	c.mu.Unlock()

	limit := c.margin
	if wait > 0 {
		limit = min(wait, math.MaxInt64-limit) + limit // no overflow for "forever"
	}
	deadline := time.Now().Add(limit)
	buf := appendFrame(nil, f)
	c.wmu.Lock()
	c.conn.SetWriteDeadline(deadline)
	_, err := c.conn.Write(buf)
	c.wmu.Unlock()
	if err != nil {
		// Part of the frame may be out: the stream is out of step for good.
		c.fail(&lostError{addr: c.addr, cause: err})
	}

	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var r result
	select {
	case r = <-ch:
	case <-timer.C:
		c.mu.Lock()
		_, waiting := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if waiting {
			return frame{}, c.callError(f, fmt.Errorf("%w: no reply from store server %s within %v (server hung or unreachable)",
				ErrTimeout, c.addr, limit))
		}
		r = <-ch // the reply came as the timer fired
	}
	if r.err != nil {
		return frame{}, c.callError(f, r.err)
	}
	if r.f.status != statusOK {
		return frame{}, &remoteError{msg: string(r.f.value), addr: c.addr, status: r.f.status}
	}
	return r.f, nil
}

func (c *Client) callError(f frame, err error) error {
	return fmt.Errorf("store: %s %q: %w", opNames[f.op], f.key, err)
}

// remoteError is the server's refusal of a request; its message already
// names the operation and the key.
type remoteError struct {
	msg    string
	addr   string
	status byte
}

func (e *remoteError) Error() string { return fmt.Sprintf("%s (store server %s)", e.msg, e.addr) }

func (e *remoteError) Unwrap() error {
	switch e.status {
	case statusTimeout:
		return ErrTimeout
	case statusClosed:
		return ErrClosed
	}
	return nil
}

// Set stores value under key on the server.
func (c *Client) Set(key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("store: set: %w", err)
	}
	if err := checkValue(key, value); err != nil {
		return fmt.Errorf("store: set: %w", err)
	}
	_, err := c.call(frame{op: opSet, key: key, value: value}, 0)
	return err
}

// Get returns key's value, which the server waits for at most timeout.
func (c *Client) Get(key string, timeout time.Duration) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("store: get: %w", err)
	}
	f, err := c.call(frame{op: opGet, key: key, num: int64(timeout)}, timeout)
	if err != nil {
		return nil, err
	}
	return f.value, nil
}

// Add adds delta to the decimal integer at key and returns the sum.
func (c *Client) Add(key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, fmt.Errorf("store: add: %w", err)
	}
	f, err := c.call(frame{op: opAdd, key: key, num: delta}, 0)
	if err != nil {
		return 0, err
	}
	return f.num, nil
}

// Delete removes key on the server.
func (c *Client) Delete(key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("store: delete: %w", err)
	}
	_, err := c.call(frame{op: opDelete, key: key}, 0)
	return err
}

// Close disconnects; waiting calls fail with ErrClosed. It is idempotent and
// returns once the reply reader has ended.
func (c *Client) Close() error {
	c.fail(fmt.Errorf("%w: client of %s closed", ErrClosed, c.addr))
	<-c.done
	return nil
}

// setGet sends a Set and a Get for each of keys in one write and waits for
// all their replies: one round trip for an all-gather. The server reads a
// connection's requests in order, so the Gets see the Set.
func (c *Client) setGet(key string, value []byte, keys []string, timeout time.Duration) ([][]byte, []error, error) {
	if err := checkKey(key); err != nil {
		return nil, nil, fmt.Errorf("store: set: %w", err)
	}
	if err := checkValue(key, value); err != nil {
		return nil, nil, fmt.Errorf("store: set: %w", err)
	}
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, nil, fmt.Errorf("store: get: %w", err)
		}
	}
	wait := max(timeout, time.Nanosecond) // a Get with 0 would not wait at all
	frames := make([]frame, 1+len(keys))
	frames[0] = frame{op: opSet, key: key, value: value}
	for i, k := range keys {
		frames[1+i] = frame{op: opGet, key: k, num: int64(wait)}
	}
	res := c.batch(frames, wait)
	vals, errs := make([][]byte, len(keys)), make([]error, len(keys))
	for i := range keys {
		vals[i], errs[i] = res[1+i].f.value, res[1+i].err
	}
	return vals, errs, res[0].err
}

// batch sends frames in one write and returns each one's reply (result.err
// set for a failed one), waiting at most wait plus the margin in all.
func (c *Client) batch(frames []frame, wait time.Duration) []result {
	res := make([]result, len(frames))
	ch := make(chan result, len(frames)) // every id gets at most one result
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		for i := range res {
			res[i].err = c.callError(frames[i], err)
		}
		return res
	}
	first := c.nextID + 1
	var buf []byte
	for i := range frames {
		c.nextID++
		frames[i].id = c.nextID
		c.pending[frames[i].id] = ch
		buf = appendFrame(buf, frames[i])
	}
	c.mu.Unlock()

	limit := min(wait, math.MaxInt64-c.margin) + c.margin
	deadline := time.Now().Add(limit)
	c.wmu.Lock()
	c.conn.SetWriteDeadline(deadline)
	_, err := c.conn.Write(buf)
	c.wmu.Unlock()
	if err != nil {
		c.fail(&lostError{addr: c.addr, cause: err})
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	got := make([]bool, len(frames))
	for n := 0; n < len(frames); n++ {
		var r result
		select {
		case r = <-ch:
		case <-timer.C:
			c.mu.Lock()
			for i := range frames {
				delete(c.pending, frames[i].id)
			}
			c.mu.Unlock()
			// Replies that came as the timer fired are in ch; the rest never will be.
			for late := true; late; {
				select {
				case r := <-ch:
					c.settle(frames, res, got, first, r)
				default:
					late = false
				}
			}
			for i := range frames {
				if !got[i] {
					res[i].err = c.callError(frames[i], fmt.Errorf("%w: no reply from store server %s within %v (server hung or unreachable)",
						ErrTimeout, c.addr, limit))
				}
			}
			return res
		}
		c.settle(frames, res, got, first, r)
	}
	return res
}

// settle files reply r of a batch whose ids start at first.
func (c *Client) settle(frames []frame, res []result, got []bool, first uint64, r result) {
	if r.err != nil && r.f.id == 0 { // the connection failed: fail() sends only the error
		for i := range frames {
			if !got[i] {
				res[i].err, got[i] = c.callError(frames[i], r.err), true
				return
			}
		}
		return
	}
	i := int(r.f.id - first)
	got[i] = true
	if r.f.status != statusOK {
		res[i].err = &remoteError{msg: string(r.f.value), addr: c.addr, status: r.f.status}
		return
	}
	res[i].f = r.f
}
