package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeCUDA is four devices: 0 and 1 joined by 4 direct NVLinks, 2 and 3 on
// an NVSwitch fabric (18 and 12 switch links), 0 unable to map 3.
type fakeCUDA struct{ n int }

func (f fakeCUDA) DriverVersion() (int, error) { return 13000, nil }
func (f fakeCUDA) DeviceCount() (int, error)   { return f.n, nil }
func (f fakeCUDA) DeviceName(dev int) (string, error) {
	return "NVIDIA H200", nil
}
func (f fakeCUDA) TotalMem(dev int) (uint64, error) { return 140 << 30, nil }
func (f fakeCUDA) DeviceAttribute(dev, attr int) (int, error) {
	switch attr {
	case attrPCIBus:
		return 0x18 + dev, nil
	case attrPCIDomain, attrPCIDevice:
		return 0, nil
	case attrCCMajor:
		return 9, nil
	case attrCCMinor:
		return 0, nil
	case attrVMM, attrPosixFD, attrMulticast, attrRDMAWithVMM:
		return 1, nil
	}
	return 0, nil
}
func (f fakeCUDA) CanAccessPeer(dev, peer int) (bool, error) {
	return !(dev == 0 && peer == 3 || dev == 3 && peer == 0), nil
}

type fakeNVML struct{ devs []nvmlDevice }

func bus(i int) string { return fmt.Sprintf("00000000:%02x:00.0", 0x18+i) }

func newFakeNVML() *fakeNVML {
	f := &fakeNVML{}
	for i := 0; i < 4; i++ {
		d := nvmlDevice{handle: uintptr(i + 1), Name: "NVIDIA H200", UUID: fmt.Sprintf("GPU-%d", i), BusID: bus(i),
			Memory: 140 << 30, CPUs: "0-31", Nodes: fmt.Sprint(i / 2), NUMA: i / 2}
		switch i {
		case 0, 1:
			for k := 0; k < 4; k++ {
				d.Links = append(d.Links, nvLink{RemoteBusID: bus(1 - i)})
			}
		case 2, 3:
			for k := 0; k < 18-6*(i-2); k++ {
				d.Links = append(d.Links, nvLink{Switch: true})
			}
		}
		f.devs = append(f.devs, d)
	}
	return f
}

func (f *fakeNVML) DriverVersion() (string, error) { return "580.159.04", nil }
func (f *fakeNVML) Devices() ([]nvmlDevice, error) { return f.devs, nil }
func (f *fakeNVML) CommonAncestor(a, b nvmlDevice) (int, error) {
	if a.NUMA == b.NUMA {
		return 30, nil // PHB
	}
	return 50, nil // SYS
}

func TestDiscoverMatrix(t *testing.T) {
	top, err := discover(fakeCUDA{n: 4}, newFakeNVML(), nil)
	require.NoError(t, err)
	require.Len(t, top.Devices, 4)
	kinds := make([][]string, 4)
	for i := range top.Links {
		for _, l := range top.Links[i] {
			kinds[i] = append(kinds[i], l.Kind)
		}
	}
	require.Equal(t, [][]string{
		{"X", "NV4", "SYS", "SYS"},
		{"NV4", "X", "SYS", "SYS"},
		{"SYS", "SYS", "X", "NV12"},
		{"SYS", "SYS", "NV12", "X"},
	}, kinds)
	require.False(t, top.Links[0][3].P2P)
	require.True(t, top.Links[0][1].P2P)
	require.Equal(t, 4, top.Links[1][0].NVLinks)
	d := top.Devices[2]
	require.Equal(t, "GPU-2", d.UUID)
	require.Equal(t, "00000000:1a:00.0", d.PCIBusID)
	require.Equal(t, 1, d.NUMANode)
	require.Equal(t, "1", d.NUMAAffinity)
	require.Equal(t, "9.0", d.ComputeCapability)
	require.True(t, d.Capabilities.MulticastHardware)
	require.False(t, d.Capabilities.MulticastEnabled, "libsymm never uses multicast")
	require.Equal(t, "580.159.04", top.Driver.Version)
	require.Equal(t, "13.0", top.Driver.CUDAVersion)

	var buf bytes.Buffer
	top.Backends = backends(top)
	require.NoError(t, WriteText(&buf, top))
	out := buf.String()
	require.Contains(t, out, "NVIDIA driver 580.159.04, CUDA 13.0")
	require.Contains(t, out, "NV12")
	require.Contains(t, out, "no peer access (symmetric memory cannot join these): GPU0->GPU3 GPU3->GPU0")
	require.Contains(t, out, "hardware yes, libsymm off")
}

