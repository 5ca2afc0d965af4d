package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/topology"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout or stderr
	}{
		{nil, exitUsage, "usage: symm <command>"},
		{[]string{"nope"}, exitUsage, `unknown command "nope"`},
		{[]string{"help"}, exitOK, "commands:"},
		{[]string{"--help"}, exitOK, "commands:"},
		{[]string{"info", "--help"}, exitOK, "usage: symm info"},
		{[]string{"bench", "-h"}, exitOK, "usage: symm bench"},
		{[]string{"version", "--help"}, exitOK, "usage: symm version"},
		{[]string{"info", "--bogus"}, exitUsage, "flag provided but not defined: --bogus"},
		{[]string{"info", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"info", "--lib-dir", "/nonexistent/libs"}, exitUsage, `invalid value "/nonexistent/libs" for flag --lib-dir: no directory /nonexistent/libs: no such file or directory`},
		{[]string{"info", "--lib-dir", "/dev/null"}, exitUsage, "/dev/null is not a directory"},
		{[]string{"top", "--pid", "abc"}, exitUsage, `invalid value "abc" for flag --pid: not a number`},
		{[]string{"top", "-n", "x"}, exitUsage, `invalid value "x" for flag -n: not a number`},
		{[]string{"version", "--help"}, exitOK, "usage: symm version\n"},
		{[]string{"bench", "--backend", "tpu"}, exitUsage, "--backend tpu: want cuda or host"},
		{[]string{"bench", "--backend", "host", "--iters", "0"}, exitUsage, "--iters must be >= 1"},
		{[]string{"bench", "--backend", "host", "--device", "7"}, exitUsage, "--device 7 does not exist: the host backend has 1 device (0)"},
		{[]string{"version"}, exitOK, "symm 0.1.0"},
		// Flags are listed as the usage line writes them.
		{[]string{"replay", "--help"}, exitOK, "\n  --limit SIZE\n"},
		{[]string{"bench", "--help"}, exitOK, "\n  --iters N\n"},
		{[]string{"top", "--help"}, exitOK, "\n  -n N\n"},
		// The help names where the replay documentation is, wherever symm is installed.
		{[]string{"help"}, exitOK, "https://github.com/libsymm/libsymm/blob/main/docs/REPLAY.md"},
	} {
		code, o, e := runCLI(tc.args...)
		require.Equal(t, tc.code, code, "%v: %s%s", tc.args, o, e)
		require.Contains(t, o+e, tc.out, "%v", tc.args)
	}
}

// Every flag a command's --help lists is written there as its usage line
// writes it: one dash for a one-letter flag, two for the others, and the
// argument by the same name.
func TestHelpAgreesWithUsage(t *testing.T) {
	for _, cmd := range []string{"info", "bench", "replay", "top", "settings", "version"} {
		code, _, e := runCLI(cmd, "--help")
		require.Equal(t, exitOK, code, cmd)
		lines := strings.Split(e, "\n")
		usageLine := lines[0]
		require.True(t, strings.HasPrefix(usageLine, "usage: symm "+cmd), usageLine)
		for _, l := range lines[1:] {
			if !strings.HasPrefix(l, "  -") {
				continue
			}
			flag := strings.TrimSpace(l)
			require.Regexp(t, `(\[| )`+regexp.QuoteMeta(flag)+`(\]|$| )`, usageLine, "symm %s --help lists %q", cmd, flag)
		}
	}
}

