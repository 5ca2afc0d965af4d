package symmetric

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/kernels"
)

// Settings. ConfigFromEnv is the one reader of symmetric memory's SYMM_*
// variables: the library calls it once, before its manager exists, and
// hands the result to NewProvider and NewManager; nothing else in the
// library or its Python package reads them again. BackendFromEnv is the one
// place that decides which backend symmetric memory runs on.

// DefaultTimeout bounds the waits of a rendezvous when neither
// SYMM_TIMEOUT_MS nor SYMM_RENDEZVOUS_TIMEOUT is set.
const DefaultTimeout = 60 * time.Second

// Config holds the rendezvous settings.
type Config struct {
	// Backend is the provider NewProvider makes: "cuda", "nvshmem", "nccl"
	// or "host" (BackendFromEnv: SYMM_BACKEND, else SYMM_DEVICE's).
	Backend string
	// HostFaultRate and HostFaultSeed, for fault-injection tests only, make
	// the host provider's Create, Export and Import fail at random
	// (SYMM_HOST_FAULTS, read on the host backend only; rate 0: none).
	HostFaultRate float64
	HostFaultSeed uint64
	// HostLimits, when set, checks a device and a block size of the host
	// backend, whose devices are labels no driver checks (the library gives
	// it the host pool's devices and memory: SYMM_HOST_DEVICES,
	// SYMM_HOST_MEMORY). Not read from the environment.
	HostLimits func(dev int, size uint64) error
	// Timeout bounds every wait of a rendezvous (SYMM_TIMEOUT_MS).
	Timeout time.Duration
	// CrashAt, for fault-injection tests only, kills the process at that
	// phase of every rendezvous (see crashAt; SYMM_FAULT_CRASH_AT).
	CrashAt string
	// FailAt, for fault-injection tests only, makes this process's
	// rendezvous fail at that phase: "send" (instead of sending its
	// descriptors), "arrays" (building the pointer arrays), "register"
	// (the provider's collective registration, NCCL windows).
	FailAt string
	// AllowOverlappingDevices lets two ranks use one device
	// (SYMM_ALLOW_OVERLAPPING_DEVICES=1).
	AllowOverlappingDevices bool
	// Signals chooses how signals and barriers run on GPUs (SYMM_SIGNALS):
	// "auto" or "" (kernels when NVRTC can build them, else stream memory
	// operations), "kernel" (kernels or an error) or "memop".
	Signals string
	// OpenNVRTC opens NVRTC for the kernels (nil: kernels.Open(nil), which
	// looks at SYMM_NVRTC_LIB and the loader path).
	OpenNVRTC func() (*kernels.NVRTC, error)
	// KernelCache is where compiled kernels are kept ("": not on disk;
	// kernels.CacheDir: SYMM_KERNEL_CACHE, else under the user's cache).
	KernelCache string
	// Trace prints the time of each rendezvous phase to standard error
	// (SYMM_TRACE_RENDEZVOUS=1), to see where a slow rendezvous spends it.
	Trace bool
	// PushFirstCall, for tests, is the number of a push workspace's first
	// call (0: 1); near a multiple of 2^32 it exercises the wrap-around of
	// the 32-bit flags (SYMM_PUSH_FIRST_CALL).
	PushFirstCall uint64
	// AllReduce forces the algorithm of AllReduceAlgorithm when not
	// AllReduceAuto (SYMM_ALL_REDUCE=auto, push, two_shot or one_shot).
	AllReduce Algorithm
	// LaunchThroughGo keeps every call of the C API in Go: no handle is
	// given a launch plan (plan.go; SYMM_LAUNCH_THROUGH_GO=1, for
	// comparison and as a way around a fault in the plans).
	LaunchThroughGo bool

	// CollectiveBlocks caps the blocks of the collectives that meet their
	// peers (SYMM_COLLECTIVE_BLOCKS; 0: kernels.DefaultCollectiveBlocks).
	// A group uses the smallest cap of its ranks, and never more blocks than
	// channels (SignalPadSize/4/world).
	CollectiveBlocks int
}

