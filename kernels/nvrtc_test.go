package kernels

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/internal/dl"
)

// buildLib compiles the C file src into the shared library out.
func buildLib(t *testing.T, src, out string) {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	b, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", out, src).CombinedOutput()
	require.NoError(t, err, "building %s (a C compiler is needed): %s", src, b)
}

// fakeNVRTC builds testdata/fakenvrtc.c as libnvrtc.so.13 and points
// SYMM_NVRTC_LIB at it.
func fakeNVRTC(t *testing.T) string {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libnvrtc.so.13")
	buildLib(t, "testdata/fakenvrtc.c", lib)
	t.Setenv("SYMM_NVRTC_LIB", lib)
	return lib
}

const fillSrc = `extern "C" __global__ void symm_fill(unsigned *p, unsigned v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
`

func TestCompileWithFakeNVRTC(t *testing.T) {
	lib := fakeNVRTC(t)
	n, err := Open(nil)
	require.NoError(t, err)
	defer n.Close()
	require.Equal(t, lib, n.Path(), "SYMM_NVRTC_LIB comes first")

	cubin, err := n.Compile(fillSrc, "fill.cu", 9, 0)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(cubin, []byte("\x7fELFsm_90\x00")), "compiled for sm_90: %q", cubin[:12])
	require.Contains(t, string(cubin), "symm_fill")

	// A source NVRTC refuses: its result and log come back, nothing leaks.
	_, err = n.Compile("#error nope\n"+fillSrc, "bad.cu", 9, 0)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "bad.cu", ce.Name)
	require.Equal(t, "sm_90", ce.Arch)
	require.Contains(t, ce.Result, "NVRTC_ERROR_COMPILATION")
	require.Contains(t, ce.Log, "fake failure")
	require.ErrorContains(t, err, "compiling bad.cu for sm_90")

	// A capability no GPU has is refused before NVRTC sees it.
	for _, cc := range [][2]int{{2, 0}, {9, 10}, {-1, 0}, {21, 0}} {
		_, err = n.Compile(fillSrc, "fill.cu", cc[0], cc[1])
		require.ErrorContains(t, err, "is not one NVRTC knows", "%v", cc)
	}
}

// Without NVRTC, Open says what is missing and how to get it. Where the
// loader finds a real NVRTC (the GPU machine), Open must succeed instead.
func TestOpenWithoutNVRTC(t *testing.T) {
	t.Setenv("SYMM_NVRTC_LIB", filepath.Join(t.TempDir(), "libnvrtc.so.13")) // not there
	_, err13 := dl.Open("libnvrtc.so.13")
	_, err12 := dl.Open("libnvrtc.so.12")
	n, err := Open([]string{t.TempDir()})
	if err13 == nil || err12 == nil {
		require.NoError(t, err, "a real NVRTC is on the loader path")
		n.Close()
		return
	}
	require.True(t, errors.Is(err, ErrNoNVRTC), "%v", err)
	require.ErrorContains(t, err, "SYMM_NVRTC_LIB")
	require.ErrorContains(t, err, "libnvrtc.so.13 not found")
}

// A library without NVRTC's functions is refused with the missing name.
func TestOpenNotNVRTC(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "x.c")
	require.NoError(t, os.WriteFile(src, []byte("int nvrtcVersion(int *a, int *b) { *a = 13; *b = 0; return 0; }\n"), 0o644))
	lib := filepath.Join(dir, "libnvrtc.so.13")
	buildLib(t, src, lib)
	t.Setenv("SYMM_NVRTC_LIB", lib)
	_, err := Open(nil)
	require.ErrorContains(t, err, "nvrtcCreateProgram")
	require.ErrorContains(t, err, "is not a usable NVRTC")
}

// The real NVRTC, where one is installed (the GPU machine; CI has none):
// the kernel compiles for Hopper, and a broken one returns NVRTC's log.
func TestCompileWithRealNVRTC(t *testing.T) {
	n, err := Open(nil)
	if errors.Is(err, ErrNoNVRTC) && os.Getenv("SYMM_REQUIRE_NVRTC") != "1" {
		t.Skipf("no NVRTC on this machine: %v", err)
	}
	require.NoError(t, err)
	defer n.Close()
	cubin, err := n.Compile(fillSrc, "fill.cu", 9, 0)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(cubin, []byte("\x7fELF")))
	require.True(t, bytes.Contains(cubin, []byte("symm_fill")), "the kernel's name is in the CUBIN")
	t.Logf("%s: fill.cu -> %d bytes of sm_90 CUBIN", n.Path(), len(cubin))

	_, err = n.Compile(fillSrc+"\nthis is not C++;\n", "broken.cu", 9, 0)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Log, "broken.cu", "NVRTC's log names the source")
}
