package allocator

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/libsymm/libsymm/internal/settings"
)

// PyTorch's allocator settings, as torch 2.11 reads them (c10/core/
// AllocatorConfig.{h,cpp} and c10/cuda/CUDAAllocatorConfig.{h,cpp}).
//
// Variables. torch 2.11 reads PYTORCH_CUDA_ALLOC_CONF and, only when that one
// is not set, PYTORCH_ALLOC_CONF (the newer name): one text is parsed, never a
// merge of both (AcceleratorAllocatorConfig::instance and
// CUDAAllocatorConfig::instance both look at PYTORCH_CUDA_ALLOC_CONF first).
// libsymm does the same, so that one environment means the same to PyTorch's
// allocator and to libsymm's pool.
//
// Syntax. Comma-separated key:value pairs. Every whitespace character is
// dropped wherever it is (PyTorch's ConfigTokenizer skips std::isspace), so
// "max_split _size_mb : 20" is max_split_size_mb:20. A value is one token or,
// for roundup_power2_divisions only, a bracketed list. One trailing comma is
// accepted (PyTorch's loop ends there); an empty text sets nothing. A key may
// be repeated: the last value wins, except roundup_power2_divisions, whose
// occurrences apply one after the other to the same table, as in PyTorch.
//
// libsymm is stricter than torch 2.11 in two places, both typing mistakes
// PyTorch lets through: every key must be followed by ':' and every pair by
// ',' (torch 2.11's ConfigTokenizer::checkToken result is ignored, so it reads
// "max_split_size_mb,100" as max_split_size_mb:100), and numbers must be
// whole decimal tokens (std::stoull reads "20MB" as 20 and "-1" as 2^64-1).
//
// Keys. What libsymm does with each key torch 2.11 knows:
//
//	expandable_segments            honoured (Config.Expandable)
//	max_split_size_mb              honoured (Config.MaxSplit)
//	max_non_split_rounding_mb      honoured (Config.MaxNonSplitRounding)
//	roundup_power2_divisions       honoured (Config.RoundupPower2Divisions)
//	garbage_collection_threshold   honoured (Config.GCThreshold)
//	per_process_memory_fraction    honoured (Config.LimitFraction; 1 is no cap)
//	backend                        native: accepted; cudaMallocAsync: refused
//	large_segment_size_mb          honoured (Config.LargeSegment)
//	release_lock_on_cudamalloc     validated; warned when True
//	graph_capture_record_stream_reuse  honoured (Config.CaptureReuse; a backend
//	                               that is a CaptureGrapher: CUDA)
//	pinned_use_cuda_host_register, pinned_num_register_threads,
//	pinned_use_background_threads, pinned_reserve_segment_size_mb
//	                               validated only: PyTorch's pinned host
//	                               allocator reads them itself
//
// (release_lock_on_hipmalloc and pinned_use_hip_host_register, the ROCm
// spellings PyTorch also accepts, are the same keys.) Any other key is an
// error, as in PyTorch ("Unrecognized key ... in Accelerator allocator
// config."). A value PyTorch would refuse is an error naming the key and the
// value, wrapping ErrInvalid.

// Environment variables of PyTorch's allocator settings, in the order torch
// 2.11 looks at them: the first one set is the only one read.
var (
	EnvTorchCUDAAllocConf = settings.TorchCUDAAllocConf.Name
	EnvTorchAllocConf     = settings.TorchAllocConf.Name
)

// RoundupIntervals is the number of size intervals of roundup_power2_divisions:
// interval i holds request sizes in [2^(20+i), 2^(21+i)) bytes, except that
// interval 0 also holds every smaller size and interval 15 every larger one
// (PyTorch's kRoundUpPowerOfTwoIntervals, from 1 MiB to 64 GiB).
const RoundupIntervals = 16

// Bounds PyTorch puts on its settings (MB there means MiB).
const (
	torchDefaultLargeSegmentMB = largeSeg >> 20    // large_segment_size_mb's default, 20
	torchMinLargeSegmentMB     = minLargeSeg >> 20 // large_segment_size_mb must be more than this (kMinLargeAlloc)
	torchMaxMB                 = math.MaxUint64 >> 20
	torchMaxRegisterThreads    = 128 // CUDAAllocatorConfig::pinned_max_register_threads
)

