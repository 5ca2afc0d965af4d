package allocator

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize reads a byte count: a non-negative integer or decimal with an
// optional unit, K/M/G/T (powers of 1024; "KiB", "KB" and "K" all mean 1024),
// or B. Spaces around the number and unit are allowed; case is ignored.
// Examples: "4096", "512MiB", "1.5 GiB", "2g".
func ParseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("%w: empty size", ErrInvalid)
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

// ConfigFromEnv builds a Config from SYMM_POOL_LIMIT, SYMM_POOL_MAX_SPLIT,
// SYMM_POOL_EXPANDABLE and SYMM_POOL_EXPANDABLE_CHUNK, read through getenv
// (os.Getenv in the library, a map in tests).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	switch v := getenv("SYMM_POOL_EXPANDABLE"); v {
	case "", "0":
	case "1":
		c.Expandable = true
	default:
		return c, fmt.Errorf("%w: SYMM_POOL_EXPANDABLE=%q: want 0 or 1", ErrInvalid, v)
	}
	if v := getenv("SYMM_POOL_EXPANDABLE_CHUNK"); v != "" {
		b, err := ParseSize(v)
		if err != nil {
			return c, fmt.Errorf("SYMM_POOL_EXPANDABLE_CHUNK: %w", err)
		}
		if b == 0 || b > 1<<40 {
			return c, fmt.Errorf("%w: SYMM_POOL_EXPANDABLE_CHUNK=%q: want a size from 1 byte to 1 TiB (rounded up to the driver's granularity)", ErrInvalid, v)
		}
		c.ExpandableChunk = b
	}
	if v := getenv("SYMM_POOL_LIMIT"); v != "" {
		b, f, err := ParseLimit(v)
		if err != nil {
			return c, fmt.Errorf("SYMM_POOL_LIMIT: %w", err)
		}
		c.Limit, c.LimitFraction = b, f
	}
	if v := getenv("SYMM_POOL_MAX_SPLIT"); v != "" {
		b, err := ParseSize(v)
		if err != nil {
			return c, fmt.Errorf("SYMM_POOL_MAX_SPLIT: %w", err)
		}
		if b != 0 && b <= smallMax {
			return c, fmt.Errorf("%w: SYMM_POOL_MAX_SPLIT=%q: must be more than 1 MiB (small blocks are always split)", ErrInvalid, v)
		}
		c.MaxSplit = roundSize(min(b, maxRequest))
	}
	return c, nil
}