// Without a driver (CI): a clear message, exit code 3, and JSON that still
// follows the schema.
func TestInfoWithoutDriver(t *testing.T) {
	t.Setenv("SYMM_CUDA_LIB", "/nonexistent/libcuda.so.1")
	t.Setenv("SYMM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
	t.Setenv("SYMM_PYTHON", "/nonexistent/python3")
	code, out, _ := runCLI("info")
	require.Equal(t, exitNoDriver, code)
	require.Contains(t, out, "no NVIDIA driver found")
	require.Contains(t, out, "host     yes")

	code, out, _ = runCLI("info", "--json")
	require.Equal(t, exitNoDriver, code)
	var top topology.Topology
	require.NoError(t, json.Unmarshal([]byte(out), &top))
	require.Equal(t, topology.SchemaVersion, top.Schema)
	require.False(t, top.Driver.Found)

	t.Setenv("SYMM_DEVICE", "")
	code, _, errOut := runCLI("bench")
	require.Equal(t, exitNoDriver, code)
	require.Contains(t, errOut, "symm bench --backend host, or SYMM_DEVICE=host")
	// --backend wins over SYMM_DEVICE.
	t.Setenv("SYMM_DEVICE", "host")
	code, _, _ = runCLI("bench", "--backend", "cuda")
	require.Equal(t, exitNoDriver, code)
}

func TestBenchHost(t *testing.T) {
	code, out, errOut := runCLI("bench", "--backend", "host", "--iters", "200")
	require.Equal(t, exitOK, code, errOut)
	for _, want := range []string{"host backend, device 0", "512 B", "1 MiB", "64 MiB", "pool alloc+free (ns)"} {
		require.Contains(t, out, want)
	}
}

// bench chooses its backend as the library does: SYMM_DEVICE, unless
// --backend says otherwise.
func TestBenchFollowsSymmDevice(t *testing.T) {
	t.Setenv("SYMM_DEVICE", "host")
	code, out, errOut := runCLI("bench", "--iters", "100")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "host backend, device 0")
	code, _, errOut = runCLI("bench", "--iters", "100", "--device", "5")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "symm bench: --device 5 does not exist: the host backend has 1 device (0)\n", errOut)
	t.Setenv("SYMM_DEVICE", "tpu")
	code, _, errOut = runCLI("bench")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "symm bench: SYMM_DEVICE=\"tpu\": want cuda or host\n", errOut)
	code, _, errOut = runCLI("bench", "--backend", "tpu")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "symm bench: --backend tpu: want cuda or host\n", errOut)
}

func TestDeviceRange(t *testing.T) {
	require.Equal(t, "no devices", deviceRange(0))
	require.Equal(t, "1 device (0)", deviceRange(1))
	require.Equal(t, "8 devices (0 to 7)", deviceRange(8))
}

// symm settings lists every registered variable with this environment's
// value, and checks the library's values with the library's parsers.
func TestSettings(t *testing.T) {
	for _, s := range settings.All {
		t.Setenv(s.Name, "")
		os.Unsetenv(s.Name)
	}
	code, out, errOut := runCLI("settings")
	require.Equal(t, exitOK, code, errOut)
	for _, s := range settings.All {
		require.Regexp(t, "(?m)^"+s.Name+" +\\(unset\\)", out)
	}
	require.Contains(t, out, "pool: ok\nsymmetric memory: ok\npush workspace: ok\n")

	code, out, _ = runCLI("settings", "--markdown")
	require.Equal(t, exitOK, code)
	require.Equal(t, settings.Markdown(), out)

	t.Setenv("SYMM_SIGNALS", "fast")
	t.Setenv("SYMM_POOL_EXPANDABLE", "yes")
	code, out, _ = runCLI("settings", "--json")
	require.Equal(t, exitFailure, code)
	var got struct {
		Settings []struct {
			Name, Value string
			Set         bool
		}
		Checks []struct{ Part, Error string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got.Settings, len(settings.All))
	for _, s := range got.Settings {
		if s.Name == "SYMM_SIGNALS" {
			require.True(t, s.Set)
			require.Equal(t, "fast", s.Value)
		}
	}
	require.Equal(t, "invalid argument: SYMM_POOL_EXPANDABLE=\"yes\": want 0 or 1", got.Checks[0].Error)
	require.Equal(t, "invalid argument: SYMM_SIGNALS=\"fast\": want auto, kernel or memop", got.Checks[1].Error)
	require.Empty(t, got.Checks[2].Error)
}
