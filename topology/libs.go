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

	"github.com/libsymm/libsymm/internal/dl"
)

// libSpec is a library looked for: its soname, where pip wheels put it
// under a site-packages directory, the variable that names it outright, and
// how to read its version once opened.
type libSpec struct {
	name, soname, wheelDir, env string
	version                     func(l *dl.Lib) (string, error)
}

var libSpecs = []libSpec{
	{name: "nccl", soname: "libnccl.so.2", wheelDir: "nvidia/nccl/lib", env: "SYMM_NCCL_LIB", version: ncclVersion},
	{name: "nvshmem", soname: "libnvshmem_host.so.3", wheelDir: "nvidia/nvshmem/lib", env: "SYMM_NVSHMEM_LIB", version: nvshmemVersion},
}

// Candidates returns where the library called name ("nccl", "nvshmem") is
// looked for, in order: its SYMM_*_LIB variable, the loader's own search (the
// soname), then each of dirs as a site-packages directory (pip's nvidia-*
// wheels) and as a directory holding the library.
func Candidates(name string, dirs []string) []string {
	for _, s := range libSpecs {
		if s.name != name {
			continue
		}
		var out []string
		if p := os.Getenv(s.env); p != "" {
			out = append(out, p)
		}
		out = append(out, s.soname)
		for _, d := range dirs {
			out = append(out, filepath.Join(d, s.wheelDir, s.soname), filepath.Join(d, s.soname))
		}
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
	soname := ""
	for _, s := range libSpecs {
		if s.name == name {
			soname = s.soname
		}
	}
	err := fmt.Errorf("%s not found (looked on the loader path and in %d more directories)", soname, len(dirs))
	if len(errs) > 0 {
		err = fmt.Errorf("%w: %w", err, errors.Join(errs...))
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
