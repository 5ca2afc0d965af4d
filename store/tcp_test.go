package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/internal/errs"
)

func TestServerAddrLoopbackByDefault(t *testing.T) {
	noLeaks(t)
	srv := newServer(t, "")
	host, port, err := net.SplitHostPort(srv.Addr())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	require.NotEqual(t, "0", port)
}

func TestServerCloseIsIdempotent(t *testing.T) {
	noLeaks(t)
	srv, err := NewServer("", "")
	require.NoError(t, err)
	c := dial(t, srv.Addr(), "")
	require.NoError(t, c.Set("k", []byte("v")))
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())
}

func TestAuth(t *testing.T) {
	for _, tc := range []struct {
		name, server, client string
		err                  string // "" = accepted
	}{
		{"matching token", "s3cret", "s3cret", ""},
		{"no token anywhere", "", "", ""},
		{"token the server does not need", "", "extra", ""},
		{"wrong token", "s3cret", "guess", "wrong token"},
		{"missing token", "s3cret", "", "requires a token and none was given"},
		{"prefix of the token", "s3cret", "s3cre", "wrong token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			srv := newServer(t, tc.server)
			start := time.Now()
			c, err := Dial(srv.Addr(), tc.client, 5*time.Second)
			if tc.err == "" {
				require.NoError(t, err)
				require.NoError(t, c.Set("k", []byte("v")))
				require.NoError(t, c.Close())
				return
			}
			require.ErrorContains(t, err, tc.err)
			require.ErrorContains(t, err, "authentication failed")
			require.ErrorContains(t, err, srv.Addr())
			require.ErrorContains(t, err, "SYMM_STORE_TOKEN")
			require.Less(t, time.Since(start), time.Second, "a refused token is not retried")
		})
	}
}

// rawConn connects without the client, to speak the protocol by hand.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(3 * time.Second))
	return c
}

func lengthPrefix(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

func authFrame(token string) []byte {
	return appendFrame(nil, frame{op: opAuth, num: protocolVersion, value: []byte(token)})
}

// TestBadFramesCloseOnlyTheirConnection sends broken frames by hand: each
// gets an error reply and its connection closed, while a well-behaved
// client of the same server goes on working.
func TestBadFramesCloseOnlyTheirConnection(t *testing.T) {
	noLeaks(t)
	srv := newServer(t, "tok")
	good := dial(t, srv.Addr(), "tok")
	setFrame := appendFrame(nil, frame{op: opSet, key: "k", value: []byte("v")})
	badUTF8 := appendFrame(nil, frame{op: opSet, key: "ok"})
	badUTF8[4+headerLen] = 0xff
	for _, tc := range []struct {
		name   string
		authed bool   // send a good auth frame first
		send   []byte // then this
		status byte   // the error reply expected (0: just a close)
		msg    string
	}{
		{"oversized before auth", false, lengthPrefix(maxAuthFrame + 1), statusBadFrame, "exceeds"},
		{"oversized after auth", true, lengthPrefix(0xffffffff), statusBadFrame, "exceeds"},
		{"shorter than a header", true, append(lengthPrefix(3), 1, 2, 3), statusBadFrame, "shorter"},
		{"unknown op", true, appendFrame(nil, frame{op: 0x42}), statusBadFrame, "unknown op"},
		{"request with a status", true, appendFrame(nil, frame{op: opDelete, status: 1}), statusBadFrame, "status"},
		{"get with a value", true, appendFrame(nil, frame{op: opGet, key: "k", value: []byte("x")}), statusBadFrame, "value"},
		{"key not utf8", true, badUTF8, statusBadFrame, "UTF-8"},
		{"key longer than the frame", true, func() []byte {
			b := appendFrame(nil, frame{op: opDelete, key: "k"})
			binary.BigEndian.PutUint16(b[4+18:], 100)
			return b
		}(), statusBadFrame, "key length"},
		{"request before auth", false, setFrame, statusAuth, "first frame must be auth"},
		{"wrong protocol version", false, appendFrame(nil, frame{op: opAuth, num: 99, value: []byte("tok")}), statusAuth, "protocol version 99"},
		{"ascii garbage", false, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), statusBadFrame, "exceeds"},
		{"truncated body then close", true, lengthPrefix(1000), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, srv.Addr())
			br := bufio.NewReader(c)
			if tc.authed {
				_, err := c.Write(authFrame("tok"))
				require.NoError(t, err)
				f := readTestReply(t, br)
				require.Equal(t, statusOK, f.status, string(f.value))
			}
			_, err := c.Write(tc.send)
			require.NoError(t, err)
			if tc.status == 0 {
				c.(*net.TCPConn).CloseWrite()
			} else {
				f := readTestReply(t, br)
				require.Equal(t, tc.status, f.status)
				require.Contains(t, string(f.value), tc.msg)
			}
			// Then the server closes the connection.
			_, err = br.ReadByte()
			require.ErrorIs(t, err, io.EOF)

			require.NoError(t, good.Set("alive", []byte(tc.name)))
			v, err := good.Get("alive", time.Second)
			require.NoError(t, err)
			require.Equal(t, tc.name, string(v))
		})
	}
}

func readTestReply(t *testing.T, br *bufio.Reader) frame {
	t.Helper()
	n, err := readFrameLen(br, maxFrame)
	require.NoError(t, err)
	body, err := readFrameBody(br, n)
	require.NoError(t, err)
	f, err := decodeFrame(body)
	require.NoError(t, err)
	require.Equal(t, opReply, f.op)
	return f
}

