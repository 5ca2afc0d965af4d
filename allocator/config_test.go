package allocator

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// envOf is an environment of the pairs name, value, ... for ConfigFromEnv.
func envOf(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	env := envOf
	c, _, err := ConfigFromEnv(env())
	require.NoError(t, err)
	// What expandable segments do once on, also while they are off.
	later := Config{ExpandableChunk: 20 << 20, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait}
	require.Equal(t, later, c)
	c, _, err = ConfigFromEnv(env("SYMM_POOL_LIMIT", "8GiB", "SYMM_POOL_MAX_SPLIT", "256MiB"))
	require.NoError(t, err)
	later.Limit, later.MaxSplit = 8<<30, 256<<20
	require.Equal(t, later, c)
	c, _, err = ConfigFromEnv(env("SYMM_POOL_LIMIT", "90%"))
	require.NoError(t, err)
	require.InDelta(t, 0.9, c.LimitFraction, 1e-12)
	c, _, err = ConfigFromEnv(env("SYMM_POOL_LIMIT", "1.5GiB"))
	require.NoError(t, err)
	require.Equal(t, uint64(3<<29), c.Limit)
	for _, bad := range [][]string{
		{"SYMM_POOL_LIMIT", "lots"}, {"SYMM_POOL_LIMIT", "0%"}, {"SYMM_POOL_LIMIT", "101%"},
		{"SYMM_POOL_LIMIT", "-5"}, {"SYMM_POOL_MAX_SPLIT", "1MiB"}, {"SYMM_POOL_MAX_SPLIT", "3 parsecs"},
		// Not a 1-byte cap, nor none: a number of bytes is whole.
		{"SYMM_POOL_LIMIT", "1.5"}, {"SYMM_POOL_LIMIT", "0.5"}, {"SYMM_POOL_LIMIT", "0.5B"},
		{"SYMM_POOL_EXPANDABLE_CHUNK", "2.5"}, {"SYMM_POOL_MAX_SPLIT", "2000000.5"},
	} {
		_, _, err := ConfigFromEnv(env(bad...))
		require.Error(t, err, "%v", bad)
		require.Contains(t, err.Error(), bad[0], "the message names the variable")
		require.Contains(t, err.Error(), fmt.Sprintf("%q", bad[1]), "the message quotes the value")
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"0", 0}, {"4096", 4096}, {"512B", 512}, {"512 b", 512}, {"1k", 1024}, {"1KiB", 1024}, {"1 KB", 1024},
		{"2M", 2 << 20}, {"1.5GiB", 3 << 29}, {" 3 gib ", 3 << 30}, {"1T", 1 << 40},
		{"16777215TiB", 16777215 << 40}, {"0.5K", 512}, {".5k", 512}, {"0.0K", 0},
		{"1.3K", 1331}, // 1331.2 bytes, rounded down
	} {
		got, err := ParseSize(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, tc := range []struct{ in, msg string }{
		{"", "empty size"},
		{"abc", "unknown unit"},
		{"1.2.3", "whole number of bytes"},
		{"GiB", "has no number"},
		{"5 XB", "unknown unit"},
		{"99999999999999999999", "fits in 64 bits"},
		{"16777216TiB", "fits in 64 bits"},
		{"-1", "negative"},
		{"-5", `size "-5" is negative`},
		{"1e3", "unknown unit"},
		{"NaN", "unknown unit"},
		{"1.5", "a size without a unit is a whole number of bytes (or give a unit: 1.5MiB)"},
		{"0.5", "whole number of bytes"},
		{"1.", "whole number of bytes"},
		{"1.5B", "whole number of bytes"},
		{"0.0001K", "less than one byte"},
	} {
		_, err := ParseSize(tc.in)
		require.Error(t, err, tc.in)
		require.True(t, errors.Is(err, ErrInvalid), tc.in)
		require.ErrorContains(t, err, tc.msg, tc.in)
		require.True(t, strings.Contains(err.Error(), fmt.Sprintf("%q", tc.in)) || tc.in == "", "message quotes the input: %v", err)
	}
}