// collectiveBlocks is a rank's cap: n, or the default for 0.
func collectiveBlocks(n int) int {
	if n <= 0 {
		return kernels.DefaultCollectiveBlocks
	}
	return n
}

// wantBackend lists the backends' names, as SYMM_BACKEND and
// symm_set_backend spell them.
const wantBackend = `want "cuda", "nvshmem", "nccl" or "host"`

// CheckBackend refuses a name that is not a backend's (ErrInvalid).
func CheckBackend(name string) error {
	switch name {
	case "cuda", "nvshmem", "nccl", "host":
		return nil
	}
	return fmt.Errorf("%w: backend %q: %s", ErrInvalid, name, wantBackend)
}

// BackendFromEnv decides which backend symmetric memory runs on:
// SYMM_BACKEND when set, else SYMM_DEVICE's ("host" for host memory, else
// "cuda"). Host memory and GPUs do not mix: SYMM_BACKEND=host needs
// SYMM_DEVICE=host (or unset), and nvshmem and nccl refuse SYMM_DEVICE=host.
// The errors wrap ErrInvalid and name the variables.
func BackendFromEnv(getenv func(string) string) (string, error) {
	dev, err := settings.Device.Word(getenv, "cuda", "host")
	if err != nil {
		return "", refused(err)
	}
	backend := settings.Backend.Get(getenv)
	switch backend {
	case "":
		if dev == "host" {
			return "host", nil
		}
		return "cuda", nil
	case "cuda":
		if dev == "host" {
			return "host", nil // SYMM_DEVICE=host wins over the default backend's name
		}
		return "cuda", nil
	case "host":
		if dev == "cuda" {
			return "", fmt.Errorf("%w: SYMM_BACKEND=host with SYMM_DEVICE=%s: host memory needs SYMM_DEVICE=host", ErrInvalid, dev)
		}
		return "host", nil
	case "nvshmem", "nccl":
		if dev == "host" {
			return "", fmt.Errorf("%w: SYMM_BACKEND=%s needs GPUs, not SYMM_DEVICE=host", ErrInvalid, backend)
		}
		return backend, nil
	}
	return "", fmt.Errorf("%w: SYMM_BACKEND=%q: %s", ErrInvalid, backend, wantBackend)
}

// ConfigFromEnv reads every setting of symmetric memory through getenv (the
// C environment in the library, a map in tests), in this order: the backend
// (BackendFromEnv), SYMM_HOST_FAULTS (host backend only), SYMM_SIGNALS,
// SYMM_FAULT_CRASH_AT, SYMM_TIMEOUT_MS (else SYMM_RENDEZVOUS_TIMEOUT),
// SYMM_PUSH_FIRST_CALL, SYMM_COLLECTIVE_BLOCKS, SYMM_ALL_REDUCE,
// SYMM_ALLOW_OVERLAPPING_DEVICES, SYMM_LAUNCH_THROUGH_GO,
// SYMM_TRACE_RENDEZVOUS and the kernel
// cache (kernels.CacheDir). The first bad value is an error wrapping
// ErrInvalid that names the variable, its value and what it accepts. Unset
// variables take their defaults: the timeout DefaultTimeout, signals
// "auto", everything else off or zero.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	var err error
	if c.Backend, err = BackendFromEnv(getenv); err != nil {
		return Config{}, err
	}
	if v := settings.HostFaults.Get(getenv); v != "" && c.Backend == "host" {
		if c.HostFaultRate, c.HostFaultSeed, err = host.ParseFaults(v); err != nil {
			return Config{}, invalid{err} // wraps allocator.ErrInvalid too, and names the variable
		}
		if c.HostFaultRate == 0 {
			c.HostFaultSeed = 0 // no faults: the seed picks nothing
		}
	}
	if c.Signals, err = settings.Signals.Word(getenv, SignalsAuto, SignalsKernel, SignalsMemop); err != nil {
		return Config{}, refused(err)
	}
	if c.Signals == "" {
		c.Signals = SignalsAuto
	}
	if c.CrashAt, err = settings.FaultCrashAt.Word(getenv, "publish", "gathered", "sent", "mapped"); err != nil {
		return Config{}, refused(err)
	}
	if c.Timeout, err = timeoutFromEnv(getenv); err != nil {
		return Config{}, err
	}
	if n, set, err := settings.PushFirstCall.Uint(getenv, 0, 1, math.MaxUint64); err != nil {
		return Config{}, refused(err)
	} else if set {
		c.PushFirstCall = n
	}
	if n, set, err := settings.CollectiveBlocks.Uint(getenv, 10, 1, SignalPadSize/4); err != nil {
		return Config{}, refused(err)
	} else if set {
		c.CollectiveBlocks = int(n)
	}
	if v := settings.AllReduce.Get(getenv); v != "" {
		if c.AllReduce, err = ParseAlgorithm(v); err != nil {
			return Config{}, refused(settings.AllReduce.Refuse(v))
		}
	}
	for _, f := range []struct {
		s  *settings.Setting
		to *bool
	}{
		{settings.AllowOverlappingDevices, &c.AllowOverlappingDevices},
		{settings.LaunchThroughGo, &c.LaunchThroughGo},
		{settings.TraceRendezvous, &c.Trace},
	} {
		if *f.to, err = f.s.Flag(getenv, false); err != nil {
			return Config{}, refused(err)
		}
	}
	c.KernelCache = kernels.CacheDir(getenv)
	return c, nil
}

