package errs

import (
	"errors"
	"fmt"
	"testing"
)

// The messages are part of every error that wraps them (Go, C and Python
// tests compare those): they must not change.
func TestMessages(t *testing.T) {
	for err, want := range map[error]string{ErrInvalid: "invalid argument", ErrUnknownPointer: "unknown pointer"} {
		if err.Error() != want {
			t.Errorf("%q, want %q", err.Error(), want)
		}
		if !errors.Is(fmt.Errorf("%w: detail", err), err) {
			t.Errorf("%v: not found through a wrap", err)
		}
	}
}
