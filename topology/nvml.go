package topology

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// NVML's types, declared here (no NVML headers at build time). Layouts from
// nvml.h (API of driver 450 and later, unchanged since).
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} symm_nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } symm_nvmlMemory_t;

// One trampoline per signature: fn is the symbol dlsym returned.
static inline nvmlReturn_t symm_nvml_void(void *fn) { return ((nvmlReturn_t(*)(void))fn)(); }
static inline nvmlReturn_t symm_nvml_str(void *fn, char *buf, unsigned n) {
  return ((nvmlReturn_t(*)(char *, unsigned))fn)(buf, n);
}
static inline nvmlReturn_t symm_nvml_int(void *fn, int *v) { return ((nvmlReturn_t(*)(int *))fn)(v); }
static inline nvmlReturn_t symm_nvml_uint(void *fn, unsigned *v) { return ((nvmlReturn_t(*)(unsigned *))fn)(v); }
static inline nvmlReturn_t symm_nvml_handle(void *fn, unsigned i, uintptr_t *d) {
  return ((nvmlReturn_t(*)(unsigned, nvmlDevice_t *))fn)(i, (nvmlDevice_t *)d);
}
static inline nvmlReturn_t symm_nvml_dev_str(void *fn, uintptr_t d, char *buf, unsigned n) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))fn)((nvmlDevice_t)d, buf, n);
}
static inline nvmlReturn_t symm_nvml_dev_uint(void *fn, uintptr_t d, unsigned *v) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, unsigned *))fn)((nvmlDevice_t)d, v);
}
static inline nvmlReturn_t symm_nvml_pci(void *fn, uintptr_t d, symm_nvmlPciInfo_t *p) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, symm_nvmlPciInfo_t *))fn)((nvmlDevice_t)d, p);
}
static inline nvmlReturn_t symm_nvml_mem(void *fn, uintptr_t d, symm_nvmlMemory_t *m) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, symm_nvmlMemory_t *))fn)((nvmlDevice_t)d, m);
}
static inline nvmlReturn_t symm_nvml_link_uint(void *fn, uintptr_t d, unsigned link, unsigned *v) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, unsigned, unsigned *))fn)((nvmlDevice_t)d, link, v);
}
static inline nvmlReturn_t symm_nvml_link_pci(void *fn, uintptr_t d, unsigned link, symm_nvmlPciInfo_t *p) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, unsigned, symm_nvmlPciInfo_t *))fn)((nvmlDevice_t)d, link, p);
}
static inline nvmlReturn_t symm_nvml_pair_uint(void *fn, uintptr_t a, uintptr_t b, unsigned *v) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, nvmlDevice_t, unsigned *))fn)((nvmlDevice_t)a, (nvmlDevice_t)b, v);
}
static inline nvmlReturn_t symm_nvml_cpus(void *fn, uintptr_t d, unsigned n, unsigned long *set) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, unsigned, unsigned long *))fn)((nvmlDevice_t)d, n, set);
}
static inline nvmlReturn_t symm_nvml_nodes(void *fn, uintptr_t d, unsigned n, unsigned long *set) {
  return ((nvmlReturn_t(*)(nvmlDevice_t, unsigned, unsigned long *, int))fn)((nvmlDevice_t)d, n, set, 0); // NVML_AFFINITY_SCOPE_NODE
}
static inline const char *symm_nvml_error(void *fn, nvmlReturn_t r) {
  return ((const char *(*)(nvmlReturn_t))fn)(r);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/libsymm/libsymm/internal/dl"
)

// NVML constants used here (nvml.h).
const (
	nvmlSuccess          = 0
	nvmlNotSupported     = 3
	nvmlMaxLinks         = 18 // NVML_NVLINK_MAX_LINKS
	nvmlFeatureEnabled   = 1
	nvmlLinkDeviceSwitch = 2 // NVML_NVLINK_DEVICE_TYPE_SWITCH
)

// nvmlLib is NVML opened with dlopen. Functions that the installed NVML
// lacks are nil, and the facts they would give are reported as unknown:
// NVML is never linked, so an old driver cannot stop libsymm from loading.
type nvmlLib struct {
	lib *dl.Lib
	fn  map[string]unsafe.Pointer
}

var nvmlSymbols = []string{
	"nvmlInit_v2", "nvmlShutdown", "nvmlErrorString",
	"nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetNVMLVersion",
	"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
	"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetMemoryAffinity",
	"nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemoteDeviceType",
	"nvmlDeviceGetTopologyCommonAncestor",
}

var nvmlOnce struct {
	sync.Once
	l   *nvmlLib
	err error
}