// timeoutFromEnv reads SYMM_TIMEOUT_MS (milliseconds), else
// SYMM_RENDEZVOUS_TIMEOUT (a duration such as 30s, or seconds), else
// DefaultTimeout. A value that is not positive, or that overflows a
// Duration, is refused.
func timeoutFromEnv(getenv func(string) string) (time.Duration, error) {
	if v := settings.TimeoutMS.Get(getenv); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > math.MaxInt64/int64(time.Millisecond) {
			return 0, refused(settings.TimeoutMS.Refuse(v))
		}
		return time.Duration(ms) * time.Millisecond, nil
	}
	v := settings.RendezvousTimeout.Get(getenv)
	if v == "" {
		return DefaultTimeout, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	// Seconds: finite, and at least a nanosecond once converted.
	if s, err := strconv.ParseFloat(v, 64); err == nil && s*1e9 >= 1 && s*1e9 < math.MaxInt64 {
		return time.Duration(s * float64(time.Second)), nil
	}
	return 0, refused(settings.RendezvousTimeout.Refuse(v))
}

// refused marks a setting's refusal (settings.Error) as ErrInvalid.
func refused(err error) error { return fmt.Errorf("%w: %w", ErrInvalid, err) }

// invalid marks an error of another package's parser as ErrInvalid too,
// keeping its message.
type invalid struct{ err error }

func (e invalid) Error() string   { return e.err.Error() }
func (e invalid) Unwrap() []error { return []error{e.err, ErrInvalid} }

// ErrNoDevice marks a backend that cannot run here: no CUDA driver or GPU,
// or its library (NVSHMEM, NCCL) missing or unsupported.
var ErrNoDevice = errors.New("no device for the backend")

// noDevice keeps the message of a provider's failure to start and marks it
// ErrNoDevice.
type noDevice struct{ err error }

func (e noDevice) Error() string   { return e.err.Error() }
func (e noDevice) Unwrap() []error { return []error{e.err, ErrNoDevice} }

// NewProvider makes the provider of c.Backend: host memory (with c's fault
// injection and limits), or CUDA, NVSHMEM or NCCL, whose failure to start
// (no driver, no library) wraps ErrNoDevice.
func NewProvider(c Config) (Provider, error) {
	var p Provider
	var err error
	switch c.Backend {
	case "host":
		hp := hostProvider{limits: c.HostLimits}
		if c.HostFaultRate > 0 {
			if hp.faults, err = host.NewFaults(c.HostFaultRate, c.HostFaultSeed); err != nil {
				return nil, err
			}
		}
		return hp, nil
	case "", "cuda":
		p, err = NewCUDAProvider()
	case "nvshmem":
		p, err = NewNVSHMEMProvider(nil)
	case "nccl":
		p, err = NewNCCLProvider(nil)
	default:
		return nil, CheckBackend(c.Backend)
	}
	if err != nil {
		return nil, noDevice{err}
	}
	return p, nil
}
