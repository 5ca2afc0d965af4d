// Package topology tells what GPUs a machine has and how they are linked:
// devices (name, UUID, PCI bus id, memory, compute capability, CPU and NUMA
// affinity), the peer matrix (NVLink counts, or the PCIe path class, as
// nvidia-smi topo -m prints it, plus whether the driver allows peer access),
// capabilities read from the driver, which NCCL and NVSHMEM libraries are
// installed and which libsymm backends can run. symm info prints it;
// symm_topology (C) and symm.topology() (Python) return it as JSON; a
// rendezvous uses it to refuse peers it cannot map.
//
// # Sources
//
// The CUDA driver (package cuda) numbers the devices as the process sees
// them and answers peer access and capabilities; NVML, opened with dlopen
// like the driver, adds links, UUIDs and affinities, matched to CUDA devices
// by PCI bus id. NVML is not linked (github.com/NVIDIA/go-nvml links its
// symbols as unresolved, and a library built that way cannot be loaded with
// RTLD_NOW, which Python's ctypes uses: "undefined symbol:
// nvmlGpuInstanceGetComputeInstanceProfileInfoV"); functions an older NVML
// lacks make their facts unknown rather than failing. Without a driver,
// Discover returns what it can and an error wrapping ErrNoDriver.
//
// # JSON schema (version 1)
//
// The JSON form of Topology, field by field, is in the README ("symm info").
// SchemaVersion changes when a field changes meaning or goes away; fields may
// be added within a version. TestJSONSchema pins the names.
//
// # Links
//
// NVLinks between two GPUs are the links of one whose remote end is the
// other, plus, on an NVSwitch fabric, the smaller of the two GPUs' switch
// link counts. Without NVLinks the kind is NVML's closest common PCIe
// ancestor: PIX, PXB, PHB, NODE or SYS. P2P is cuDeviceCanAccessPeer,
// which is what symmetric memory needs.
//
// Files: topology.go (Discover and the types), nvml.go (NVML), peers.go
// (devices by PCI bus id, peer access), libs.go (where NCCL, NVSHMEM and NVRTC
// are looked for: Candidates), text.go (symm info's text), memuse.go (every
// GPU's memory use now, for symm top).
package topology
