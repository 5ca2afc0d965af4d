package symmetric

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
	"github.com/libsymm/libsymm/store"
)

// A local attacker of another uid: this test binary, run as nobody, binds
// a name (both socket types the library has used: a datagram mailbox and a
// listening seqpacket socket), says "ready", takes everything sent to it
// for a while and prints what it got: "got <messages> <descriptors>".
// In forge mode it first writes a rank's link metadata into a TCP store,
// pointing at its own name, before the real rank publishes.
const (
	attackerEnv      = "SYMM_TEST_ATTACKER_NAME"
	attackerStoreEnv = "SYMM_TEST_ATTACKER_STORE" // addr|key: forge mode
	nobodyUID        = 65534
)

// bindAbstract binds the abstract name as a socket of type typ.
func bindAbstract(name string, typ int) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_NONBLOCK, 0)
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrUnix{Name: "\x00" + name})
	}
	return fd, err
}

func attacker(name string) int {
	dg, err := bindAbstract(name, unix.SOCK_DGRAM)
	if err != nil {
		fmt.Println("error binding the datagram name:", err)
		return 2
	}
	sp, err := bindAbstract(name, unix.SOCK_SEQPACKET)
	if err == nil {
		err = unix.Listen(sp, 16)
	}
	if err != nil {
		fmt.Println("error binding the seqpacket name:", err)
		return 2
	}
	if spec := os.Getenv(attackerStoreEnv); spec != "" {
		addr, key, _ := strings.Cut(spec, "|")
		c, err := store.Dial(addr, "", 5*time.Second)
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		host, _ := os.Hostname()
		start, _ := ipc.ProcessStart(os.Getpid())
		// It claims the victim's uid: a self-reported field proves nothing.
		raw, _ := json.Marshal(meta{PID: os.Getpid(), UID: 0, Host: host, Provider: "host", Socket: name,
			Start: start, PIDNS: ipc.PIDNamespace()})
		if err := c.Set(key, raw); err != nil {
			fmt.Println("error", err)
			return 2
		}
		defer c.Close()
	}
	fmt.Println("ready")
	msgs, fds := 0, 0
	var conns []int
	buf, oob := make([]byte, 70<<10), make([]byte, 4096)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if nfd, _, err := unix.Accept4(sp, unix.SOCK_NONBLOCK); err == nil {
			conns = append(conns, nfd)
		}
		for _, fd := range append([]int{dg}, conns...) {
			for {
				n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
				if err != nil || n == 0 && oobn == 0 {
					break
				}
				msgs++
				if scms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
					for _, s := range scms {
						if got, err := unix.ParseUnixRights(&s); err == nil {
							fds += len(got)
						}
					}
				}
			}
		}
	}
	fmt.Println("got", msgs, fds)
	return 0
}

// asNobody starts the attacker as uid nobody (the test binary is copied
// where nobody may run it) and waits for it to be ready; wait returns what
// it printed last.
func asNobody(t *testing.T, name string, env ...string) (wait func() string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to start a process of another uid")
	}
	dir, err := os.MkdirTemp("", "symm-attacker")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "attacker")
	src, err := os.Open(os.Args[0])
	require.NoError(t, err)
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	src.Close()
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), attackerEnv+"="+name), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyUID}}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "the attacker said nothing")
	require.Equal(t, "ready", lines.Text())
	return func() string {
		last := ""
		for lines.Scan() {
			last = lines.Text()
		}
		require.NoError(t, cmd.Wait())
		return last
	}
}

