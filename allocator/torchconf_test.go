package allocator

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// all16 is a roundup_power2_divisions table with every interval set to d.
func all16(d uint64) (t [RoundupIntervals]uint64) {
	for i := range t {
		t[i] = d
	}
	return t
}

// table16 builds a roundup_power2_divisions table from runs: [from, to) → d.
func table16(runs ...[3]uint64) (t [RoundupIntervals]uint64) {
	for _, r := range runs {
		for i := r[0]; i < r[1]; i++ {
			t[i] = r[2]
		}
	}
	return t
}

// requireRoundTrip checks that what ParseTorchAllocConf accepted is read back
// from its String form to the same settings and warnings.
func requireRoundTrip(t *testing.T, in string, c TorchConf, warns []string) {
	t.Helper()
	back, w2, err := ParseTorchAllocConf(c.String())
	require.NoError(t, err, "%q -> %q", in, c.String())
	require.Equal(t, c, back, "%q -> %q", in, c.String())
	require.Equal(t, warns, w2, "%q -> %q", in, c.String())
}

func TestParseTorchAllocConfGood(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  TorchConf
		warns []string // substrings, one per warning
	}{
		{in: "", want: TorchConf{}},
		{in: " \t\n ", want: TorchConf{}},
		{in: "expandable_segments:True", want: TorchConf{ExpandableSegments: true}},
		{in: "expandable_segments:False", want: TorchConf{}},
		{in: "expandable_segments:True,", want: TorchConf{ExpandableSegments: true}},
		{in: " expandable_segments : True , max_split_size_mb : 100 ", want: TorchConf{ExpandableSegments: true, MaxSplitSizeMB: 100}},
		{in: "\texpandable_segments:\nTrue", want: TorchConf{ExpandableSegments: true}},
		// PyTorch drops whitespace inside tokens too.
		{in: "max_split _size_mb:2 0", want: TorchConf{MaxSplitSizeMB: 20}},
		{in: "expandable_segments:True,expandable_segments:False", want: TorchConf{}},
		{in: "max_split_size_mb:20", want: TorchConf{MaxSplitSizeMB: 20}},
		{in: "max_split_size_mb:18446744073709551615", want: TorchConf{MaxSplitSizeMB: math.MaxUint64 >> 20}},
		{in: "max_non_split_rounding_mb:64", want: TorchConf{MaxNonSplitRoundingMB: 64}},
		{in: "large_segment_size_mb:20", want: TorchConf{LargeSegmentSizeMB: 20}},
		{in: "large_segment_size_mb:11,max_split_size_mb:11", want: TorchConf{LargeSegmentSizeMB: 11, MaxSplitSizeMB: 11}},
		// large_segment_size_mb is read first, wherever it stands.
		{in: "max_split_size_mb:40,large_segment_size_mb:40", want: TorchConf{LargeSegmentSizeMB: 40, MaxSplitSizeMB: 40}},
		{in: "garbage_collection_threshold:0.6", want: TorchConf{GarbageCollectionThreshold: 0.6}},
		{in: "garbage_collection_threshold:1e-3", want: TorchConf{GarbageCollectionThreshold: 0.001}},
		{in: "per_process_memory_fraction:0.5", want: TorchConf{PerProcessMemoryFraction: 0.5, FractionGiven: true}},
		{in: "per_process_memory_fraction:1", want: TorchConf{PerProcessMemoryFraction: 1, FractionGiven: true}},
		// As in PyTorch: a cap of 0 bytes.
		{in: "per_process_memory_fraction:0", want: TorchConf{FractionGiven: true}},
		{in: "backend:native", want: TorchConf{Backend: "native"}},
		{in: "release_lock_on_cudamalloc:False", want: TorchConf{}},
		{in: "release_lock_on_cudamalloc:True", want: TorchConf{ReleaseLockOnCudaMalloc: true},
			warns: []string{"release_lock_on_cudamalloc:True is ignored"}},
		{in: "release_lock_on_hipmalloc:True", want: TorchConf{ReleaseLockOnCudaMalloc: true},
			warns: []string{"release_lock_on_cudamalloc:True"}},
		{in: "graph_capture_record_stream_reuse:True", want: TorchConf{GraphCaptureRecordStreamReuse: true}},
		{in: "graph_capture_record_stream_reuse:False", want: TorchConf{}},
		// The pinned host allocator's keys: PyTorch's; no warning.
		{in: "pinned_use_cuda_host_register:True,pinned_num_register_threads:8", want: TorchConf{PinnedUseCudaHostRegister: true, PinnedNumRegisterThreads: 8}},
		{in: "pinned_use_hip_host_register:True", want: TorchConf{PinnedUseCudaHostRegister: true}},
		{in: "pinned_num_register_threads:1", want: TorchConf{PinnedNumRegisterThreads: 1}},
		{in: "pinned_num_register_threads:128", want: TorchConf{PinnedNumRegisterThreads: 128}},
		{in: "pinned_use_background_threads:True", want: TorchConf{PinnedUseBackgroundThreads: true}},
		{in: "pinned_reserve_segment_size_mb:64", want: TorchConf{PinnedReserveSegmentSizeMB: 64}},
		// roundup_power2_divisions: one number for every interval...
		{in: "roundup_power2_divisions:4", want: TorchConf{RoundupPower2Divisions: all16(4)}},
		{in: "roundup_power2_divisions:1", want: TorchConf{RoundupPower2Divisions: all16(1)}},
		// ... or a list: the first entry also covers the intervals below it,
		// '>' the intervals above the last one named.
		{in: "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
			want: TorchConf{RoundupPower2Divisions: table16([3]uint64{0, 9, 1}, [3]uint64{9, 10, 2}, [3]uint64{10, 11, 4}, [3]uint64{11, 16, 8})}},
		// PyTorch's own example: intervals 7 and 9 are named by no entry and stay 0.
		{in: "roundup_power2_divisions:[64:8,256:4,1024:4,>:1]",
			want: TorchConf{RoundupPower2Divisions: table16([3]uint64{0, 7, 8}, [3]uint64{8, 9, 4}, [3]uint64{10, 11, 4}, [3]uint64{11, 16, 1})}},
		{in: "roundup_power2_divisions:[>:8]", want: TorchConf{RoundupPower2Divisions: table16([3]uint64{1, 16, 8})}},
		{in: "roundup_power2_divisions:[1:2]", want: TorchConf{RoundupPower2Divisions: table16([3]uint64{0, 1, 2})}},
		{in: "roundup_power2_divisions:[65536:4]", want: TorchConf{RoundupPower2Divisions: all16(4)}}, // clamped to the last interval
		{in: "roundup_power2_divisions:[256:0,>:4]", want: TorchConf{RoundupPower2Divisions: table16([3]uint64{9, 16, 4})}},
		{in: "roundup_power2_divisions:[256:1,]", want: TorchConf{RoundupPower2Divisions: table16([3]uint64{0, 9, 1})}}, // as PyTorch: a comma before ']'.
		{in: "roundup_power2_divisions:[]", want: TorchConf{}},
		{in: "roundup_power2_divisions : [ 256 : 1 , > : 2 ]", want: TorchConf{RoundupPower2Divisions: table16([3]uint64{0, 9, 1}, [3]uint64{9, 16, 2})}},
		// Occurrences apply one after the other to the same table.
		{in: "roundup_power2_divisions:4,roundup_power2_divisions:[256:1]",
			want: TorchConf{RoundupPower2Divisions: table16([3]uint64{0, 9, 1}, [3]uint64{9, 16, 4})}},
		{in: "expandable_segments:True,max_split_size_mb:200,max_non_split_rounding_mb:40,garbage_collection_threshold:0.8," +
			"roundup_power2_divisions:[>:4],per_process_memory_fraction:0.9,backend:native,pinned_use_background_threads:True",
			want: TorchConf{ExpandableSegments: true, MaxSplitSizeMB: 200, MaxNonSplitRoundingMB: 40, GarbageCollectionThreshold: 0.8,
				RoundupPower2Divisions: table16([3]uint64{1, 16, 4}), PerProcessMemoryFraction: 0.9, FractionGiven: true, Backend: "native", PinnedUseBackgroundThreads: true}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c, warns, err := ParseTorchAllocConf(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, c)
			require.Len(t, warns, len(tc.warns), "%q", warns)
			for i, w := range tc.warns {
				require.Contains(t, warns[i], w)
			}
			requireRoundTrip(t, tc.in, c, warns)
		})
	}
}