// openNVML opens and initializes NVML once per process (NVML counts its
// own initializations; it is never shut down, like the CUDA driver).
func openNVML(path string) (*nvmlLib, error) {
	nvmlOnce.Do(func() {
		lib, err := dl.Open(path)
		if err != nil {
			nvmlOnce.err = fmt.Errorf("NVML: %w", err)
			return
		}
		l := &nvmlLib{lib: lib, fn: map[string]unsafe.Pointer{}}
		for _, s := range nvmlSymbols {
			if p, err := lib.Lookup(s); err == nil {
				l.fn[s] = p
			}
		}
		if l.fn["nvmlInit_v2"] == nil || l.fn["nvmlDeviceGetCount_v2"] == nil || l.fn["nvmlDeviceGetHandleByIndex_v2"] == nil {
			nvmlOnce.err = fmt.Errorf("NVML: %s lacks nvmlInit_v2 or the device functions", path)
			return
		}
		if r := C.symm_nvml_void(l.fn["nvmlInit_v2"]); r != nvmlSuccess {
			nvmlOnce.err = fmt.Errorf("NVML: nvmlInit_v2: %w", l.err(r))
			return
		}
		nvmlOnce.l = l
	})
	return nvmlOnce.l, nvmlOnce.err
}

// nvmlError is an NVML return code with NVML's own text.
type nvmlError struct {
	code int
	text string
}

func (e *nvmlError) Error() string { return fmt.Sprintf("%s (NVML error %d)", e.text, e.code) }

var errMissing = errors.New("not in this NVML")

func (l *nvmlLib) err(r C.nvmlReturn_t) error {
	if r == nvmlSuccess {
		return nil
	}
	text := "unknown error"
	if f := l.fn["nvmlErrorString"]; f != nil {
		if s := C.symm_nvml_error(f, r); s != nil {
			text = C.GoString(s)
		}
	}
	return &nvmlError{code: int(r), text: text}
}

func (l *nvmlLib) need(name string) (unsafe.Pointer, error) {
	if f := l.fn[name]; f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("%s: %w", name, errMissing)
}

func (l *nvmlLib) str(name string, call func(f unsafe.Pointer, buf *C.char, n C.uint) C.nvmlReturn_t) (string, error) {
	f, err := l.need(name)
	if err != nil {
		return "", err
	}
	buf := (*C.char)(C.calloc(256, 1))
	defer C.free(unsafe.Pointer(buf))
	if err := l.err(call(f, buf, 256)); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return C.GoString(buf), nil
}

func (l *nvmlLib) DriverVersion() (string, error) {
	return l.str("nvmlSystemGetDriverVersion", func(f unsafe.Pointer, b *C.char, n C.uint) C.nvmlReturn_t {
		return C.symm_nvml_str(f, b, n)
	})
}

func (l *nvmlLib) CUDAVersion() (int, error) {
	f, err := l.need("nvmlSystemGetCudaDriverVersion_v2")
	if err != nil {
		return 0, err
	}
	var v C.int
	return int(v), l.err(C.symm_nvml_int(f, &v))
}

// Devices returns what NVML knows of every device, in NVML's order.
func (l *nvmlLib) Devices() ([]nvmlDevice, error) {
	hs, err := l.handles()
	if err != nil {
		return nil, err
	}
	devs := make([]nvmlDevice, len(hs))
	for i, h := range hs {
		devs[i] = l.device(h)
	}
	return devs, nil
}

// handles returns every device's NVML handle, in NVML's order.
func (l *nvmlLib) handles() ([]uintptr, error) {
	var n C.uint
	if err := l.err(C.symm_nvml_uint(l.fn["nvmlDeviceGetCount_v2"], &n)); err != nil {
		return nil, fmt.Errorf("nvmlDeviceGetCount_v2: %w", err)
	}
	hs := make([]uintptr, n)
	for i := range hs {
		var h C.uintptr_t
		if err := l.err(C.symm_nvml_handle(l.fn["nvmlDeviceGetHandleByIndex_v2"], C.uint(i), &h)); err != nil {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex_v2(%d): %w", i, err)
		}
		hs[i] = uintptr(h)
	}
	return hs, nil
}

// memory reads device h's memory now (nvmlDeviceGetMemoryInfo): total,
// used by every process, free.
func (l *nvmlLib) memory(h uintptr) (total, used, free uint64, err error) {
	f, err := l.need("nvmlDeviceGetMemoryInfo")
	if err != nil {
		return 0, 0, 0, err
	}
	var mem C.symm_nvmlMemory_t
	if err := l.err(C.symm_nvml_mem(f, C.uintptr_t(h), &mem)); err != nil {
		return 0, 0, 0, fmt.Errorf("nvmlDeviceGetMemoryInfo: %w", err)
	}
	return uint64(mem.total), uint64(mem.used), uint64(mem.free), nil
}

