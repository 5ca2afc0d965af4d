package symmetric

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/kernels"
)

// envMap reads variables from a map, as ConfigFromEnv's getenv.
func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// defaults is the Config of an empty environment.
var defaults = Config{Backend: "cuda", Timeout: DefaultTimeout, Signals: SignalsAuto}

func TestConfigFromEnv(t *testing.T) {
	with := func(f func(*Config)) Config {
		c := defaults
		f(&c)
		return c
	}
	host := func(f func(*Config)) Config {
		return with(func(c *Config) { c.Backend = "host"; f(c) })
	}
	for _, tc := range []struct {
		env  map[string]string
		want Config
	}{
		{nil, defaults},
		// The backend: SYMM_BACKEND, else SYMM_DEVICE's.
		{map[string]string{"SYMM_DEVICE": "cuda"}, defaults},
		{map[string]string{"SYMM_DEVICE": "host"}, host(func(*Config) {})},
		{map[string]string{"SYMM_BACKEND": "host"}, host(func(*Config) {})},
		{map[string]string{"SYMM_BACKEND": "host", "SYMM_DEVICE": "host"}, host(func(*Config) {})},
		{map[string]string{"SYMM_BACKEND": "cuda", "SYMM_DEVICE": "host"}, host(func(*Config) {})},
		{map[string]string{"SYMM_BACKEND": "nvshmem"}, with(func(c *Config) { c.Backend = "nvshmem" })},
		{map[string]string{"SYMM_BACKEND": "nccl", "SYMM_DEVICE": "cuda"}, with(func(c *Config) { c.Backend = "nccl" })},
		// Host faults: on the host backend only.
		{map[string]string{"SYMM_DEVICE": "host", "SYMM_HOST_FAULTS": "0.25:9"},
			host(func(c *Config) { c.HostFaultRate, c.HostFaultSeed = 0.25, 9 })},
		{map[string]string{"SYMM_DEVICE": "host", "SYMM_HOST_FAULTS": "1"}, host(func(c *Config) { c.HostFaultRate = 1 })},
		{map[string]string{"SYMM_DEVICE": "host", "SYMM_HOST_FAULTS": "0:5"}, host(func(*Config) {})},
		{map[string]string{"SYMM_HOST_FAULTS": "lots"}, defaults},
		// Signals.
		{map[string]string{"SYMM_SIGNALS": "auto"}, defaults},
		{map[string]string{"SYMM_SIGNALS": "kernel"}, with(func(c *Config) { c.Signals = SignalsKernel })},
		{map[string]string{"SYMM_SIGNALS": "memop"}, with(func(c *Config) { c.Signals = SignalsMemop })},
		// Crash points.
		{map[string]string{"SYMM_FAULT_CRASH_AT": "publish"}, with(func(c *Config) { c.CrashAt = "publish" })},
		{map[string]string{"SYMM_FAULT_CRASH_AT": "mapped"}, with(func(c *Config) { c.CrashAt = "mapped" })},
		// Timeouts: SYMM_TIMEOUT_MS wins.
		{map[string]string{"SYMM_TIMEOUT_MS": "300"}, with(func(c *Config) { c.Timeout = 300 * time.Millisecond })},
		{map[string]string{"SYMM_TIMEOUT_MS": "300", "SYMM_RENDEZVOUS_TIMEOUT": "5s"},
			with(func(c *Config) { c.Timeout = 300 * time.Millisecond })},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "1m30s"}, with(func(c *Config) { c.Timeout = 90 * time.Second })},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "2.5"}, with(func(c *Config) { c.Timeout = 2500 * time.Millisecond })},
		// Tests' and tuning settings.
		{map[string]string{"SYMM_PUSH_FIRST_CALL": "0xfffffff0"}, with(func(c *Config) { c.PushFirstCall = 0xfffffff0 })},
		{map[string]string{"SYMM_PUSH_FIRST_CALL": "7"}, with(func(c *Config) { c.PushFirstCall = 7 })},
		{map[string]string{"SYMM_COLLECTIVE_BLOCKS": "1"}, with(func(c *Config) { c.CollectiveBlocks = 1 })},
		{map[string]string{"SYMM_COLLECTIVE_BLOCKS": "512"}, with(func(c *Config) { c.CollectiveBlocks = 512 })},
		{map[string]string{"SYMM_ALL_REDUCE": "auto"}, defaults},
		{map[string]string{"SYMM_ALL_REDUCE": "two_shot"}, with(func(c *Config) { c.AllReduce = AllReduceTwoShot })},
		{map[string]string{"SYMM_ALL_REDUCE": "push"}, with(func(c *Config) { c.AllReduce = AllReducePush })},
		{map[string]string{"SYMM_ALLOW_OVERLAPPING_DEVICES": "1"}, with(func(c *Config) { c.AllowOverlappingDevices = true })},
		{map[string]string{"SYMM_ALLOW_OVERLAPPING_DEVICES": "0"}, defaults},
		{map[string]string{"SYMM_TRACE_RENDEZVOUS": "1"}, with(func(c *Config) { c.Trace = true })},
		{map[string]string{"SYMM_LAUNCH_THROUGH_GO": "1"}, with(func(c *Config) { c.LaunchThroughGo = true })},
		// The kernel cache (kernels.CacheDir).
		{map[string]string{"SYMM_KERNEL_CACHE": "/tmp/k"}, with(func(c *Config) { c.KernelCache = "/tmp/k" })},
		{map[string]string{"SYMM_KERNEL_CACHE": "off", "HOME": "/home/u"}, defaults},
		{map[string]string{"HOME": "/home/u"}, with(func(c *Config) { c.KernelCache = "/home/u/.cache/libsymm/kernels" })},
	} {
		got, err := ConfigFromEnv(envMap(tc.env))
		require.NoError(t, err, "%v", tc.env)
		require.Equal(t, tc.want, got, "%v", tc.env)
	}
}

