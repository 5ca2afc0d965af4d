package symmetric

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
	"github.com/libsymm/libsymm/store"
)

// strangerEnv makes this test binary, run as a child, connect to the link
// listener it names (held by its parent), say it is rank 0, send a
// descriptor, and print what became of the connection: another process of
// our uid posing as a peer.
const strangerEnv = "SYMM_TEST_STRANGER_TO"

func TestMain(m *testing.M) {
	if to := os.Getenv(strangerEnv); to != "" {
		os.Exit(stranger(to))
	}
	if name := os.Getenv(attackerEnv); name != "" {
		os.Exit(attacker(name))
	}
	if spec := os.Getenv(rankEnv); spec != "" {
		os.Exit(childRank(spec))
	}
	os.Exit(m.Run())
}

func stranger(to string) int {
	c, err := ipc.Dial(to, os.Getppid(), 5*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer c.Close()
	fd, err := unix.MemfdCreate("stranger", unix.MFD_CLOEXEC)
	if err != nil {
		return 2
	}
	unix.Ftruncate(fd, 1<<20)
	hi, _ := json.Marshal(hello{Rank: 0})
	raw, _ := json.Marshal(note{Kind: "r", Seq: 1, Step: "block", Rank: 0,
		Meta: &meta{PID: os.Getpid(), UID: os.Getuid(), Provider: "host", Size: 4096, Block: 1 << 20}})
	if c.Send(hi, nil) != nil || c.Send(raw, []int{fd}) != nil {
		fmt.Println("refused at once")
		return 0
	}
	// The listener closes a connection it refuses: nothing ever comes.
	_, _, err = c.Recv(1, 5*time.Second)
	if errors.Is(err, ipc.ErrPeerClosed) {
		fmt.Println("refused")
		return 0
	}
	fmt.Println("not refused:", err)
	return 0
}

func openFDs(t *testing.T) int {
	t.Helper()
	// Files that earlier tests dropped unclosed are closed by finalizers:
	// let them run first, not in the middle of a count.
	for range 3 {
		runtime.GC()
		time.Sleep(2 * time.Millisecond)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// settleFDs waits a little for descriptors that goroutines are closing.
func requireFDs(t *testing.T, want int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); openFDs(t) != want && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, want, openFDs(t), "open descriptors")
}

// A process that is not the expected peer connects to rank 1's listener
// first, says it is rank 0 and sends a descriptor: its connection is
// refused (closed unread), and the real rank 0's is taken.
func TestStrangerIsRefused(t *testing.T) {
	nonce := make(chan string, 4)
	old := listenerNonce
	listenerNonce = func() string { n := fmt.Sprint(time.Now().UnixNano()); nonce <- n; return n }
	defer func() { listenerNonce = old }()
	base := openFDs(t)

	st := store.NewMemory()
	defer st.Close()
	ms := []*Manager{NewManager(NewHostProvider(), Config{Timeout: 10 * time.Second}), NewManager(NewHostProvider(), Config{Timeout: 10 * time.Second})}
	blocks := make([]*Block, 2)
	for r := range ms {
		b, err := ms[r].Alloc(0, 4096)
		require.NoError(t, err)
		blocks[r] = b
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, errs[1] = ms[1].Rendezvous(blocks[1].Ptr(), Group{Name: "s", Rank: 1, World: 2, Store: st})
	}()
	name := fmt.Sprintf("%s-1-%s", socketBase(os.Getpid(), "s", 1), <-nonce)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), strangerEnv+"="+name)
	out := make(chan string, 1)
	go func() {
		b, err := cmd.CombinedOutput()
		out <- fmt.Sprintf("%s%v", b, err)
	}()
	time.Sleep(200 * time.Millisecond) // the stranger is in the listener's queue first
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, errs[0] = ms[0].Rendezvous(blocks[0].Ptr(), Group{Name: "s", Rank: 0, World: 2, Store: st})
	}()
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, "refused\n<nil>", <-out, "what became of the stranger's connection")
	for r := range ms {
		require.NoError(t, ms[r].Free(blocks[r].Ptr()))
		ms[r].Close()
	}
	requireFDs(t, base)
}