func TestServerCloseFailsClientCalls(t *testing.T) {
	noLeaks(t)
	srv, err := NewServer("", "")
	require.NoError(t, err)
	c := dial(t, srv.Addr(), "")
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get("never", 30*time.Second)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, srv.Close())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorContains(t, err, srv.Addr())
	case <-time.After(2 * time.Second):
		t.Fatal("Get still waiting after the server closed")
	}
	require.Less(t, time.Since(start), 2*time.Second)

	// Later calls fail at once, naming the server.
	err = c.Set("k", []byte("v"))
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorContains(t, err, srv.Addr())
	require.ErrorContains(t, err, "lost")
}

// fakeServer accepts one client, answers its auth, then does what then says.
func fakeServer(t *testing.T, then func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if n, err := readFrameLen(br, maxFrame); err == nil {
			readFrameBody(br, n)
		}
		c.Write(appendFrame(nil, frame{op: opReply}))
		then(c)
	}()
	return ln.Addr().String()
}

func TestClientGivesUpOnHungServer(t *testing.T) {
	noLeaks(t)
	release := make(chan struct{})
	addr := fakeServer(t, func(c net.Conn) { <-release }) // reads nothing, answers nothing
	defer close(release)
	c := dial(t, addr, "")
	c.margin = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		call func() error
		wait time.Duration
	}{
		{"get", func() error { _, err := c.Get("k", 100*time.Millisecond); return err }, 300 * time.Millisecond},
		{"set", func() error { return c.Set("k", nil) }, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := tc.call()
			took := time.Since(start)
			require.ErrorIs(t, err, ErrTimeout)
			require.ErrorContains(t, err, addr)
			require.ErrorContains(t, err, "no reply")
			require.GreaterOrEqual(t, took, tc.wait)
			require.Less(t, took, tc.wait+time.Second)
		})
	}
}

func TestClientFailsWhenServerDies(t *testing.T) {
	noLeaks(t)
	addr := fakeServer(t, func(c net.Conn) {
		time.Sleep(50 * time.Millisecond)
		c.Close() // dies with a request pending
	})
	c := dial(t, addr, "")
	start := time.Now()
	_, err := c.Get("k", 10*time.Second)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorContains(t, err, addr)
	require.ErrorContains(t, err, "lost")
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestDialRetriesUntilLateServer(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	srvc := make(chan *Server, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		srv, err := NewServer(addr, "tok")
		if err != nil {
			t.Error(err)
		}
		srvc <- srv
	}()
	start := time.Now()
	c, err := Dial(addr, "tok", 5*time.Second)
	srv := <-srvc
	require.NotNil(t, srv)
	defer srv.Close()
	require.NoError(t, err)
	defer c.Close()
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
	require.NoError(t, c.Set("k", []byte("v")))
}

func TestDialGivesUp(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	start := time.Now()
	_, err = Dial(addr, "", 200*time.Millisecond)
	require.Less(t, time.Since(start), time.Second)
	require.ErrorContains(t, err, addr)
	require.ErrorContains(t, err, "no store server answered")
	var op *net.OpError
	require.True(t, errors.As(err, &op), "the last dial error is wrapped: %v", err)

	_, err = Dial("", "", time.Second)
	require.ErrorContains(t, err, "no server address")
}

// A malformed address is refused at once as bad input, not retried for the
// whole timeout as an absent server is.
func TestDialRefusesAMalformedAddress(t *testing.T) {
	for _, c := range []struct{ addr, msg string }{
		{"not-an-address", "want host:port"},
		{"127.0.0.1", "want host:port"},
		{"127.0.0.1:http", `port "http" is not a number from 1 to 65535`},
		{"127.0.0.1:0", `port "0" is not a number from 1 to 65535`},
		{"127.0.0.1:70000", `port "70000"`},
	} {
		start := time.Now()
		_, err := Dial(c.addr, "", time.Minute)
		require.Less(t, time.Since(start), time.Second, c.addr)
		require.ErrorIs(t, err, errs.ErrInvalid, c.addr)
		require.ErrorContains(t, err, c.msg, c.addr)
		require.ErrorContains(t, err, fmt.Sprintf("%q", c.addr))
	}
}

func TestServerStateAfterClientsLeave(t *testing.T) {
	noLeaks(t)
	srv := newServer(t, "")
	// A client that disconnects while its Get waits leaves no goroutine
	// on the server (the wait is canceled with its connection).
	c, err := Dial(srv.Addr(), "", time.Second)
	require.NoError(t, err)
	go c.Get("never", 30*time.Second)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, c.Close())

	other := dial(t, srv.Addr(), "")
	require.NoError(t, other.Set("k", []byte("v")))
	require.Eventually(t, func() bool {
		srv.mem.mu.Lock()
		defer srv.mem.mu.Unlock()
		return len(srv.mem.waiters) == 0
	}, 2*time.Second, 5*time.Millisecond, "the waiting Get of a gone client is still registered")
}

func TestClientGetForever(t *testing.T) {
	noLeaks(t)
	srv := newServer(t, "")
	c := dial(t, srv.Addr(), "")
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Set("k", []byte("v"))
	}()
	v, err := c.Get("k", time.Duration(1<<63-1)) // the margin must not overflow
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
}
