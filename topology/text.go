package topology

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText writes t for people: driver, devices, the link matrix as
// nvidia-smi topo -m draws it, libraries and backends.
func WriteText(w io.Writer, t *Topology) error {
	var b strings.Builder
	writeDriver(&b, t)
	if len(t.Devices) > 0 {
		writeDevices(&b, t)
		writeLinks(&b, t)
	}
	writeLibrariesAndBackends(&b, t)
	if t.Kernels != nil {
		writeKernels(&b, t.Kernels)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeDriver(b *strings.Builder, t *Topology) {
	if !t.Driver.Found {
		// The loader's words are in the libraries table below (the cuda row):
		// said once, there.
		fmt.Fprintf(b, "%s: the CUDA driver library does not open here (see libraries); the host backend runs without a GPU (SYMM_DEVICE=host)\n", ErrNoDriver)
		return
	}
	ver := t.Driver.Version
	if ver == "" {
		ver = "version unknown (no NVML)"
	}
	fmt.Fprintf(b, "NVIDIA driver %s, CUDA %s\n", ver, t.Driver.CUDAVersion)
	if !t.Driver.NVML {
		fmt.Fprintf(b, "NVML not available (%s): links shown as ?, no UUIDs or affinities\n", t.Driver.NVMLError)
	}
}

func writeDevices(b *strings.Builder, t *Topology) {
	b.WriteString("\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tname\tmemory\tPCI bus id\tCC\tNUMA\tCPUs\tVMM\tPOSIX fd\tfabric\tRDMA+VMM\tmulticast\tUUID")
	for _, d := range t.Devices {
		c := d.Capabilities
		numa := d.NUMAAffinity
		if d.NUMANode >= 0 {
			numa += fmt.Sprintf(" (GPU memory: node %d)", d.NUMANode)
		}
		mc := "no"
		if c.MulticastHardware {
			mc = "hardware yes, libsymm off"
		}
		fmt.Fprintf(tw, "%d\t%s\t%.1f GiB\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Index, d.Name,
			float64(d.MemoryBytes)/(1<<30), d.PCIBusID, d.ComputeCapability, orUnknown(numa), orUnknown(d.CPUAffinity),
			yes(c.VMM), yes(c.PosixFD), yes(c.Fabric), yes(c.GPUDirectRDMAWithVMM), mc, orUnknown(d.UUID))
	}
	tw.Flush()
}

func writeLinks(b *strings.Builder, t *Topology) {
	b.WriteString("\nlinks (X itself, NV<n> n NVLinks, PIX/PXB PCIe switches, PHB host bridge, NODE one NUMA node, SYS across NUMA nodes)\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for i := range t.Devices {
		fmt.Fprintf(tw, "\tGPU%d", i)
	}
	fmt.Fprintln(tw, "\t")
	var noP2P []string
	for i, row := range t.Links {
		fmt.Fprintf(tw, "GPU%d", i)
		for j, l := range row {
			fmt.Fprintf(tw, "\t%s", l.Kind)
			if !l.P2P {
				noP2P = append(noP2P, fmt.Sprintf("GPU%d->GPU%d", i, j))
			}
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
	if len(noP2P) == 0 {
		b.WriteString("peer access: every GPU can map every other's memory\n")
	} else {
		fmt.Fprintf(b, "no peer access (symmetric memory cannot join these): %s\n", strings.Join(noP2P, " "))
	}
}

func writeLibrariesAndBackends(b *strings.Builder, t *Topology) {
	b.WriteString("\nlibraries\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, l := range t.Libraries {
		if l.Found {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", l.Name, orUnknown(l.Version), l.Path)
		} else {
			fmt.Fprintf(tw, "  %s\tnot found\t%s\n", l.Name, l.Error)
		}
	}
	tw.Flush()
	b.WriteString("\nbackends\n")
	tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, be := range t.Backends {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", be.Name, yes(be.Available), be.Reason)
	}
	tw.Flush()
}

func writeKernels(b *strings.Builder, k *Kernels) {
	b.WriteString("\nkernels (signals, one-shot all-reduce; compiled at run time with NVRTC)\n")
	switch {
	case k.Error != "":
		fmt.Fprintf(b, "  cannot run: %s\n", k.Error)
	case len(k.Devices) == 0:
		fmt.Fprintf(b, "  NVRTC %s found; no device to run them on\n", k.NVRTC)
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, d := range k.Devices {
		if d.Ready {
			how := "compiled, not loaded"
			if d.Loaded {
				how = "compiled and loaded"
			}
			fmt.Fprintf(tw, "  GPU%d\t%s\tready (NVRTC %s; %s)\n", d.Index, d.Arch, k.NVRTC, how)
		} else {
			fmt.Fprintf(tw, "  GPU%d\t%s\tcannot run: %s\n", d.Index, d.Arch, d.Reason)
		}
	}
	tw.Flush()
}

func yes(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}