func TestParseTorchAllocConfBad(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // substrings of the message
	}{
		// Syntax.
		{",expandable_segments:True", []string{`","`, "where a key should be"}},
		{"expandable_segments:True,,max_split_size_mb:20", []string{`","`}},
		{"expandable_segments", []string{"expandable_segments", "expected ':'"}},
		{"expandable_segments:", []string{"expandable_segments", "missing value"}},
		{"expandable_segments:,", []string{"missing value"}},
		{"expandable_segments True", []string{"expandable_segmentsTrue"}},
		{"expandable_segments:True max_split_size_mb:20", []string{"expandable_segments:Truemax_split_size_mb"}},
		{"expandable_segments:True:False", []string{"expandable_segments:True", "expected ','"}},
		{":True", []string{`":"`}},
		// Unknown keys, as PyTorch.
		{"foo:1", []string{`unrecognized key "foo"`, "Unrecognized key 'foo'"}},
		{"Expandable_Segments:True", []string{"Expandable_Segments"}},
		{"max_split_size:20", []string{"max_split_size"}},
		// Booleans are True or False, as PyTorch spells them.
		{"expandable_segments:true", []string{"expandable_segments:true", "True or False"}},
		{"expandable_segments:1", []string{"expandable_segments:1"}},
		{"expandable_segments:[True]", []string{"expandable_segments:[True]", "not a list"}},
		{"release_lock_on_cudamalloc:yes", []string{"release_lock_on_cudamalloc:yes"}},
		{"pinned_use_cuda_host_register:on", []string{"pinned_use_cuda_host_register:on"}},
		{"pinned_use_background_threads:0", []string{"pinned_use_background_threads:0"}},
		{"graph_capture_record_stream_reuse:TRUE", []string{"graph_capture_record_stream_reuse:TRUE"}},
		// Sizes.
		{"max_split_size_mb:19", []string{"max_split_size_mb:19", ">= 20"}},
		{"max_split_size_mb:0", []string{"max_split_size_mb:0"}},
		{"max_split_size_mb:-1", []string{"max_split_size_mb:-1", "whole number"}},
		{"max_split_size_mb:20MB", []string{"max_split_size_mb:20MB"}},
		{"max_split_size_mb:1e3", []string{"max_split_size_mb:1e3"}},
		{"max_split_size_mb:18446744073709551616", []string{"fits in 64 bits"}},
		{"max_split_size_mb:30,large_segment_size_mb:40", []string{"max_split_size_mb:30", ">= 40"}},
		{"max_non_split_rounding_mb:19", []string{"max_non_split_rounding_mb:19", ">= 20"}},
		{"large_segment_size_mb:10", []string{"large_segment_size_mb:10", "more than 10"}},
		{"large_segment_size_mb:x", []string{"large_segment_size_mb:x"}},
		// Fractions.
		{"garbage_collection_threshold:0", []string{"garbage_collection_threshold:0", "(0.0, 1.0)"}},
		{"garbage_collection_threshold:1", []string{"garbage_collection_threshold:1"}},
		{"garbage_collection_threshold:1.5", []string{"garbage_collection_threshold:1.5"}},
		{"garbage_collection_threshold:-0.1", []string{"garbage_collection_threshold:-0.1"}},
		{"garbage_collection_threshold:nan", []string{"garbage_collection_threshold:nan"}},
		{"garbage_collection_threshold:half", []string{"garbage_collection_threshold:half", "not a number"}},
		{"per_process_memory_fraction:1.1", []string{"per_process_memory_fraction:1.1", "per_process_memory_fraction is invalid", "[0.0, 1.0]"}},
		{"per_process_memory_fraction:-0.5", []string{"per_process_memory_fraction:-0.5"}},
		{"per_process_memory_fraction:NaN", []string{"per_process_memory_fraction:NaN"}},
		// The backend.
		{"backend:cudaMallocAsync", []string{"backend:cudaMallocAsync", "cannot serve memory from cudaMallocAsync"}},
		{"backend:hipMallocAsync", []string{"backend:hipMallocAsync", "options are native and cudaMallocAsync"}},
		{"backend:Native", []string{"backend:Native"}},
		// The pinned allocator's numbers.
		{"pinned_num_register_threads:0", []string{"pinned_num_register_threads:0", "power of 2"}},
		{"pinned_num_register_threads:3", []string{"pinned_num_register_threads:3", "power of 2"}},
		{"pinned_num_register_threads:256", []string{"pinned_num_register_threads:256", "at most 128"}},
		{"pinned_reserve_segment_size_mb:0", []string{"pinned_reserve_segment_size_mb:0", "more than 0"}},
		// roundup_power2_divisions.
		{"roundup_power2_divisions:3", []string{"roundup_power2_divisions:3", "power of 2"}},
		{"roundup_power2_divisions:0", []string{"roundup_power2_divisions:0", "power of 2"}},
		{"roundup_power2_divisions:x", []string{"roundup_power2_divisions:x"}},
		{"roundup_power2_divisions:[256:3]", []string{"roundup_power2_divisions:[256:3]", "power of 2 or 0"}},
		{"roundup_power2_divisions:[3:2]", []string{"roundup_power2_divisions:[3:2]", "intervals must be powers of 2"}},
		{"roundup_power2_divisions:[0:2]", []string{"roundup_power2_divisions:[0:2]"}},
		{"roundup_power2_divisions:[>:3]", []string{"roundup_power2_divisions:[>:3]"}},
		{"roundup_power2_divisions:[256:1", []string{"roundup_power2_divisions", "closing ']'"}},
		{"roundup_power2_divisions:[256:1;512:2]", []string{"roundup_power2_divisions:[256:1;512:2]"}},
		{"roundup_power2_divisions:[256]", []string{"BOUNDARY:DIVISIONS"}},
		{"roundup_power2_divisions:[256:1:2]", []string{"expected ','"}},
		{"roundup_power2_divisions:[a:2]", []string{`"a"`}},
		{"roundup_power2_divisions:[256:x]", []string{`"x"`}},
		{"roundup_power2_divisions:[[256:1]]", []string{"roundup_power2_divisions"}},
		{"roundup_power2_divisions:]", []string{"missing value"}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			_, _, err := ParseTorchAllocConf(tc.in)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalid)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// torchRoundSize is PyTorch's round_size (c10/cuda/CUDACachingAllocator.cpp)
// with its roundup_power2_next_division, transcribed with size_t's
// wrap-around arithmetic, as the reference for roundDivisions.
func torchRoundSize(size uint64, div [RoundupIntervals]uint64) uint64 {
	const kMinBlockSize = 512
	if size < kMinBlockSize {
		return kMinBlockSize
	}
	logSize := 63 - bits.LeadingZeros64(size)
	index := 0
	if logSize > 20 {
		index = logSize - 20
	}
	divisions := div[min(index, RoundupIntervals-1)]
	if divisions > 1 && size > kMinBlockSize*divisions {
		if size&(size-1) == 0 {
			return size
		}
		floor := uint64(1) << (63 - bits.LeadingZeros64(size))
		step := floor >> (63 - bits.LeadingZeros64(divisions))
		if step == 0 {
			return floor << 1
		}
		lo := size &^ (step - 1)
		if lo == size {
			return size
		}
		return lo + step
	}
	return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize)
}

