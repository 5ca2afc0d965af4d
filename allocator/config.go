package allocator

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/libsymm/libsymm/internal/settings"
)

// ParseSize reads a byte count: a non-negative integer, optionally followed
// by B, or a non-negative integer or decimal followed by a unit K/M/G/T
// (powers of 1024; "KiB", "KB" and "K" all mean 1024), rounded down to a
// whole byte. A number of bytes is whole: "1.5" and "1.5B" are refused, as
// is a decimal that comes to less than one byte ("0.0001K"), so that no
// typo becomes a cap of 1 byte or of none. Spaces around the number and unit
// are allowed; case is ignored. Examples: "4096", "512MiB", "1.5 GiB", "2g".
func ParseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("%w: empty size", ErrInvalid)
	}
	if t[0] == '-' {
		return 0, fmt.Errorf("%w: size %q is negative (a byte count is 0 or more)", ErrInvalid, s)
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	shift := 0
	switch strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "i") {
	case "":
		if unit != "" && unit != "b" {
			return 0, fmt.Errorf("%w: size %q: unknown unit %q", ErrInvalid, s, unit)
		}
	case "k":
		shift = 10
	case "m":
		shift = 20
	case "g":
		shift = 30
	case "t":
		shift = 40
	default:
		return 0, fmt.Errorf("%w: size %q: unknown unit %q (use B, KiB, MiB, GiB or TiB)", ErrInvalid, s, unit)
	}
	if num == "" {
		return 0, fmt.Errorf("%w: size %q has no number", ErrInvalid, s)
	}
	if shift == 0 && strings.Contains(num, ".") {
		return 0, fmt.Errorf("%w: size %q: a size without a unit is a whole number of bytes (or give a unit: %sMiB)", ErrInvalid, s, num)
	}
	if !strings.Contains(num, ".") {
		v, err := strconv.ParseUint(num, 10, 64)
		if err != nil || (shift > 0 && v > math.MaxUint64>>shift) {
			return 0, fmt.Errorf("%w: size %q is not a byte count that fits in 64 bits", ErrInvalid, s)
		}
		return v << shift, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || f < 0 {
		return 0, fmt.Errorf("%w: size %q is not a number", ErrInvalid, s)
	}
	v := f * float64(uint64(1)<<shift)
	if v >= math.MaxUint64/2 {
		return 0, fmt.Errorf("%w: size %q is too large", ErrInvalid, s)
	}
	if f > 0 && v < 1 {
		return 0, fmt.Errorf("%w: size %q is less than one byte", ErrInvalid, s)
	}
	return uint64(v), nil
}

// ParseLimit reads SYMM_POOL_LIMIT: a size (see ParseSize), or a share of
// device memory as a percentage ("90%") in (0, 100].
func ParseLimit(s string) (bytes uint64, fraction float64, err error) {
	t := strings.TrimSpace(s)
	if strings.HasSuffix(t, "%") {
		f, perr := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, "%")), 64)
		if perr != nil || !(f > 0 && f <= 100) {
			return 0, 0, fmt.Errorf("%w: limit %q: a percentage must be in (0, 100]", ErrInvalid, s)
		}
		return 0, f / 100, nil
	}
	b, err := ParseSize(t)
	return b, 0, err
}

// ConfigFromEnv builds a Config from the environment, read through getenv
// (the C environment in the library, a map in tests): first PyTorch's allocator
// settings (PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF; see
// torchconf.go), then libsymm's own SYMM_POOL_LIMIT, SYMM_POOL_MAX_SPLIT,
// SYMM_POOL_EXPANDABLE, SYMM_POOL_EXPANDABLE_CHUNK and
// SYMM_POOL_UNMAP_FREE_PAGES. A SYMM_POOL_ variable
// that is set wins over the PyTorch setting of the same field:
//
//	SYMM_POOL_EXPANDABLE  over  expandable_segments
//	SYMM_POOL_MAX_SPLIT   over  max_split_size_mb
//	SYMM_POOL_LIMIT       over  per_process_memory_fraction
//
// The warnings (settings ignored or overridden) are for the caller to print
// once; they carry no prefix.
func ConfigFromEnv(getenv func(string) string) (Config, []string, error) {
	tc, name, text, warns, err := torchConfFromEnv(getenv)
	if err != nil {
		return Config{}, nil, err
	}
	c := tc.Config()
	c.AllocConf = text
	// overrides notes a SYMM_POOL_ variable that replaces a different
	// PyTorch setting.
	overrides := func(env, v, setting string) {
		warns = append(warns, fmt.Sprintf("%s=%s overrides %s from %s", env, v, setting, name))
	}

	if err := c.expandableFromEnv(getenv, overrides, &warns); err != nil {
		return c, nil, err
	}
	if v := settings.PoolLimit.Get(getenv); v != "" {
		b, f, err := ParseLimit(v)
		if err != nil {
			return c, nil, fmt.Errorf("SYMM_POOL_LIMIT: %w", err)
		}
		if c.LimitFraction != 0 && f != c.LimitFraction {
			overrides("SYMM_POOL_LIMIT", v, fmt.Sprintf("per_process_memory_fraction:%g", c.LimitFraction))
		}
		c.Limit, c.LimitFraction = b, f
	}
	if v := settings.PoolMaxSplit.Get(getenv); v != "" {
		b, err := ParseSize(v)
		if err != nil {
			return c, nil, fmt.Errorf("SYMM_POOL_MAX_SPLIT: %w", err)
		}
		if b != 0 && b <= smallMax {
			return c, nil, refused(settings.PoolMaxSplit.Refuse(v))
		}
		split := uint64(0)
		if b != 0 {
			split = roundSize(min(b, maxRequest))
		}
		if tc.MaxSplitSizeMB != 0 && split != c.MaxSplit {
			overrides("SYMM_POOL_MAX_SPLIT", v, fmt.Sprintf("max_split_size_mb:%d", tc.MaxSplitSizeMB))
		}
		c.MaxSplit = split
	}
	if c.GCThreshold > 0 && c.Limit == 0 && c.LimitFraction == 0 {
		// As in PyTorch, the threshold is a share of the cap: without one
		// there is nothing to collect against (until a cap is set at run
		// time, e.g. by torch.cuda.set_per_process_memory_fraction).
		warns = append(warns, fmt.Sprintf("%s: garbage_collection_threshold:%g has no effect until a memory cap is set (per_process_memory_fraction, SYMM_POOL_LIMIT or torch.cuda.set_per_process_memory_fraction)",
			name, c.GCThreshold))
	}
	if c.Expandable && c.GCThreshold > 0 {
		warns = append(warns, fmt.Sprintf("%s: garbage_collection_threshold:%g has no effect with expandable segments (PyTorch's collector also skips them)",
			name, c.GCThreshold))
	}
	return c, warns, nil
}

