package symmetric

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "symm.h"
*/
import "C"

import "fmt"

// Algorithm is an all-reduce algorithm of libsymm: one of the C ABI's
// SYMM_ALL_REDUCE_* (include/symm.h owns the values; read here through cgo).
type Algorithm int

const (
	// AllReduceAuto lets ChooseAllReduce choose (or SYMM_ALL_REDUCE, when
	// it forces one).
	AllReduceAuto Algorithm = C.SYMM_ALL_REDUCE_AUTO
	// AllReducePush is the push all-reduce (push.go): one kernel, no
	// barrier; bounded by its workspace's limit.
	AllReducePush Algorithm = C.SYMM_ALL_REDUCE_PUSH
	// AllReduceTwoShot is the two-shot all-reduce (allreduce.go).
	AllReduceTwoShot Algorithm = C.SYMM_ALL_REDUCE_TWO_SHOT
	// AllReduceOneShot is the one-shot all-reduce (allreduce.go).
	AllReduceOneShot Algorithm = C.SYMM_ALL_REDUCE_ONE_SHOT
)

// algorithmNames spells each algorithm as SYMM_ALL_REDUCE does: its C name
// after SYMM_ALL_REDUCE_, in lower case (choose_test.go checks them).
var algorithmNames = [...]string{AllReduceAuto: "auto", AllReducePush: "push", AllReduceTwoShot: "two_shot", AllReduceOneShot: "one_shot"}

// String is the algorithm's name, as SYMM_ALL_REDUCE spells it.
func (a Algorithm) String() string {
	if a >= 0 && int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// ParseAlgorithm reads an algorithm's name ("" is auto).
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return AllReduceAuto, nil
	}
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: all-reduce algorithm %q: want auto, push, two_shot or one_shot", ErrInvalid, s)
}

// pushCrossovers is, per world size, the largest message in bytes (a power
// of two) for which the push all-reduce is chosen; above it, the two-shot.
// Measured on 4 × H200 (all pairs NV18), 2026-11-26, commits afb435f and
// 16a1b4d (bench/RESULTS.md, the two sections of that day: µs per op, 20
// calls captured in a CUDA graph, float32 and bfloat16, 4 KiB to 1 MiB),
// comparing libsymm's own push and two-shot:
//
//	world  push wins up to  first size the two-shot wins (push / two-shot µs, bf16 and f32)
//	2      1 MiB            -       (see below)
//	3      256 KiB          512 KiB (11.32/10.19, 11.19/10.01; 256 KiB: 7.39/9.63, 7.33/9.40)
//	4      128 KiB          256 KiB (9.25/8.62; float32 a tie, 9.17/9.29; 128 KiB: 7.04/8.58, 6.97/8.82)
//
// World 2 was measured again on 2 × H200, 2026-11-26, commit 79deb82
// (tests/device/symm_bench.py 2): at 1 MiB the push takes 10.60 / 10.34 µs
// (bf16 / f32) and symm.all_reduce's two-shot, which copies the tensor into
// its symmetric scratch buffer and the sum back out, 11.49 / 11.42 (the
// two-shot in place on a symmetric tensor: 9.98 / 9.35), so the push runs
// up to the workspace's default limit, 1 MiB.
//
// World 1 takes world 2's entry (not measured: any algorithm is a copy).
// Worlds above 4 are NOT measured (8 GPUs were not lent): they keep 4's
// 128 KiB, an extrapolation (the push's cost grows with the world, each
// rank storing its message into every peer's workspace, so the crossover
// is not expected to rise). The one-shot is never chosen: at every size
// measured it was slower than the push or the two-shot.
var pushCrossovers = [...]uint64{1: 1 << 20, 2: 1 << 20, 3: 256 << 10, 4: 128 << 10}

// PushCrossover is the largest message, in bytes, for which ChooseAllReduce
// chooses the push all-reduce for a group of world ranks.
func PushCrossover(world int) uint64 {
	if world >= 1 && world < len(pushCrossovers) {
		return pushCrossovers[world]
	}
	return pushCrossovers[len(pushCrossovers)-1]
}

// ChooseAllReduce is the algorithm libsymm's all-reduce uses for a message
// of nbytes bytes on a group of world ranks, from the measured crossovers
// above: the push up to PushCrossover(world), the two-shot above it. It
// knows of no workspace: Manager.AllReduceAlgorithm also bounds the push by
// the workspace's limit, and honours a forced algorithm.
func ChooseAllReduce(world int, nbytes uint64) Algorithm {
	if nbytes <= PushCrossover(world) {
		return AllReducePush
	}
	return AllReduceTwoShot
}

// AllReduceAlgorithm is the one place where libsymm's all-reduce chooses
// its algorithm: force, when not AllReduceAuto (a caller's choice), else
// the manager's Config.AllReduce (SYMM_ALL_REDUCE), else ChooseAllReduce
// bounded by the push workspace's limit pushMax (larger messages go to the
// two-shot; 0: no push workspace, never the push). A forced push of a
// message over pushMax is refused (ErrInvalid, naming the limit), as is a
// world under 1 or an unknown algorithm.
func (m *Manager) AllReduceAlgorithm(world int, nbytes, pushMax uint64, force Algorithm) (Algorithm, error) {
	return chooseAllReduce(world, nbytes, pushMax, force, m.cfg.AllReduce)
}

func chooseAllReduce(world int, nbytes, pushMax uint64, force, cfg Algorithm) (Algorithm, error) {
	if world < 1 {
		return 0, fmt.Errorf("%w: all-reduce over %d ranks: want at least 1", ErrInvalid, world)
	}
	if force < AllReduceAuto || force > AllReduceOneShot {
		return 0, fmt.Errorf("%w: all-reduce algorithm %d: want 0 (auto), 1 (push), 2 (two_shot) or 3 (one_shot)", ErrInvalid, int(force))
	}
	why := "asked for"
	if force == AllReduceAuto {
		force, why = cfg, "forced by SYMM_ALL_REDUCE=push"
	}
	switch force {
	case AllReduceAuto:
		if a := ChooseAllReduce(world, nbytes); a != AllReducePush || nbytes <= pushMax {
			return a, nil
		}
		return AllReduceTwoShot, nil
	case AllReducePush:
		if nbytes > pushMax {
			return 0, fmt.Errorf("%w: the push all-reduce (%s) of %d bytes: over the push workspace's limit of %d bytes "+
				"(a larger workspace takes it: SYMM_PUSH_MAX_BYTES sizes the ones made from Python)", ErrInvalid, why, nbytes, pushMax)
		}
	}
	return force, nil
}