// TorchConf is a parsed PyTorch allocator-settings text. A zero field is a key
// not given (or given its default: the two mean the same to libsymm); every
// value a field can hold from ParseTorchAllocConf is one PyTorch accepts.
// String writes it back in a form ParseTorchAllocConf reads to the same value.
type TorchConf struct {
	// Backend is "native" when given; cudaMallocAsync is refused by the parser.
	Backend string
	// ExpandableSegments is expandable_segments.
	ExpandableSegments bool
	// MaxSplitSizeMB is max_split_size_mb (blocks of at least this many MiB
	// are never split), at least LargeSegmentSizeMB (20 when not given).
	MaxSplitSizeMB uint64
	// MaxNonSplitRoundingMB is max_non_split_rounding_mb: a block that is not
	// split serves requests at most this many MiB smaller (same lower bound).
	MaxNonSplitRoundingMB uint64
	// LargeSegmentSizeMB is large_segment_size_mb, more than 10.
	LargeSegmentSizeMB uint64
	// GarbageCollectionThreshold is garbage_collection_threshold, in (0, 1).
	GarbageCollectionThreshold float64
	// RoundupPower2Divisions is roundup_power2_divisions by interval (see
	// RoundupIntervals): 0 or a power of two; 0 and 1 leave sizes alone.
	RoundupPower2Divisions [RoundupIntervals]uint64
	// PerProcessMemoryFraction is per_process_memory_fraction, in [0, 1],
	// when FractionGiven (0, as in PyTorch, is a cap of 0 bytes: every
	// request that needs new memory fails).
	PerProcessMemoryFraction float64
	FractionGiven            bool
	// ReleaseLockOnCudaMalloc is release_lock_on_cudamalloc.
	ReleaseLockOnCudaMalloc bool
	// GraphCaptureRecordStreamReuse is graph_capture_record_stream_reuse.
	GraphCaptureRecordStreamReuse bool
	// The pinned host allocator's settings (PyTorch's, not libsymm's).
	PinnedUseCudaHostRegister  bool
	PinnedUseBackgroundThreads bool
	PinnedNumRegisterThreads   uint64 // a power of two up to 128
	PinnedReserveSegmentSizeMB uint64 // more than 0
}

// ParseTorchAllocConf parses PyTorch's allocator settings text s (the value of
// PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF). It returns the settings, a
// warning for each setting libsymm ignores (without prefix or variable name),
// and an error wrapping ErrInvalid for a text PyTorch would refuse or a
// setting libsymm refuses.
func ParseTorchAllocConf(s string) (TorchConf, []string, error) {
	c, _, w, err := parseTorchAllocConf(s)
	return c, w, err
}

// parseTorchAllocConf is ParseTorchAllocConf that also returns the keys the
// text gives (the ROCm spellings under the CUDA names).
func parseTorchAllocConf(s string) (TorchConf, map[string]bool, []string, error) {
	var c TorchConf
	pairs, err := torchPairs(s)
	if err != nil {
		return TorchConf{}, nil, nil, err
	}
	keys := make(map[string]bool, len(pairs))
	for _, p := range pairs {
		keys[torchKeyAliases.Replace(p.key)] = true
	}
	// large_segment_size_mb first, whatever its place: the lower bound of
	// max_split_size_mb and max_non_split_rounding_mb is its value (torch
	// 2.11 parses it in a pass of its own before the other keys).
	largeMB := uint64(torchDefaultLargeSegmentMB)
	for _, p := range pairs {
		if p.key != "large_segment_size_mb" {
			continue
		}
		v, err := p.uint()
		if err != nil {
			return TorchConf{}, nil, nil, err
		}
		if v <= torchMinLargeSegmentMB {
			return TorchConf{}, nil, nil, p.errorf("must be more than %d (MiB)", torchMinLargeSegmentMB)
		}
		largeMB = min(v, maxRequest>>20) // clamped, as PyTorch clamps it (to its own bound)
		c.LargeSegmentSizeMB = largeMB
	}
	for _, p := range pairs {
		if err := c.set(p, largeMB); err != nil {
			return TorchConf{}, nil, nil, err
		}
	}
	return c, keys, c.warnings(), nil
}