// Every bad value is ErrInvalid, naming the variable, its value and what
// it accepts (the messages C and Python tests look for).
func TestConfigFromEnvRefuses(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SYMM_DEVICE": "tpu"}, `SYMM_DEVICE="tpu": want "cuda" or "host"`},
		{map[string]string{"SYMM_BACKEND": "quantum"}, `SYMM_BACKEND="quantum": want "cuda", "nvshmem", "nccl" or "host"`},
		{map[string]string{"SYMM_BACKEND": "CUDA"}, `SYMM_BACKEND="CUDA"`},
		{map[string]string{"SYMM_BACKEND": "host", "SYMM_DEVICE": "cuda"}, "host memory needs SYMM_DEVICE=host"},
		{map[string]string{"SYMM_BACKEND": "nvshmem", "SYMM_DEVICE": "host"}, "SYMM_BACKEND=nvshmem needs GPUs"},
		{map[string]string{"SYMM_BACKEND": "nccl", "SYMM_DEVICE": "host"}, "SYMM_BACKEND=nccl needs GPUs"},
		{map[string]string{"SYMM_DEVICE": "host", "SYMM_HOST_FAULTS": "2"}, `SYMM_HOST_FAULTS="2": want a failure rate from 0 to 1`},
		{map[string]string{"SYMM_DEVICE": "host", "SYMM_HOST_FAULTS": "0.5:x"}, "SYMM_HOST_FAULTS"},
		{map[string]string{"SYMM_SIGNALS": "fast"}, `SYMM_SIGNALS="fast": want auto, kernel or memop`},
		{map[string]string{"SYMM_FAULT_CRASH_AT": "later"}, `SYMM_FAULT_CRASH_AT="later": want publish, gathered, sent or mapped`},
		{map[string]string{"SYMM_TIMEOUT_MS": "-5"}, `SYMM_TIMEOUT_MS="-5": want a positive number of milliseconds`},
		{map[string]string{"SYMM_TIMEOUT_MS": "0"}, "SYMM_TIMEOUT_MS"},
		{map[string]string{"SYMM_TIMEOUT_MS": "1s"}, "SYMM_TIMEOUT_MS"},
		{map[string]string{"SYMM_TIMEOUT_MS": "9223372036854775807"}, "SYMM_TIMEOUT_MS"},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "soon"}, `SYMM_RENDEZVOUS_TIMEOUT="soon": want seconds or a duration such as 30s`},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "-3s"}, "SYMM_RENDEZVOUS_TIMEOUT"},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "0"}, "SYMM_RENDEZVOUS_TIMEOUT"},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "inf"}, "SYMM_RENDEZVOUS_TIMEOUT"},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "NaN"}, "SYMM_RENDEZVOUS_TIMEOUT"},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "1e300"}, "SYMM_RENDEZVOUS_TIMEOUT"},
		{map[string]string{"SYMM_RENDEZVOUS_TIMEOUT": "1e-12"}, "SYMM_RENDEZVOUS_TIMEOUT"},
		{map[string]string{"SYMM_PUSH_FIRST_CALL": "0"}, `SYMM_PUSH_FIRST_CALL="0": want a positive call number`},
		{map[string]string{"SYMM_PUSH_FIRST_CALL": "-1"}, "SYMM_PUSH_FIRST_CALL"},
		{map[string]string{"SYMM_COLLECTIVE_BLOCKS": "0"}, `SYMM_COLLECTIVE_BLOCKS="0": want a number of blocks from 1 to 512`},
		{map[string]string{"SYMM_COLLECTIVE_BLOCKS": "513"}, "SYMM_COLLECTIVE_BLOCKS"},
		{map[string]string{"SYMM_COLLECTIVE_BLOCKS": "70000"}, "SYMM_COLLECTIVE_BLOCKS"},
		{map[string]string{"SYMM_ALL_REDUCE": "fastest"}, `SYMM_ALL_REDUCE="fastest": want auto, push, two_shot or one_shot`},
		{map[string]string{"SYMM_ALLOW_OVERLAPPING_DEVICES": "yes"}, `SYMM_ALLOW_OVERLAPPING_DEVICES="yes": want 1 (on) or 0 (off)`},
		{map[string]string{"SYMM_TRACE_RENDEZVOUS": "true"}, `SYMM_TRACE_RENDEZVOUS="true": want 1 (on) or 0 (off)`},
		{map[string]string{"SYMM_LAUNCH_THROUGH_GO": "yes"}, `SYMM_LAUNCH_THROUGH_GO="yes": want 1 (on) or 0 (off)`},
	} {
		c, err := ConfigFromEnv(envMap(tc.env))
		require.ErrorIs(t, err, ErrInvalid, "%v", tc.env)
		require.ErrorContains(t, err, tc.want, "%v", tc.env)
		require.Equal(t, Config{}, c, "%v: nothing half-read", tc.env)
	}
	// SYMM_HOST_FAULTS keeps the pool's error class too (one parser: host.ParseFaults).
	_, err := ConfigFromEnv(envMap(map[string]string{"SYMM_DEVICE": "host", "SYMM_HOST_FAULTS": "x"}))
	require.ErrorIs(t, err, allocator.ErrInvalid)
}