func TestDiscoverWithoutNVML(t *testing.T) {
	top, err := discover(fakeCUDA{n: 2}, nil, errors.New("NVML: dlopen: nope"))
	require.NoError(t, err)
	require.False(t, top.Driver.NVML)
	require.Equal(t, "?", top.Links[0][1].Kind)
	require.True(t, top.Links[0][1].P2P, "peer access comes from the CUDA driver")
	require.Equal(t, -1, top.Devices[0].NUMANode)
	var buf bytes.Buffer
	require.NoError(t, WriteText(&buf, top))
	require.Contains(t, buf.String(), "NVML not available (NVML: dlopen: nope)")
}

// On a machine without a driver (CI), Discover says so and fills in the rest.
func TestDiscoverNoDriver(t *testing.T) {
	if os.Getenv("SYMM_TEST_DEVICE") == "cuda" {
		t.Skip("the GPU machine has a driver, loaded once per process by TestGPUDiscover; this is the no-driver path")
	}
	t.Setenv("SYMM_CUDA_LIB", "/nonexistent/libcuda.so.1")
	t.Setenv("SYMM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
	top, err := Discover(Options{LibraryDirs: []string{t.TempDir()}})
	require.ErrorIs(t, err, ErrNoDriver)
	require.False(t, top.Driver.Found)
	require.Contains(t, top.Driver.Error, "/nonexistent/libcuda.so.1")
	require.Empty(t, top.Devices)
	require.Equal(t, "host", top.Backends[0].Name)
	require.True(t, top.Backends[0].Available)
	var buf bytes.Buffer
	require.NoError(t, WriteText(&buf, top))
	require.True(t, strings.HasPrefix(buf.String(), "no NVIDIA driver found: "), buf.String())
	lines := 0
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "/nonexistent/libcuda.so.1") {
			lines++
		}
	}
	require.Equal(t, 1, lines, "the loader's error is said once (the cuda row): %s", buf.String())
	require.Contains(t, buf.String(), "the host backend runs without a GPU (SYMM_DEVICE=host)")
}

// The JSON form is the documented schema: these names and types, in this
// shape (doc.go). Changing one is a schema change.
func TestJSONSchema(t *testing.T) {
	top, err := discover(fakeCUDA{n: 2}, newFakeNVML(), nil)
	require.NoError(t, err)
	top.Libraries = append(top.Libraries, Library{Name: "nccl", Found: true, Path: "/x/libnccl.so.2", Version: "2.28.9"})
	top.Backends = backends(top)
	top.Kernels = &Kernels{NVRTC: "13.0", Devices: []KernelDevice{{Index: 0, Arch: "sm_90", Ready: true, Loaded: true}, {Index: 1, Arch: "sm_90", Reason: "why"}}}
	raw, err := json.Marshal(top)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	keys := func(v any) []string {
		var ks []string
		for k := range v.(map[string]any) {
			ks = append(ks, k)
		}
		return ks
	}
	require.ElementsMatch(t, []string{"schema", "driver", "devices", "links", "libraries", "backends", "kernels"}, keys(m))
	require.ElementsMatch(t, []string{"nvrtc", "devices"}, keys(m["kernels"]))
	require.ElementsMatch(t, []string{"index", "arch", "ready", "loaded", "reason"}, keys(m["kernels"].(map[string]any)["devices"].([]any)[1]))
	require.EqualValues(t, SchemaVersion, m["schema"])
	require.ElementsMatch(t, []string{"found", "version", "cuda_version", "nvml"}, keys(m["driver"]))
	dev := m["devices"].([]any)[0]
	require.ElementsMatch(t, []string{"index", "name", "uuid", "pci_bus_id", "memory_bytes", "compute_capability",
		"cpu_affinity", "numa_affinity", "numa_node", "capabilities"}, keys(dev))
	require.ElementsMatch(t, []string{"vmm", "posix_fd", "fabric", "gpu_direct_rdma_with_vmm", "multicast_hardware",
		"multicast_enabled"}, keys(dev.(map[string]any)["capabilities"]))
	link := m["links"].([]any)[0].([]any)[1]
	require.ElementsMatch(t, []string{"kind", "nvlinks", "p2p"}, keys(link))
	require.ElementsMatch(t, []string{"name", "found", "path", "version"}, keys(m["libraries"].([]any)[2]))
	require.ElementsMatch(t, []string{"name", "available", "reason"}, keys(m["backends"].([]any)[0]))

	// And it reads back into the same value.
	var back Topology
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, *top, back)
}