func TestRoundDivisions(t *testing.T) {
	listTable, _, err := ParseTorchAllocConf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
	require.NoError(t, err)
	for _, tc := range []struct {
		n    uint64
		div  [RoundupIntervals]uint64
		want uint64
	}{
		{1, all16(4), 512},
		{1200, all16(4), 1536},                                         // 1200 ≤ 512·4: plain rounding
		{2048, all16(4), 2048},                                         // not above 512·4
		{3000, all16(4), 3072},                                         // steps of 512 between 2 KiB and 4 KiB
		{4097, all16(16), 4608},                                        // 4097 ≤ 512·16: plain rounding
		{5*mib + 1, all16(4), 6 * mib},                                 // steps of 1 MiB between 4 and 8 MiB
		{5 * mib, all16(4), 5 * mib},                                   // on a step already
		{8 * mib, all16(4), 8 * mib},                                   // a power of two
		{mib + 1, all16(8), mib + 128<<10},                             // steps of 128 KiB between 1 and 2 MiB
		{3*mib + 1, all16(2), 4 * mib},                                 // two steps: the power of two above
		{3*mib + 1, all16(1), 3*mib + 512},                             // 1 division: plain rounding
		{3*mib + 1, all16(0), 3*mib + 512},                             // 0: plain rounding
		{100*mib + 1, listTable.RoundupPower2Divisions, 100*mib + 512}, // interval 6: 1
		{300 * mib, listTable.RoundupPower2Divisions, 300 * mib},       // interval 8: 1
		{600*mib + 1, listTable.RoundupPower2Divisions, 768 * mib},     // interval 9: 2
		{1536*mib + 1, listTable.RoundupPower2Divisions, 1792 * mib},   // interval 10: 4
		{3072*mib + 1, listTable.RoundupPower2Divisions, 3328 * mib},   // interval 11: 8
		{100<<30 + 1, listTable.RoundupPower2Divisions, 104 << 30},     // beyond 32 GiB: the last interval (8)
		{maxRequest, all16(4), maxRequest},
		{maxRequest - 1, all16(4), maxRequest},
	} {
		got := roundDivisions(tc.n, &tc.div)
		require.Equal(t, tc.want, got, "n=%d div=%v", tc.n, tc.div)
		require.Equal(t, torchRoundSize(tc.n, tc.div), got, "PyTorch's formula, n=%d", tc.n)
	}
	// Against PyTorch's formula for many sizes and divisions: equal, a
	// multiple of 512, at least the request and less than 1/d above it.
	sizes := []uint64{1, 511, 512, 513, 1023, 1024, 1025, 4095, 4096, 4097, 65535, 65537}
	for e := 10; e <= 56; e++ {
		p := uint64(1) << e
		sizes = append(sizes, p-1, p, p+1, p+p/3, p+p/2+7, p+p-513)
	}
	for _, d := range []uint64{0, 1, 2, 4, 8, 16, 32, 64, 128, 1 << 10, 1 << 20, 1 << 40} {
		div := all16(d)
		for _, n := range sizes {
			if n > maxRequest {
				continue
			}
			got := roundDivisions(n, &div)
			require.Equal(t, torchRoundSize(n, div), got, "n=%d d=%d", n, d)
			require.Zero(t, got%512, "n=%d d=%d", n, d)
			require.GreaterOrEqual(t, got, n)
			require.LessOrEqual(t, got, maxRequest)
		}
	}
	// Each interval uses its own divisions.
	var div [RoundupIntervals]uint64
	for i := range div {
		div[i] = 1 << (i % 5)
	}
	for e := 9; e < 40; e++ {
		for _, n := range []uint64{1<<e + 1, 1<<e + 1<<e/3, 1<<(e+1) - 1} {
			require.Equal(t, torchRoundSize(n, div), roundDivisions(n, &div), "n=%d", n)
		}
	}
}

