package allocator

import (
	"fmt"
	"math/bits"
	"strings"
)

// Size rules. Every formula the pool uses to size blocks and segments is here.
//
// Requests. A request of n > 0 bytes is served by a block of
//
//	round(n) = max(512, ⌈n/512⌉·512)
//
// bytes, so every block starts on a 512-byte boundary inside a segment whose
// base is at least 512-aligned (cudaMalloc gives 256; the pool promises 512).
// The rounding wastes at most 511 bytes per block.
//
// With roundup_power2_divisions (Config.RoundupPower2Divisions, PyTorch's
// round_size), a request of n ≥ 512 bytes in an interval of d > 1 divisions
// with n > 512·d is served by a block of
//
//	roundDiv(n, d) = n                               if n is a power of two
//	               = ⌈n/step⌉·step, step = 2^⌊log2 n⌋/d  otherwise
//
// bytes: the next of d equal steps between the powers of two around n. As
// 2^⌊log2 n⌋ ≥ 512·d, step ≥ 512 and the block stays a multiple of 512; it
// wastes less than 1/d of n (at most n/d − 1 bytes). Other requests round as
// above.
//
// Pools. A block of r bytes comes from
//
//	small pool  r ≤ 1 MiB              segments of 2 MiB
//	large pool  1 MiB < r < 10 MiB     segments of 20 MiB
//	            10 MiB ≤ r             a segment of ⌈r/2 MiB⌉·2 MiB
//	oversize    r ≥ MaxSplit (if set)  a segment of ⌈r/2 MiB⌉·2 MiB, never split
//
// (PyTorch's CUDACachingAllocator uses the same numbers, so memory behaviour
// stays familiar.) A free block larger than a request is split when the
// remainder is at least 512 bytes (small pool) or more than 1 MiB (large
// pool); otherwise the whole block is handed out. So the bytes a request can
// hold beyond round(n) are at most 0 (small), 1 MiB (large) and 20 MiB
// (oversize, where a cached block up to 20 MiB larger is reused rather than
// asking the driver again; Config.MaxNonSplitRounding, PyTorch's
// max_non_split_rounding_mb, changes that tolerance).
//
// Free lists. Free blocks are kept in bins, two-level segregated fit (TLSF):
// with u = size/512,
//
//	u < 16:  bin u                    (exact: every block in it has one size)
//	u ≥ 16:  bin 16 + 8·(f−4) + s     f = ⌊log2 u⌋, s = the 3 bits below the top bit
//
// so bin i ≥ 16 holds sizes in [(8+s)·2^(f−3), (9+s)·2^(f−3)) units: its
// blocks differ by less than 1/(8+s) ≤ 12.5%. A request looks for the
// smallest fitting block in its own bin (best fit over at most bestFitScan
// blocks), then takes the smallest block of the first non-empty higher bin,
// which a bitmap finds in O(1). Any block of a higher bin fits.
const (
	minBlock    = 512
	smallMax    = 1 << 20  // largest request of the small pool
	smallSeg    = 2 << 20  // small pool segment size
	largeSeg    = 20 << 20 // segment for 1 MiB < r < 10 MiB
	minLargeSeg = 10 << 20 // from here a request gets a segment of its own size
	segRound    = 2 << 20  // large segments are multiples of this
	largeBuffer = 20 << 20 // oversize reuse tolerance, unless Config.MaxNonSplitRounding
	bestFitScan = 32       // blocks examined in a bin for the best fit

	exactBins = 16
	slBits    = 3
	slCount   = 1 << slBits
	// maxUnitsLog2 bounds the sizes the bins index: 2^(maxUnitsLog2)·512 bytes = 2^57 B.
	maxUnitsLog2 = 48
	numBins      = exactBins + (maxUnitsLog2-4+1)*slCount
	bitmapWords  = (numBins + 63) / 64
)

// SmallMax is the largest request the small pool serves: the bound a
// caller outside the package (the front cache in C) guesses a request's
// pool by.
const SmallMax = smallMax

// maxRequest is the largest request the pool accepts: larger sizes would
// overflow the rounding arithmetic long before any device could hold them.
const maxRequest = uint64(1) << 56

// poolKind names the three pools of a stream.
type poolKind uint8

const (
	smallPool poolKind = iota
	largePool
	oversizePool
	numPools
)

func (k poolKind) String() string {
	return [...]string{"small_pool", "large_pool", "oversize"}[k]
}

// roundSize is round(n) above. n must be in (0, maxRequest].
func roundSize(n uint64) uint64 {
	if n < minBlock {
		return minBlock
	}
	return (n + minBlock - 1) &^ (minBlock - 1)
}