// torchKeyAliases maps the ROCm spellings PyTorch accepts to the CUDA ones.
var torchKeyAliases = strings.NewReplacer(
	"release_lock_on_hipmalloc", "release_lock_on_cudamalloc",
	"pinned_use_hip_host_register", "pinned_use_cuda_host_register")

// set applies one key:value pair; largeMB is large_segment_size_mb's value.
func (c *TorchConf) set(p torchPair, largeMB uint64) error {
	var err error
	switch p.key {
	case "large_segment_size_mb": // parsed first, in ParseTorchAllocConf
	case "expandable_segments":
		c.ExpandableSegments, err = p.bool()
	case "max_split_size_mb":
		c.MaxSplitSizeMB, err = p.mb(largeMB)
	case "max_non_split_rounding_mb":
		c.MaxNonSplitRoundingMB, err = p.mb(largeMB)
	case "garbage_collection_threshold":
		var v float64
		if v, err = p.float(); err == nil && !(v > 0 && v < 1) {
			err = p.errorf("must be in (0.0, 1.0), as in PyTorch")
		}
		c.GarbageCollectionThreshold = v
	case "roundup_power2_divisions":
		err = p.roundup(&c.RoundupPower2Divisions)
	case "per_process_memory_fraction":
		var v float64
		if v, err = p.float(); err == nil {
			if !(v >= 0 && v <= 1) {
				// PyTorch's own words, which a program may look for.
				err = p.errorf("per_process_memory_fraction is invalid, set it in [0.0, 1.0]")
			}
		}
		c.PerProcessMemoryFraction, c.FractionGiven = v, true
	case "backend":
		switch v := p.value(); v {
		case "native":
			c.Backend = v
		case "cudaMallocAsync":
			// Refused rather than ignored: the setting asks for CUDA's
			// stream-ordered allocator instead of a caching pool, and the
			// process has just made libsymm's caching pool its allocator.
			// Running libsymm anyway would give neither what was asked nor
			// a visible reason (and PyTorch may have chosen cudaMallocAsync
			// for itself at load time, so two allocators would share the
			// device).
			err = p.errorf("libsymm is a caching allocator and cannot serve memory from cudaMallocAsync; remove the setting (or use backend:native) in processes that use libsymm's pool")
		default:
			err = p.errorf("unknown allocator backend; options are native and cudaMallocAsync")
		}
	case "release_lock_on_cudamalloc", "release_lock_on_hipmalloc":
		c.ReleaseLockOnCudaMalloc, err = p.bool()
	case "graph_capture_record_stream_reuse":
		c.GraphCaptureRecordStreamReuse, err = p.bool()
	case "pinned_use_cuda_host_register", "pinned_use_hip_host_register":
		c.PinnedUseCudaHostRegister, err = p.bool()
	case "pinned_use_background_threads":
		c.PinnedUseBackgroundThreads, err = p.bool()
	case "pinned_num_register_threads":
		var v uint64
		if v, err = p.uint(); err == nil {
			switch {
			case !isPow2(v):
				err = p.errorf("the number of register threads must be a power of 2")
			case v > torchMaxRegisterThreads:
				err = p.errorf("the number of register threads must be at most %d", torchMaxRegisterThreads)
			}
		}
		c.PinnedNumRegisterThreads = v
	case "pinned_reserve_segment_size_mb":
		var v uint64
		if v, err = p.uint(); err == nil && v == 0 {
			err = p.errorf("the pinned reserve segment size must be more than 0")
		}
		c.PinnedReserveSegmentSizeMB = v
	default:
		return fmt.Errorf("%w: unrecognized key %q (PyTorch refuses it too: \"Unrecognized key '%s' in Accelerator allocator config.\")",
			ErrInvalid, p.key, p.key)
	}
	return err
}

