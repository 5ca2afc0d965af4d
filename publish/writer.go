package publish

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/internal/settings"
	"golang.org/x/sys/unix"
)

// Dir is where pages are written and read: SYMM_PUBLISH_DIR, else /dev/shm.
func Dir(getenv func(string) string) string {
	if d := settings.PublishDir.Get(getenv); d != "" {
		return d
	}
	return "/dev/shm"
}

// Name is the file name of page id of process pid of user uid.
func Name(uid, pid int, id uint64) string {
	return fmt.Sprintf("libsymm-%d-%d-%s", uid, pid, formatID(id))
}

// UserPrefix starts the names of user uid's pages.
func UserPrefix(uid int) string { return fmt.Sprintf("libsymm-%d-", uid) }

func formatID(id uint64) string { return fmt.Sprintf("%016x", id) }

// parseName reads a page's file name; ok is false for any other name.
func parseName(name string) (uid, pid int, id uint64, ok bool) {
	f := strings.Split(name, "-")
	if len(f) != 4 || f[0] != "libsymm" {
		return 0, 0, 0, false
	}
	u, err1 := strconv.Atoi(f[1])
	p, err2 := strconv.Atoi(f[2])
	i, err3 := strconv.ParseUint(f[3], 16, 64)
	if err1 != nil || err2 != nil || err3 != nil || Name(u, p, i) != name {
		return 0, 0, 0, false
	}
	return u, p, i, true
}

// newPageID draws a page's identity (a variable: tests choose it).
var newPageID = func() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("drawing a page id: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// PIDNamespace is the inode of this process's pid namespace, from
// /proc/self/ns/pid ("pid:[4026531836]"); 0 when it cannot be read.
func PIDNamespace() uint64 {
	s, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return 0
	}
	var ino uint64
	if _, err := fmt.Sscanf(s, "pid:[%d]", &ino); err != nil {
		return 0
	}
	return ino
}

// owner names the owner of path for a message: "uid 1000 (alice)".
func owner(path string) string {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return "owner unknown: " + err.Error()
	}
	return describeUID(int(st.Uid))
}

// describeUID is "uid N (name)", or "uid N" when the name is unknown.
func describeUID(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// Source is what a Writer publishes: called by the writer's goroutine only.
type Source struct {
	// Devices is how many devices the pool has.
	Devices int
	// Names are the statistic names, in the order Stats returns values.
	Names []string
	// Stats returns device dev's statistics.
	Stats func(dev int) ([]int64, error)
	// Streams returns device dev's per-stream usage (nil: none listed).
	Streams func(dev int) ([]Stream, error)
	// Symmetric returns the process's symmetric memory (nil: none).
	Symmetric func() Symmetric
	// Backend names the pool's backend (cuda, host).
	Backend string
}

// Writer owns one process's page.
type Writer struct {
	path string
	// mu serializes Update and Close: an update never writes to a page
	// that Close has unmapped.
	mu  sync.Mutex
	buf []byte // the mapping of the file; nil once closed
	l   layout
	src Source
	// pairs are the indexes of statistics "allocated_bytes.X" and
	// "reserved_bytes.X" (the same X, a current or peak figure): Update
	// keeps allocated <= reserved.
	pairs [][2]int
	stop  chan struct{}
	done  chan struct{}
}

// Create makes a page of this process in dir (mode 0600), fills its
// constant parts and publishes once. The caller starts the refresh (Run)
// and removes the page at exit (Close, or Path from a C destructor). Its
// path is new (a random ID in the name, O_EXCL): no other page is touched,
// except pages of this pid and pid namespace whose process has ended
// (killed before it could remove them).
func Create(dir string, src Source) (*Writer, error) {
	if src.Devices < 0 || src.Devices > maxDevices || len(src.Names) > maxStats {
		return nil, fmt.Errorf("publish: %d devices and %d statistics (at most %d and %d)", src.Devices, len(src.Names), maxDevices, maxStats)
	}
	l := newLayout(src.Devices, len(src.Names), MaxStreams)
	names := encodeNames(src.Names)
	size := l.namesOff + len(names)
	uid, pid := os.Getuid(), os.Getpid()
	removeDeadOf(dir, uid, pid)
	id, err := newPageID()
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	path := filepath.Join(dir, Name(uid, pid, id))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, unix.EEXIST) {
		// Not ours (ours are new): left alone, and its owner named.
		return nil, fmt.Errorf("publish: creating %s: a file is there already, owned by %s; it is not this process's and is left alone", path, owner(path))
	}
	if err != nil {
		return nil, fmt.Errorf("publish: creating %s: %w", path, err)
	}
	defer unix.Close(fd)
	// The umask may have taken bits off: readers trust exactly 0600.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("publish: chmod %s: %w", path, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("publish: sizing %s: %w", path, err)
	}
	buf, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("publish: mapping %s: %w", path, err)
	}
	w := &Writer{path: path, buf: buf, l: l, src: src, pairs: statPairs(src.Names)}
	le := binary.LittleEndian
	copy(buf, magic)
	le.PutUint32(buf[8:], version)
	le.PutUint32(buf[12:], uint32(size))
	le.PutUint32(buf[16:], uint32(pid))
	le.PutUint32(buf[20:], uint32(uid))
	// /proc/self, not /proc/PID: in a pid namespace whose /proc is not its
	// own, PID there is another process.
	start, _ := startTicks("/proc/self/stat")
	le.PutUint64(buf[24:], start)
	le.PutUint64(buf[offID:], id)
	le.PutUint64(buf[offPIDNS:], PIDNamespace())
	le.PutUint32(buf[52:], uint32(l.ndev))
	le.PutUint32(buf[56:], uint32(l.nstats))
	le.PutUint32(buf[60:], uint32(l.nstreams))
	copy(buf[64:64+backendSize-1], src.Backend)
	copy(buf[80:80+cmdlineSize-1], commandLine())
	le.PutUint32(buf[360:], uint32(l.namesOff))
	le.PutUint32(buf[364:], uint32(len(names)))
	copy(buf[l.namesOff:], names)
	w.Update()
	return w, nil
}

