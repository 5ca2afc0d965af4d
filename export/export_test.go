package main

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/publish"
	"github.com/libsymm/libsymm/store"
	"github.com/libsymm/libsymm/symmetric"
)

// These tests drive the Go side of the C ABI in-process. They use the host
// backend unless SYMM_TEST_DEVICE=cuda (the GPU run sets it), so the same
// binary proves the zero-allocation hot path on a GPU too. The pool's
// statistics page goes to a directory of the test's own, removed at the
// end: a Go program exits without running the library's destructor, which
// removes the page of a C or Python program.
func TestMain(m *testing.M) {
	if os.Getenv("SYMM_TEST_DEVICE") == "cuda" {
		os.Setenv("SYMM_DEVICE", "cuda")
	} else {
		os.Setenv("SYMM_DEVICE", "host")
	}
	pages, err := os.MkdirTemp("", "symm-export-test-pages-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv("SYMM_PUBLISH_DIR", pages)
	code := m.Run()
	os.RemoveAll(pages)
	os.Exit(code)
}

// The pool's page is in the test's own directory, not in /dev/shm.
func TestPageInTheTestsDirectory(t *testing.T) {
	p, _ := poolAlloc(512, 0, 0)
	require.NotZero(t, p, "alloc: %s", lastErrorText())
	poolFree(p, 512, 0, 0)
	l := publish.List(os.Getenv("SYMM_PUBLISH_DIR"), os.Getuid())
	require.Len(t, l.Pages, 1)
	require.Equal(t, os.Getpid(), l.Pages[0].PID)
}

func TestHotPathMakesNoHeapAllocation(t *testing.T) {
	// The last error lives in C thread-local storage: stay on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, n := range []uint64{512, 1 << 20, 64 << 20} {
		ptr, _ := poolAlloc(n, 0, 0)
		require.NotZero(t, ptr, "alloc %d", lastErrorText())
		poolFree(ptr, n, 0, 0)
		avg := testing.AllocsPerRun(2000, func() {
			p, _ := poolAlloc(n, 0, 0)
			if p == 0 {
				panic(lastErrorText())
			}
			poolFree(p, n, 0, 0)
		})
		require.Zero(t, avg, "%d-byte alloc+free through the export layer allocates", n)
	}
}

func lastErrorText() string { _, m := lastError(); return m }

func TestErrorsReachTheThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clearError()
	poolFree(0xdead000, 64, 0, 0)
	code, msg := lastError()
	require.Equal(t, 4, code, "SYMM_ERR_UNKNOWN_POINTER")
	require.Contains(t, msg, "symm_pool_free: ")
	require.Contains(t, msg, "0xdead000")

	clearError()
	p0, _ := poolAlloc(16, 1000, 0)
	require.Zero(t, p0)
	code, msg = lastError()
	require.Equal(t, 1, code, "SYMM_ERR_INVALID")
	require.Contains(t, msg, "device 1000")

	clearError()
	p1, _ := poolAlloc(1<<60, 0, 0)
	require.Zero(t, p1)
	code, msg = lastError()
	require.Equal(t, 2, code, "SYMM_ERR_OUT_OF_MEMORY")
	require.Contains(t, msg, "requested 1152921504606846976 bytes")
}

func TestPanicsBecomeInternalErrors(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clearError()
	func() {
		defer func() { recovered("symm_test", recover()) }()
		var live []int
		_ = live[len(live)] // an index out of range panics, as a bug would
	}()
	code, msg := lastError()
	require.Equal(t, 7, code, "SYMM_ERR_INTERNAL")
	require.Contains(t, msg, "symm_test: internal error")
}

func TestBackendChoice(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	_, kind, err := newBackend(env("SYMM_DEVICE", "host", "SYMM_HOST_DEVICES", "3", "SYMM_HOST_MEMORY", "1GiB"))
	require.NoError(t, err)
	require.EqualValues(t, 2, kind)
	for _, bad := range [][]string{
		{"SYMM_DEVICE", "tpu"}, {"SYMM_DEVICE", "host", "SYMM_HOST_DEVICES", "0"},
		{"SYMM_DEVICE", "host", "SYMM_HOST_DEVICES", "x"}, {"SYMM_DEVICE", "host", "SYMM_HOST_MEMORY", "lots"},
	} {
		_, _, err := newBackend(env(bad...))
		require.Error(t, err, "%v", bad)
		require.Contains(t, err.Error(), bad[len(bad)-2], "names the variable")
	}
	if os.Getenv("SYMM_TEST_DEVICE") != "cuda" {
		_, _, err = newBackend(env("SYMM_CUDA_LIB", "/nonexistent/libcuda.so.1"))
		require.ErrorIs(t, err, errNoDevice, "no silent fallback to host")
		require.Contains(t, err.Error(), "/nonexistent/libcuda.so.1")
		require.Equal(t, 3, int(errCode(err)), "SYMM_ERR_NO_DEVICE")
	}
}

// BenchmarkExportAllocFree is the Go part of symm_pool_alloc+symm_pool_free
// (without the C→Go transition, which bench/ measures from C).
func BenchmarkExportAllocFree(b *testing.B) {
	for _, n := range []uint64{512, 1 << 20, 64 << 20} {
		b.Run(sizeName(n), func(b *testing.B) {
			p, _ := poolAlloc(n, 0, 0)
			poolFree(p, n, 0, 0)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				p, _ := poolAlloc(n, 0, 0)
				poolFree(p, n, 0, 0)
			}
		})
	}
}

func sizeName(n uint64) string { return fmt.Sprintf("%dB", n) }

// A freed block's handles leave the C handle table (a leak check), and their
// numbers stay invalid.
func TestHandleTableForgetsFreedBlocks(t *testing.T) {
	m, err := getManager()
	require.NoError(t, err)
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), symmetric.Group{Name: "solo", Rank: 0, World: 1, Store: store.NewMemory()})
	require.NoError(t, err)
	id := handleID(h)
	require.Equal(t, id, handleID(h), "one number per handle")
	require.Greater(t, id, int64(0x5180_0000), "numbers start far from 0")
	require.Equal(t, 1, handles.len())
	require.NoError(t, m.Free(b.Ptr()))
	dropFreedHandles()
	require.Zero(t, handles.len())
	_, err = handles.get(id)
	require.ErrorIs(t, err, symmetric.ErrInvalid)
}
