package allocator

import (
	"fmt"
	"strconv"
)

// Run-time changes of PyTorch's allocator settings:
// torch.cuda.memory._set_allocator_settings and
// torch._C._accelerator_setAllocatorSettings, which torch 2.11 parses itself
// (c10::CachingAllocator::setAllocatorSettings) and then hands to the CUDA
// parser hook, through which libsymm's PyTorch extension passes the same
// text on (symm_pool_set_allocator_settings).
//
// PyTorch's semantics, which libsymm keeps: each call is one text, parsed as
// the environment's is (ParseTorchAllocConf). max_split_size_mb,
// roundup_power2_divisions and garbage_collection_threshold go back to their
// defaults when the text does not give them; every other key keeps its value
// unless given (AcceleratorAllocatorConfig::parseArgs resets those three).
//
// What libsymm does with a call:
//   - before its pool exists, the text is merged over the environment's
//     settings (MergeTorchSettings) and the pool is made from the result:
//     every key applies, as if the environment had said it;
//   - once the pool exists (ApplyTorchSettings): per_process_memory_fraction
//     is accepted and changes nothing, as in PyTorch, whose devices read it
//     once (torch.cuda.set_per_process_memory_fraction changes the cap);
//     the keys libsymm leaves to PyTorch or ignores are accepted (backend
//     native, the pinned host allocator's, release_lock_on_cudamalloc,
//     graph_capture_record_stream_reuse); the pool's geometry
//     (expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
//     large_segment_size_mb, roundup_power2_divisions,
//     garbage_collection_threshold) is fixed when the pool is made, so a call
//     that would change one of them fails with ErrBusy naming the key, its
//     value and the pool's, and changes nothing. The same value again is
//     accepted.

// torchResetKeys are the keys a settings call sets back to their defaults
// when it does not give them, as torch 2.11 does.
var torchResetKeys = [...]string{"max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold"}

// MergeTorchSettings is the settings text a pool made now must follow after
// the call text next, given the environment's text env ("" for none): next's
// keys, and env's for the keys next does not give and that a call keeps.
func MergeTorchSettings(env, next string) (string, error) {
	base, _, _, err := parseTorchAllocConf(env)
	if err != nil {
		return "", err
	}
	c, keys, _, err := parseTorchAllocConf(next)
	if err != nil {
		return "", err
	}
	kept := base
	for _, k := range torchResetKeys {
		keys[k] = true // a call always decides these
	}
	for k := range keys {
		setTorchKey(&kept, &c, k)
	}
	return kept.String(), nil
}

// setTorchKey copies key k of src into dst (k as ParseTorchAllocConf names
// it, the ROCm spellings under the CUDA names).
func setTorchKey(dst, src *TorchConf, k string) {
	switch k {
	case "backend":
		dst.Backend = src.Backend
	case "expandable_segments":
		dst.ExpandableSegments = src.ExpandableSegments
	case "max_split_size_mb":
		dst.MaxSplitSizeMB = src.MaxSplitSizeMB
	case "max_non_split_rounding_mb":
		dst.MaxNonSplitRoundingMB = src.MaxNonSplitRoundingMB
	case "large_segment_size_mb":
		dst.LargeSegmentSizeMB = src.LargeSegmentSizeMB
	case "garbage_collection_threshold":
		dst.GarbageCollectionThreshold = src.GarbageCollectionThreshold
	case "roundup_power2_divisions":
		dst.RoundupPower2Divisions = src.RoundupPower2Divisions
	case "per_process_memory_fraction":
		dst.PerProcessMemoryFraction = src.PerProcessMemoryFraction
	case "release_lock_on_cudamalloc":
		dst.ReleaseLockOnCudaMalloc = src.ReleaseLockOnCudaMalloc
	case "graph_capture_record_stream_reuse":
		dst.GraphCaptureRecordStreamReuse = src.GraphCaptureRecordStreamReuse
	case "pinned_use_cuda_host_register":
		dst.PinnedUseCudaHostRegister = src.PinnedUseCudaHostRegister
	case "pinned_use_background_threads":
		dst.PinnedUseBackgroundThreads = src.PinnedUseBackgroundThreads
	case "pinned_num_register_threads":
		dst.PinnedNumRegisterThreads = src.PinnedNumRegisterThreads
	case "pinned_reserve_segment_size_mb":
		dst.PinnedReserveSegmentSizeMB = src.PinnedReserveSegmentSizeMB
	}
}

// ApplyTorchSettings applies the settings text s to the pool, which exists
// (see the rules above). It returns the warnings of the settings libsymm
// ignores; an error wrapping ErrInvalid for a text PyTorch or libsymm
// refuses, or ErrBusy for a key the pool cannot change now. On error nothing
// changes.
func (p *Pool) ApplyTorchSettings(s string) ([]string, error) {
	c, keys, warns, err := parseTorchAllocConf(s)
	if err != nil {
		return nil, err
	}
	for _, k := range torchResetKeys {
		keys[k] = true
	}
	want := c.Config()
	for _, f := range p.fixedSettings(want) {
		if keys[f.key] && f.want != f.have {
			return nil, fmt.Errorf("%w: %s:%s: libsymm's pool fixes this setting when it is made (it has %s): it cannot change at run time; "+
				"set it in PYTORCH_CUDA_ALLOC_CONF, or call torch.cuda.memory._set_allocator_settings before CUDA is initialized; nothing was changed",
				ErrBusy, f.key, f.want, f.have)
		}
	}
	// per_process_memory_fraction is accepted and changes nothing: PyTorch
	// 2.11's allocator reads it when a device's allocator is made, and a
	// later call leaves the fraction and the cap as they were (measured:
	// tests/device/test_torch_settings.py, fraction_call).
	return warns, nil
}

// fixedSetting is one setting the pool fixes when it is made: its key, the
// value asked for and the pool's, both as PyTorch writes them.
type fixedSetting struct{ key, want, have string }

func (p *Pool) fixedSettings(want Config) []fixedSetting {
	mb := func(b uint64) string { return strconv.FormatUint(b>>20, 10) }
	split := func(b uint64) string {
		if b == 0 {
			return "unlimited"
		}
		return mb(b)
	}
	orDefault := func(v, def uint64) uint64 {
		if v == 0 {
			return def
		}
		return v
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	b := map[bool]string{true: "True", false: "False"}
	return []fixedSetting{
		{"expandable_segments", b[want.Expandable], b[p.Expandable()]},
		{"max_split_size_mb", split(want.MaxSplit), split(p.cfg.MaxSplit)},
		{"max_non_split_rounding_mb", mb(orDefault(want.MaxNonSplitRounding, largeBuffer)), mb(p.slack)},
		{"large_segment_size_mb", mb(orDefault(want.LargeSegment, largeSeg)), mb(p.largeSeg)},
		{"roundup_power2_divisions", fmt.Sprint(want.RoundupPower2Divisions), fmt.Sprint(p.cfg.RoundupPower2Divisions)},
		{"garbage_collection_threshold", f(want.GCThreshold), f(p.cfg.GCThreshold)},
	}
}