// warnings names each setting libsymm ignores. Settings equal to PyTorch's
// default ask for nothing, so they get none; nor do the pinned host
// allocator's, which PyTorch's own pinned allocator reads from the same
// variable and honours (libsymm serves device memory only).
func (c *TorchConf) warnings() []string {
	var w []string
	if c.ReleaseLockOnCudaMalloc {
		w = append(w, "release_lock_on_cudamalloc:True is ignored: libsymm's pool holds only the requesting stream's lock, never a device-wide one, while the driver allocates")
	}
	return w
}

// String writes c as PyTorch's settings text: the keys that are not zero, in
// a fixed order; roundup_power2_divisions as a list of all 16 intervals.
func (c TorchConf) String() string {
	var kv []string
	add := func(k, v string) { kv = append(kv, k+":"+v) }
	b := func(v bool) string {
		if v {
			return "True"
		}
		return "False"
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	if c.Backend != "" {
		add("backend", c.Backend)
	}
	if c.ExpandableSegments {
		add("expandable_segments", b(true))
	}
	if c.LargeSegmentSizeMB != 0 {
		add("large_segment_size_mb", u(c.LargeSegmentSizeMB))
	}
	if c.MaxSplitSizeMB != 0 {
		add("max_split_size_mb", u(c.MaxSplitSizeMB))
	}
	if c.MaxNonSplitRoundingMB != 0 {
		add("max_non_split_rounding_mb", u(c.MaxNonSplitRoundingMB))
	}
	if c.GarbageCollectionThreshold != 0 {
		add("garbage_collection_threshold", f(c.GarbageCollectionThreshold))
	}
	if c.RoundupPower2Divisions != ([RoundupIntervals]uint64{}) {
		parts := make([]string, RoundupIntervals)
		for i, d := range c.RoundupPower2Divisions {
			parts[i] = u(1<<i) + ":" + u(d) // the boundary 2^i (MiB) names interval i
		}
		add("roundup_power2_divisions", "["+strings.Join(parts, ",")+"]")
	}
	if c.FractionGiven {
		add("per_process_memory_fraction", f(c.PerProcessMemoryFraction))
	}
	if c.ReleaseLockOnCudaMalloc {
		add("release_lock_on_cudamalloc", b(true))
	}
	if c.GraphCaptureRecordStreamReuse {
		add("graph_capture_record_stream_reuse", b(true))
	}
	if c.PinnedUseCudaHostRegister {
		add("pinned_use_cuda_host_register", b(true))
	}
	if c.PinnedUseBackgroundThreads {
		add("pinned_use_background_threads", b(true))
	}
	if c.PinnedNumRegisterThreads != 0 {
		add("pinned_num_register_threads", u(c.PinnedNumRegisterThreads))
	}
	if c.PinnedReserveSegmentSizeMB != 0 {
		add("pinned_reserve_segment_size_mb", u(c.PinnedReserveSegmentSizeMB))
	}
	return strings.Join(kv, ",")
}

// Config is the pool configuration these settings ask for: what ConfigFromEnv
// starts from before the SYMM_POOL_ variables, and what symm replay's
// --alloc-conf replays. Settings libsymm ignores or leaves to PyTorch have no
// field in it.
func (c TorchConf) Config() Config {
	cfg := Config{
		Expandable:             c.ExpandableSegments,
		MaxNonSplitRounding:    c.MaxNonSplitRoundingMB << 20,
		RoundupPower2Divisions: c.RoundupPower2Divisions,
		GCThreshold:            c.GarbageCollectionThreshold,
		LargeSegment:           c.LargeSegmentSizeMB << 20,
		CaptureReuse:           c.GraphCaptureRecordStreamReuse,
	}
	if c.MaxSplitSizeMB != 0 {
		cfg.MaxSplit = roundSize(min(c.MaxSplitSizeMB<<20, maxRequest))
	}
	switch f := c.PerProcessMemoryFraction; {
	case !c.FractionGiven || f >= 1: // 1 is no cap, as in PyTorch
	case f == 0:
		cfg.LimitZero = true
	default:
		cfg.LimitFraction = f
	}
	return cfg
}

// ---- tokens -----------------------------------------------------------------

// torchPair is one key with its value: one token, or the tokens between
// brackets (list true).
type torchPair struct {
	key  string
	vals []string
	list bool
}

func isTorchSep(t string) bool { return t == "," || t == ":" || t == "[" || t == "]" }

// torchTokens splits s as PyTorch's ConfigTokenizer does: ',', ':', '[' and
// ']' are tokens of their own, whitespace is dropped, the rest runs together.
func torchTokens(s string) []string {
	var toks []string
	var buf strings.Builder
	flush := func() {
		if buf.Len() > 0 {
			toks = append(toks, buf.String())
			buf.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; ch {
		case ',', ':', '[', ']':
			flush()
			toks = append(toks, string(ch))
		case ' ', '\t', '\n', '\v', '\f', '\r': // std::isspace in the C locale
		default:
			buf.WriteByte(ch)
		}
	}
	flush()
	return toks
}

// torchPairs reads s as key:value pairs separated by commas.
func torchPairs(s string) ([]torchPair, error) {
	toks := torchTokens(s)
	var pairs []torchPair
	for i := 0; i < len(toks); {
		key := toks[i]
		if isTorchSep(key) {
			return nil, fmt.Errorf("%w: %q where a key should be (settings are key:value pairs separated by commas)", ErrInvalid, key)
		}
		if i+1 >= len(toks) || toks[i+1] != ":" {
			return nil, fmt.Errorf("%w: %s: expected ':' and a value after the key", ErrInvalid, key)
		}
		i += 2
		if i >= len(toks) || (isTorchSep(toks[i]) && toks[i] != "[") {
			return nil, fmt.Errorf("%w: %s: missing value", ErrInvalid, key)
		}
		p := torchPair{key: key}
		if toks[i] == "[" {
			j := i + 1
			for j < len(toks) && toks[j] != "]" {
				j++
			}
			if j == len(toks) {
				return nil, fmt.Errorf("%w: %s: expected a closing ']'", ErrInvalid, key)
			}
			p.vals, p.list = toks[i+1:j], true
			i = j + 1
		} else {
			p.vals = toks[i : i+1]
			i++
		}
		pairs = append(pairs, p)
		if i < len(toks) {
			if toks[i] != "," {
				return nil, fmt.Errorf("%w: %s:%s: expected ',' before %q", ErrInvalid, key, p.value(), toks[i])
			}
			i++
		}
	}
	return pairs, nil
}

// value is the pair's value as written (a list with its brackets).
func (p torchPair) value() string {
	if p.list {
		return "[" + strings.Join(p.vals, "") + "]"
	}
	return p.vals[0]
}

// errorf is an ErrInvalid naming the key and the value.
func (p torchPair) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s:%s: %s", ErrInvalid, p.key, p.value(), fmt.Sprintf(format, args...))
}

// scalar is the pair's one value token; a list is an error.
func (p torchPair) scalar(want string) (string, error) {
	if p.list {
		return "", p.errorf("expected %s, not a list", want)
	}
	return p.vals[0], nil
}

func (p torchPair) bool() (bool, error) {
	v, err := p.scalar("True or False")
	if err != nil {
		return false, err
	}
	switch v {
	case "True":
		return true, nil
	case "False":
		return false, nil
	}
	return false, p.errorf("expected True or False (PyTorch takes no other spelling)")
}

func (p torchPair) uint() (uint64, error) {
	v, err := p.scalar("a whole number")
	if err != nil {
		return 0, err
	}
	return parseTorchUint(p, v)
}

func parseTorchUint(p torchPair, v string) (uint64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, p.errorf("%q is not a whole number that fits in 64 bits", v)
	}
	return n, nil
}

