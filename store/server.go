package store

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Server serves a Memory over TCP to Clients (see frame.go for the wire
// format). Each connection has a goroutine that reads its requests in order;
// Set, Add and Delete are answered at once, and a Get that must wait gets a
// goroutine of its own, so it holds up neither its connection nor any other.
type Server struct {
	ln        net.Listener
	mem       *Memory
	needToken bool
	tokenHash [sha256.Size]byte

	mu     sync.Mutex
	closed bool
	conns  map[*serverConn]struct{}
	wg     sync.WaitGroup // the accept loop and every connection
}

// Server timing and bounds.
const (
	authTimeout     = 10 * time.Second // a new connection must authenticate within this
	bodyTimeout     = 60 * time.Second // once a frame's length is in, its body within this
	writeTimeout    = 10 * time.Second // a reply must be taken by the client within this
	closingTimeout  = time.Second      // ... or this, while the server closes
	maxWaitingGets  = 4096             // per connection
	lingerTimeout   = 500 * time.Millisecond
	lingerBytes     = 1 << 20
	acceptBackoffHi = time.Second
)

// NewServer listens on addr ("127.0.0.1:0" picks a port; an empty addr means "127.0.0.1:0": loopback unless told otherwise).
// token, if non-empty, must be presented by every client (SYMM_STORE_TOKEN); a client with a wrong/missing token is disconnected after an error reply and never sees data.
func NewServer(addr, token string) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if len(token) > maxTokenLen {
		return nil, fmt.Errorf("store: server token of %d bytes exceeds the %d-byte limit", len(token), maxTokenLen)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store: server cannot listen on %s: %w", addr, err)
	}
	s := &Server{
		ln:        ln,
		mem:       NewMemory(),
		needToken: token != "",
		tokenHash: sha256.Sum256([]byte(token)),
		conns:     map[*serverConn]struct{}{},
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr returns the host:port actually bound.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, wakes every waiting Get with ErrClosed (each client
// gets that reply), then disconnects every client. It is idempotent and
// returns once every goroutine of the server has ended.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.mu.Unlock()

	err := s.ln.Close()
	// From here every request, waiting or new, ends with ErrClosed at once.
	s.mem.Close()
	for _, sc := range conns {
		sc.stop()
	}
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or the like: wait and go on serving the
			// clients already connected.
			time.Sleep(backoff)
			backoff = min(2*backoff, acceptBackoffHi)
			continue
		}
		backoff = 5 * time.Millisecond
		sc := &serverConn{
			s:    s,
			c:    c,
			br:   bufio.NewReader(c),
			done: make(chan struct{}),
			gets: make(chan struct{}, maxWaitingGets),
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[sc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go sc.serve()
	}
}

// serverConn is one client's connection.
type serverConn struct {
	s    *Server
	c    net.Conn
	br   *bufio.Reader
	done chan struct{} // closed when the reader stops: waiting Gets give up
	gets chan struct{} // one token per waiting Get

	handlers sync.WaitGroup // waiting Gets
	wmu      sync.Mutex     // one reply written at a time

	mu       sync.Mutex // orders deadline changes against stop
	stopping bool
}

// stop makes the reader end (and stay ended) and bounds the writes still to
// come, without closing the connection: the replies of waking Gets still go
// out.
func (sc *serverConn) stop() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.stopping = true
	sc.c.SetReadDeadline(time.Unix(1, 0))
	sc.c.SetWriteDeadline(time.Now().Add(closingTimeout))
}

func (sc *serverConn) setReadDeadline(t time.Time) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !sc.stopping {
		sc.c.SetReadDeadline(t)
	}
}

func (sc *serverConn) serve() {
	defer func() {
		close(sc.done)
		sc.handlers.Wait()
		sc.c.Close()
		sc.s.mu.Lock()
		delete(sc.s.conns, sc)
		sc.s.mu.Unlock()
		sc.s.wg.Done()
	}()
	if !sc.auth() {
		return
	}
	for {
		sc.setReadDeadline(time.Time{})
		f, err := sc.readFrame(maxFrame, bodyTimeout)
		if err != nil {
			return
		}
		sc.handle(f)
	}
}

// readFrame reads and decodes one frame; once its length is in, the body
// must follow within body (0: keep the deadline already set). A frame that
// breaks the format is answered with statusBadFrame before the error is
// returned.
func (sc *serverConn) readFrame(limit int, body time.Duration) (frame, error) {
	n, err := readFrameLen(sc.br, limit)
	if err == nil {
		if body > 0 {
			sc.setReadDeadline(time.Now().Add(body))
		}
		var b []byte
		if b, err = readFrameBody(sc.br, n); err == nil {
			var f frame
			if f, err = decodeFrame(b); err == nil {
				return f, nil
			}
		}
	}
	var fe *frameError
	if errors.As(err, &fe) {
		sc.reply(frame{status: statusBadFrame, value: []byte(fmt.Sprintf(
			"store server %s: %v; closing the connection", sc.s.Addr(), err))})
		sc.linger()
	}
	return frame{}, err
}