// device reads one device; facts NVML cannot give stay at their zero value
// (NUMA: -1).
func (l *nvmlLib) device(h uintptr) nvmlDevice {
	d := nvmlDevice{handle: h, NUMA: -1}
	devStr := func(name string) string {
		s, _ := l.str(name, func(f unsafe.Pointer, b *C.char, n C.uint) C.nvmlReturn_t {
			return C.symm_nvml_dev_str(f, C.uintptr_t(h), b, n)
		})
		return s
	}
	d.Name, d.UUID = devStr("nvmlDeviceGetName"), devStr("nvmlDeviceGetUUID")
	var pci C.symm_nvmlPciInfo_t
	if f := l.fn["nvmlDeviceGetPciInfo_v3"]; f != nil && C.symm_nvml_pci(f, C.uintptr_t(h), &pci) == nvmlSuccess {
		d.BusID = normalizeBusID(C.GoString(&pci.busId[0]))
	}
	if total, _, _, err := l.memory(h); err == nil {
		d.Memory = total
	}
	if f := l.fn["nvmlDeviceGetNumaNodeId"]; f != nil {
		var v C.uint
		if C.symm_nvml_dev_uint(f, C.uintptr_t(h), &v) == nvmlSuccess {
			d.NUMA = int(v)
		}
	}
	const words = 64 // 4096 CPUs or NUMA nodes
	set := (*C.ulong)(C.calloc(words, C.size_t(unsafe.Sizeof(C.ulong(0)))))
	defer C.free(unsafe.Pointer(set))
	if f := l.fn["nvmlDeviceGetCpuAffinity"]; f != nil && C.symm_nvml_cpus(f, C.uintptr_t(h), words, set) == nvmlSuccess {
		d.CPUs = cpuList(unsafe.Slice((*uint64)(unsafe.Pointer(set)), words))
	}
	if f := l.fn["nvmlDeviceGetMemoryAffinity"]; f != nil {
		C.memset(unsafe.Pointer(set), 0, words*C.size_t(unsafe.Sizeof(C.ulong(0))))
		if C.symm_nvml_nodes(f, C.uintptr_t(h), words, set) == nvmlSuccess {
			d.Nodes = cpuList(unsafe.Slice((*uint64)(unsafe.Pointer(set)), words))
		}
	}
	state, remote, kind := l.fn["nvmlDeviceGetNvLinkState"], l.fn["nvmlDeviceGetNvLinkRemotePciInfo_v2"], l.fn["nvmlDeviceGetNvLinkRemoteDeviceType"]
	if state != nil && remote != nil {
		for link := C.uint(0); link < nvmlMaxLinks; link++ {
			var on C.uint
			if C.symm_nvml_link_uint(state, C.uintptr_t(h), link, &on) != nvmlSuccess || on != nvmlFeatureEnabled {
				continue
			}
			var t C.uint
			if kind != nil && C.symm_nvml_link_uint(kind, C.uintptr_t(h), link, &t) == nvmlSuccess && t == nvmlLinkDeviceSwitch {
				d.Links = append(d.Links, nvLink{Switch: true})
				continue
			}
			if C.symm_nvml_link_pci(remote, C.uintptr_t(h), link, &pci) == nvmlSuccess {
				d.Links = append(d.Links, nvLink{RemoteBusID: normalizeBusID(C.GoString(&pci.busId[0]))})
			}
		}
	}
	return d
}

// CommonAncestor is NVML's closest common PCIe ancestor of two devices
// (nvmlGpuTopologyLevel_t), or an error.
func (l *nvmlLib) CommonAncestor(a, b nvmlDevice) (int, error) {
	f, err := l.need("nvmlDeviceGetTopologyCommonAncestor")
	if err != nil {
		return 0, err
	}
	var v C.uint
	return int(v), l.err(C.symm_nvml_pair_uint(f, C.uintptr_t(a.handle), C.uintptr_t(b.handle), &v))
}

// normalizeBusID writes a PCI bus id as NVML does: 8-digit domain,
// lowercase ("00000000:18:00.0"), whatever the source wrote.
func normalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	var dom, bus, dev, fn uint
	if n, _ := fmt.Sscanf(s, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); n == 4 {
		return fmt.Sprintf("%08x:%02x:%02x.%x", dom, bus, dev, fn)
	}
	if n, _ := fmt.Sscanf(s, "%x:%x.%x", &bus, &dev, &fn); n == 3 {
		return fmt.Sprintf("%08x:%02x:%02x.%x", 0, bus, dev, fn)
	}
	return s
}

// cpuList writes a CPU bit set as ranges: "0-31,64-95".
func cpuList(words []uint64) string {
	var parts []string
	start := -1
	for cpu := 0; cpu <= len(words)*64; cpu++ {
		on := cpu < len(words)*64 && words[cpu/64]&(1<<(cpu%64)) != 0
		switch {
		case on && start < 0:
			start = cpu
		case !on && start >= 0:
			if start == cpu-1 {
				parts = append(parts, fmt.Sprint(start))
			} else {
				parts = append(parts, fmt.Sprintf("%d-%d", start, cpu-1))
			}
			start = -1
		}
	}
	return strings.Join(parts, ",")
}