func TestConfigFromEnvTorch(t *testing.T) {
	env := envOf
	type want struct {
		cfg   Config
		warns []string // substrings, one per warning
	}
	for _, tc := range []struct {
		name string
		env  []string
		want want
	}{
		{"nothing", nil, want{cfg: Config{}}},
		{"PYTORCH_CUDA_ALLOC_CONF", []string{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"},
			want{cfg: Config{Expandable: true, ExpandableChunk: 20 * mib, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait, AllocConf: "expandable_segments:True"}}},
		{"PYTORCH_ALLOC_CONF", []string{"PYTORCH_ALLOC_CONF", "expandable_segments:True"},
			want{cfg: Config{Expandable: true, ExpandableChunk: 20 * mib, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait, AllocConf: "expandable_segments:True"}}},
		{"an empty PYTORCH_CUDA_ALLOC_CONF counts as unset",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "", "PYTORCH_ALLOC_CONF", "max_split_size_mb:64"},
			want{cfg: Config{MaxSplit: 64 * mib, AllocConf: "max_split_size_mb:64"}}},
		{"both: PYTORCH_CUDA_ALLOC_CONF wins, as in torch 2.11",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64", "PYTORCH_ALLOC_CONF", "expandable_segments:True"},
			want{cfg: Config{MaxSplit: 64 * mib, AllocConf: "max_split_size_mb:64"},
				warns: []string{`PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF are both set; PYTORCH_ALLOC_CONF="expandable_segments:True" is ignored`}}},
		{"both, the same text: no warning",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64", "PYTORCH_ALLOC_CONF", "max_split_size_mb:64"},
			want{cfg: Config{MaxSplit: 64 * mib, AllocConf: "max_split_size_mb:64"}}},
		{"every honoured key",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:200,max_non_split_rounding_mb:40,garbage_collection_threshold:0.75," +
				"roundup_power2_divisions:[>:4],per_process_memory_fraction:0.5"},
			want{cfg: Config{MaxSplit: 200 * mib, MaxNonSplitRounding: 40 * mib, GCThreshold: 0.75,
				RoundupPower2Divisions: table16([3]uint64{1, 16, 4}), LimitFraction: 0.5,
				AllocConf: "max_split_size_mb:200,max_non_split_rounding_mb:40,garbage_collection_threshold:0.75," +
					"roundup_power2_divisions:[>:4],per_process_memory_fraction:0.5"}}},
		{"a fraction of 1 is no cap", []string{"PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:1"},
			want{cfg: Config{AllocConf: "per_process_memory_fraction:1"}}},
		{"a fraction of 0 is a cap of 0 bytes", []string{"PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0"},
			want{cfg: Config{LimitZero: true, AllocConf: "per_process_memory_fraction:0"}}},
		{"ignored settings warn, naming the variable",
			[]string{"PYTORCH_ALLOC_CONF", "release_lock_on_cudamalloc:True,pinned_num_register_threads:4"},
			want{cfg: Config{AllocConf: "release_lock_on_cudamalloc:True,pinned_num_register_threads:4"},
				warns: []string{"PYTORCH_ALLOC_CONF: release_lock_on_cudamalloc:True is ignored"}}},
		{"garbage collection without a cap",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.5"},
			want{cfg: Config{GCThreshold: 0.5, AllocConf: "garbage_collection_threshold:0.5"},
				warns: []string{"PYTORCH_CUDA_ALLOC_CONF: garbage_collection_threshold:0.5 has no effect until a memory cap is set"}}},
		{"garbage collection with SYMM_POOL_LIMIT's cap",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.5", "SYMM_POOL_LIMIT", "8GiB"},
			want{cfg: Config{GCThreshold: 0.5, Limit: 8 << 30, AllocConf: "garbage_collection_threshold:0.5"}}},
		{"garbage collection with expandable segments",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9", "SYMM_POOL_EXPANDABLE", "1"},
			want{cfg: Config{GCThreshold: 0.5, LimitFraction: 0.9, Expandable: true, ExpandableChunk: 20 * mib, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait, AllocConf: "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9"},
				warns: []string{"has no effect with expandable segments"}}},
		// SYMM_POOL_ variables win for their field.
		{"SYMM_POOL_EXPANDABLE=0 over expandable_segments:True",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "SYMM_POOL_EXPANDABLE", "0"},
			want{cfg: Config{AllocConf: "expandable_segments:True"},
				warns: []string{"SYMM_POOL_EXPANDABLE=0 overrides expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF"}}},
		{"SYMM_POOL_EXPANDABLE=1 over expandable_segments:False",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False", "SYMM_POOL_EXPANDABLE", "1"},
			want{cfg: Config{Expandable: true, ExpandableChunk: 20 * mib, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait, AllocConf: "expandable_segments:False"}}},
		{"SYMM_POOL_EXPANDABLE=1 agrees", []string{"PYTORCH_ALLOC_CONF", "expandable_segments:True", "SYMM_POOL_EXPANDABLE", "1"},
			want{cfg: Config{Expandable: true, ExpandableChunk: 20 * mib, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait, AllocConf: "expandable_segments:True"}}},
		{"SYMM_POOL_MAX_SPLIT over max_split_size_mb",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512", "SYMM_POOL_MAX_SPLIT", "256MiB"},
			want{cfg: Config{MaxSplit: 256 * mib, AllocConf: "max_split_size_mb:512"},
				warns: []string{"SYMM_POOL_MAX_SPLIT=256MiB overrides max_split_size_mb:512 from PYTORCH_CUDA_ALLOC_CONF"}}},
		{"SYMM_POOL_MAX_SPLIT=0 turns it off",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512", "SYMM_POOL_MAX_SPLIT", "0"},
			want{cfg: Config{AllocConf: "max_split_size_mb:512"}, warns: []string{"SYMM_POOL_MAX_SPLIT=0 overrides"}}},
		{"SYMM_POOL_MAX_SPLIT agrees", []string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512", "SYMM_POOL_MAX_SPLIT", "512MiB"},
			want{cfg: Config{MaxSplit: 512 * mib, AllocConf: "max_split_size_mb:512"}}},
		{"SYMM_POOL_LIMIT over per_process_memory_fraction",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0.5", "SYMM_POOL_LIMIT", "8GiB"},
			want{cfg: Config{Limit: 8 << 30, AllocConf: "per_process_memory_fraction:0.5"},
				warns: []string{"SYMM_POOL_LIMIT=8GiB overrides per_process_memory_fraction:0.5 from PYTORCH_CUDA_ALLOC_CONF"}}},
		{"SYMM_POOL_LIMIT agrees", []string{"PYTORCH_CUDA_ALLOC_CONF", "per_process_memory_fraction:0.5", "SYMM_POOL_LIMIT", "50%"},
			want{cfg: Config{LimitFraction: 0.5, AllocConf: "per_process_memory_fraction:0.5"}}},
		// Expandable segments' library defaults: chunks of the large
		// segment size, free pages unmapped.
		{"expandable chunks follow large_segment_size_mb",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,large_segment_size_mb:40"},
			want{cfg: Config{Expandable: true, ExpandableChunk: 40 * mib, UnmapFreePages: true, FreePagesWait: DefaultFreePagesWait, LargeSegment: 40 * mib,
				AllocConf: "expandable_segments:True,large_segment_size_mb:40"}}},
		{"SYMM_POOL_EXPANDABLE_CHUNK and SYMM_POOL_UNMAP_FREE_PAGES=0 win",
			[]string{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "SYMM_POOL_EXPANDABLE_CHUNK", "2MiB", "SYMM_POOL_UNMAP_FREE_PAGES", "0"},
			want{cfg: Config{Expandable: true, ExpandableChunk: 2 * mib, AllocConf: "expandable_segments:True"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, warns, err := ConfigFromEnv(env(tc.env...))
			require.NoError(t, err)
			if !tc.want.cfg.Expandable {
				// What expandable segments would do once turned on.
				tc.want.cfg.ExpandableChunk, tc.want.cfg.UnmapFreePages, tc.want.cfg.FreePagesWait = tc.want.cfg.DefaultExpandableChunk(), true, DefaultFreePagesWait
			}
			require.Equal(t, tc.want.cfg, c)
			require.Len(t, warns, len(tc.want.warns), "%q", warns)
			for i, w := range tc.want.warns {
				require.Contains(t, warns[i], w)
			}
			// Each setting warns once, whatever the number of its occurrences.
			seen := map[string]bool{}
			for _, w := range warns {
				require.False(t, seen[w], "warned twice: %s", w)
				seen[w] = true
			}
		})
	}
	for _, bad := range [][]string{
		{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:yes"},
		{"PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync"},
		{"PYTORCH_ALLOC_CONF", "foo:1"},
		// The variable torch 2.11 reads is the one checked.
		{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:1", "PYTORCH_ALLOC_CONF", "max_split_size_mb:100"},
	} {
		_, _, err := ConfigFromEnv(env(bad...))
		require.Error(t, err, "%v", bad)
		require.ErrorIs(t, err, ErrInvalid)
		require.Contains(t, err.Error(), bad[0]+"=", "the message names the variable")
		require.Contains(t, err.Error(), bad[1], "and its text")
	}
	// The PyTorch variable PyTorch ignores is not checked either.
	_, _, err := ConfigFromEnv(env("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:100", "PYTORCH_ALLOC_CONF", "max_split_size_mb:1"))
	require.NoError(t, err)
	// Values a Config holds from the environment are ones New takes.
	c, _, err := ConfigFromEnv(env("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:[1:2,>:64],garbage_collection_threshold:0.9999"))
	require.NoError(t, err)
	_, err = New(newFake(1), c)
	require.NoError(t, err)
}

// ---- the pool with PyTorch's settings ---------------------------------------------

func TestPoolRoundupPower2Divisions(t *testing.T) {
	p, _ := newPool(t, Config{RoundupPower2Divisions: all16(4)})
	for _, tc := range []struct{ n, want uint64 }{
		{700, 1024}, {3000, 3072}, {5*mib + 1, 6 * mib}, {12*mib + 1, 14 * mib}, {48*mib + 1, 56 * mib},
	} {
		ptr, pl, err := p.Alloc(0, sA, tc.n)
		require.NoError(t, err)
		require.Equal(t, tc.want, pl.Size, "request of %d bytes", tc.n)
		require.NoError(t, p.Free(0, sA, ptr, tc.n))
	}
	check(t, p)
	// Graph pools round as PyTorch rounds every request it serves...
	id := PoolID{First: 1}
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	ptr, size, err := p.AllocIn(0, sA, 5*mib+1, id)
	require.NoError(t, err)
	require.EqualValues(t, 6*mib, size)
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.Free(0, sA, ptr, 5*mib+1))
	require.NoError(t, p.ReleasePool(0, id, false))
	// ... but a MemPool's segments are exactly what PyTorch's allocator,
	// which rounded the request already, asks for.
	ptr, size, err = p.AllocSegment(0, sA, 5*mib+1)
	require.NoError(t, err)
	require.EqualValues(t, 5*mib+512, size)
	require.NoError(t, p.Free(0, sA, ptr, 5*mib+1))
	check(t, p)
	// A table New cannot take.
	for _, bad := range []Config{
		{RoundupPower2Divisions: table16([3]uint64{3, 4, 3})},
		{GCThreshold: 1}, {GCThreshold: -0.5}, {GCThreshold: math.NaN()},
	} {
		_, err := New(newFake(1), bad)
		require.ErrorIs(t, err, ErrInvalid, "%+v", bad)
	}
}

