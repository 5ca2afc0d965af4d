package topology

import (
	"fmt"
	"sync"
)

// BusID is the PCI bus id of CUDA device dev as NVML writes it
// ("00000000:18:00.0"): a name of the device that every process of the host
// shares, whatever its CUDA_VISIBLE_DEVICES.
func BusID(dev int) (string, error) { return busID(realCUDA{}, dev) }

func busID(cu cudaFacts, dev int) (string, error) {
	var v [3]int
	for i, a := range []int{attrPCIDomain, attrPCIBus, attrPCIDevice} {
		x, err := cu.DeviceAttribute(dev, a)
		if err != nil {
			return "", err
		}
		v[i] = x
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", v[0], v[1], v[2]), nil
}

// local maps bus ids to this process's CUDA ordinals, read once.
var local struct {
	sync.Once
	ordinal map[string]int
}

// Ordinal is the CUDA ordinal of the device with PCI bus id bus in this
// process, and false when this process does not see it.
func Ordinal(bus string) (int, bool) {
	local.Do(func() {
		local.ordinal = map[string]int{}
		n, err := realCUDA{}.DeviceCount()
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			if b, err := BusID(i); err == nil {
				local.ordinal[b] = i
			}
		}
	})
	i, ok := local.ordinal[normalizeBusID(bus)]
	return i, ok
}

// CheckPeerAccess returns nil when device a may map memory that lives on
// device b (cuDeviceCanAccessPeer), both given by PCI bus id. Devices this
// process does not see are not checked (nil). The error names both devices
// and the link between them, as symm info shows it.
func CheckPeerAccess(a, b string) error {
	ia, okA := Ordinal(a)
	ib, okB := Ordinal(b)
	if !okA || !okB || ia == ib {
		return nil
	}
	ok, err := realCUDA{}.CanAccessPeer(ia, ib)
	if err != nil {
		return fmt.Errorf("asking whether GPU %d (%s) can access GPU %d (%s): %w", ia, a, ib, b, err)
	}
	if ok {
		return nil
	}
	return fmt.Errorf("GPU %d (%s) cannot map memory of GPU %d (%s): no peer-to-peer path between them (link: %s)",
		ia, a, ib, b, describeLink(ia, ib))
}

// describeLink says how devices a and b are connected, from NVML when it answers.
func describeLink(a, b int) string {
	var nv nvmlFacts
	l, err := openNVML(nvmlPath(""))
	if err == nil {
		nv = l
	}
	t, err := discover(realCUDA{}, nv, err)
	if err != nil || a >= len(t.Links) || b >= len(t.Links) {
		return "unknown"
	}
	return linkWords(t.Links[a][b])
}

func linkWords(l Link) string {
	words := map[string]string{
		"PIX": "PIX, one PCIe switch", "PXB": "PXB, several PCIe switches", "PHB": "PHB, through a PCIe host bridge",
		"NODE": "NODE, across host bridges of one NUMA node", "SYS": "SYS, across NUMA nodes", "?": "unknown (no NVML)",
	}
	if w, ok := words[l.Kind]; ok {
		return w
	}
	return l.Kind
}
