package publish

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
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

// List reads every page in dir that user uid may trust: owned by uid, not
// readable or writable by anyone else, well formed, of a live process.
// Pages of processes that are gone (killed before they could remove them)
// are deleted; any other page that cannot be used is reported with the
// reason. A missing dir is an empty listing.
func List(dir string, uid int) Listing {
	var out Listing
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			out.Problems = append(out.Problems, Problem{dir, err.Error()})
		}
		return out
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "libsymm-") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		p, gone, err := readPage(path, e.Name(), uid)
		switch {
		case gone:
			if rerr := os.Remove(path); rerr == nil {
				out.Removed = append(out.Removed, path)
			} else if !errors.Is(rerr, fs.ErrNotExist) {
				out.Problems = append(out.Problems, Problem{path, "the process is gone, and its page cannot be removed: " + rerr.Error()})
			}
		case err != nil:
			out.Problems = append(out.Problems, Problem{path, err.Error()})
		default:
			out.Pages = append(out.Pages, p)
		}
	}
	sort.Slice(out.Pages, func(i, j int) bool { return out.Pages[i].PID < out.Pages[j].PID })
	return out
}

// readPage reads one page; gone reports a page of a process that no longer
// runs (its pid is free or belongs to a newer process).
func readPage(path, name string, uid int) (p *Page, gone bool, err error) {
	var wantUID, pid int
	if _, err := fmt.Sscanf(name, "libsymm-%d-%d", &wantUID, &pid); err != nil || Name(wantUID, pid) != name {
		return nil, false, fmt.Errorf("not a page name (libsymm-UID-PID)")
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, false, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, false, fmt.Errorf("not a regular file (%s)", fi.Mode())
	case !ok || int(st.Uid) != uid:
		return nil, false, fmt.Errorf("owned by uid %d, not by uid %d: a page is trusted only from the same user", st.Uid, uid)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, false, fmt.Errorf("mode %#o lets other users read or write it: a page is trusted only at 0600", fi.Mode().Perm())
	case wantUID != uid:
		return nil, false, fmt.Errorf("named for uid %d, owned by uid %d", wantUID, uid)
	case fi.Size() > maxSize:
		return nil, false, fmt.Errorf("%d bytes, more than a page can be (%d)", fi.Size(), maxSize)
	}
	b, err := readStable(path)
	if err != nil {
		return nil, false, err
	}
	p, err = Parse(b)
	if err != nil {
		return nil, false, err
	}
	if p.PID != pid || p.UID != uid {
		return nil, false, fmt.Errorf("page of pid %d uid %d under the name of pid %d uid %d", p.PID, p.UID, pid, uid)
	}
	start, serr := StartTicks(pid)
	if serr != nil || (p.Start != 0 && start != p.Start) {
		return nil, true, nil
	}
	return p, false, nil
}

// readStable reads path whole until it reads an even sequence number that
// is the same after the read: a copy no write overlapped.
func readStable(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var seq [8]byte
	for try := 0; try < 1000; try++ {
		fi, err := f.Stat()
		if err != nil {
			return nil, err
		}
		b := make([]byte, fi.Size())
		if _, err := f.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("reading: %w", err)
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
