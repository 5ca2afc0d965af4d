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

// Once the pool exists, a settings call changes each of the pool's settings
// for the requests and segments that come after it, as PyTorch's does; a
// call that does not give max_split_size_mb, roundup_power2_divisions or
// garbage_collection_threshold sets them back to their defaults; the memory
// fraction of a call changes nothing; a refused call changes nothing.
func TestApplyTorchSettings(t *testing.T) {
	v := NewVirtual(2, 1<<30)
	p, err := New(v, Config{})
	require.NoError(t, err)
	apply := func(text string) {
		t.Helper()
		_, err := p.ApplyTorchSettings(text)
		require.NoError(t, err, text)
		require.Equal(t, text, p.Settings().AllocConf)
	}
	allocated := func() int64 { return stat(t, p, 0, "allocated_bytes.all.current") }
	reserved := func() int64 { return stat(t, p, 0, "reserved_bytes.all.current") }

	// large_segment_size_mb: the next 1-10 MiB request's new segment.
	apply("large_segment_size_mb:40")
	r0 := reserved()
	mustAlloc(t, p, 0, 1, 2*mib)
	require.EqualValues(t, 40*mib, reserved()-r0)

	// roundup_power2_divisions: 5 MiB + 1 is rounded to 6 MiB (4 steps
	// between 4 and 8 MiB); a call without the key rounds to 512 bytes again.
	apply("roundup_power2_divisions:4")
	a0 := allocated()
	mustAlloc(t, p, 0, 2, 5*mib+1)
	require.EqualValues(t, 6*mib, allocated()-a0)
	apply("large_segment_size_mb:40")
	a0 = allocated()
	mustAlloc(t, p, 0, 3, 5*mib+1)
	require.EqualValues(t, 5*mib+512, allocated()-a0)

	// max_split_size_mb: the next request of at least that size is
	// oversize; a call without it makes nothing oversize again.
	apply("max_split_size_mb:64")
	require.EqualValues(t, 64*mib, p.Settings().MaxSplit)
	mustAlloc(t, p, 0, 4, 80*mib)
	require.EqualValues(t, 1, stat(t, p, 0, "oversize_allocations.current"))
	apply("")
	mustAlloc(t, p, 0, 4, 80*mib)
	require.EqualValues(t, 1, stat(t, p, 0, "oversize_allocations.current"))

	// expandable_segments: new default-pool segments are expandable, in a
	// shard of their own per stream; frees find each block's own shard;
	// turned off, new segments are fixed again and the expandable ones
	// stay what they are.
	apply("expandable_segments:True")
	require.True(t, p.Expandable())
	x := mustAlloc(t, p, 0, 5, 3*mib)
	require.True(t, p.Settings().Expandable)
	apply("expandable_segments:False")
	require.False(t, p.Expandable())
	f := mustAlloc(t, p, 0, 5, 3*mib)
	require.NotEqual(t, x, f)
	require.NoError(t, p.Free(0, 5, x, 3*mib))
	require.NoError(t, p.Free(0, 5, f, 3*mib))
	kinds := func() map[bool]int {
		k := map[bool]int{}
		for _, seg := range p.Snapshot().Segments {
			k[seg.IsExpandable]++
		}
		return k
	}
	require.Equal(t, 1, kinds()[true], "the expandable segment stays")
	segs := stat(t, p, 0, "segment.all.current")
	require.NoError(t, p.CheckInvariants())
	require.NoError(t, p.EmptyCache())
	require.Zero(t, kinds()[true], "empty_cache releases both kinds")
	require.Equal(t, segs-2, stat(t, p, 0, "segment.all.current"))
	require.NoError(t, p.CheckInvariants())

	// A refused call changes nothing.
	apply("max_split_size_mb:64,garbage_collection_threshold:0.5")
	for _, text := range []string{"max_split_size_mb:1", "garbage_collection_threshold:1.5", "bogus:1", "large_segment_size_mb:5"} {
		_, err := p.ApplyTorchSettings(text)
		require.ErrorIs(t, err, ErrInvalid, text)
		require.EqualValues(t, 64*mib, p.Settings().MaxSplit, text)
		require.Equal(t, 0.5, p.Settings().GCThreshold, text)
	}
	q, err := New(hideExpander{v}, Config{})
	require.NoError(t, err)
	_, err = q.ApplyTorchSettings("expandable_segments:True,max_split_size_mb:64")
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "cannot reserve address space")
	require.False(t, q.Expandable())
	require.Zero(t, q.Settings().MaxSplit)

	// As in PyTorch, the fraction of a run-time call changes nothing.
	_, err = p.ApplyTorchSettings("per_process_memory_fraction:0.5")
	require.NoError(t, err)
	fr, err := p.MemoryFraction(0)
	require.NoError(t, err)
	require.Equal(t, 1.0, fr)
}
