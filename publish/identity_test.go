package publish

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestMain doubles as a page writer in another process: with
// PUBLISH_TEST_WRITER=DIR it publishes a page in DIR, prints its path, and
// removes it and exits when its standard input ends.
func TestMain(m *testing.M) {
	if dir := os.Getenv("PUBLISH_TEST_WRITER"); dir != "" {
		var v atomic.Int64
		w, err := Create(dir, testSource(1, &v))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(w.Path())
		_, _ = io.Copy(io.Discard, os.Stdin)
		w.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// writerInNewPIDNamespace starts a page writer as pid 1 of a new pid
// namespace with its own /proc, as a container sharing /dev/shm with the
// host (docker --ipc=host) is, and returns its page's path and a function
// that ends it (it removes its page first).
func writerInNewPIDNamespace(t *testing.T, dir string) (string, func()) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("a new pid namespace needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) is missing")
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PUBLISH_TEST_WRITER="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var once sync.Once
	stop := func() { once.Do(func() { in.Close(); _ = cmd.Wait() }) }
	t.Cleanup(stop)
	line, _ := bufio.NewReader(out).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(line, "error:"):
		t.Fatalf("the writer in a new pid namespace: %s", line)
	case !strings.HasPrefix(line, dir):
		stop()
		t.Skipf("no new pid namespace here: %q %s", line, stderr.String())
	}
	return line, stop
}

// Two processes of other pid namespaces, both pid 1 there, keep their own
// pages in a directory this process shares; a listing from here shows both
// and removes neither, though pid 1 here is another process; each writer
// removes its own page at exit, and no other.
func TestPagesOfOtherPIDNamespaces(t *testing.T) {
	dir := t.TempDir()
	a, stopA := writerInNewPIDNamespace(t, dir)
	b, stopB := writerInNewPIDNamespace(t, dir)
	require.NotEqual(t, a, b, "two writers with the same pid share no page")
	l := List(dir, os.Getuid())
	require.Empty(t, l.Problems)
	require.Empty(t, l.Removed)
	require.Len(t, l.Pages, 2)
	for _, p := range l.Pages {
		require.Equal(t, 1, p.PID)
		require.True(t, p.OtherNamespace)
	}
	require.FileExists(t, a)
	require.FileExists(t, b)
	stopA()
	require.NoFileExists(t, a, "a writer removes its page at exit")
	require.FileExists(t, b, "and no other")
	stopB()
	require.NoFileExists(t, b)
}

// Two writers of one process (one pid) have two pages; closing one leaves
// the other.
func TestTwoWritersOfOnePID(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w1, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	w2, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	require.NotEqual(t, w1.Path(), w2.Path())
	require.Len(t, List(dir, os.Getuid()).Pages, 2)
	require.NoError(t, w1.Close())
	require.FileExists(t, w2.Path())
	require.Len(t, List(dir, os.Getuid()).Pages, 1)
	require.NoError(t, w2.Close())
}

// copyPage writes page b in dir under the name its pid, uid and id give,
// after edit, and returns its path.
func copyPage(t *testing.T, dir string, b []byte, edit func(b []byte)) string {
	t.Helper()
	b = append([]byte(nil), b...)
	edit(b)
	le := binary.LittleEndian
	path := filepath.Join(dir, Name(int(le.Uint32(b[20:])), int(le.Uint32(b[16:])), le.Uint64(b[offID:])))
	require.NoError(t, os.WriteFile(path, b, 0o600))
	return path
}

