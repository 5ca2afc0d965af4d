package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/topology"
)

// Nothing in the source may create or use multicast memory.
func TestSymmSourceHasNoMulticast(t *testing.T) {
	require.NotContains(t, strings.ToLower(SymmSource), "multimem.")
	require.NotContains(t, SymmSource, "cuMulticast")
}

func symmKernels() []string {
	ks := []string{Barrier, PutSignal, WaitSignal, PushInit, PadReset}
	for _, d := range Dtypes() { // every dtype of include/symm.h has its kernels
		ks = append(ks, PushAllReduceKernel(d))
	}
	for _, d := range Dtypes() {
		for _, v := range []int{4, 1} {
			for _, w := range []int{2, 3, 4, 8} {
				ks = append(ks, AllReduceKernel(d, v, w), TwoShotAllReduceKernel(d, v, w), ReduceScatterKernel(d, v, w))
			}
		}
	}
	return append(ks, AllGatherKernel(4), AllGatherKernel(1))
}

// symm.cu compiles, for every architecture libsymm runs on, wherever an
// NVRTC is found (no GPU needed: `pip install nvidia-cuda-nvrtc` and
// SYMM_NVRTC_LIB, or the GPU machine), and every kernel name is in the CUBIN.
func TestSymmSourceCompiles(t *testing.T) {
	n, err := Open(nil)
	if errors.Is(err, ErrNoNVRTC) && os.Getenv("SYMM_REQUIRE_NVRTC") != "1" {
		t.Skipf("no NVRTC on this machine: %v", err)
	}
	require.NoError(t, err)
	defer n.Close()
	for _, cc := range [][2]int{{8, 0}, {9, 0}, {10, 0}} {
		cubin, err := n.Compile(SymmSource, SymmName, cc[0], cc[1])
		if err != nil && cc[0] == 10 && strings.Contains(err.Error(), "invalid value for --gpu-architecture") {
			continue // an NVRTC older than Blackwell
		}
		require.NoError(t, err, "sm_%d%d", cc[0], cc[1])
		for _, k := range symmKernels() {
			require.True(t, bytes.Contains(cubin, []byte(k)), "%s in the sm_%d%d CUBIN", k, cc[0], cc[1])
		}
		t.Logf("%s: sm_%d%d CUBIN of %d bytes", n.Path(), cc[0], cc[1], len(cubin))
	}
}

// The push all-reduce's grid: a thread per line, blocks of 256 (one warp
// for the smallest), at most 128 blocks; its set-up at least one block.
func TestPushLaunch(t *testing.T) {
	for _, c := range []struct {
		nlines         uint64
		blocks, thread uint32
	}{{1, 1, 32}, {33, 1, 64}, {256, 1, 256}, {257, 2, 256}, {1024, 4, 256}, {65536, 128, 256}, {1 << 20, 128, 256}} {
		b, th := PushLaunch(c.nlines)
		require.Equal(t, [2]uint32{c.blocks, c.thread}, [2]uint32{b, th}, "%d lines", c.nlines)
	}
	for _, c := range [][3]uint64{{0, 1, 512}, {1, 1, 512}, {513, 2, 512}, {1 << 30, 128, 512}} {
		b, th := PushInitLaunch(c[0])
		require.Equal(t, [2]uint32{uint32(c[1]), uint32(c[2])}, [2]uint32{b, th}, "%d lines", c[0])
	}
	require.Equal(t, "float16", Float16.String())
	require.Equal(t, 2, Float16.Size())
	// The kernel's per-block copies of the call number cover the largest grid.
	require.Contains(t, SymmSource, fmt.Sprintf("#define SYMM_PUSH_MAX_BLOCKS %d\n", PushMaxBlocks))
}

func TestDecodeReport(t *testing.T) {
	_, ok := DecodeReport(0)
	require.False(t, ok)
	w := uint64(1)<<63 | uint64(OpWait)<<56 | uint64(70)<<32 | 511
	r, ok := DecodeReport(w)
	require.True(t, ok)
	require.Equal(t, Report{Op: OpWait, Peer: 70, Channel: 511}, r)
	w = uint64(1)<<63 | uint64(OpMismatch)<<56 | uint64(3)<<32 | uint64(MeetOneShotIn)<<24 | uint64(MeetReset)<<16 | 17
	r, ok = DecodeReport(w)
	require.True(t, ok)
	require.Equal(t, Report{Op: OpMismatch, Peer: 3, Channel: 17, Mine: MeetReset, Theirs: MeetOneShotIn}, r)
}