func TestHelpers(t *testing.T) {
	require.Equal(t, "00000000:18:00.0", normalizeBusID("0000:18:00.0"))
	require.Equal(t, "00000001:af:00.0", normalizeBusID("00000001:AF:00.0"))
	require.Equal(t, "00000000:18:00.0", normalizeBusID("18:00.0"))
	require.Equal(t, "0-3,8,10-11", cpuList([]uint64{0b1101_0000_1111}))
	require.Equal(t, "", cpuList([]uint64{0}))
	require.Equal(t, "63-64", cpuList([]uint64{1 << 63, 1}))
	require.Equal(t, "2.28.9", ncclVersionString(22809))
	require.Equal(t, "2.7.8", ncclVersionString(2708))
}

func TestCandidates(t *testing.T) {
	t.Setenv("SYMM_NCCL_LIB", "/opt/nccl/libnccl.so.2")
	require.Equal(t, []string{"/opt/nccl/libnccl.so.2", "libnccl.so.2", "/site/nvidia/nccl/lib/libnccl.so.2", "/site/libnccl.so.2"},
		Candidates("nccl", []string{"/site"}))
	t.Setenv("SYMM_NVRTC_LIB", "")
	require.Equal(t, []string{"libnvrtc.so.13", "libnvrtc.so.12",
		"/site/nvidia/cu13/lib/libnvrtc.so.13", "/site/libnvrtc.so.13",
		"/site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "/site/libnvrtc.so.12"},
		Candidates("nvrtc", []string{"/site"}), "CUDA 13's wheel layout first, then CUDA 12's")
	require.Nil(t, Candidates("nope", nil))
}

// normalizeBusID parses bus ids from the driver, NVML and peers' metadata:
// it never panics, and its output is a fixed point.
func FuzzNormalizeBusID(f *testing.F) {
	for _, s := range []string{"0000:18:00.0", "00000000:AF:00.0", "18:00.0", "", "x:y:z.w", "ffffffff:ff:1f.7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		once := normalizeBusID(s)
		require.Equal(t, once, normalizeBusID(once), "input %q", s)
	})
}

func TestBackendsFromLibraries(t *testing.T) {
	top, err := discover(fakeCUDA{n: 2}, newFakeNVML(), nil)
	require.NoError(t, err)
	top.Libraries = append(top.Libraries, Library{Name: "nvshmem", Found: true, Version: "3.4.5"},
		Library{Name: "nccl", Found: true, Version: "2.26.0"})
	by := map[string]Backend{}
	for _, b := range backends(top) {
		by[b.Name] = b
	}
	require.True(t, by["cuda"].Available)
	require.True(t, by["nvshmem"].Available, by["nvshmem"].Reason)
	require.False(t, by["nccl"].Available)
	require.Contains(t, by["nccl"].Reason, "needs NCCL 2.27 or later")
	top.Libraries[len(top.Libraries)-1].Version = "2.28.9"
	for _, b := range backends(top) {
		if b.Name == "nccl" {
			require.True(t, b.Available, b.Reason)
		}
	}
}