// After rank 1 closes its side of the group (exit, crash, Close), a process
// of another uid binds the name rank 1 published. Rank 0's next rendezvous
// of the group must fail, naming rank 1, and the attacker must receive
// nothing: no message, no descriptor of rank 0's block.
func TestClosedRankNameTakenByAnotherUID(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	cfg := Config{Timeout: 2 * time.Second}
	ms := []*Manager{NewManager(NewHostProvider(), cfg), NewManager(NewHostProvider(), cfg)}
	defer ms[0].Close()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := ms[r].Alloc(0, 4096)
			if err == nil {
				_, err = ms[r].Rendezvous(b.Ptr(), Group{Name: "squat", Rank: r, World: 2, Store: st})
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	name := ms[0].links["squat"].peers[1].Socket
	ms[1].Close()
	wait := asNobody(t, name)

	b, err := ms[0].Alloc(0, 4096)
	require.NoError(t, err)
	defer ms[0].Free(b.Ptr())
	_, err = ms[0].Rendezvous(b.Ptr(), Group{Name: "squat", Rank: 0, World: 2, Store: st})
	require.Error(t, err)
	require.ErrorContains(t, err, "rank 1")
	require.Equal(t, "got 0 0", wait(), "what the attacker received")
}

// Before rank 1 publishes, a process of another uid writes rank 1's link
// metadata into the (unauthenticated) TCP store, naming its own socket and
// claiming our uid. Rank 0's first rendezvous must fail, naming rank 1, and
// the attacker must receive nothing.
func TestForgedLinkMetadataGetsNothing(t *testing.T) {
	srv, err := store.NewServer("127.0.0.1:0", "")
	require.NoError(t, err)
	defer srv.Close()
	c, err := store.Dial(srv.Addr(), "", time.Second)
	require.NoError(t, err)
	defer c.Close()
	m := NewManager(NewHostProvider(), Config{Timeout: 2 * time.Second})
	defer m.Close()
	name := fmt.Sprintf("symm-test-forger-%d", os.Getpid())
	wait := asNobody(t, name, attackerStoreEnv+"="+srv.Addr()+"|symm/forged/link1/1")

	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	defer m.Free(b.Ptr())
	_, err = m.Rendezvous(b.Ptr(), Group{Name: "forged", Rank: 0, World: 2, Store: c})
	require.Error(t, err)
	require.ErrorContains(t, err, "rank 1")
	require.ErrorContains(t, err, fmt.Sprintf("uid %d", nobodyUID))
	require.Equal(t, "got 0 0", wait(), "what the attacker received")
}

// rankEnv makes this test binary, run as a child, rendezvous one host block
// as one rank of a group over a TCP store ("addr|group|rank|world") and
// print the outcome.
const rankEnv = "SYMM_TEST_RANK"

func childRank(spec string) int {
	parts := strings.Split(spec, "|")
	var rank, world int
	fmt.Sscan(parts[2], &rank)
	fmt.Sscan(parts[3], &world)
	c, err := store.Dial(parts[0], "", 5*time.Second)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	defer c.Close()
	m := NewManager(NewHostProvider(), Config{Timeout: 5 * time.Second})
	defer m.Close()
	b, err := m.Alloc(0, 4096)
	if err == nil {
		_, err = m.Rendezvous(b.Ptr(), Group{Name: parts[1], Rank: rank, World: world, Store: c})
	}
	fmt.Println("rendezvous:", err)
	return 0
}

// Ranks in two pid namespaces that share a network namespace (containers
// of one pod) cannot check each other's processes: the first rendezvous
// refuses them at once on both sides, saying why, instead of timing out on
// messages that look forged.
func TestRanksInAnotherPIDNamespaceAreRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a pid namespace")
	}
	srv, err := store.NewServer("127.0.0.1:0", "")
	require.NoError(t, err)
	defer srv.Close()
	c, err := store.Dial(srv.Addr(), "", time.Second)
	require.NoError(t, err)
	defer c.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), rankEnv+"="+srv.Addr()+"|pidns|1|2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out := make(chan string, 1)
	go func() {
		b, err := cmd.CombinedOutput()
		out <- fmt.Sprintf("%s%v", b, err)
	}()
	m := NewManager(NewHostProvider(), Config{Timeout: 5 * time.Second})
	defer m.Close()
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	defer m.Free(b.Ptr())
	start := time.Now()
	_, err = m.Rendezvous(b.Ptr(), Group{Name: "pidns", Rank: 0, World: 2, Store: c})
	require.ErrorContains(t, err, "rank 1 runs in pid namespace")
	require.Less(t, time.Since(start), 3*time.Second, "refused at once, not at the timeout")
	child := <-out
	require.Contains(t, child, "must share one", "the other rank: %s", child)
}

// A connection whose process is not the one that published the rank (its
// pid reused: another start time) is refused, naming both start times.
func TestStartTimeMustMatch(t *testing.T) {
	ln, err := ipc.Listen(fmt.Sprintf("symm-test-start-%d", os.Getpid()))
	require.NoError(t, err)
	defer ln.Close()
	c, err := ipc.Dial(ln.Name(), os.Getpid(), time.Second)
	require.NoError(t, err)
	defer c.Close()
	start, err := ipc.ProcessStart(os.Getpid())
	require.NoError(t, err)
	require.NoError(t, checkPeer(c, 1, meta{PID: os.Getpid(), Start: start}))
	err = checkPeer(c, 1, meta{PID: os.Getpid(), Start: start + 1})
	require.ErrorContains(t, err, fmt.Sprintf("rank 1's pid %d is another process now (started at tick %d, the one that published started at %d)",
		os.Getpid(), start, start+1))
}
