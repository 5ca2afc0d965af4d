package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/store"
	"github.com/libsymm/libsymm/symmetric"
)

func headerEnum(t *testing.T, prefix string) map[string]int {
	h, err := os.ReadFile("../include/symm.h")
	require.NoError(t, err)
	m := map[string]int{}
	for _, e := range regexp.MustCompile(`\b`+prefix+`([A-Z0-9_]+) = (\d+)`).FindAllStringSubmatch(string(h), -1) {
		v, err := strconv.Atoi(e[2])
		require.NoError(t, err)
		m[e[1]] = v
	}
	require.NotEmpty(t, m, prefix)
	return m
}

// Every trace action of the allocator has a SYMM_TRACE_* code, the one whose
// C name is the action's name in upper case, and the header has no other.
func TestTraceActionsMatchTheHeader(t *testing.T) {
	codes := headerEnum(t, "SYMM_TRACE_")
	require.Len(t, traceActions, len(codes))
	for a, c := range traceActions {
		name := allocator.TraceAction(a).String()
		v, ok := codes[strings.ToUpper(name)]
		require.True(t, ok, name)
		require.Equal(t, v, int(c), name)
	}
	require.Len(t, blockStates, len(headerEnum(t, "SYMM_BLOCK_")))
}

// errCode is the one mapping of errors onto SYMM_ERR_* codes: each package's
// sentinels get theirs, whichever package's name the caller used.
func TestErrCode(t *testing.T) {
	codes := headerEnum(t, "SYMM_ERR_")
	for err, want := range map[error]string{
		allocator.ErrInvalid: "INVALID", symmetric.ErrInvalid: "INVALID",
		allocator.ErrUnknownPointer: "UNKNOWN_POINTER", symmetric.ErrUnknownPointer: "UNKNOWN_POINTER",
		allocator.ErrOutOfMemory: "OUT_OF_MEMORY", allocator.ErrBusy: "BUSY",
		symmetric.ErrMeetingMismatch: "MISMATCH", symmetric.ErrSignalTimeout: "TIMEOUT", store.ErrTimeout: "TIMEOUT",
		symmetric.ErrPeerFailed: "PEER", store.ErrClosed: "PEER", symmetric.ErrNoKernels: "NO_DEVICE",
		symmetric.ErrNoDevice: "NO_DEVICE", errNoDevice: "NO_DEVICE", errors.New("a bug"): "INTERNAL",
	} {
		require.Equal(t, codes[want], int(errCode(fmt.Errorf("wrapped: %w", err))), "%v", err)
	}
	require.ErrorIs(t, symmetric.ErrInvalid, allocator.ErrInvalid)
	require.ErrorIs(t, symmetric.ErrUnknownPointer, allocator.ErrUnknownPointer)
}
