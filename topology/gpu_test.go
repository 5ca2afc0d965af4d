package topology

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGPUDiscover reads the real machine; it runs on the GPU machine
// (tests/device/run.sh sets SYMM_TEST_DEVICE=cuda) and is skipped elsewhere.
func TestGPUDiscover(t *testing.T) {
	if os.Getenv("SYMM_TEST_DEVICE") != "cuda" {
		t.Skip("needs a GPU: SYMM_TEST_DEVICE=cuda")
	}
	top, err := Discover(Options{})
	require.NoError(t, err)
	require.True(t, top.Driver.Found)
	require.True(t, top.Driver.NVML, top.Driver.NVMLError)
	require.NotEmpty(t, top.Driver.Version)
	require.NotEmpty(t, top.Devices)
	for i, d := range top.Devices {
		require.True(t, strings.HasPrefix(d.UUID, "GPU-"), "device %d UUID %q (matched to NVML by bus id %s)", i, d.UUID, d.PCIBusID)
		require.True(t, d.Capabilities.VMM && d.Capabilities.PosixFD, "device %d", i)
		require.False(t, d.Capabilities.MulticastEnabled)
		require.Equal(t, "X", top.Links[i][i].Kind)
		id, err := BusID(i)
		require.NoError(t, err)
		ord, ok := Ordinal(id)
		require.True(t, ok)
		require.Equal(t, i, ord)
		for j := range top.Devices {
			if i != j {
				require.NoError(t, CheckPeerAccess(top.Devices[i].PCIBusID, top.Devices[j].PCIBusID))
			}
		}
	}
	t.Logf("%d devices; links from GPU0: %+v", len(top.Devices), top.Links[0])
}
