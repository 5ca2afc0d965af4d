package version

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionIsSetInOnePlace(t *testing.T) {
	require.Regexp(t, `^\d+\.\d+\.\d+$`, Version)
	// The header states it for C programs.
	h, err := os.ReadFile("../../include/symm.h")
	require.NoError(t, err)
	require.Contains(t, string(h), `#define SYMM_VERSION "`+Version+`"`)
	// The Python package reads it through a link, not a copy.
	target, err := os.Readlink("../../python/VERSION")
	require.NoError(t, err, "python/VERSION must be a symbolic link to internal/version/VERSION")
	require.Equal(t, "../internal/version/VERSION", target)
	py, err := os.ReadFile("../../python/pyproject.toml")
	require.NoError(t, err)
	require.Contains(t, string(py), `version = {file = "VERSION"}`)
	// No other literal: the C library returns Go's value.
	for _, f := range []string{"../../export/shim.cpp", "../../python/pyproject.toml", "../../python/symm/__init__.py"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.False(t, regexp.MustCompile(`["=]\s*"?`+regexp.QuoteMeta(Version)+`"`).MatchString(string(b)) &&
			!strings.Contains(f, "symm.h"), "%s repeats the version number", f)
	}
}