func TestPoolMaxNonSplitRounding(t *testing.T) {
	for _, tc := range []struct {
		slack    uint64
		newSegOK bool // a 170 MiB request takes a new segment rather than the idle 200 MiB one
	}{{0, true}, {20 * mib, true}, {40 * mib, false}} {
		p, fb := newPool(t, Config{MaxSplit: 100 * mib, MaxNonSplitRounding: tc.slack})
		big := mustAlloc(t, p, 0, sA, 200*mib)
		require.NoError(t, p.Free(0, sA, big, 200*mib))
		before := fb.allocs
		ptr := mustAlloc(t, p, 0, sA, 170*mib)
		require.Equal(t, tc.newSegOK, fb.allocs > before, "slack %d", tc.slack)
		require.Equal(t, !tc.newSegOK, ptr == big, "slack %d", tc.slack)
		// A stream that steals an idle oversize segment keeps the same tolerance.
		require.NoError(t, p.Free(0, sA, ptr, 170*mib))
		require.NoError(t, p.EmptyCache())
		check(t, p)
	}
}

// The cached path stays free of heap allocations with every PyTorch setting
// that touches it (rounding, the collector's clock).
func TestCachedPathNoHeapAllocTorchSettings(t *testing.T) {
	p, _ := newPool(t, Config{RoundupPower2Divisions: all16(4), GCThreshold: 0.5, Limit: 1 << 30, MaxSplit: 100 * mib})
	requireCachedNoHeapAlloc(t, p, 700, 3000, 1<<20, 5*mib+1, 64<<20, 150*mib+3)
}

