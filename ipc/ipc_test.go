package ipc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	// The runtime opens its poller's descriptors on first use; do it now so
	// that the per-test descriptor counts compare like with like.
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
	os.Exit(m.Run())
}

// openFDs lists this process's open descriptors (with what they are).
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	d, err := os.Open("/proc/self/fd")
	require.NoError(t, err)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	require.NoError(t, err)
	fds := map[string]string{}
	for _, n := range names {
		if target, err := os.Readlink("/proc/self/fd/" + n); err == nil {
			fds[n] = target
		}
	}
	return fds
}

// noLeaks fails t if it leaves a descriptor open. Call it first: cleanups run
// last registered first, so the check comes after every other cleanup.
func noLeaks(t *testing.T) {
	before := openFDs(t)
	t.Cleanup(func() {
		var leaked []string
		for end := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
			leaked = leaked[:0]
			for fd, target := range openFDs(t) {
				if _, ok := before[fd]; !ok {
					leaked = append(leaked, fd+" -> "+target)
				}
			}
			if len(leaked) == 0 || time.Now().After(end) {
				break
			}
		}
		require.Empty(t, leaked, "descriptors left open")
	})
}

var testSeq int

// uniqueName is a socket name no other test (or test run) uses.
func uniqueName() string {
	testSeq++
	return fmt.Sprintf("symm-test-%d-%d", os.Getpid(), testSeq)
}

