package symmetric

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The measured crossovers (choose.go's table): the push up to 1 MiB on 2
// ranks, 256 KiB on 3, 128 KiB on 4 and beyond; the two-shot above.
func TestChooseAllReduce(t *testing.T) {
	for _, c := range []struct {
		world int
		limit uint64
	}{{1, 1 << 20}, {2, 1 << 20}, {3, 256 << 10}, {4, 128 << 10}, {5, 128 << 10}, {8, 128 << 10}, {64, 128 << 10}} {
		require.Equal(t, c.limit, PushCrossover(c.world), "world %d", c.world)
		for _, n := range []uint64{0, 4, 4 << 10, c.limit} {
			require.Equal(t, AllReducePush, ChooseAllReduce(c.world, n), "world %d, %d bytes", c.world, n)
		}
		for _, n := range []uint64{c.limit + 1, 4 << 20, 1 << 40} {
			require.Equal(t, AllReduceTwoShot, ChooseAllReduce(c.world, n), "world %d, %d bytes", c.world, n)
		}
	}
}

func TestAllReduceAlgorithm(t *testing.T) {
	m := NewManager(nil, Config{})
	const ws = 1 << 20
	for _, c := range []struct {
		world        int
		nbytes, push uint64
		force        Algorithm
		want         Algorithm
	}{
		{4, 4 << 10, ws, AllReduceAuto, AllReducePush},
		{4, 256 << 10, ws, AllReduceAuto, AllReduceTwoShot},
		{2, 256 << 10, ws, AllReduceAuto, AllReducePush},
		{2, 256 << 10, 128 << 10, AllReduceAuto, AllReduceTwoShot}, // over the workspace's limit
		{2, 4 << 10, 0, AllReduceAuto, AllReduceTwoShot},           // no workspace
		{4, 4 << 20, ws, AllReduceOneShot, AllReduceOneShot},
		{4, 4 << 10, ws, AllReduceTwoShot, AllReduceTwoShot},
		{4, 1 << 20, ws, AllReducePush, AllReducePush}, // forced, within the limit
	} {
		got, err := m.AllReduceAlgorithm(c.world, c.nbytes, c.push, c.force)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%+v", c)
	}
	_, err := m.AllReduceAlgorithm(4, 2<<20, ws, AllReducePush)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "the push all-reduce (asked for) of 2097152 bytes: over the push workspace's limit of 1048576 bytes")
	_, err = m.AllReduceAlgorithm(0, 8, ws, AllReduceAuto)
	require.ErrorContains(t, err, "all-reduce over 0 ranks")
	for _, f := range []Algorithm{-1, 4} {
		_, err = m.AllReduceAlgorithm(2, 8, ws, f)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, "want 0 (auto), 1 (push), 2 (two_shot) or 3 (one_shot)")
	}

	// SYMM_ALL_REDUCE (Config.AllReduce) forces one; the caller's choice wins.
	for _, a := range []Algorithm{AllReducePush, AllReduceTwoShot, AllReduceOneShot} {
		m := NewManager(nil, Config{AllReduce: a})
		got, err := m.AllReduceAlgorithm(4, 64<<10, ws, AllReduceAuto)
		require.NoError(t, err)
		require.Equal(t, a, got)
		got, err = m.AllReduceAlgorithm(4, 64<<10, ws, AllReduceTwoShot)
		require.NoError(t, err)
		require.Equal(t, AllReduceTwoShot, got)
	}
	_, err = NewManager(nil, Config{AllReduce: AllReducePush}).AllReduceAlgorithm(4, 2<<20, ws, AllReduceAuto)
	require.ErrorContains(t, err, "(forced by SYMM_ALL_REDUCE=push)")
}

func TestParseAlgorithm(t *testing.T) {
	for s, want := range map[string]Algorithm{"": AllReduceAuto, "auto": AllReduceAuto, "push": AllReducePush,
		"two_shot": AllReduceTwoShot, "one_shot": AllReduceOneShot} {
		got, err := ParseAlgorithm(s)
		require.NoError(t, err)
		require.Equal(t, want, got)
		if s != "" {
			require.Equal(t, s, got.String())
		}
	}
	_, err := ParseAlgorithm("two-shot")
	require.ErrorIs(t, err, ErrInvalid)
	require.Equal(t, "Algorithm(7)", Algorithm(7).String())
}

// Every SYMM_ALL_REDUCE_* of include/symm.h is an Algorithm (cgo reads the
// values) whose name is its C name's tail in lower case, and no other.
func TestAlgorithmNamesMatchTheHeader(t *testing.T) {
	h, err := os.ReadFile("../include/symm.h")
	require.NoError(t, err)
	m := regexp.MustCompile(`\bSYMM_ALL_REDUCE_([A-Z_]+) = (\d+)`).FindAllStringSubmatch(string(h), -1)
	require.Len(t, m, len(algorithmNames))
	for _, e := range m {
		v, err := strconv.Atoi(e[2])
		require.NoError(t, err)
		require.Equal(t, strings.ToLower(e[1]), Algorithm(v).String())
	}
}
