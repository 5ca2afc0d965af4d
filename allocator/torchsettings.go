package allocator

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
//   - once the pool exists (ApplyTorchSettings), the pool's geometry
//     (expandable_segments, max_split_size_mb, max_non_split_rounding_mb,
//     large_segment_size_mb, roundup_power2_divisions,
//     garbage_collection_threshold) and graph_capture_record_stream_reuse
//     change for what comes next, as in
//     PyTorch (tunables.go); per_process_memory_fraction is accepted and
//     changes nothing, as in PyTorch, whose devices read it once
//     (torch.cuda.set_per_process_memory_fraction changes the cap); the
//     keys libsymm leaves to PyTorch or ignores are accepted (backend
//     native, the pinned host allocator's, release_lock_on_cudamalloc).

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
		dst.PerProcessMemoryFraction, dst.FractionGiven = src.PerProcessMemoryFraction, src.FractionGiven
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

// ApplyTorchSettings applies the settings text s to the pool, which exists,
// as PyTorch applies a run-time call (see the rules above): every key the
// text gives takes effect for the requests and segments that come after
// (tunables.go), the three keys PyTorch resets go back to their defaults
// when the text does not give them, and the others keep their values. It
// returns the warnings of the settings libsymm ignores; an error wrapping
// ErrInvalid for a text PyTorch or libsymm refuses (expandable segments on
// a backend that cannot map chunks among them). On error nothing changes.
func (p *Pool) ApplyTorchSettings(s string) ([]string, error) {
	c, keys, warns, err := parseTorchAllocConf(s)
	if err != nil {
		return nil, err
	}
	want := c.Config()
	// The keys a call keeps when it does not give them keep the pool's
	// values now.
	if !keys["max_non_split_rounding_mb"] {
		want.MaxNonSplitRounding = p.slack()
	}
	if !keys["large_segment_size_mb"] {
		want.LargeSegment = p.largeSegSize()
	}
	if !keys["graph_capture_record_stream_reuse"] {
		want.CaptureReuse = p.CaptureReuse()
	}
	if err := checkTunables(want); err != nil {
		return nil, err
	}
	p.tun.mu.Lock()
	defer p.tun.mu.Unlock()
	if keys["expandable_segments"] {
		if err := p.switchExpandable(want.Expandable); err != nil {
			return nil, err
		}
	}
	want.AllocConf = s
	p.setTunables(want)
	p.settingsChanged()
	// per_process_memory_fraction is accepted and changes nothing: PyTorch
	// 2.11's allocator reads it when a device's allocator is made, and a
	// later call leaves the fraction and the cap as they were (measured:
	// tests/device/test_torch_settings.py, fraction_call).
	return warns, nil
}
