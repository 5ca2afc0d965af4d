package kernels

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
)

func TestCacheDir(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	require.Equal(t, "/c", CacheDir(env("SYMM_KERNEL_CACHE", "/c", "HOME", "/h")))
	require.Equal(t, "", CacheDir(env("SYMM_KERNEL_CACHE", "off", "HOME", "/h")))
	require.Equal(t, "/x/libsymm/kernels", CacheDir(env("XDG_CACHE_HOME", "/x", "HOME", "/h")))
	require.Equal(t, "/h/.cache/libsymm/kernels", CacheDir(env("HOME", "/h")))
	require.Equal(t, "", CacheDir(env()))
}

// The second process finds the CUBIN on disk; a different source, target or
// a damaged file compiles again; an unwritable cache only costs a compile.
func TestLoaderDiskCache(t *testing.T) {
	fakeNVRTC(t)
	n, err := Open(nil)
	require.NoError(t, err)
	defer n.Close()
	dir := t.TempDir()

	c1, disk, err := NewLoader(n, "fill.cu", fillSrc, dir).CUBIN(9, 0, 13000)
	require.NoError(t, err)
	require.False(t, disk, "first: compiled")
	l2 := NewLoader(n, "fill.cu", fillSrc, dir)
	c2, disk, err := l2.CUBIN(9, 0, 13000)
	require.NoError(t, err)
	require.True(t, disk, "second loader: from disk")
	require.Equal(t, c1, c2)
	c3, disk, err := l2.CUBIN(9, 0, 13000)
	require.NoError(t, err)
	require.False(t, disk, "then from memory")
	require.Equal(t, c1, c3)

	for _, c := range []struct {
		name, src  string
		major, drv int
	}{
		{"other source", fillSrc + "// changed\n", 9, 13000},
		{"other target", fillSrc, 8, 13000},
		{"other driver", fillSrc, 9, 13010},
	} {
		_, disk, err := NewLoader(n, "fill.cu", c.src, dir).CUBIN(c.major, 0, c.drv)
		require.NoError(t, err, c.name)
		require.False(t, disk, "%s: compiled, not taken from the cache", c.name)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.cubin"))
	require.NoError(t, err)
	require.Len(t, files, 4)

	// A damaged file is compiled over.
	l := NewLoader(n, "fill.cu", fillSrc, dir)
	path := filepath.Join(dir, l.cacheKey(9, 0, 13000))
	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o644))
	c4, disk, err := l.CUBIN(9, 0, 13000)
	require.NoError(t, err)
	require.False(t, disk)
	require.Equal(t, c1, c4)
	onDisk, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, c1, onDisk, "rewritten")

	// A cache directory that cannot be created: compiled, no error.
	blocker := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	_, _, err = NewLoader(n, "fill.cu", fillSrc, filepath.Join(blocker, "sub")).CUBIN(9, 0, 13000)
	require.NoError(t, err)

	// A compile error reaches the caller and caches nothing.
	_, _, err = NewLoader(n, "bad.cu", "#error x\n", dir).CUBIN(9, 0, 13000)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
}

// On a GPU: the kernel compiled by the real NVRTC loads, runs and writes
// what it should; a missing kernel name and a bad argument are errors.
func TestLoaderOnGPU(t *testing.T) {
	b, err := cuda.NewBackend()
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	n, err := Open(nil)
	require.NoError(t, err, "NVRTC must be found where there is a GPU (set SYMM_NVRTC_LIB)")
	defer n.Close()
	l := NewLoader(n, "fill.cu", fillSrc, t.TempDir())
	f, err := l.Function(0, "symm_fill")
	require.NoError(t, err)
	const words = 1000
	ptr, err := b.Alloc(0, 4*words)
	require.NoError(t, err)
	defer b.Free(0, ptr, 4*words)
	require.NoError(t, cuda.Memset(0, ptr, 0, 4*words))
	require.NoError(t, cuda.Launch(0, f, cuda.Dim3{X: 4, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, 0,
		ptr, uint32(0xabcd1234), int32(words-1)))
	require.NoError(t, cuda.StreamSynchronize(0, 0))
	out := make([]byte, 4*words)
	require.NoError(t, cuda.MemcpyDtoH(0, out, ptr))
	for i := range words - 1 {
		require.Equal(t, uint32(0xabcd1234), binary.LittleEndian.Uint32(out[4*i:]), "word %d", i)
	}
	require.Zero(t, binary.LittleEndian.Uint32(out[4*(words-1):]), "n bounds the kernel")

	f2, err := l.Function(0, "symm_fill")
	require.NoError(t, err)
	require.Equal(t, f, f2, "the module is loaded once per device")
	_, err = l.Function(0, "no_such_kernel")
	require.ErrorContains(t, err, "cuModuleGetFunction")
	err = cuda.Launch(0, f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, 0, ptr, "x", int32(1))
	require.ErrorContains(t, err, "argument 1 has type string")
}
