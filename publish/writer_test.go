package publish

import (
	"testing"

	"github.com/libsymm/libsymm/internal/settings"
	"github.com/stretchr/testify/require"
)

// TestSettingDocumentsTheDir holds the README's default of SYMM_PUBLISH_DIR
// to Dir's.
func TestSettingDocumentsTheDir(t *testing.T) {
	require.Equal(t, "`"+Dir(func(string) string { return "" })+"`", settings.PublishDir.Default)
}