// linger ends our side of the stream and drains what the client still sends
// for a moment before the connection is closed: closing with unread bytes
// would reset the connection and could destroy the error reply before the
// client reads it.
func (sc *serverConn) linger() {
	if tc, ok := sc.c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	sc.setReadDeadline(time.Now().Add(lingerTimeout))
	io.Copy(io.Discard, io.LimitReader(sc.br, lingerBytes))
}

// auth reads the connection's first frame, which must be an Auth with the
// protocol version and, if the server has one, the token.
func (sc *serverConn) auth() bool {
	sc.setReadDeadline(time.Now().Add(authTimeout))
	f, err := sc.readFrame(maxAuthFrame, 0) // all within authTimeout
	if err != nil {
		return false
	}
	var msg string
	switch {
	case f.op != opAuth:
		msg = fmt.Sprintf("the first frame must be auth, not %s", opNames[f.op])
	case f.num != protocolVersion:
		msg = fmt.Sprintf("client speaks protocol version %d, server %s speaks %d", f.num, sc.s.Addr(), protocolVersion)
	case sc.s.needToken:
		// Hashing first makes the comparison constant-time in the length too.
		h := sha256.Sum256(f.value)
		if subtle.ConstantTimeCompare(h[:], sc.s.tokenHash[:]) != 1 {
			if len(f.value) == 0 {
				msg = fmt.Sprintf("server %s requires a token and none was given (set SYMM_STORE_TOKEN)", sc.s.Addr())
			} else {
				msg = fmt.Sprintf("wrong token for server %s (SYMM_STORE_TOKEN must match the server's)", sc.s.Addr())
			}
		}
	}
	if msg != "" {
		sc.reply(frame{id: f.id, status: statusAuth, value: []byte(msg)})
		sc.linger()
		return false
	}
	sc.reply(frame{id: f.id})
	return true
}

func (sc *serverConn) handle(f frame) {
	r := frame{id: f.id}
	var err error
	switch f.op {
	case opSet:
		err = sc.s.mem.Set(f.key, f.value)
	case opAdd:
		r.num, err = sc.s.mem.Add(f.key, f.num)
	case opDelete:
		err = sc.s.mem.Delete(f.key)
	case opGet:
		if f.num > 0 {
			sc.waitGet(f)
			return
		}
		r.value, err = sc.s.mem.Get(f.key, 0)
	default:
		err = fmt.Errorf("store: %s is not a request after authentication", opNames[f.op])
	}
	sc.replyErr(r, err)
}

// waitGet answers a Get that may wait, from a goroutine of its own.
func (sc *serverConn) waitGet(f frame) {
	select {
	case sc.gets <- struct{}{}:
	default:
		sc.reply(frame{id: f.id, status: statusBusy, value: []byte(fmt.Sprintf(
			"store: get %q: %d Gets are already waiting on this connection", f.key, maxWaitingGets))})
		return
	}
	sc.handlers.Add(1)
	go func() {
		defer sc.handlers.Done()
		defer func() { <-sc.gets }()
		v, err := sc.s.mem.get(f.key, time.Duration(f.num), sc.done)
		if errors.Is(err, errCanceled) {
			return // the connection is gone: nobody to answer
		}
		sc.replyErr(frame{id: f.id, value: v}, err)
	}()
}

func (sc *serverConn) replyErr(r frame, err error) {
	if err != nil {
		r.num, r.value = 0, []byte(err.Error())
		switch {
		case errors.Is(err, ErrTimeout):
			r.status = statusTimeout
		case errors.Is(err, ErrClosed):
			r.status = statusClosed
		default:
			r.status = statusInvalid
		}
	}
	sc.reply(r)
}

// reply writes r whole. A client that does not take it in time is
// disconnected: a half-written frame would put the stream out of step.
func (sc *serverConn) reply(r frame) {
	r.op = opReply
	buf := appendFrame(nil, r)
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	sc.mu.Lock()
	if sc.stopping {
		sc.c.SetWriteDeadline(time.Now().Add(closingTimeout))
	} else {
		sc.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	}
	sc.mu.Unlock()
	if _, err := sc.c.Write(buf); err != nil {
		sc.c.Close()
	}
}