// gcScene sets up device 0 with three idle large segments of known ages and
// reserved bytes over the collector's line (when the pool has a cap):
//
//	stream sA: a1 (30 MiB, idle longest), a2 (30 MiB, idle a while), a4 (40 MiB, live)
//	stream sB: x (12 MiB, reused all along: idle, youngest)
//
// It returns the addresses of a1, a2, x.
func gcScene(t *testing.T, p *Pool) (a1, a2, x uintptr) {
	t.Helper()
	warm := func(times int) { // cached requests on sB advance the clock; x stays young
		for i := 0; i < times; i++ {
			ptr := mustAlloc(t, p, 0, sB, 12*mib)
			require.Equal(t, x, ptr)
			require.NoError(t, p.Free(0, sB, ptr, 12*mib))
		}
	}
	x = mustAlloc(t, p, 0, sB, 12*mib)
	require.NoError(t, p.Free(0, sB, x, 12*mib))
	a1 = mustAlloc(t, p, 0, sA, 30*mib)
	a2 = mustAlloc(t, p, 0, sA, 30*mib)
	mustAlloc(t, p, 0, sA, 20*mib) // a3, live
	require.NoError(t, p.Free(0, sA, a1, 30*mib))
	warm(10)
	require.NoError(t, p.Free(0, sA, a2, 30*mib))
	warm(2)
	// 92 MiB reserved: under a 100 MiB line, so this new segment collects nothing.
	mustAlloc(t, p, 0, sA, 40*mib) // a4, live
	require.EqualValues(t, 132*mib, stat(t, p, 0, "reserved_bytes.all.current"))
	return a1, a2, x
}

