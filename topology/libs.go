package topology

/*
static inline int symm_call_int1(void *fn, int *a) { return ((int (*)(int *))fn)(a); }
static inline int symm_call_int2(void *fn, int *a, int *b) { return ((int (*)(int *, int *))fn)(a, b); }
static inline int symm_call_int3(void *fn, int *a, int *b, int *c) {
  return ((int (*)(int *, int *, int *))fn)(a, b, c);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/libsymm/libsymm/internal/dl"
	"github.com/libsymm/libsymm/internal/env"
	"github.com/libsymm/libsymm/internal/settings"
)

// libSpec is a library looked for: the files it may be (soname and where
// pip wheels put it under a site-packages directory, newest first), the
// variable that names it outright, and how to read its version once opened.
type libSpec struct {
	name    string
	env     *settings.Setting // the variable that names it outright
	files   []libFile
	version func(l *dl.Lib) (string, error)
}

type libFile struct{ soname, wheelDir string }

var libSpecs = []libSpec{
	{name: "nccl", env: settings.NCCLLib, version: ncclVersion,
		files: []libFile{{"libnccl.so.2", "nvidia/nccl/lib"}}},
	{name: "nvshmem", env: settings.NVSHMEMLib, version: nvshmemVersion,
		files: []libFile{{"libnvshmem_host.so.3", "nvidia/nvshmem/lib"}}},
	// NVRTC compiles kernels at run time (no toolkit at build time). CUDA
	// 13's wheels put every library in nvidia/cu13/lib; CUDA 12's had one
	// directory per library.
	{name: "nvrtc", env: settings.NVRTCLib, version: nvrtcVersion,
		files: []libFile{{"libnvrtc.so.13", "nvidia/cu13/lib"}, {"libnvrtc.so.12", "nvidia/cuda_nvrtc/lib"}}},
}

// told holds the directories a program told the library once, at its start
// (symm_add_library_dirs: the Python package's site-packages, where pip's
// nvidia-* wheels are), for every library opened after that. The wheels'
// sub-paths are libSpecs' alone: the program names directories, never
// files.
var told struct {
	mu   sync.Mutex
	dirs []string
}

// AddLibraryDirs remembers dirs, each a site-packages directory (pip's
// nvidia-* wheels under it) or a directory holding the libraries, after
// those added before; a directory already added, and an empty entry, are
// left out. Every entry must be absolute (a relative one would depend on the
// working directory at each open): otherwise nothing is added and the error
// names it. A directory need not exist. Libraries opened after the call look
// there (Candidates); one already opened stays as it is.
func AddLibraryDirs(dirs []string) error {
	var add []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return fmt.Errorf("library directory %q is not an absolute path", d)
		}
		add = append(add, filepath.Clean(d))
	}
	told.mu.Lock()
	defer told.mu.Unlock()
	for _, d := range add {
		known := false
		for _, k := range told.dirs {
			known = known || k == d
		}
		if !known {
			told.dirs = append(told.dirs, d)
		}
	}
	return nil
}

// LibraryDirs returns the directories AddLibraryDirs remembered, in order.
func LibraryDirs() []string {
	told.mu.Lock()
	defer told.mu.Unlock()
	return append([]string(nil), told.dirs...)
}

// forgetLibraryDirs forgets what AddLibraryDirs remembered (tests).
func forgetLibraryDirs() {
	told.mu.Lock()
	told.dirs = nil
	told.mu.Unlock()
}

// Candidates returns where the library called name ("nccl", "nvshmem",
// "nvrtc") is looked for, in order:
//  1. its SYMM_*_LIB variable (a user who names a file means that file);
//  2. each directory of LibraryDirs (what the Python package told: pip's
//     wheels, those PyTorch itself loads; before the loader path, so that a
//     system copy does not shadow them);
//  3. the loader's own search (each soname);
//  4. each of dirs (the caller's own, as symm info's site-packages).
//
// A directory is searched as a site-packages directory (the wheel's
// sub-path) and as a directory holding the library.
func Candidates(name string, dirs []string) []string {
	for _, s := range libSpecs {
		if s.name != name {
			continue
		}
		var out []string
		if p := s.env.Get(env.Get); p != "" {
			out = append(out, p)
		}
		in := func(dirs []string) {
			for _, d := range dirs {
				for _, f := range s.files {
					out = append(out, filepath.Join(d, f.wheelDir, f.soname), filepath.Join(d, f.soname))
				}
			}
		}
		in(LibraryDirs())
		for _, f := range s.files {
			out = append(out, f.soname)
		}
		in(dirs)
		return out
	}
	return nil
}

// OpenFirst opens the first of Candidates(name, dirs) that loads, and
// returns it with its path. A candidate path that does not exist is skipped
// quietly; when none loads, the error lists why each that exists did not.
func OpenFirst(name string, dirs []string) (*dl.Lib, string, error) {
	var errs []error
	for _, path := range Candidates(name, dirs) {
		if filepath.IsAbs(path) {
			if _, err := os.Stat(path); err != nil {
				continue // not there: no need to say so for every directory
			}
		}
		l, err := dl.Open(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return l, path, nil
	}
	soname := name
	for _, s := range libSpecs {
		if s.name == name {
			soname = s.files[0].soname
		}
	}
	where := "on the loader path"
	if more := append(append([]string(nil), dirs...), LibraryDirs()...); len(more) > 0 {
		where += " and in " + strings.Join(more, ", ")
	}
	err := fmt.Errorf("%s not found (looked %s)", soname, where)
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		err = fmt.Errorf("%w: %s", err, strings.Join(msgs, "; ")) // one line: symm info prints a table
	}
	return nil, "", err
}

func findLibraries(dirs []string) []Library {
	var out []Library
	for _, s := range libSpecs {
		lib := Library{Name: s.name}
		l, path, err := OpenFirst(s.name, dirs)
		if err != nil {
			lib.Error = err.Error()
			out = append(out, lib)
			continue
		}
		lib.Found, lib.Path = true, path
		if v, err := s.version(l); err == nil {
			lib.Version = v
		} else {
			lib.Error = err.Error()
		}
		l.Close()
		out = append(out, lib)
	}
	return out
}

// nvrtcVersion calls nvrtcVersion: "13.0".
func nvrtcVersion(l *dl.Lib) (string, error) {
	f, err := l.Lookup("nvrtcVersion")
	if err != nil {
		return "", err
	}
	var major, minor C.int
	if r := C.symm_call_int2(f, &major, &minor); r != 0 {
		return "", fmt.Errorf("nvrtcVersion returned %d", r)
	}
	return fmt.Sprintf("%d.%d", major, minor), nil
}

// ncclVersion calls ncclGetVersion: 22809 is 2.28.9 (before 2.9: 2708 is 2.7.8).
func ncclVersion(l *dl.Lib) (string, error) {
	f, err := l.Lookup("ncclGetVersion")
	if err != nil {
		return "", err
	}
	var v C.int
	if r := C.symm_call_int1(f, &v); r != 0 {
		return "", fmt.Errorf("ncclGetVersion returned %d", r)
	}
	return ncclVersionString(int(v)), nil
}

func ncclVersionString(code int) string {
	if code >= 10000 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
}

// nvshmemVersion asks NVSHMEM's vendor version (major, minor, patch), or the
// OpenSHMEM version it implements when the vendor call is missing.
func nvshmemVersion(l *dl.Lib) (string, error) {
	var a, b, c C.int
	if f, err := l.Lookup("nvshmemx_vendor_get_version_info"); err == nil {
		C.symm_call_int3(f, &a, &b, &c)
		return fmt.Sprintf("%d.%d.%d", a, b, c), nil
	}
	if f, err := l.Lookup("nvshmem_info_get_version"); err == nil {
		C.symm_call_int2(f, &a, &b)
		return fmt.Sprintf("OpenSHMEM %d.%d", a, b), nil
	}
	return "", errors.New("neither nvshmemx_vendor_get_version_info nor nvshmem_info_get_version is exported")
}