func listen(t *testing.T) *Listener {
	t.Helper()
	l, err := Listen(uniqueName())
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// pair returns both ends of a connection within this process.
func pair(t *testing.T) (server, client *Conn) {
	t.Helper()
	l := listen(t)
	type res struct {
		c   *Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := Dial(l.Name(), os.Getpid(), 2*time.Second)
		dialed <- res{c, err}
	}()
	server, err := l.Accept(os.Getpid(), 2*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	r := <-dialed
	require.NoError(t, r.err)
	t.Cleanup(func() { r.c.Close() })
	return server, r.c
}

func memfd(t *testing.T, content []byte) int {
	t.Helper()
	fd, err := unix.MemfdCreate("symm-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	_, err = unix.Write(fd, content)
	require.NoError(t, err)
	return fd
}

func readFD(t *testing.T, fd int) []byte {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	b := make([]byte, st.Size)
	n, err := unix.Pread(fd, b, 0)
	require.NoError(t, err)
	return b[:n]
}

func requireCloexec(t *testing.T, fd int) {
	t.Helper()
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err)
	require.NotZero(t, flags&unix.FD_CLOEXEC, "fd %d is not close-on-exec", fd)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func TestListenNames(t *testing.T) {
	noLeaks(t)
	long := strings.Repeat("n", maxNameLen)
	for _, tc := range []struct {
		name, sock, err string
	}{
		{"plain", uniqueName(), ""},
		{"at the limit", long[:maxNameLen-10] + fmt.Sprint(os.Getpid()%1e9+1e9), ""},
		{"empty", "", "must be 1 to 100 bytes"},
		{"too long", long + "x", "must be 1 to 100 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(tc.sock)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			defer l.Close()
			require.Equal(t, tc.sock, l.Name())
			_, err = Listen(tc.sock)
			require.ErrorContains(t, err, "taken")
			require.ErrorContains(t, err, tc.sock)
		})
	}
	// The name is free again once its listener is closed.
	name := uniqueName()
	l, err := Listen(name)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	l, err = Listen(name)
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

func TestPassMemfd(t *testing.T) {
	noLeaks(t)
	server, client := pair(t)
	pattern := bytes.Repeat([]byte("symmetric "), 1000)
	sent := make(chan error, 1)
	go func() {
		fd, err := unix.MemfdCreate("symm-test", unix.MFD_CLOEXEC)
		if err == nil {
			_, err = unix.Write(fd, pattern)
			if err == nil {
				err = client.Send([]byte("block 0"), []int{fd})
			}
			unix.Close(fd) // the peer has its own duplicate
		}
		sent <- err
	}()
	payload, fds, err := server.Recv(1, 2*time.Second)
	require.NoError(t, err)
	require.NoError(t, <-sent)
	defer closeAll(fds)
	require.Equal(t, "block 0", string(payload))
	require.Len(t, fds, 1)
	requireCloexec(t, fds[0])
	require.Equal(t, pattern, readFD(t, fds[0]))
	require.Equal(t, os.Getpid(), server.PeerPID())
	require.Equal(t, os.Getpid(), client.PeerPID())
}

func TestSeveralFDsAndPayloads(t *testing.T) {
	noLeaks(t)
	server, client := pair(t)
	for _, tc := range []struct {
		name    string
		payload []byte
		files   []string
	}{
		{"three fds", []byte("three"), []string{"zero", "one", "two"}},
		{"empty payload, no fds", []byte{}, nil},
		{"fds only", nil, []string{"only"}},
		{"largest payload", bytes.Repeat([]byte{0xab}, maxPayload), []string{"big"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fds []int
			for _, content := range tc.files {
				fds = append(fds, memfd(t, []byte(content)))
			}
			require.NoError(t, client.Send(tc.payload, fds))
			closeAll(fds)
			payload, got, err := server.Recv(len(tc.files), time.Second)
			require.NoError(t, err)
			defer closeAll(got)
			require.Equal(t, len(tc.payload), len(payload))
			require.True(t, bytes.Equal(tc.payload, payload))
			require.Len(t, got, len(tc.files))
			for i, fd := range got {
				requireCloexec(t, fd)
				require.Equal(t, tc.files[i], string(readFD(t, fd)), "descriptors arrive in order")
			}
		})
	}
}

func TestSendRefuses(t *testing.T) {
	noLeaks(t)
	_, client := pair(t)
	for _, tc := range []struct {
		name    string
		payload []byte
		fds     []int
		err     string
	}{
		{"payload too large", make([]byte, maxPayload+1), nil, "exceeds"},
		{"too many fds", nil, make([]int, maxFDsPerMsg+1), "descriptors exceed"},
		{"negative fd", nil, []int{-1}, "invalid descriptor -1"},
		{"closed fd", nil, []int{1 << 20}, "bad file descriptor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := client.Send(tc.payload, tc.fds)
			require.ErrorContains(t, err, tc.err)
			require.ErrorContains(t, err, fmt.Sprintf("pid %d", os.Getpid()))
		})
	}
}

// TestRecvTooManyFDs: descriptors beyond maxFDs are an error, and none of
// those that arrived stays open.
func TestRecvTooManyFDs(t *testing.T) {
	noLeaks(t)
	server, client := pair(t)
	for _, tc := range []struct {
		sent, max int
	}{
		{1, 0}, // no room at all: the kernel drops them (MSG_CTRUNC)
		{2, 1}, // room for 2 after alignment: caught by the count
		{3, 1}, // 2 fit, 1 dropped
		{7, 2},
		{maxFDsPerMsg, maxFDsPerMsg - 1},
	} {
		t.Run(fmt.Sprintf("%d sent, %d expected", tc.sent, tc.max), func(t *testing.T) {
			fds := make([]int, tc.sent)
			for i := range fds {
				fds[i] = memfd(t, []byte{byte(i)})
			}
			require.NoError(t, client.Send([]byte("x"), fds))
			closeAll(fds)
			before := len(openFDs(t))
			payload, got, err := server.Recv(tc.max, time.Second)
			require.ErrorContains(t, err, "more than")
			require.ErrorContains(t, err, "closed")
			require.Nil(t, payload)
			require.Nil(t, got)
			require.Equal(t, before, len(openFDs(t)), "Recv left received descriptors open")

			// The connection is still in step.
			require.NoError(t, client.Send([]byte("next"), nil))
			payload, _, err = server.Recv(0, time.Second)
			require.NoError(t, err)
			require.Equal(t, "next", string(payload))
		})
	}
	_, _, err := server.Recv(-1, time.Second)
	require.ErrorContains(t, err, "maxFDs -1")
}

func TestRecvTimeout(t *testing.T) {
	noLeaks(t)
	server, client := pair(t)
	for _, timeout := range []time.Duration{0, 100 * time.Millisecond} {
		start := time.Now()
		_, _, err := server.Recv(1, timeout)
		took := time.Since(start)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.ErrorContains(t, err, "nothing came within "+timeout.String())
		require.ErrorContains(t, err, fmt.Sprintf("pid %d on symm-test-", os.Getpid()))
		require.GreaterOrEqual(t, took, timeout)
		require.Less(t, took, timeout+time.Second)
	}
	// A message that is already there needs no wait.
	require.NoError(t, client.Send([]byte("now"), nil))
	payload, _, err := server.Recv(0, 0)
	require.NoError(t, err)
	require.Equal(t, "now", string(payload))
}

func TestRecvAfterPeerCloses(t *testing.T) {
	noLeaks(t)
	server, client := pair(t)
	require.NoError(t, client.Send([]byte("last"), nil))
	require.NoError(t, client.Close())
	payload, _, err := server.Recv(0, time.Second)
	require.NoError(t, err, "messages sent before the close still arrive")
	require.Equal(t, "last", string(payload))
	_, _, err = server.Recv(0, time.Second)
	require.ErrorContains(t, err, "the peer closed the connection")
	err = server.Send([]byte("x"), nil)
	require.ErrorContains(t, err, "closed")
}

func TestCloseEndsWaits(t *testing.T) {
	noLeaks(t)
	t.Run("accept", func(t *testing.T) {
		l := listen(t)
		errc := make(chan error, 1)
		go func() {
			_, err := l.Accept(os.Getpid(), 10*time.Second)
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, l.Close())
		select {
		case err := <-errc:
			require.ErrorContains(t, err, "listener closed")
			require.ErrorIs(t, err, os.ErrClosed)
		case <-time.After(2 * time.Second):
			t.Fatal("Accept still waiting after Close")
		}
	})
	t.Run("recv", func(t *testing.T) {
		server, _ := pair(t)
		errc := make(chan error, 1)
		go func() {
			_, _, err := server.Recv(1, 10*time.Second)
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond)
		require.NoError(t, server.Close())
		select {
		case err := <-errc:
			require.ErrorIs(t, err, os.ErrClosed)
		case <-time.After(2 * time.Second):
			t.Fatal("Recv still waiting after Close")
		}
	})
}

func TestDialRetriesUntilLateListen(t *testing.T) {
	noLeaks(t)
	name := uniqueName()
	accepted := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		l, err := Listen(name)
		if err != nil {
			accepted <- err
			return
		}
		defer l.Close()
		c, err := l.Accept(os.Getpid(), 2*time.Second)
		if err == nil {
			err = c.Send([]byte("hello"), nil)
			c.Close()
		}
		accepted <- err
	}()
	start := time.Now()
	c, err := Dial(name, os.Getpid(), 3*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	payload, _, err := c.Recv(0, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "hello", string(payload))
	require.NoError(t, <-accepted)
}

func TestDialGivesUp(t *testing.T) {
	noLeaks(t)
	name := uniqueName()
	start := time.Now()
	_, err := Dial(name, 4321, 100*time.Millisecond)
	require.Less(t, time.Since(start), time.Second)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorContains(t, err, name)
	require.ErrorContains(t, err, "pid 4321 was not listening")

	for _, tc := range []struct {
		name string
		pid  int
		err  string
	}{
		{"", 1, "must be 1 to 100 bytes"},
		{"x", 0, "pid must be positive"},
	} {
		_, err := Dial(tc.name, tc.pid, time.Second)
		require.ErrorContains(t, err, tc.err)
	}
}

func TestDialWrongPID(t *testing.T) {
	noLeaks(t)
	l := listen(t)
	_, err := Dial(l.Name(), 1, time.Second)
	require.ErrorContains(t, err, fmt.Sprintf("the listener is pid %d", os.Getpid()))
	require.ErrorContains(t, err, "expected pid 1")
	require.ErrorContains(t, err, l.Name())
}

func TestAcceptTimeout(t *testing.T) {
	noLeaks(t)
	l := listen(t)
	for _, timeout := range []time.Duration{0, 100 * time.Millisecond} {
		start := time.Now()
		_, err := l.Accept(4321, timeout)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.ErrorContains(t, err, "for pid 4321, none came")
		require.NotContains(t, err.Error(), "rejected")
		require.Less(t, time.Since(start), timeout+time.Second)
	}
	_, err := l.Accept(0, time.Second)
	require.ErrorContains(t, err, "pid must be positive")
}

// ---- other processes -------------------------------------------------------

const (
	helperEnv     = "SYMM_TEST_IPC_HELPER"
	helperNameEnv = "SYMM_TEST_IPC_NAME"
)

// pattern is what the helper writes into its memfd: no page repeats another.
func pattern(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	return b
}

const patternSize = 1 << 20

// helper runs in a child process (this test binary again): it dials the
// parent's socket, says so on stdout, then plays its part. Its exit code is
// the result.
func helper(mode string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 3
	}
	c, err := Dial(os.Getenv(helperNameEnv), os.Getppid(), 5*time.Second)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	fmt.Println("dialed")
	switch mode {
	case "wait":
	case "send-memfd":
		fd, err := unix.MemfdCreate("symm-helper", unix.MFD_CLOEXEC)
		if err != nil {
			return fail(err)
		}
		if _, err := unix.Write(fd, pattern(patternSize)); err != nil {
			return fail(err)
		}
		if err := c.Send([]byte(strconv.Itoa(patternSize)), []int{fd}); err != nil {
			return fail(err)
		}
		unix.Close(fd)
	default:
		return fail(fmt.Errorf("unknown mode %q", mode))
	}
	// Wait for the parent to close (or reject) the connection.
	if _, _, err := c.Recv(0, 5*time.Second); err != nil && !strings.Contains(err.Error(), "peer closed") {
		return fail(err)
	}
	return 0
}

// startHelper starts a child process in mode, dialing l, and returns once it
// has connected.
func startHelper(t *testing.T, l *Listener, mode string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperNameEnv+"="+l.Name())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "dialed\n" {
		cmd.Process.Kill()
		waited = true
		cmd.Wait() // stderr is complete only after Wait
		t.Fatalf("helper did not connect (%q, %v): %s", line, err, stderr.String())
	}
	t.Cleanup(func() {
		if !waited {
			waited = true
			require.NoError(t, cmd.Wait(), "helper: %s", stderr.String())
		}
	})
	return cmd
}