// The backend's name alone, as symm_get_backend and symm_set_backend see it.
func TestBackendNames(t *testing.T) {
	for _, n := range []string{"cuda", "nvshmem", "nccl", "host"} {
		require.NoError(t, CheckBackend(n))
		got, err := BackendFromEnv(envMap(map[string]string{"SYMM_BACKEND": n}))
		require.NoError(t, err)
		require.Equal(t, n, got)
	}
	for _, n := range []string{"", "CUDA", "host ", "tpu"} {
		require.ErrorIs(t, CheckBackend(n), ErrInvalid, "%q", n)
	}
	require.ErrorContains(t, CheckBackend("tpu"), `backend "tpu": want "cuda", "nvshmem", "nccl" or "host"`)
}

// The host provider that NewProvider makes carries the config's faults and
// limits; the other backends' failure to start is ErrNoDevice.
func TestNewProvider(t *testing.T) {
	p, err := NewProvider(Config{Backend: "host", HostLimits: func(dev int, size uint64) error {
		if dev != 0 || size > 1<<20 {
			return fmt.Errorf("%w: device %d, %d bytes", ErrInvalid, dev, size)
		}
		return nil
	}})
	require.NoError(t, err)
	m := NewManager(p, Config{})
	_, err = m.Alloc(1, 4096)
	require.ErrorContains(t, err, "device 1, 4096 bytes")
	_, err = m.Alloc(0, 2<<20)
	require.ErrorIs(t, err, ErrInvalid)
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	require.NoError(t, m.Free(b.Ptr()))
	require.ErrorContains(t, m.Bootstrap(nil, 0, 1, 3), "device 3")

	p, err = NewProvider(Config{Backend: "host", HostFaultRate: 1})
	require.NoError(t, err)
	_, err = p.Create(0, 4096)
	require.ErrorContains(t, err, "injected fault")

	_, err = NewProvider(Config{Backend: "tpu"})
	require.ErrorIs(t, err, ErrInvalid)
	if _, err := NewProvider(Config{Backend: "nccl"}); err != nil {
		require.ErrorIs(t, err, ErrNoDevice, "no NCCL here: no device, with the loader's message")
		require.NotContains(t, err.Error(), ErrNoDevice.Error())
	}
}