func (p torchPair) float() (float64, error) {
	v, err := p.scalar("a number")
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, p.errorf("%q is not a number", v)
	}
	return f, nil
}

// mb reads a size in MiB of at least largeMB (max_split_size_mb,
// max_non_split_rounding_mb), clamped as PyTorch clamps it.
func (p torchPair) mb(largeMB uint64) (uint64, error) {
	v, err := p.uint()
	if err != nil {
		return 0, err
	}
	if v < largeMB {
		return 0, p.errorf("too small, must be >= %d (MiB, large_segment_size_mb), as in PyTorch", largeMB)
	}
	return min(v, torchMaxMB), nil
}

// roundup applies roundup_power2_divisions to div as PyTorch's
// parseRoundUpPower2Divisions does. A single number (a power of two) sets
// every interval. A list of BOUNDARY:DIVISIONS entries sets interval
// log2(BOUNDARY) (BOUNDARY in MiB, a power of two, clamped to the 16
// intervals); the first entry also sets every interval below its own; '>'
// as BOUNDARY sets every interval above the last one set. DIVISIONS is 0 or
// a power of two.
func (p torchPair) roundup(div *[RoundupIntervals]uint64) error {
	if !p.list {
		v, err := p.uint()
		if err != nil {
			return err
		}
		if !isPow2(v) {
			return p.errorf("for roundups, the divisions must be a power of 2")
		}
		for i := range div {
			div[i] = v
		}
		return nil
	}
	first, last := true, 0
	for i := 0; i < len(p.vals); {
		if i+2 >= len(p.vals) || p.vals[i+1] != ":" || isTorchSep(p.vals[i]) || isTorchSep(p.vals[i+2]) {
			return p.errorf("expected BOUNDARY:DIVISIONS entries separated by commas (e.g. [256:1,512:2,>:4])")
		}
		bound, val := p.vals[i], p.vals[i+2]
		i += 3
		if i < len(p.vals) {
			if p.vals[i] != "," {
				return p.errorf("expected ',' between entries, not %q", p.vals[i])
			}
			i++
		}
		d, err := parseTorchUint(p, val)
		if err != nil {
			return err
		}
		if d != 0 && !isPow2(d) {
			return p.errorf("for roundups, the divisions must be a power of 2 or 0 to disable roundup, not %d", d)
		}
		if bound == ">" {
			for j := last + 1; j < RoundupIntervals; j++ {
				div[j] = d
			}
			continue
		}
		b, err := parseTorchUint(p, bound)
		if err != nil {
			return err
		}
		if !isPow2(b) {
			return p.errorf("for roundups, the intervals must be powers of 2 (MiB), not %d", b)
		}
		idx := min(bits.Len64(b)-1, RoundupIntervals-1)
		if first {
			for j := 0; j < idx; j++ {
				div[j] = d
			}
			first = false
		}
		div[idx] = d
		last = idx
	}
	return nil
}