// A listener name taken by someone else is replaced by a fresh one.
func TestListenerNameTaken(t *testing.T) {
	var calls atomic.Int32
	old := listenerNonce
	listenerNonce = func() string {
		if calls.Add(1) <= 2 { // the first name each rank tries is taken
			return "taken"
		}
		return old()
	}
	defer func() { listenerNonce = old }()
	for r := 0; r < 2; r++ {
		squat, err := ipc.Listen(fmt.Sprintf("%s-%d-taken", socketBase(os.Getpid(), "t", 1), r))
		require.NoError(t, err)
		defer squat.Close()
	}
	ranks(t, 2, func(rank int, m *Manager, st store.Store) error {
		b, err := m.Alloc(0, 4096)
		if err != nil {
			return err
		}
		if _, err := m.Rendezvous(b.Ptr(), Group{Name: "t", Rank: rank, World: 2, Store: st}); err != nil {
			return err
		}
		return m.Free(b.Ptr())
	})
	require.EqualValues(t, 4, calls.Load(), "each rank tried a second name")
}

// The store server goes away while ranks wait for a peer: they fail at once
// with an error that says the store is gone, and nothing stays open.
func TestStoreServerGone(t *testing.T) {
	base := openFDs(t)
	srv, err := store.NewServer("", "")
	require.NoError(t, err)
	var clients []*store.Client
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	var wg sync.WaitGroup
	var closed time.Time
	for r := 0; r < 2; r++ {
		c, err := store.Dial(srv.Addr(), "", time.Second)
		require.NoError(t, err)
		clients = append(clients, c)
		wg.Add(1)
		go func(r int, c store.Store) {
			defer wg.Done()
			m := NewManager(NewHostProvider(), Config{Timeout: 20 * time.Second})
			b, err := m.Alloc(0, 4096)
			if err != nil {
				errs[r] = err
				return
			}
			defer m.Free(b.Ptr())
			_, errs[r] = m.Rendezvous(b.Ptr(), Group{Name: "gone", Rank: r, World: 3, Store: c}) // rank 2 never comes
			took[r] = time.Since(closed)
		}(r, c)
	}
	time.Sleep(300 * time.Millisecond)
	closed = time.Now()
	require.NoError(t, srv.Close())
	wg.Wait()
	for r := 0; r < 2; r++ {
		require.ErrorIs(t, errs[r], store.ErrClosed, "rank %d", r)
		require.ErrorContains(t, errs[r], "the store went away", "rank %d", r)
		require.Less(t, took[r], 2*time.Second, "rank %d failed at once, not at the timeout", r)
	}
	for _, c := range clients {
		c.Close()
	}
	requireFDs(t, base)
}

// With descriptors exhausted (RLIMIT_NOFILE), a rendezvous fails with a
// clear error and leaves nothing open.
func TestDescriptorExhaustion(t *testing.T) {
	var lim unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &lim))
	st := store.NewMemory()
	defer st.Close()
	m := NewManager(NewHostProvider(), Config{Timeout: 2 * time.Second})
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	base := openFDs(t)
	// The limit caps descriptor numbers: below the lowest free one, no new
	// descriptor can be made.
	free := 0
	for {
		if _, err := unix.FcntlInt(uintptr(free), unix.F_GETFD, 0); err != nil {
			break
		}
		free++
	}
	low := lim
	low.Cur = uint64(free)
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	_, err = m.Rendezvous(b.Ptr(), Group{Name: "nofile", Rank: 0, World: 2, Store: st})
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim))
	require.Error(t, err)
	require.ErrorContains(t, err, "too many open files")
	requireFDs(t, base)
	require.NoError(t, m.Free(b.Ptr()))
}