// TestHelperProcess is not a test: TestMain runs the helper in the child
// before tests start. Listed so that -test.run finds nothing else to run.
func TestHelperProcess(t *testing.T) {}

func TestAcceptRejectsOtherProcess(t *testing.T) {
	noLeaks(t)
	l := listen(t)
	child := startHelper(t, l, "wait")
	// The child is connected and waits in our backlog; we expect pid 1.
	start := time.Now()
	_, err := l.Accept(1, 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.ErrorContains(t, err, "waited 300ms for pid 1, none came")
	require.ErrorContains(t, err, fmt.Sprintf("1 other process rejected, the last pid %d uid %d", child.Process.Pid, os.Getuid()))
	require.Equal(t, 1, l.Rejected())
}

// TestCrossProcessMemfd: another process makes a memfd, writes a pattern and
// sends the descriptor; we map it and read the pattern.
func TestCrossProcessMemfd(t *testing.T) {
	noLeaks(t)
	l := listen(t)
	child := startHelper(t, l, "send-memfd")
	c, err := l.Accept(child.Process.Pid, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, child.Process.Pid, c.PeerPID())
	payload, fds, err := c.Recv(1, 5*time.Second)
	require.NoError(t, err)
	defer closeAll(fds)
	require.Len(t, fds, 1)
	requireCloexec(t, fds[0])
	size, err := strconv.Atoi(string(payload))
	require.NoError(t, err)
	mem, err := unix.Mmap(fds[0], 0, size, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	if !bytes.Equal(pattern(size), mem) {
		t.Fatal(errors.New("the mapped memory does not hold the child's pattern"))
	}
}

// A peer that closes with our messages unread: the kernel reports the reset
// once, ahead of what the peer sent first. Recv reads on: the peer's last
// message, then the end, both as such.
func TestRecvAfterPeerClosesWithOursUnread(t *testing.T) {
	noLeaks(t)
	server, client := pair(t)
	require.NoError(t, server.Send([]byte("never read"), nil))
	require.NoError(t, client.Send([]byte("last words"), nil))
	require.NoError(t, client.Close())
	payload, _, err := server.Recv(0, time.Second)
	require.NoError(t, err, "the peer's message comes before the end")
	require.Equal(t, "last words", string(payload))
	_, _, err = server.Recv(0, time.Second)
	require.ErrorIs(t, err, ErrPeerClosed)
	err = server.SendWithin([]byte("x"), nil, time.Second)
	require.ErrorIs(t, err, ErrPeerClosed)
}

// SendWithin gives up at its timeout when the peer never reads.
func TestSendWithinTimesOut(t *testing.T) {
	noLeaks(t)
	_, client := pair(t)
	big := make([]byte, 60<<10)
	start := time.Now()
	var err error
	for err == nil && time.Since(start) < 10*time.Second {
		err = client.SendWithin(big, nil, 100*time.Millisecond)
	}
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorContains(t, err, "the peer took nothing for 100ms")
}

// AcceptFrom takes the first process its test accepts and closes the
// others (here: none is wanted, so it waits out its timeout, naming them).
func TestAcceptFrom(t *testing.T) {
	noLeaks(t)
	l := listen(t)
	go func() {
		if c, err := Dial(l.Name(), os.Getpid(), 2*time.Second); err == nil {
			defer c.Close()
			c.Recv(0, time.Second)
		}
	}()
	_, err := l.AcceptFrom(func(pid int) bool { return false }, "rank 0 (pid 1)", 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorContains(t, err, "waited 300ms for rank 0 (pid 1), none came (1 other process rejected")
	go func() {
		if c, err := Dial(l.Name(), os.Getpid(), 2*time.Second); err == nil {
			defer c.Close()
			c.Recv(0, time.Second)
		}
	}()
	c, err := l.AcceptFrom(func(pid int) bool { return pid == os.Getpid() }, "us", 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, os.Getpid(), c.PeerPID())
	c.Close()
}

func TestProcessStart(t *testing.T) {
	mine, err := ProcessStart(os.Getpid())
	require.NoError(t, err)
	require.NotZero(t, mine)
	again, err := ProcessStart(os.Getpid())
	require.NoError(t, err)
	require.Equal(t, mine, again)
	parent, err := ProcessStart(os.Getppid())
	require.NoError(t, err)
	require.LessOrEqual(t, parent, mine, "a parent starts before its child")
	_, err = ProcessStart(1 << 30) // above pid_max
	require.ErrorContains(t, err, "the start time of pid 1073741824")
	require.Contains(t, PIDNamespace(), "pid:[")
}