// segmentsAt lists the segment addresses of device 0.
func segmentsAt(p *Pool) map[uintptr]bool {
	m := map[uintptr]bool{}
	for _, s := range p.Snapshot().Segments {
		m[uintptr(s.Address)] = true
	}
	return m
}

func TestGarbageCollection(t *testing.T) {
	// Line: 0.25 × 400 MiB = 100 MiB.
	p, fb := newPool(t, Config{Limit: 400 * mib, GCThreshold: 0.25})
	a1, a2, x := gcScene(t, p)
	frees := fb.frees
	// 132 MiB reserved > 100: before taking a 50 MiB segment, the collector
	// frees 32 MiB or more, oldest first: a1 (age 14) in the first round
	// (mean age 20/3), a2 (age 4) in the second (mean 3); x (age 2) stays.
	mustAlloc(t, p, 0, sA, 50*mib)
	require.Equal(t, frees+2, fb.frees)
	segs := segmentsAt(p)
	require.False(t, segs[a1], "the oldest idle segment is collected")
	require.False(t, segs[a2], "and the next oldest, to reach the target")
	require.True(t, segs[x], "the youngest stays cached")
	require.EqualValues(t, 122*mib, stat(t, p, 0, "reserved_bytes.all.current"))
	check(t, p)
	// 122 MiB > 100 again: the next new segment collects x, the last
	// candidate (a request x fits would take it from sB instead).
	mustAlloc(t, p, 0, sA, 14*mib)
	require.False(t, segmentsAt(p)[x])
	check(t, p)
}