// statPairs finds the statistics "allocated_bytes.X" and
// "reserved_bytes.X" of the same X, where X is a current or peak figure.
// Only those obey allocated <= reserved: the cumulative ".allocated" and
// ".freed" count every reuse of cached memory, so a pool that frees 8 MiB
// and gives back nothing has freed 8 MiB of allocated bytes and none of
// reserved ones.
func statPairs(names []string) [][2]int {
	idx := make(map[string]int, len(names))
	for i, n := range names {
		idx[n] = i
	}
	var out [][2]int
	for i, n := range names {
		rest, ok := strings.CutPrefix(n, "allocated_bytes.")
		if ok && (strings.HasSuffix(rest, ".current") || strings.HasSuffix(rest, ".peak")) {
			if j, ok := idx["reserved_bytes."+rest]; ok {
				out = append(out, [2]int{i, j})
			}
		}
	}
	return out
}

// Path is the page's file.
func (w *Writer) Path() string { return w.path }

func (w *Writer) seq() *uint64 { return (*uint64)(unsafe.Pointer(&w.buf[offSeq])) }

// Update reads the source and rewrites the page's changing parts under the
// seqlock. A device whose statistics cannot be read keeps its last values.
func (w *Writer) Update() {
	le := binary.LittleEndian
	type devVals struct {
		stats   []int64
		streams []Stream
	}
	vals := make([]devVals, w.l.ndev)
	for i := range vals { // read before the page turns odd: readers wait less
		vals[i].stats, _ = w.src.Stats(i)
		if w.src.Streams != nil {
			vals[i].streams, _ = w.src.Streams(i)
		}
		// A pool's statistics are read shard by shard (one lock at a time)
		// and its reserved bytes after them, so memory freed and released
		// meanwhile leaves allocated above reserved for one reading. No
		// state of the pool has that: the page shows allocated <= reserved
		// (allocated at most reserved), so that monitors draw the bars and
		// ratios of a state that can exist.
		if st := vals[i].stats; len(st) == w.l.nstats {
			for _, p := range w.pairs {
				st[p[0]] = min(st[p[0]], st[p[1]])
			}
		}
		for k := range vals[i].streams {
			s := &vals[i].streams[k]
			s.Allocated = min(s.Allocated, s.Reserved)
		}
	}
	var sym Symmetric
	if w.src.Symmetric != nil {
		sym = w.src.Symmetric()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf == nil {
		return
	}
	atomic.AddUint64(w.seq(), 1) // odd: writing
	b := w.buf
	le.PutUint64(b[40:], uint64(time.Now().UnixNano()))
	le.PutUint32(b[336:], uint32(sym.Blocks))
	le.PutUint32(b[340:], uint32(sym.Handles))
	le.PutUint32(b[344:], uint32(sym.PeerMappings))
	le.PutUint64(b[352:], sym.Bytes)
	for i, v := range vals {
		o := w.l.devOff(i)
		if len(v.stats) == w.l.nstats {
			for j, x := range v.stats {
				le.PutUint64(b[o+8*j:], uint64(x))
			}
		}
		o += 8 * w.l.nstats
		n := min(len(v.streams), w.l.nstreams)
		le.PutUint32(b[o:], uint32(n))
		o += 8
		for k, s := range v.streams[:n] {
			slot := b[o+k*streamSlotSize:]
			var flags uint64
			if s.Private {
				flags = 1
			}
			le.PutUint64(slot, s.Stream)
			le.PutUint64(slot[8:], flags)
			le.PutUint64(slot[16:], uint64(s.Allocated))
			le.PutUint64(slot[24:], uint64(s.Reserved))
			le.PutUint64(slot[32:], uint64(s.Segments))
		}
	}
	atomic.AddUint64(w.seq(), 1) // even: done
}

// Run refreshes the page every interval until Close.
func (w *Writer) Run(interval time.Duration) {
	binary.LittleEndian.PutUint32(w.buf[48:], uint32(interval/time.Millisecond))
	w.stop, w.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				w.Update()
			}
		}
	}()
}

// Close stops the refresh and removes the page.
func (w *Writer) Close() error {
	if w.stop != nil {
		close(w.stop)
		<-w.done
		w.stop = nil
	}
	err := os.Remove(w.path)
	w.mu.Lock()
	if w.buf != nil {
		_ = unix.Munmap(w.buf)
		w.buf = nil
	}
	w.mu.Unlock()
	return err
}

// commandLine is /proc/self/cmdline with spaces between the arguments.
func commandLine() string {
	b, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// StartTicks is process pid's start time in clock ticks since boot (field
// 22 of /proc/PID/stat): with the pid, it names one process, so a page of a
// dead process is told from one of a new process that got its pid.
func StartTicks(pid int) (uint64, error) {
	return startTicks("/proc/" + strconv.Itoa(pid) + "/stat")
}

func startTicks(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := string(b)
	// The command (field 2) is in parentheses and may hold spaces: count
	// fields after the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command field", path)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("%s: %d fields after the command", path, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22 overall
}
