package trace

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The actions are the C ABI's SYMM_TRACE_* (include/symm.h), named as
// PyTorch does: the header's names in lower case, no more and no fewer (the
// allocator's and Python's are tested against the header too:
// export/codes_test.go, tests/python/test_binding.py).
func TestActionsMatchTheHeader(t *testing.T) {
	h, err := os.ReadFile("../../include/symm.h")
	require.NoError(t, err)
	var want []string
	for _, m := range regexp.MustCompile(`\bSYMM_TRACE_([A-Z_]+) = \d+`).FindAllStringSubmatch(string(h), -1) {
		want = append(want, strings.ToLower(m[1]))
	}
	got := make([]string, 0, numActions)
	for a := Action(0); a < numActions; a++ {
		got = append(got, a.String())
	}
	sort.Strings(want)
	sort.Strings(got)
	require.Equal(t, want, got)
}