func isPow2(v uint64) bool { return v != 0 && v&(v-1) == 0 }

// ---- the environment ----------------------------------------------------------

// torchConfFromEnv reads PyTorch's allocator settings from the environment:
// PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (torch 2.11's order; an
// empty variable counts as unset). It returns the settings, the variable's
// name and text ("" when neither is set), and warnings prefixed with the
// variable's name.
func torchConfFromEnv(getenv func(string) string) (c TorchConf, name, text string, warns []string, err error) {
	name = EnvTorchCUDAAllocConf
	text = getenv(name)
	if other := getenv(EnvTorchAllocConf); text == "" {
		name, text = EnvTorchAllocConf, other
	} else if other != "" && other != text {
		warns = append(warns, fmt.Sprintf("%s and %s are both set; %s=%q is ignored (torch 2.11 reads only %s then, and so does libsymm)",
			EnvTorchCUDAAllocConf, EnvTorchAllocConf, EnvTorchAllocConf, other, EnvTorchCUDAAllocConf))
	}
	if text == "" {
		return TorchConf{}, "", "", warns, nil
	}
	c, w, err := ParseTorchAllocConf(text)
	if err != nil {
		return TorchConf{}, name, text, nil, fmt.Errorf("%s=%q: %w", name, text, err)
	}
	for _, s := range w {
		warns = append(warns, name+": "+s)
	}
	return c, name, text, warns, nil
}