// The numbers the kernels share with the host have one owner: the .cu files
// define none of sourceConstants' names, every SYMM_* name they use is
// either defined by the source's head or a macro of their own, and the
// head holds each constant once, with its value.
func TestSourceConstantsAreDefinedOnce(t *testing.T) {
	defined := map[string]bool{}
	head := sourceDefines()
	require.True(t, strings.HasPrefix(SymmSource, head))
	for _, c := range sourceConstants() {
		require.False(t, defined[c.Name], "%s defined twice", c.Name)
		defined[c.Name] = true
		require.Regexp(t, fmt.Sprintf(`(?m)^#define %s %s$`, c.Name, c.literal()), head)
	}
	own := map[string]bool{}
	for _, src := range []string{symmCore, symmCollectives, symmPush} {
		for _, m := range regexp.MustCompile(`(?m)^#define (SYMM_\w+)`).FindAllStringSubmatch(src, -1) {
			require.False(t, defined[m[1]], "%s retyped in a .cu file", m[1])
			own[m[1]] = true
		}
	}
	// The host's X-macro of dtypes (kernelDtypes), defined once in the head.
	require.Equal(t, 1, strings.Count(head, "#define SYMM_KERNEL_DTYPES(X)"))
	defined["SYMM_KERNEL_DTYPES"] = true
	require.Contains(t, head, "#define SYMM_KERNEL_DTYPES(X) X(f32, SYMM_FLOAT32) X(bf16, SYMM_BFLOAT16) X(f16, SYMM_FLOAT16)\n")
	code := regexp.MustCompile(`//[^\n]*`).ReplaceAllString(symmCore+symmCollectives+symmPush, "")
	for _, name := range regexp.MustCompile(`\bSYMM_[A-Z0-9_]+\b`).FindAllString(code, -1) {
		require.True(t, defined[name] || own[name], "%s is used by the kernels but defined nowhere", name)
	}
	require.Equal(t, 512, PadSlots)
	require.Contains(t, head, "#define SYMM_EPOCH_STOPPED 2147483648u\n")
	require.Contains(t, head, "#define SYMM_OP_PUT 1\n")
}

// The dtypes are include/symm.h's SYMM_DTYPES, read through cgo: codes,
// names and sizes.
func TestDtypesComeFromTheHeader(t *testing.T) {
	require.Equal(t, []Dtype{Float32, BFloat16, Float16}, Dtypes())
	require.Len(t, Dtypes(), NumDtypes)
	require.Len(t, dtypes, NumDtypes) // the codes are 0 to NumDtypes-1
	for d, want := range map[Dtype][2]any{Float32: {"float32", 4}, BFloat16: {"bfloat16", 2}, Float16: {"float16", 2}} {
		require.Equal(t, want, [2]any{d.String(), d.Size()})
	}
	require.Equal(t, [3]int{0, 1, 2}, [3]int{int(Float32), int(BFloat16), int(Float16)})
	require.Equal(t, "dtype(7)", Dtype(7).String())
	require.Equal(t, 0, Dtype(-1).Size())
}

func TestAllReduceLaunch(t *testing.T) {
	for _, c := range []struct {
		nwords         uint64
		v              int
		blocks, thread uint32
	}{
		{1, 1, 1, 32}, {1024, 4, 1, 256}, {2048, 4, 1, 512}, {2049, 4, 2, 512},
		{1 << 20, 4, 96, 512}, {1 << 20, 1, 96, 512}, {100, 1, 1, 128}, {20 * 2048, 4, 20, 512},
	} {
		b, th := AllReduceLaunch(c.nwords, c.v, DefaultCollectiveBlocks)
		require.Equal(t, [2]uint32{c.blocks, c.thread}, [2]uint32{b, th}, "%d words, %d per thread", c.nwords, c.v)
	}
	b, th := AllReduceLaunch(1<<20, 4, 96)
	require.Equal(t, [2]uint32{96, 512}, [2]uint32{b, th}, "a larger cap")
	b, th = AllReduceLaunch(1<<20, 4, 0)
	require.Equal(t, [2]uint32{1, 512}, [2]uint32{b, th}, "a cap of 0 is 1")
	require.Equal(t, "symm_ar_bf16_v1_wany", AllReduceKernel(BFloat16, 1, 3))
	require.Equal(t, "symm_push_ar_f16", PushAllReduceKernel(Float16))
	require.Equal(t, "symm_ar_f32_v4_w8", AllReduceKernel(Float32, 4, 8))
	require.Equal(t, "symm_ts_bf16_v4_w2", TwoShotAllReduceKernel(BFloat16, 4, 2))
	require.Equal(t, "symm_ts_f32_v1_wany", TwoShotAllReduceKernel(Float32, 1, 6))
	require.Equal(t, "symm_rs_bf16_v4_w8", ReduceScatterKernel(BFloat16, 4, 8))
	require.Equal(t, "symm_ag_v1", AllGatherKernel(1))
}

// Probe reports NVRTC's version, or why it cannot be used, and an entry per
// device (none here: the devices come from topology.Discover).
func TestProbe(t *testing.T) {
	fakeNVRTC(t)
	var top topology.Topology
	Probe(&top, nil, "", true)
	require.NotNil(t, top.Kernels)
	require.Empty(t, top.Kernels.Error)
	require.NotEmpty(t, top.Kernels.NVRTC)
	require.Empty(t, top.Kernels.Devices)

	t.Setenv("SYMM_NVRTC_LIB", filepath.Join(t.TempDir(), "libnvrtc.so.13"))
	t.Setenv("LD_LIBRARY_PATH", "")
	Probe(&top, nil, "", true)
	if top.Kernels.NVRTC == "" { // a real NVRTC on the loader path would answer
		require.Contains(t, top.Kernels.Error, "NVRTC not found")
	}
}
