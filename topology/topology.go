package topology

import (
	"errors"
	"fmt"
	"sort"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/internal/env"
	"github.com/libsymm/libsymm/internal/settings"
)

// SchemaVersion is the version of the JSON form of Topology (doc.go). It
// changes only when a field changes meaning or goes away; new fields may be
// added without a change.
const SchemaVersion = 1

// ErrNoDriver is wrapped by Discover's error on a machine without a usable
// NVIDIA driver. The Topology returned with it is still filled in (no
// devices; the host backend and the reason).
var ErrNoDriver = errors.New("no NVIDIA driver found")

// Topology is what Discover finds: devices, how each pair is linked, the
// libraries libsymm can use and which backends can run.
type Topology struct {
	Schema    int       `json:"schema"`
	Driver    Driver    `json:"driver"`
	Devices   []Device  `json:"devices"`
	Links     [][]Link  `json:"links"` // Links[i][j]: from device i to device j (CUDA ordinals)
	Libraries []Library `json:"libraries"`
	Backends  []Backend `json:"backends"`
	// Kernels says whether libsymm's kernels (signals, one-shot all-reduce)
	// run here; filled by kernels.Probe (nil when nobody asked).
	Kernels *Kernels `json:"kernels,omitempty"`
}

// Kernels is what kernels.Probe found: NVRTC, and per device whether the
// kernels compiled (or came from the disk cache) and loaded.
type Kernels struct {
	NVRTC   string         `json:"nvrtc"`           // NVRTC's version; "" when not found
	Error   string         `json:"error,omitempty"` // why NVRTC cannot be used
	Devices []KernelDevice `json:"devices"`
}

// KernelDevice is one device's answer.
type KernelDevice struct {
	Index  int    `json:"index"`
	Arch   string `json:"arch"`   // "sm_90"
	Ready  bool   `json:"ready"`  // compiled for the device's architecture (or found in the cache)
	Loaded bool   `json:"loaded"` // and loaded on the device (symm info; symm_topology does not load)
	Reason string `json:"reason,omitempty"`
}

// Driver says whether the CUDA driver and NVML were found, and their versions.
type Driver struct {
	Found       bool   `json:"found"`
	Version     string `json:"version"`      // NVIDIA driver, e.g. "580.159.04" (from NVML; "" without it)
	CUDAVersion string `json:"cuda_version"` // the driver's CUDA API, e.g. "13.0"
	NVML        bool   `json:"nvml"`         // NVML answered: links and affinities are known
	Error       string `json:"error,omitempty"`
	NVMLError   string `json:"nvml_error,omitempty"`
}

// Device is one CUDA device as this process numbers it (after CUDA_VISIBLE_DEVICES).
type Device struct {
	Index             int          `json:"index"`
	Name              string       `json:"name"`
	UUID              string       `json:"uuid"`       // "" without NVML
	PCIBusID          string       `json:"pci_bus_id"` // "00000000:18:00.0"
	MemoryBytes       uint64       `json:"memory_bytes"`
	ComputeCapability string       `json:"compute_capability"` // "9.0"
	CPUAffinity       string       `json:"cpu_affinity"`       // CPUs near the device, "0-31,64-95"; "" unknown
	NUMAAffinity      string       `json:"numa_affinity"`      // NUMA nodes near the device (nvidia-smi's "NUMA Affinity"), "0"; "" unknown
	NUMANode          int          `json:"numa_node"`          // the GPU memory's own NUMA node (nvidia-smi's "GPU NUMA ID"); -1: none or unknown
	Capabilities      Capabilities `json:"capabilities"`
}

// Capabilities are read from the driver (cuDeviceGetAttribute).
type Capabilities struct {
	VMM                  bool `json:"vmm"`                      // virtual memory management (cuMemCreate/cuMemMap)
	PosixFD              bool `json:"posix_fd"`                 // exportable as POSIX file descriptors: the CUDA backend's IPC
	Fabric               bool `json:"fabric"`                   // exportable as fabric handles (multi-node NVLink)
	GPUDirectRDMAWithVMM bool `json:"gpu_direct_rdma_with_vmm"` // VMM memory usable for GPUDirect RDMA
	MulticastHardware    bool `json:"multicast_hardware"`       // the hardware has NVLink multicast (NVLS)
	MulticastEnabled     bool `json:"multicast_enabled"`        // libsymm uses it: always false
}

