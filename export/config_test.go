package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
)

// The configuration's warnings reach standard error once, each prefixed
// "symm: ", however many times the pool's creation is tried.
func TestConfigWarningsPrintedOnce(t *testing.T) {
	env := map[string]string{
		"PYTORCH_CUDA_ALLOC_CONF": "release_lock_on_cudamalloc:True,expandable_segments:True",
		"PYTORCH_ALLOC_CONF":      "max_split_size_mb:64",
		"SYMM_POOL_EXPANDABLE":    "0",
	}
	_, warns, err := allocator.ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Len(t, warns, 3)
	var out bytes.Buffer
	o := &onceWarner{w: &out}
	o.warn(warns)
	o.warn(warns)
	o.warn([]string{"another"})
	want := ""
	for _, w := range warns {
		want += "symm: " + w + "\n"
	}
	require.Equal(t, want, out.String())
	require.Contains(t, out.String(), "symm: PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF are both set")
	require.Contains(t, out.String(), "symm: PYTORCH_CUDA_ALLOC_CONF: release_lock_on_cudamalloc:True is ignored")
	require.Contains(t, out.String(), "symm: SYMM_POOL_EXPANDABLE=0 overrides expandable_segments:True")
}

// A PyTorch setting libsymm refuses is SYMM_ERR_INVALID, its message naming
// the variable, the key and the value.
func TestTorchConfErrorCode(t *testing.T) {
	_, _, err := allocator.ConfigFromEnv(func(k string) string {
		if k == "PYTORCH_ALLOC_CONF" {
			return "backend:cudaMallocAsync"
		}
		return ""
	})
	require.Error(t, err)
	require.Equal(t, 1, int(errCode(err)), "SYMM_ERR_INVALID")
	require.Contains(t, err.Error(), "PYTORCH_ALLOC_CONF=")
	require.Contains(t, err.Error(), "backend:cudaMallocAsync")
}

// TestSettingsDocumentTheDefaults holds the README's defaults and bounds of
// the front cache and the host backend to the values used here.
func TestSettingsDocumentTheDefaults(t *testing.T) {
	n, err := allocator.ParseSize(strings.Trim(settings.PoolFrontCacheMax.Default, "`"))
	require.NoError(t, err)
	require.EqualValues(t, frontMaxDefault, n)
	require.Contains(t, settings.PoolFrontCacheMax.Want, "64 MiB")
	require.EqualValues(t, 64<<20, frontMaxLimit)
	require.Equal(t, "`0`", settings.PoolFrontCache.Default)
	on, maxBlock, err := frontCacheWanted(func(string) string { return "" })
	require.NoError(t, err)
	require.False(t, on, "the front cache is off unless SYMM_POOL_FRONT_CACHE=1")
	require.EqualValues(t, frontMaxDefault, maxBlock)
	on, _, err = frontCacheWanted(func(k string) string { return map[string]string{"SYMM_POOL_FRONT_CACHE": "1"}[k] })
	require.NoError(t, err)
	require.True(t, on, "SYMM_POOL_FRONT_CACHE=1 turns it on")
	require.Contains(t, settings.HostDevices.Help, "(1–64)")
}