// A page of another pid namespace is never removed, whatever its pid is
// here: shown while it is refreshed, reported once it is not.
func TestPageOfAnotherNamespaceIsKept(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	good, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	require.NoError(t, w.Close())
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid
	le := binary.LittleEndian
	other := func(id uint64, updated time.Time) func(b []byte) {
		return func(b []byte) {
			le.PutUint32(b[16:], uint32(dead))
			le.PutUint64(b[offID:], id)
			le.PutUint64(b[offPIDNS:], PIDNamespace()+1)
			le.PutUint64(b[40:], uint64(updated.UnixNano()))
		}
	}
	fresh := copyPage(t, dir, good, other(1, time.Now()))
	stale := copyPage(t, dir, good, other(2, time.Now().Add(-time.Minute)))
	unknown := copyPage(t, dir, good, func(b []byte) { other(3, time.Now())(b); le.PutUint64(b[offPIDNS:], 0) })
	l := List(dir, os.Getuid())
	require.Empty(t, l.Removed)
	require.Len(t, l.Pages, 2)
	for _, p := range l.Pages {
		require.Equal(t, dead, p.PID)
		require.True(t, p.OtherNamespace)
	}
	require.Len(t, l.Problems, 1)
	require.Equal(t, stale, l.Problems[0].Path)
	require.Contains(t, l.Problems[0].Err, fmt.Sprintf("pid %d of another pid namespace (pid:[%d]), not refreshed for 1m0s", dead, PIDNamespace()+1))
	require.Contains(t, l.Problems[0].Err, "left for its owner to remove")
	for _, p := range []string{fresh, stale, unknown} {
		require.FileExists(t, p)
	}
}

// Create removes what earlier processes with its pid left behind in its
// pid namespace (their start time differs), and nothing else.
func TestCreateRemovesDeadPagesOfItsPID(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	good, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	le := binary.LittleEndian
	earlier := copyPage(t, dir, good, func(b []byte) {
		le.PutUint64(b[offID:], 1)
		le.PutUint64(b[24:], le.Uint64(b[24:])-1)
	})
	foreign := copyPage(t, dir, good, func(b []byte) {
		le.PutUint64(b[offID:], 2)
		le.PutUint64(b[24:], le.Uint64(b[24:])-1)
		le.PutUint64(b[offPIDNS:], PIDNamespace()+1)
	})
	w2, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	require.NoFileExists(t, earlier)
	require.FileExists(t, foreign)
	require.FileExists(t, w.Path(), "a live page of this very pid stays")
	require.NoError(t, w.Close())
	require.NoError(t, w2.Close())
}

// uidName is what messages say of uid.
func uidName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// Other users' pages are not looked at, not even named; a file under this
// user's name owned by another is reported with its owner.
func TestOnlyThisUsersPages(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	defer w.Close()
	me, them := os.Getuid(), os.Getuid()+1
	l := List(dir, them) // to them, this process's page is another user's
	require.Empty(t, l.Pages)
	require.Empty(t, l.Problems)

	good, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	theirs := copyPage(t, dir, good, func(b []byte) { binary.LittleEndian.PutUint32(b[20:], uint32(them)) })
	l = List(dir, them)
	require.Empty(t, l.Pages)
	require.Len(t, l.Problems, 1)
	require.Equal(t, theirs, l.Problems[0].Path)
	require.Contains(t, l.Problems[0].Err, fmt.Sprintf("owned by %s, not by %s", uidName(me), uidName(them)))

	if me == 0 { // a page under root's name owned by nobody: only root can make one
		planted := copyPage(t, dir, good, func(b []byte) { binary.LittleEndian.PutUint64(b[offID:], 9) })
		require.NoError(t, os.Chown(planted, 65534, 65534))
		l = List(dir, me)
		require.Len(t, l.Pages, 1)
		require.Len(t, l.Problems, 1)
		require.Contains(t, l.Problems[0].Err, fmt.Sprintf("owned by %s, not by %s", uidName(65534), uidName(0)))
	}
}

// A page is trusted at mode 0600 only.
func TestReaderTrustsOnly0600(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, os.Chmod(w.Path(), 0o400))
	l := List(dir, os.Getuid())
	require.Empty(t, l.Pages)
	require.Len(t, l.Problems, 1)
	require.Contains(t, l.Problems[0].Err, "mode 0400: a page is trusted only at 0600")
}

