package kernels

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/internal/settings"
)

// Loader turns one kernel source into loaded modules: compiled once per
// compute capability (and kept on disk, so that the next process starts
// warm), loaded once per device. Safe for concurrent use.
type Loader struct {
	nvrtc     *NVRTC
	name, src string
	cacheDir  string // "": no disk cache

	mu      sync.Mutex
	cubins  map[[2]int][]byte // (major, minor) -> CUBIN
	modules map[int]uintptr   // device -> module
}

// CacheDir is where compiled kernels are kept: SYMM_KERNEL_CACHE ("off": not
// at all), else $XDG_CACHE_HOME/libsymm/kernels, else ~/.cache/libsymm/kernels.
func CacheDir(getenv func(string) string) string {
	switch v := settings.KernelCache.Get(getenv); v {
	case "off":
		return ""
	case "":
	default:
		return v
	}
	if x := getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "libsymm", "kernels")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".cache", "libsymm", "kernels")
	}
	return ""
}

// NewLoader returns a Loader of src (name names it in messages) over n,
// keeping CUBINs under cacheDir ("" for none).
func NewLoader(n *NVRTC, name, src, cacheDir string) *Loader {
	return &Loader{nvrtc: n, name: name, src: src, cacheDir: cacheDir,
		cubins: map[[2]int][]byte{}, modules: map[int]uintptr{}}
}

// cacheKey names a CUBIN on disk: everything that changes the compiler's
// output (source, target, NVRTC) or what may load it (the driver).
func (l *Loader) cacheKey(major, minor, driverVersion int) string {
	h := sha256.New()
	fmt.Fprintf(h, "libsymm kernels v1\x00%s\x00sm_%d%d\x00nvrtc %s\x00driver %d\x00", l.name, major, minor, l.nvrtc.Version(), driverVersion)
	h.Write([]byte(l.src))
	return fmt.Sprintf("%s-sm_%d%d.cubin", hex.EncodeToString(h.Sum(nil)[:16]), major, minor)
}

// CUBIN returns the source compiled for compute capability major.minor:
// from memory, from the disk cache (fromDisk), or compiled now (and stored).
// A cache file that is not a CUBIN is compiled over; a cache that cannot be
// written costs only the next process's compile.
func (l *Loader) CUBIN(major, minor, driverVersion int) (cubin []byte, fromDisk bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cubinLocked(major, minor, driverVersion)
}

func (l *Loader) cubinLocked(major, minor, driverVersion int) ([]byte, bool, error) {
	cc := [2]int{major, minor}
	if c, ok := l.cubins[cc]; ok {
		return c, false, nil
	}
	var path string
	if l.cacheDir != "" {
		path = filepath.Join(l.cacheDir, l.cacheKey(major, minor, driverVersion))
		if c, err := os.ReadFile(path); err == nil && len(c) > 4 && string(c[:4]) == "\x7fELF" {
			l.cubins[cc] = c
			return c, true, nil
		}
	}
	c, err := l.nvrtc.Compile(l.src, l.name, major, minor)
	if err != nil {
		return nil, false, err
	}
	l.cubins[cc] = c
	if path != "" {
		_ = writeAtomic(path, c) // best effort: see above
	}
	return c, false, nil
}

// writeAtomic writes b to path through a temporary file and a rename, so
// that another process never reads half a CUBIN.
func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// Function returns kernel (an extern "C" name in the source) loaded on
// device dev, compiling and loading the module on first use.
func (l *Loader) Function(dev int, kernel string) (uintptr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.modules[dev]
	if !ok {
		major, err := cuda.DeviceAttribute(dev, cuda.AttrComputeCapabilityMajor)
		if err != nil {
			return 0, err
		}
		minor, err := cuda.DeviceAttribute(dev, cuda.AttrComputeCapabilityMinor)
		if err != nil {
			return 0, err
		}
		dv, err := cuda.DriverVersion()
		if err != nil {
			return 0, err
		}
		c, _, err := l.cubinLocked(major, minor, dv)
		if err != nil {
			return 0, err
		}
		if m, err = cuda.ModuleLoad(dev, c); err != nil {
			return 0, fmt.Errorf("kernels: loading %s on device %d: %w", l.name, dev, err)
		}
		l.modules[dev] = m
	}
	return cuda.ModuleFunction(dev, m, kernel)
}

// Compiles compiles the source for compute capability cc ("9.0"), or finds
// it in the disk cache, without touching a device.
func (l *Loader) Compiles(cc string) error {
	var major, minor int
	if _, err := fmt.Sscanf(cc, "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("kernels: compute capability %q: %w", cc, err)
	}
	dv, err := cuda.DriverVersion()
	if err != nil {
		return err
	}
	_, _, err = l.CUBIN(major, minor, dv)
	return err
}
