package publish

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Problem is a page that could not be used, and why.
type Problem struct {
	Path string `json:"path"`
	Err  string `json:"error"`
}

// Listing is what List found in a directory.
type Listing struct {
	Pages    []*Page   `json:"processes"`
	Problems []Problem `json:"problems,omitempty"`
	// Removed are pages of processes that are gone, deleted by List.
	Removed []string `json:"removed,omitempty"`
}

// foreignStale is how long a page of another pid namespace may go without
// a refresh (or 20 of its intervals, if longer) and still be shown: its
// pid cannot be looked up, so its age is all a reader knows.
const foreignStale = 5 * time.Second

// List reads every page of user uid in dir (those named libsymm-UID-...;
// other users' pages are not looked at) that uid may trust: owned by uid,
// read and written by uid alone (0600), well formed, of a live process.
// Pages whose process is proven gone (same pid namespace as this process,
// and its pid free or taken by a newer process) are deleted; a page of
// another pid namespace is never deleted: it is listed while it is
// refreshed, and reported once it is not. Any other page that cannot be
// used is reported with the reason. A missing dir is an empty listing.
func List(dir string, uid int) Listing {
	var out Listing
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			out.Problems = append(out.Problems, Problem{dir, err.Error()})
		}
		return out
	}
	ns, now := procNamespace(), time.Now()
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), UserPrefix(uid)) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		p, gone, err := readPage(path, e.Name(), uid, ns, now)
		switch {
		case gone:
			if rerr := os.Remove(path); rerr == nil {
				out.Removed = append(out.Removed, path)
			} else if !errors.Is(rerr, fs.ErrNotExist) {
				out.Problems = append(out.Problems, Problem{path, "the process is gone, and its page cannot be removed: " + rerr.Error()})
			}
		case errors.Is(err, fs.ErrNotExist): // removed since the listing: its process ended
		case err != nil:
			out.Problems = append(out.Problems, Problem{path, err.Error()})
		default:
			out.Pages = append(out.Pages, p)
		}
	}
	sort.Slice(out.Pages, func(i, j int) bool {
		a, b := out.Pages[i], out.Pages[j]
		return a.PID < b.PID || (a.PID == b.PID && a.ID < b.ID)
	})
	return out
}

// removeDeadOf removes the pages of process pid of user uid in dir whose
// process is proven gone (left by an earlier process with this pid in this
// pid namespace, killed before it could remove them).
func removeDeadOf(dir string, uid, pid int) {
	ns := procNamespace()
	ents, err := os.ReadDir(dir)
	if err != nil || ns == 0 {
		return
	}
	prefix := fmt.Sprintf("libsymm-%d-%d-", uid, pid)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			path := filepath.Join(dir, e.Name())
			if _, gone, _ := readPage(path, e.Name(), uid, ns, time.Now()); gone {
				_ = os.Remove(path)
			}
		}
	}
}

// procNamespace is this process's pid namespace when /proc shows that
// namespace's pids (/proc/self is our pid), else 0: only then does a pid
// in a page of this namespace name a process in /proc.
func procNamespace() uint64 {
	if s, err := os.Readlink("/proc/self"); err != nil || s != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return PIDNamespace()
}

// readPage reads one page of user uid; gone reports a page whose process
// is proven to have ended. ns is the reader's pid namespace (0: unknown).
func readPage(path, name string, uid int, ns uint64, now time.Time) (p *Page, gone bool, err error) {
	_, pid, id, ok := parseName(name)
	if !ok {
		return nil, false, fmt.Errorf("not a page name (libsymm-UID-PID-ID)")
	}
	b, err := readFile(path, uid)
	if err != nil {
		return nil, false, err
	}
	p, err = Parse(b)
	if err != nil {
		return nil, false, err
	}
	if p.PID != pid || p.UID != uid || p.ID != formatID(id) {
		return nil, false, fmt.Errorf("page %s of pid %d uid %d under the name of page %s of pid %d uid %d", p.ID, p.PID, p.UID, formatID(id), pid, uid)
	}
	gone, err = ended(p, ns, now)
	return p, gone, err
}

// ended tells whether p's process has ended (gone), from its pid when p
// is of the reader's pid namespace ns. Of another namespace (or an unknown
// one), nothing is proven: an error reports a page no longer refreshed.
func ended(p *Page, ns uint64, now time.Time) (gone bool, err error) {
	if ns == 0 || p.PIDNamespace != ns {
		p.OtherNamespace = true
		stale := max(foreignStale, 20*time.Duration(p.Interval)*time.Millisecond)
		if age := now.Sub(time.Unix(0, p.Updated)); age > stale {
			return false, fmt.Errorf("pid %d of another pid namespace (%s), not refreshed for %s: its process may have ended, "+
				"but its pid cannot be looked up from this namespace, so its page is left for its owner to remove",
				p.PID, nsName(p.PIDNamespace), age.Round(time.Second))
		}
		return false, nil
	}
	start, err := StartTicks(p.PID)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true, nil // no such process
	case err != nil:
		return false, fmt.Errorf("cannot tell whether pid %d runs: %w", p.PID, err)
	case p.Start != 0 && start != p.Start:
		return true, nil // its pid is a newer process's
	}
	return false, nil
}

func nsName(ns uint64) string {
	if ns == 0 {
		return "unknown"
	}
	return fmt.Sprintf("pid:[%d]", ns)
}

// readFile opens path without following a link or blocking (a FIFO), checks
// the file it opened (a regular file of uid, mode 0600, of a page's size)
// and reads at most the size it checked.
func readFile(path string, uid int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("a symbolic link: pages are never followed")
	case errors.Is(err, unix.EACCES):
		return nil, fmt.Errorf("cannot be opened (%v): owned by %s, not by %s", err, owner(path), describeUID(uid))
	case err != nil:
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat() // fstat: the file opened, whatever the path names now
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("no owner in %T", fi.Sys())
	}
	switch perm := fi.Mode().Perm(); {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("not a regular file (%s)", fi.Mode())
	case int(st.Uid) != uid:
		return nil, fmt.Errorf("owned by %s, not by %s: a page is trusted only from its own user", describeUID(int(st.Uid)), describeUID(uid))
	case perm&0o077 != 0:
		return nil, fmt.Errorf("mode %#o lets other users read or write it: a page is trusted only at 0600", perm)
	case perm != 0o600:
		return nil, fmt.Errorf("mode %#o: a page is trusted only at 0600", perm)
	case fi.Size() > maxSize:
		return nil, fmt.Errorf("%d bytes, more than a page can be (%d)", fi.Size(), maxSize)
	}
	return readStable(f, int(fi.Size()))
}

// readStable reads the first size bytes of f until it reads an even
// sequence number that is the same after the read: a copy no write
// overlapped.
func readStable(f *os.File, size int) ([]byte, error) {
	b := make([]byte, size)
	var seq [8]byte
	for try := 0; try < 1000; try++ {
		if _, err := f.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("reading %d bytes: %w", size, err)
		}
		if len(b) < headerSize {
			return b, nil // Parse names the problem
		}
		before := binary.LittleEndian.Uint64(b[offSeq:])
		if _, err := f.ReadAt(seq[:], offSeq); err != nil {
			return nil, fmt.Errorf("reading: %w", err)
		}
		if before%2 == 0 && binary.LittleEndian.Uint64(seq[:]) == before {
			return b, nil
		}
	}
	return nil, fmt.Errorf("the page changed during each of 1000 reads")
}
