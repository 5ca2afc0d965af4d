package ipc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// memfdWith is a memfd holding content, or -1.
func memfdWith(content []byte) int {
	fd, err := unix.MemfdCreate("symm-test", unix.MFD_CLOEXEC)
	if err != nil {
		return -1
	}
	if _, err := unix.Write(fd, content); err != nil {
		unix.Close(fd)
		return -1
	}
	return fd
}

func mailbox(t *testing.T) *Mailbox {
	t.Helper()
	m, err := OpenMailbox(uniqueName())
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func TestMailboxPassesMemfdWithCredentials(t *testing.T) {
	noLeaks(t)
	a, b := mailbox(t), mailbox(t)
	fd := memfd(t, []byte("hello"))
	defer unix.Close(fd)
	require.NoError(t, a.SendTo(b.Name(), []byte("p"), []int{fd}, time.Second))
	require.NoError(t, a.SendTo(b.Name(), nil, nil, time.Second)) // empty payload, no fds: still a message
	m, err := b.Recv(1, time.Second)
	require.NoError(t, err)
	defer closeAll(m.FDs)
	require.Equal(t, "p", string(m.Payload))
	require.Equal(t, os.Getpid(), m.PID)
	require.Equal(t, os.Getuid(), m.UID)
	require.Len(t, m.FDs, 1)
	requireCloexec(t, m.FDs[0])
	require.Equal(t, "hello", string(readFD(t, m.FDs[0])))
	m2, err := b.Recv(0, time.Second)
	require.NoError(t, err)
	require.Empty(t, m2.Payload)
	require.Empty(t, m2.FDs)
}

func TestMailboxErrors(t *testing.T) {
	noLeaks(t)
	a, b := mailbox(t), mailbox(t)
	_, err := OpenMailbox(a.Name())
	require.ErrorContains(t, err, "taken")
	_, err = OpenMailbox("")
	require.Error(t, err)

	err = a.SendTo("symm-test-nobody-"+strconv.Itoa(os.Getpid()), nil, nil, time.Second)
	require.ErrorContains(t, err, "no process holds that mailbox")
	require.ErrorContains(t, a.SendTo(b.Name(), make([]byte, maxPayload+1), nil, time.Second), "exceeds")
	require.ErrorContains(t, a.SendTo(b.Name(), nil, []int{-1}, time.Second), "invalid descriptor")

	start := time.Now()
	_, err = b.Recv(0, 100*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
	_, err = b.Recv(-1, time.Second)
	require.ErrorContains(t, err, "maxFDs")

	// Too many descriptors: every one that arrived is closed, nothing leaks.
	f1, f2 := memfd(t, nil), memfd(t, nil)
	require.NoError(t, a.SendTo(b.Name(), nil, []int{f1, f2}, time.Second))
	unix.Close(f1)
	unix.Close(f2)
	_, err = b.Recv(1, time.Second)
	require.ErrorContains(t, err, "descriptors")
	require.ErrorIs(t, err, ErrBadMessage)

	// A datagram that is not ours (no version byte) is refused.
	raw, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Sendto(raw, []byte{0x7f, 1, 2}, 0, abstractAddr(b.Name())))
	unix.Close(raw)
	_, err = b.Recv(1, time.Second)
	require.ErrorContains(t, err, "not a message of this package")
}

func TestMailboxCloseEndsRecv(t *testing.T) {
	noLeaks(t)
	m, err := OpenMailbox(uniqueName())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := m.Recv(1, 10*time.Second); done <- err }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, m.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, os.ErrClosed)
	case <-time.After(2 * time.Second):
		t.Fatal("Recv did not end when the mailbox closed")
	}
}

// A message outlives its sender: the child sends a memfd and exits before we
// read; the descriptor still arrives, with the child's pid.
func TestMailboxCrossProcessAfterSenderExit(t *testing.T) {
	noLeaks(t)
	m := mailbox(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=mailbox-send", helperNameEnv+"="+m.Name())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), "helper: %s", stderr.String())
	msg, err := m.Recv(1, 5*time.Second)
	require.NoError(t, err)
	defer closeAll(msg.FDs)
	require.Equal(t, cmd.Process.Pid, msg.PID)
	require.Equal(t, os.Getuid(), msg.UID)
	require.Len(t, msg.FDs, 1)
	size, err := strconv.Atoi(string(msg.Payload))
	require.NoError(t, err)
	mem, err := unix.Mmap(msg.FDs[0], 0, size, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	require.True(t, bytes.Equal(pattern(size), mem), "the mapped memory does not hold the child's pattern")
}

func ExampleMailbox() {
	a, _ := OpenMailbox(fmt.Sprintf("symm-example-a-%d", os.Getpid()))
	b, _ := OpenMailbox(fmt.Sprintf("symm-example-b-%d", os.Getpid()))
	defer a.Close()
	defer b.Close()
	a.SendTo(b.Name(), []byte("rank 0"), nil, time.Second)
	m, _ := b.Recv(0, time.Second)
	fmt.Println(string(m.Payload), m.PID == os.Getpid())
	// Output: rank 0 true
}