// envOf is c's settings as the variables ConfigFromEnv reads.
func envOf(c Config) map[string]string {
	e := map[string]string{"SYMM_BACKEND": c.Backend, "SYMM_SIGNALS": c.Signals, "SYMM_FAULT_CRASH_AT": c.CrashAt,
		"SYMM_TIMEOUT_MS": "", "SYMM_KERNEL_CACHE": c.KernelCache}
	if c.Backend == "host" {
		e["SYMM_DEVICE"] = "host"
	}
	if c.HostFaultRate > 0 {
		e["SYMM_HOST_FAULTS"] = strconv.FormatFloat(c.HostFaultRate, 'g', -1, 64) + ":" + strconv.FormatUint(c.HostFaultSeed, 10)
	}
	if c.Timeout%time.Millisecond == 0 {
		e["SYMM_TIMEOUT_MS"] = strconv.FormatInt(int64(c.Timeout/time.Millisecond), 10)
	} else {
		e["SYMM_RENDEZVOUS_TIMEOUT"] = c.Timeout.String()
	}
	if c.KernelCache == "" {
		e["SYMM_KERNEL_CACHE"] = "off"
	}
	if c.PushFirstCall > 0 {
		e["SYMM_PUSH_FIRST_CALL"] = strconv.FormatUint(c.PushFirstCall, 10)
	}
	if c.CollectiveBlocks > 0 {
		e["SYMM_COLLECTIVE_BLOCKS"] = strconv.Itoa(c.CollectiveBlocks)
	}
	e["SYMM_ALL_REDUCE"] = c.AllReduce.String()
	e["SYMM_ALLOW_OVERLAPPING_DEVICES"] = map[bool]string{true: "1", false: "0"}[c.AllowOverlappingDevices]
	e["SYMM_TRACE_RENDEZVOUS"] = map[bool]string{true: "1", false: "0"}[c.Trace]
	e["SYMM_LAUNCH_THROUGH_GO"] = map[bool]string{true: "1", false: "0"}[c.LaunchThroughGo]
	return e
}