// Link is how one device reaches another.
type Link struct {
	// Kind as nvidia-smi topo -m writes it: "X" (itself), "NV<n>" (n
	// NVLinks), "PIX" (one PCIe switch), "PXB" (several switches), "PHB" (a
	// host bridge), "NODE" (host bridges of one NUMA node), "SYS" (across
	// NUMA nodes), "?" (unknown: no NVML).
	Kind    string `json:"kind"`
	NVLinks int    `json:"nvlinks"`
	// P2P: the driver lets this device map the other's memory
	// (cuDeviceCanAccessPeer), which symmetric memory needs.
	P2P bool `json:"p2p"`
}

// Library is a library libsymm looked for.
type Library struct {
	Name    string `json:"name"` // "cuda", "nvml", "nccl", "nvshmem", "nvrtc"
	Found   bool   `json:"found"`
	Path    string `json:"path,omitempty"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Backend is one of libsymm's backends and whether it can run here.
type Backend struct {
	Name      string `json:"name"` // "cuda", "host", "nvshmem", "nccl"
	Available bool   `json:"available"`
	Reason    string `json:"reason"`
}

// Options of Discover.
type Options struct {
	// NVMLLibrary is the NVML library to open (default: SYMM_NVML_LIB, else
	// libnvidia-ml.so.1).
	NVMLLibrary string
	// LibraryDirs are searched for NCCL and NVSHMEM after the loader's own
	// path: Python site-packages directories (nvidia/nccl/lib and
	// nvidia/nvshmem/lib under each) or directories holding the libraries.
	LibraryDirs []string
}

// cudaFacts is what Discover asks the CUDA driver (package cuda; fakes in tests).
type cudaFacts interface {
	DriverVersion() (int, error)
	DeviceCount() (int, error)
	DeviceName(dev int) (string, error)
	TotalMem(dev int) (uint64, error)
	DeviceAttribute(dev, attr int) (int, error)
	CanAccessPeer(dev, peer int) (bool, error)
}

// nvmlFacts is what Discover asks NVML.
type nvmlFacts interface {
	DriverVersion() (string, error)
	Devices() ([]nvmlDevice, error)
	CommonAncestor(a, b nvmlDevice) (int, error)
}

// nvmlDevice is NVML's view of one device.
type nvmlDevice struct {
	handle uintptr
	Name   string
	UUID   string
	BusID  string
	Memory uint64
	CPUs   string
	Nodes  string // NUMA nodes near the device
	NUMA   int
	Links  []nvLink // active NVLinks
}

// nvLink is one active NVLink: to a switch, or to the device at RemoteBusID.
type nvLink struct {
	Switch      bool
	RemoteBusID string
}

type realCUDA struct{}

func (realCUDA) DriverVersion() (int, error)                { return cuda.DriverVersion() }
func (realCUDA) DeviceCount() (int, error)                  { return cuda.DeviceCount() }
func (realCUDA) DeviceName(dev int) (string, error)         { return cuda.DeviceName(dev) }
func (realCUDA) TotalMem(dev int) (uint64, error)           { return cuda.TotalMem(dev) }
func (realCUDA) DeviceAttribute(dev, attr int) (int, error) { return cuda.DeviceAttribute(dev, attr) }
func (realCUDA) CanAccessPeer(dev, peer int) (bool, error)  { return cuda.CanAccessPeer(dev, peer) }

// Discover reads the machine: the CUDA driver for devices, capabilities and
// peer access; NVML for links, UUIDs and affinities; the loader path and
// opts.LibraryDirs for NCCL and NVSHMEM. Without a driver it returns the
// topology it could fill in and an error wrapping ErrNoDriver; it never
// panics and never needs a GPU.
func Discover(opts Options) (*Topology, error) {
	var nv nvmlFacts
	l, nvErr := openNVML(nvmlPath(opts.NVMLLibrary))
	if nvErr == nil {
		nv = l
	}
	t, err := discover(realCUDA{}, nv, nvErr)
	t.Libraries = append(t.Libraries, findLibraries(opts.LibraryDirs)...)
	t.Backends = backends(t)
	return t, err
}

// nvmlPath is the NVML library to open: path, else SYMM_NVML_LIB, else the soname.
func nvmlPath(path string) string {
	if path == "" {
		path = settings.NVMLLib.Get(env.Get)
	}
	if path == "" {
		path = "libnvidia-ml.so.1"
	}
	return path
}

// CUDA device attributes read here (CUdevice_attribute).
const (
	attrPCIBus      = 33
	attrPCIDevice   = 34
	attrPCIDomain   = 50
	attrCCMajor     = 75
	attrCCMinor     = 76
	attrVMM         = 102
	attrPosixFD     = 103
	attrRDMAWithVMM = 112
	attrFabric      = 128
	attrMulticast   = 132
)

// nvmlTopologyKinds maps nvmlGpuTopologyLevel_t to nvidia-smi's names.
var nvmlTopologyKinds = map[int]string{0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

func discover(cu cudaFacts, nv nvmlFacts, nvErr error) (*Topology, error) {
	t := &Topology{Schema: SchemaVersion, Devices: []Device{}, Links: [][]Link{}}
	if nvErr != nil {
		t.Driver.NVMLError = nvErr.Error()
	}
	cudaLib := Library{Name: "cuda", Path: cuda.DefaultLibrary}
	if p := settings.CUDALib.Get(env.Get); p != "" {
		cudaLib.Path = p
	}
	v, err := cu.DriverVersion()
	if err != nil {
		t.Driver.Error = err.Error()
		cudaLib.Error = err.Error()
		t.Libraries = append(t.Libraries, cudaLib, nvmlLibrary(nv, nvErr))
		return t, fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	t.Driver.Found = true
	t.Driver.CUDAVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	cudaLib.Found, cudaLib.Version = true, t.Driver.CUDAVersion
	t.Libraries = append(t.Libraries, cudaLib, nvmlLibrary(nv, nvErr))

	var nvDevs map[string]nvmlDevice
	if nv != nil {
		t.Driver.NVML = true
		t.Driver.Version, _ = nv.DriverVersion()
		if list, err := nv.Devices(); err == nil {
			nvDevs = map[string]nvmlDevice{}
			for _, d := range list {
				nvDevs[d.BusID] = d
			}
		} else {
			t.Driver.NVML, t.Driver.NVMLError = false, err.Error()
		}
	}
	n, err := cu.DeviceCount()
	if err != nil {
		// A driver without usable devices (CUDA_ERROR_NO_DEVICE): found, empty.
		t.Driver.Error = err.Error()
		return t, nil
	}
	attr := func(dev, a int) int { v, _ := cu.DeviceAttribute(dev, a); return v }
	for i := 0; i < n; i++ {
		d := Device{Index: i, NUMANode: -1}
		d.Name, _ = cu.DeviceName(i)
		d.MemoryBytes, _ = cu.TotalMem(i)
		d.PCIBusID, _ = busID(cu, i)
		d.ComputeCapability = fmt.Sprintf("%d.%d", attr(i, attrCCMajor), attr(i, attrCCMinor))
		d.Capabilities = Capabilities{
			VMM:                  attr(i, attrVMM) != 0,
			PosixFD:              attr(i, attrPosixFD) != 0,
			Fabric:               attr(i, attrFabric) != 0,
			GPUDirectRDMAWithVMM: attr(i, attrRDMAWithVMM) != 0,
			MulticastHardware:    attr(i, attrMulticast) != 0,
		}
		if nd, ok := nvDevs[d.PCIBusID]; ok {
			d.UUID, d.CPUAffinity, d.NUMAAffinity, d.NUMANode = nd.UUID, nd.CPUs, nd.Nodes, nd.NUMA
		}
		t.Devices = append(t.Devices, d)
	}
	t.Links = links(cu, nv, t.Devices, nvDevs)
	return t, nil
}

func nvmlLibrary(nv nvmlFacts, nvErr error) Library {
	l := Library{Name: "nvml", Found: nv != nil}
	if l.Found {
		l.Version, _ = nv.DriverVersion()
	} else if nvErr != nil {
		l.Error = nvErr.Error()
	}
	return l
}

// links builds the matrix. NVLinks between two GPUs are those whose remote
// end is the other GPU, plus, through NVSwitches, the smaller of the two
// devices' switch-link counts (every GPU on a switch fabric reaches every
// other over all its switch links), as nvidia-smi and PyTorch count them.
func links(cu cudaFacts, nv nvmlFacts, devs []Device, nvDevs map[string]nvmlDevice) [][]Link {
	n := len(devs)
	m := make([][]Link, n)
	switchLinks := make([]int, n)
	direct := make([]map[string]int, n)
	for i, d := range devs {
		direct[i] = map[string]int{}
		for _, l := range nvDevs[d.PCIBusID].Links {
			if l.Switch {
				switchLinks[i]++
			} else {
				direct[i][l.RemoteBusID]++
			}
		}
	}
	for i := range devs {
		m[i] = make([]Link, n)
		for j := range devs {
			if i == j {
				m[i][j] = Link{Kind: "X", P2P: true}
				continue
			}
			l := Link{Kind: "?"}
			l.P2P, _ = cu.CanAccessPeer(i, j)
			l.NVLinks = direct[i][devs[j].PCIBusID] + min(switchLinks[i], switchLinks[j])
			a, okA := nvDevs[devs[i].PCIBusID]
			b, okB := nvDevs[devs[j].PCIBusID]
			switch {
			case l.NVLinks > 0:
				l.Kind = fmt.Sprintf("NV%d", l.NVLinks)
			case okA && okB && nv != nil:
				if level, err := nv.CommonAncestor(a, b); err == nil {
					if k, ok := nvmlTopologyKinds[level]; ok {
						l.Kind = k
					}
				}
			}
			m[i][j] = l
		}
	}
	return m
}

// backends says which of libsymm's backends can run, from what was found.
func backends(t *Topology) []Backend {
	vmm := false
	for _, d := range t.Devices {
		vmm = vmm || (d.Capabilities.VMM && d.Capabilities.PosixFD)
	}
	cudaB := Backend{Name: "cuda", Available: t.Driver.Found && len(t.Devices) > 0 && vmm}
	switch {
	case cudaB.Available:
		cudaB.Reason = fmt.Sprintf("%d device(s) with VMM and POSIX file-descriptor handles", len(t.Devices))
	case !t.Driver.Found:
		cudaB.Reason = "no NVIDIA driver found"
	case len(t.Devices) == 0:
		cudaB.Reason = "the driver sees no device"
	default:
		cudaB.Reason = "no device supports VMM with POSIX file-descriptor handles"
	}
	out := []Backend{cudaB, {Name: "host", Available: true, Reason: "memfd + mmap (SYMM_DEVICE=host)"}}
	for _, name := range []string{"nvshmem", "nccl"} {
		b := Backend{Name: name, Reason: "library not found"}
		for _, l := range t.Libraries {
			if l.Name != name || !l.Found {
				continue
			}
			var major, minor int
			fmt.Sscanf(l.Version, "%d.%d", &major, &minor)
			supported := major == 3 // NVSHMEM: the 3.x ABI
			need := "NVSHMEM 3.x"
			if name == "nccl" {
				supported, need = major > 2 || major == 2 && minor >= 27, "NCCL 2.27 or later (symmetric windows)"
			}
			switch {
			case !supported:
				b.Reason = fmt.Sprintf("library %s found; the backend needs %s", l.Version, need)
			case !cudaB.Available:
				b.Reason = fmt.Sprintf("library %s found, but the cuda backend cannot run (%s)", l.Version, cudaB.Reason)
			default:
				b.Available = true
				b.Reason = fmt.Sprintf("library %s (SYMM_BACKEND=%s; every rank calls symm_backend_init)", l.Version, name)
			}
		}
		out = append(out, b)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Available && !out[j].Available })
	return out
}
