package version

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionEverywhere(t *testing.T) {
	for file, want := range map[string]string{
		"../../export/shim.cpp":       `#define SYMM_VERSION_STRING "` + Version + `"`,
		"../../python/pyproject.toml": `version = "` + Version + `"`,
	} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Contains(t, string(b), want, file)
	}
}
