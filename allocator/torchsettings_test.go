package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// large_segment_size_mb: requests from 1 to 10 MiB get segments of that size.
func TestLargeSegmentSize(t *testing.T) {
	for _, c := range []struct {
		conf string
		want uint64
	}{{"", 20 << 20}, {"large_segment_size_mb:40", 40 << 20}, {"large_segment_size_mb:11,max_split_size_mb:11", 11 << 20}} {
		t.Run(c.conf, func(t *testing.T) {
			tc, _, err := ParseTorchAllocConf(c.conf)
			require.NoError(t, err)
			f := newFake(1)
			p, err := New(f, tc.Config())
			require.NoError(t, err)
			ptr, _, err := p.Alloc(0, 0, 2<<20)
			require.NoError(t, err)
			require.Equal(t, c.want, f.used[0])
			require.NoError(t, p.Free(0, 0, ptr, 2<<20))
		})
	}
	_, err := New(newFake(1), Config{LargeSegment: 10 << 20})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestMergeTorchSettings(t *testing.T) {
	for _, c := range []struct{ env, call, want string }{
		{"", "expandable_segments:True", "expandable_segments:True"},
		// max_split_size_mb, roundup_power2_divisions and
		// garbage_collection_threshold go back to their defaults unless given;
		// the other keys keep the environment's.
		{"max_split_size_mb:64,expandable_segments:True,large_segment_size_mb:40", "per_process_memory_fraction:0.5",
			"expandable_segments:True,large_segment_size_mb:40,per_process_memory_fraction:0.5"},
		{"garbage_collection_threshold:0.5", "garbage_collection_threshold:0.25", "garbage_collection_threshold:0.25"},
		{"release_lock_on_hipmalloc:True", "", "release_lock_on_cudamalloc:True"},
	} {
		got, err := MergeTorchSettings(c.env, c.call)
		require.NoError(t, err, c)
		require.Equal(t, c.want, got, c)
	}
	_, err := MergeTorchSettings("", "max_split_size_mb:1")
	require.ErrorIs(t, err, ErrInvalid)
}

// Once the pool exists, a settings call applies the memory fraction and
// refuses to change the pool's geometry, changing nothing then.
func TestApplyTorchSettings(t *testing.T) {
	tc, _, err := ParseTorchAllocConf("max_split_size_mb:64")
	require.NoError(t, err)
	p, err := New(newFake(2), tc.Config())
	require.NoError(t, err)
	frac := func(dev int) float64 {
		f, err := p.MemoryFraction(dev)
		require.NoError(t, err)
		return f
	}
	require.Equal(t, 1.0, frac(0))

	// As in PyTorch, the fraction of a run-time call changes nothing.
	_, err = p.ApplyTorchSettings("max_split_size_mb:64,per_process_memory_fraction:0.5")
	require.NoError(t, err)
	require.Equal(t, 1.0, frac(0))
	require.Equal(t, 1.0, frac(1))
	require.Equal(t, uint64(0), p.Limit(1))
	require.NoError(t, p.SetMemoryFraction(0, 0.5)) // the cap the API sets; the calls below keep it

	for _, c := range []struct{ text, key string }{
		{"max_split_size_mb:128,per_process_memory_fraction:0.25", "max_split_size_mb:128"},
		{"per_process_memory_fraction:0.25", "max_split_size_mb:unlimited"}, // reset to its default: a change
		{"max_split_size_mb:64,expandable_segments:True", "expandable_segments:True"},
		{"max_split_size_mb:64,large_segment_size_mb:40", "large_segment_size_mb:40"},
		{"max_split_size_mb:64,garbage_collection_threshold:0.5", "garbage_collection_threshold:0.5"},
		{"max_split_size_mb:64,roundup_power2_divisions:4", "roundup_power2_divisions"},
		{"max_split_size_mb:64,max_non_split_rounding_mb:40", "max_non_split_rounding_mb:40"},
	} {
		_, err := p.ApplyTorchSettings(c.text)
		require.ErrorIs(t, err, ErrBusy, c.text)
		require.ErrorContains(t, err, c.key, c.text)
		require.ErrorContains(t, err, "cannot change at run time", c.text)
		require.Equal(t, 0.5, frac(0), "nothing changes: %s", c.text)
	}
	// The same geometry again, keys libsymm leaves to PyTorch, and a
	// fraction (changing nothing).
	warns, err := p.ApplyTorchSettings("max_split_size_mb:64,expandable_segments:False,large_segment_size_mb:20,backend:native," +
		"pinned_num_register_threads:8,graph_capture_record_stream_reuse:True,per_process_memory_fraction:1")
	require.NoError(t, err)
	require.Len(t, warns, 1)
	require.Equal(t, 0.5, frac(0))
	_, err = p.ApplyTorchSettings("max_split_size_mb:64,bogus:1")
	require.ErrorIs(t, err, ErrInvalid)
	require.NoError(t, p.SetLimit(0, 1<<30))
	require.Equal(t, 1.0, frac(0), "a cap in bytes is no fraction")
}