// The reader checks the file it opened, not the path: while the page's path
// turns into a link to a FIFO, or a FIFO, and back, no listing follows the
// link or waits on the FIFO.
func TestReaderNeverFollowsNorBlocks(t *testing.T) {
	dir := t.TempDir()
	var v atomic.Int64
	w, err := Create(dir, testSource(1, &v))
	require.NoError(t, err)
	defer w.Close()
	good, err := os.ReadFile(w.Path())
	require.NoError(t, err)
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tmp := filepath.Join(dir, "next")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 3 {
			case 0:
				_ = os.WriteFile(tmp, good, 0o600)
			case 1:
				_ = os.Symlink(fifo, tmp)
			case 2:
				_ = unix.Mkfifo(tmp, 0o600)
			}
			_ = os.Rename(tmp, w.Path())
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	var mu sync.Mutex
	var odd []string
	done := make(chan struct{})
	var quit atomic.Bool
	go func() {
		defer close(done)
		for i := 0; i < 5000 && !quit.Load(); i++ {
			for _, p := range List(dir, os.Getuid()).Problems {
				if !strings.Contains(p.Err, "a symbolic link: pages are never followed") && !strings.Contains(p.Err, "not a regular file") {
					mu.Lock()
					odd = append(odd, p.Err)
					mu.Unlock()
				}
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		quit.Store(true)
		for { // let the blocked open return
			fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK, 0)
			if err == nil {
				unix.Close(fd)
			}
			select {
			case <-done:
				t.Fatal("a listing waited on a FIFO")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, odd)
}

// A page pre-created where a writer would write is left alone, and the
// writer's error names its owner.
func TestWriterLeavesAPageInItsWay(t *testing.T) {
	dir := t.TempDir()
	defer func(f func() (uint64, error)) { newPageID = f }(newPageID)
	newPageID = func() (uint64, error) { return 42, nil }
	path := filepath.Join(dir, Name(os.Getuid(), os.Getpid(), 42))
	require.NoError(t, os.WriteFile(path, []byte("someone else's"), 0o600))
	owner := os.Getuid()
	if owner == 0 {
		owner = 65534
		require.NoError(t, os.Chown(path, owner, owner))
	}
	var v atomic.Int64
	_, err := Create(dir, testSource(1, &v))
	require.Error(t, err)
	require.Contains(t, err.Error(), "a file is there already, owned by "+uidName(owner))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "someone else's", string(b))
}

// The page shows allocated <= reserved for current and peak figures,
// though the pool's statistics, read shard by shard, may say otherwise for
// a moment; cumulative figures (allocated, freed) are shown as read.
func TestPublishedAllocatedWithinReserved(t *testing.T) {
	dir := t.TempDir()
	names := []string{"allocated_bytes.all.current", "reserved_bytes.all.current", "allocated_bytes.large_pool.peak",
		"reserved_bytes.large_pool.peak", "allocated_bytes.small_pool.current", "num_ooms",
		"allocated_bytes.all.freed", "reserved_bytes.all.freed", "allocated_bytes.all.allocated", "reserved_bytes.all.allocated"}
	w, err := Create(dir, Source{
		Devices: 1, Names: names, Backend: "host",
		Stats: func(int) ([]int64, error) { return []int64{9, 5, 12, 10, 7, 3, 8, 0, 24, 16}, nil },
		Streams: func(int) ([]Stream, error) {
			return []Stream{{Stream: 1, Allocated: 9, Reserved: 5}, {Stream: 2, Allocated: 2, Reserved: 5}}, nil
		},
	})
	require.NoError(t, err)
	defer w.Close()
	l := List(dir, os.Getuid())
	require.Len(t, l.Pages, 1)
	d := l.Pages[0].Devices[0]
	require.Equal(t, map[string]int64{"allocated_bytes.all.current": 5, "reserved_bytes.all.current": 5,
		"allocated_bytes.large_pool.peak": 10, "reserved_bytes.large_pool.peak": 10,
		"allocated_bytes.small_pool.current": 7, "num_ooms": 3,
		"allocated_bytes.all.freed": 8, "reserved_bytes.all.freed": 0,
		"allocated_bytes.all.allocated": 24, "reserved_bytes.all.allocated": 16}, d.Stats)
	require.Equal(t, []Stream{{Stream: 1, Allocated: 5, Reserved: 5}, {Stream: 2, Allocated: 2, Reserved: 5}}, d.Streams)
}
