package env

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A variable set after start (os.Setenv sets the C environment too when cgo
// is linked) is seen; an unset one reads "".
func TestGetSeesLaterChanges(t *testing.T) {
	require.Equal(t, "", Get("SYMM_TEST_ENV_UNSET"))
	t.Setenv("SYMM_TEST_ENV_SET", "host")
	require.Equal(t, "host", Get("SYMM_TEST_ENV_SET"))
}