// roundDivisions is round(n) under roundup_power2_divisions div (PyTorch's
// round_size and roundup_power2_next_division): n must be in (0, maxRequest].
func roundDivisions(n uint64, div *[RoundupIntervals]uint64) uint64 {
	if n < minBlock {
		return minBlock
	}
	// PyTorch's roundup_power2_divisions(size): interval ⌊log2 n⌋ − 20,
	// clamped to [0, 15].
	i := max(bits.Len64(n)-1-20, 0)
	d := div[min(i, RoundupIntervals-1)]
	// d ≤ maxRequest/512 keeps 512·d from overflowing where PyTorch's size_t
	// product wraps: beyond it n > 512·d is false for every request anyway.
	if d <= 1 || d > maxRequest/minBlock || n <= minBlock*d || n&(n-1) == 0 {
		return roundSize(n)
	}
	step := (uint64(1) << (bits.Len64(n) - 1)) >> (bits.Len64(d) - 1)
	return (n + step - 1) &^ (step - 1)
}

// kindFor picks the pool of a rounded request. maxSplit 0 means no oversize pool.
func kindFor(r, maxSplit uint64) poolKind {
	switch {
	case maxSplit != 0 && r >= maxSplit:
		return oversizePool
	case r <= smallMax:
		return smallPool
	default:
		return largePool
	}
}

// segmentSize is the size of the segment the pool asks the backend for when
// no cached block fits a rounded request r of pool k; large is the segment
// of requests from 1 to 10 MiB (largeSeg, or Config.LargeSegment).
func segmentSize(r uint64, k poolKind, large uint64) uint64 {
	switch {
	case k == smallPool:
		return smallSeg
	case k == largePool && r < minLargeSeg:
		return large
	default:
		return (r + segRound - 1) &^ (segRound - 1)
	}
}

// shouldSplit reports whether a free block of size have, chosen for a rounded
// request r of pool k, is split rather than handed out whole.
func shouldSplit(have, r uint64, k poolKind) bool {
	rest := have - r
	switch k {
	case smallPool:
		return rest >= minBlock
	case largePool:
		return rest > smallMax
	default:
		return false
	}
}

// binIndex is the TLSF bin of a block of size bytes (a multiple of 512).
func binIndex(size uint64) int {
	u := size / minBlock
	if u < exactBins {
		return int(u)
	}
	f := bits.Len64(u) - 1
	if f > maxUnitsLog2 {
		return numBins - 1
	}
	s := (u >> (f - slBits)) & (slCount - 1)
	return exactBins + (f-4)*slCount + int(s)
}

// binBounds returns the sizes in bytes that bin i holds: [lo, hi).
func binBounds(i int) (lo, hi uint64) {
	if i < exactBins {
		return uint64(i) * minBlock, uint64(i+1) * minBlock
	}
	f := (i-exactBins)/slCount + 4
	s := uint64((i - exactBins) % slCount)
	step := uint64(1) << (f - slBits)
	return (slCount + s) * step * minBlock, (slCount + s + 1) * step * minBlock
}

// SizeClassTable renders the bins with the worst case of each: the largest
// share of a handed-out block that the request does not use, for a request
// whose smallest fitting cached block is in the bin. It is written to
// allocator/SIZECLASSES.md and checked by a test, so the document cannot drift
// from the code.
func SizeClassTable(maxBytes uint64) string {
	var b strings.Builder
	b.WriteString("| bin | block sizes | pool | rounding waste (worst) | kept beyond request (worst) |\n")
	b.WriteString("| --- | --- | --- | --- | --- |\n")
	for i := 1; i < numBins; i++ {
		lo, hi := binBounds(i)
		if lo > maxBytes {
			break
		}
		k := kindFor(lo, 0)
		// Rounding: request lo-511 (or 1 for the first bin) gets lo bytes.
		var round string
		if lo == minBlock {
			round = "511 B of 512 B (1 B request)"
		} else {
			round = fmt.Sprintf("511 B (%.2f%%)", 100*511/float64(lo))
		}
		// Kept: a block is not split when the rest is below the split threshold.
		var kept string
		switch k {
		case smallPool:
			kept = "0 (always split)"
		default:
			kept = fmt.Sprintf("≤ 1 MiB (%.1f%% at %s)", 100*float64(smallMax)/float64(lo+smallMax), human(lo))
		}
		b.WriteString(fmt.Sprintf("| %d | [%s, %s) | %s | %s | %s |\n", i, human(lo), human(hi), k, round, kept))
	}
	return b.String()
}

func human(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