func TestGarbageCollectionNeedsACap(t *testing.T) {
	p, fb := newPool(t, Config{GCThreshold: 0.25})
	a1, _, _ := gcScene(t, p)
	frees := fb.frees
	mustAlloc(t, p, 0, sA, 50*mib)
	require.Equal(t, frees, fb.frees, "no cap: nothing to collect against, as in PyTorch")
	// A cap set at run time (torch.cuda.set_per_process_memory_fraction
	// reaches SetMemoryFraction; SetLimit likewise) turns the collector on.
	require.NoError(t, p.SetLimit(0, 400*mib))
	mustAlloc(t, p, 0, sA, 60*mib)
	require.Greater(t, fb.frees, frees)
	require.False(t, segmentsAt(p)[a1])
	check(t, p)
}

func TestGarbageCollectionOff(t *testing.T) {
	// No threshold: the cap alone collects nothing before the limit is hit.
	p, fb := newPool(t, Config{Limit: 400 * mib})
	gcScene(t, p)
	frees := fb.frees
	mustAlloc(t, p, 0, sA, 50*mib)
	require.Equal(t, frees, fb.frees)

	// Nor while a graph capture may be under way (a route to a private pool is open).
	p, fb = newPool(t, Config{Limit: 400 * mib, GCThreshold: 0.25})
	gcScene(t, p)
	id := PoolID{First: 7}
	require.NoError(t, p.BeginAllocateToPool(0, id, nil))
	frees = fb.frees
	mustAlloc(t, p, 0, sA, 50*mib)
	require.Equal(t, frees, fb.frees)
	require.NoError(t, p.EndAllocateToPool(0, id))
	require.NoError(t, p.ReleasePool(0, id, false))

	// Nor expandable segments (PyTorch's collector skips them too): a new
	// segment over the line leaves another stream's idle one mapped.
	p, _ = expandablePool(t, 1<<30, Config{Limit: 400 * mib, GCThreshold: 0.25})
	big := mustAlloc(t, p, 0, sA, 150*mib)
	require.NoError(t, p.Free(0, sA, big, 150*mib))
	mustAlloc(t, p, 0, sB, 60*mib)
	require.GreaterOrEqual(t, stat(t, p, 0, "reserved_bytes.all.current"), int64(210*mib))
}

func TestSnapshotAllocatorSettings(t *testing.T) {
	c, _, err := ConfigFromEnv(func(k string) string {
		if k == EnvTorchAllocConf {
			return "roundup_power2_divisions:[2:4],garbage_collection_threshold:0.5,per_process_memory_fraction:0.5"
		}
		return ""
	})
	require.NoError(t, err)
	p, _ := newPool(t, c)
	s := p.Snapshot().AllocatorSettings
	require.Equal(t, c.AllocConf, s["PYTORCH_CUDA_ALLOC_CONF"])
	require.Equal(t, 0.5, s["garbage_collection_threshold"])
	r := s["roundup_power2_divisions"].(map[string]any)
	require.Len(t, r, RoundupIntervals)
	require.EqualValues(t, 4, r["1"])
	require.EqualValues(t, 4, r["2"])
	require.EqualValues(t, 0, r["4"])
	require.Contains(t, r, "32768")
}

// FuzzParseTorchAllocConf: the parser never panics, what it accepts reads
// back the same from String, and a table it accepts rounds every size to a
// multiple of 512 that fits the request.
func FuzzParseTorchAllocConf(f *testing.F) {
	for _, s := range []string{
		"", "expandable_segments:True", "max_split_size_mb:20,garbage_collection_threshold:0.5",
		"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "roundup_power2_divisions:4",
		"large_segment_size_mb:40,max_split_size_mb:40", "backend:native", "per_process_memory_fraction:0.25",
		"pinned_num_register_threads:8,pinned_reserve_segment_size_mb:1", "roundup_power2_divisions:[>:8,1:2]",
		"foo:bar", ",", "a:[", "roundup_power2_divisions:[256:1,]", " release_lock_on_cudamalloc : True ,",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, warns, err := ParseTorchAllocConf(s)
		if err != nil {
			if !strings.Contains(err.Error(), ErrInvalid.Error()) {
				t.Fatalf("%q: error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		back, w2, err := ParseTorchAllocConf(c.String())
		if err != nil || back != c || fmt.Sprint(w2) != fmt.Sprint(warns) {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, c, c.String(), back, err)
		}
		for _, n := range []uint64{1, 513, uint64(len(s))*mib + 1, 3*mib + 12345, maxRequest - 1} {
			r := roundDivisions(n, &c.RoundupPower2Divisions)
			if r%512 != 0 || r < n || r > maxRequest {
				t.Fatalf("%q: %d rounds to %d", s, n, r)
			}
		}
	})
}