// Whatever the environment, ConfigFromEnv never panics; what it refuses is
// ErrInvalid naming a SYMM_ variable; what it accepts is a valid config
// (each field within its documented range) that reads back the same from
// its own variables.
func FuzzConfigFromEnv(f *testing.F) {
	f.Add("", "", "", "", "", "", "", "", "", "", "", "")
	f.Add("host", "", "0.5:3", "memop", "sent", "250", "", "0x10", "96", "push", "1", "1")
	f.Add("cuda", "nccl", "", "kernel", "", "", "1.5", "1", "512", "two_shot", "0", "")
	f.Add("", "host", "1", "auto", "mapped", "", "2m", "", "1", "one_shot", "", "0")
	f.Add("tpu", "quantum", "x", "fast", "later", "-1", "inf", "0", "0", "fastest", "yes", "true")
	f.Fuzz(func(t *testing.T, device, backend, faults, signals, crash, timeoutMS, rvTimeout, push, blocks, allReduce, overlap, trace string) {
		env := map[string]string{"SYMM_DEVICE": device, "SYMM_BACKEND": backend, "SYMM_HOST_FAULTS": faults,
			"SYMM_SIGNALS": signals, "SYMM_FAULT_CRASH_AT": crash, "SYMM_TIMEOUT_MS": timeoutMS,
			"SYMM_RENDEZVOUS_TIMEOUT": rvTimeout, "SYMM_PUSH_FIRST_CALL": push, "SYMM_COLLECTIVE_BLOCKS": blocks,
			"SYMM_ALL_REDUCE": allReduce, "SYMM_ALLOW_OVERLAPPING_DEVICES": overlap, "SYMM_TRACE_RENDEZVOUS": trace}
		c, err := ConfigFromEnv(envMap(env))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v: error %v is not ErrInvalid", env, err)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Fatalf("%v: a refused environment gave %+v", env, c)
			}
			return
		}
		switch {
		case CheckBackend(c.Backend) != nil,
			c.Timeout <= 0,
			c.Signals != SignalsAuto && c.Signals != SignalsKernel && c.Signals != SignalsMemop,
			c.CollectiveBlocks < 0 || c.CollectiveBlocks > SignalPadSize/4,
			c.AllReduce < AllReduceAuto || c.AllReduce > AllReduceOneShot,
			!(c.HostFaultRate >= 0 && c.HostFaultRate <= 1) || math.IsNaN(c.HostFaultRate),
			c.HostFaultRate > 0 && c.Backend != "host":
			t.Fatalf("%v: accepted an invalid config %+v", env, c)
		}
		back, err := ConfigFromEnv(envMap(envOf(c)))
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("%v -> %+v -> %v -> %+v, %v", env, c, envOf(c), back, err)
		}
	})
}

// The cache directory comes from the kernels package's reader, the one
// owner of SYMM_KERNEL_CACHE.
func TestConfigKernelCacheIsKernelsOwn(t *testing.T) {
	env := map[string]string{"XDG_CACHE_HOME": "/x"}
	c, err := ConfigFromEnv(envMap(env))
	require.NoError(t, err)
	require.Equal(t, kernels.CacheDir(envMap(env)), c.KernelCache)
}

// TestSettingsDocumentTheDefaults holds the registry's documented defaults
// and bounds (the README's table) to the values this package uses.
func TestSettingsDocumentTheDefaults(t *testing.T) {
	require.Equal(t, strconv.Itoa(DefaultPushMaxBytes), settings.PushMaxBytes.Default)
	require.Equal(t, strconv.FormatInt(DefaultTimeout.Milliseconds(), 10), settings.TimeoutMS.Default)
	d, err := time.ParseDuration(strings.Trim(settings.RendezvousTimeout.Default, "`"))
	require.NoError(t, err)
	require.Equal(t, DefaultTimeout, d)
	require.Equal(t, strconv.Itoa(kernels.DefaultCollectiveBlocks), settings.CollectiveBlocks.Default)
	require.Contains(t, settings.CollectiveBlocks.Help, fmt.Sprintf("1–%d", SignalPadSize/4))
	require.Contains(t, settings.CollectiveBlocks.Help, fmt.Sprintf("%d / world", SignalPadSize/4))
	require.Equal(t, "`"+SignalsAuto+"`", settings.Signals.Default)
	require.Equal(t, "`auto`", settings.AllReduce.Default)
	require.Equal(t, AllReduceAuto, mustAlgorithm(t, "auto"))
}

func mustAlgorithm(t *testing.T, name string) Algorithm {
	a, err := ParseAlgorithm(name)
	require.NoError(t, err)
	return a
}