// expandableFromEnv applies SYMM_POOL_EXPANDABLE, SYMM_POOL_EXPANDABLE_CHUNK
// and SYMM_POOL_UNMAP_FREE_PAGES to c (ConfigFromEnv), adding its warnings
// to warns.
func (c *Config) expandableFromEnv(getenv func(string) string, overrides func(env, v, setting string), warns *[]string) error {
	v, err := settings.PoolExpandable.Word(getenv, "0", "1")
	if err != nil {
		return refused(err)
	}
	if v != "" {
		if on := v == "1"; on != c.Expandable {
			if c.Expandable {
				overrides("SYMM_POOL_EXPANDABLE", v, "expandable_segments:True")
			}
			c.Expandable = on
		}
	}
	// The chunk and the unmapping of free pages are what expandable
	// segments do whenever they are on: from the start, or once a program
	// turns them on while it runs (expandable_segments:True through
	// torch.cuda.memory._set_allocator_settings).
	c.ExpandableChunk = c.DefaultExpandableChunk()
	if v := settings.PoolExpandableChunk.Get(getenv); v != "" {
		b, err := ParseExpandableChunk(v)
		if err != nil {
			return err
		}
		c.ExpandableChunk = b
	}
	// With expandable segments, free pages are unmapped by default: with
	// 20 MiB chunks it costs no measurable step time (bench/RESULTS.md,
	// "expandable segments by 20 MiB chunks") and lets reserved memory
	// follow the live blocks.
	c.UnmapFreePages, err = settings.PoolUnmapFreePages.Flag(getenv, true)
	if err != nil {
		return refused(err)
	}
	if c.UnmapFreePages {
		c.FreePagesWait = DefaultFreePagesWait
	}
	return nil
}

// DefaultExpandableChunk is the library's big chunk for expandable
// segments when SYMM_POOL_EXPANDABLE_CHUNK is not set: c's large segment
// size (PyTorch's large_segment_size_mb, 20 MiB by default), the size of
// the pages PyTorch's expandable segments map for the large pool. Each
// chunk is one physical allocation, and the driver's cost is per
// allocation: 20 MiB chunks map 7 times faster per byte than 2 MiB ones on
// an H100 (cuda.BenchmarkGPUMapChunks). Segments map them where a mapping
// covers a whole one and 2 MiB chunks elsewhere (expandable.go has the
// figures). A tensor shared with another process is mapped there chunk by
// chunk (symm_pool_chunk_at says where each begins and its size).
func (c Config) DefaultExpandableChunk() uint64 {
	if c.LargeSegment != 0 {
		return c.LargeSegment
	}
	return largeSeg
}

// ParseExpandableChunk reads a big chunk's size as SYMM_POOL_EXPANDABLE_CHUNK
// is written: a size from 1 byte to 1 TiB, which the pool rounds up to the
// driver's granularity (ExpandableChunkBytes). The one parser of it, for the
// library and for symm replay --chunk.
func ParseExpandableChunk(v string) (uint64, error) {
	b, err := ParseSize(v)
	if err != nil {
		return 0, fmt.Errorf("SYMM_POOL_EXPANDABLE_CHUNK: %w", err)
	}
	if b == 0 || b > 1<<40 {
		return 0, refused(settings.PoolExpandableChunk.Refuse(v))
	}
	return b, nil
}

// ExpandableChunkBytes is the big chunk a pool maps for Config.ExpandableChunk
// c on a device of granularity g: c rounded up to a multiple of g, and g for
// 0 (initExpandable's rule).
func ExpandableChunkBytes(c, g uint64) uint64 {
	if c <= g {
		return g
	}
	return roundUp(c, g)
}

// refused marks a setting's refusal (settings.Error) as ErrInvalid.
func refused(err error) error { return fmt.Errorf("%w: %w", ErrInvalid, err) }
