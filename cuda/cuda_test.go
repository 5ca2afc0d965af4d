package cuda

// Three kinds of tests live here:
//   - plain ones (error texts, the symbol table, loading failures), which run
//     everywhere;
//   - TestFake*, which compile testdata/fakecuda.c with the system C compiler
//     and load it through openDriver, exercising loading, the trampolines and
//     the context handling without a GPU (skipped without a C compiler);
//   - TestGPU*, which use the real driver and skip when it cannot be loaded.
// No test uses cgo.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
)

// ---- plain tests -------------------------------------------------------------

func TestResultBuiltinText(t *testing.T) {
	cases := []struct {
		r    Result
		name string
		desc string
	}{
		{0, "CUDA_SUCCESS", "no error"},
		{1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
		{2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
		{3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
		{4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
		{34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
		{46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
		{100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
		{101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
		{200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
		{201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
		{304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
		{400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
		{500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
		{600, "CUDA_ERROR_NOT_READY", "device not ready"},
		{700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
		{801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
		{999, "CUDA_ERROR_UNKNOWN", "unknown error"},
	}
	// With a real driver loaded, the text is the driver's: the names are
	// those of cuda.h, the descriptions may be worded differently.
	driverText := errorTextDriver.Load() != nil
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.name, builtinResults[c.r].name)
			require.Equal(t, c.desc, builtinResults[c.r].desc)
			require.Equal(t, c.name, c.r.Name())
			if driverText {
				require.True(t, strings.HasPrefix(c.r.Error(), c.name+": "), c.r.Error())
			} else {
				require.Equal(t, c.name+": "+c.desc, c.r.Error())
			}
		})
	}
	require.Equal(t, "CUresult 12345: unrecognized error code", Result(12345).Error())
	require.Equal(t, "CUresult 12345", Result(12345).Name())
}

func TestResultOutOfMemory(t *testing.T) {
	require.True(t, ErrorOutOfMemory.OutOfMemory())
	for _, r := range []Result{Success, ErrorInvalidValue, ErrorNotReady, ErrorUnknown, 3, 100} {
		require.False(t, r.OutOfMemory(), r.Name())
	}

	err := fmt.Errorf("cuMemAlloc(%d bytes) on device %d: %w", 1<<20, 0, ErrorOutOfMemory)
	require.True(t, allocator.IsOutOfMemory(err))
	var r Result
	require.True(t, errors.As(err, &r))
	require.Equal(t, ErrorOutOfMemory, r)
	require.ErrorIs(t, err, ErrorOutOfMemory)
	require.Equal(t, "cuMemAlloc(1048576 bytes) on device 0: CUDA_ERROR_OUT_OF_MEMORY: out of memory", err.Error())

	require.False(t, allocator.IsOutOfMemory(fmt.Errorf("x: %w", ErrorInvalidValue)))
}

// The brief and DESIGN.md: no multicast object function is ever resolved or
// named. Check the table, and every non-test source file of the package.
func TestSymbolTableHasNoMulticast(t *testing.T) {
	seen := map[string]bool{}
	nRequired := 0
	for id, s := range symbols {
		require.NotEmpty(t, s.name, "symbols[%d] is not filled in", id)
		require.NotContains(t, strings.ToLower(s.name), "multicast")
		require.True(t, strings.HasPrefix(s.name, "cu"), s.name)
		require.NotContains(t, s.name, "_v", "%s: request base names; the ABI version picks the variant", s.name)
		require.NotContains(t, s.name, "_pt", s.name)
		// A name is listed once per ABI version it is asked at.
		key := fmt.Sprint(s.name, symbolVersion[fnID(id)])
		require.False(t, seen[key], "%s listed twice", s.name)
		seen[key] = true
		require.NotEmpty(t, s.purpose)
		if s.required {
			nRequired++
		}
	}
	require.Equal(t, 32, nRequired)
	require.Len(t, symbols, 66)

	if _, err := os.Stat("shim.h"); err != nil {
		t.Log("not run from the package directory: source scan skipped")
		return
	}
	files, err := filepath.Glob("*")
	require.NoError(t, err)
	more, err := filepath.Glob("testdata/*")
	require.NoError(t, err)
	for _, f := range append(files, more...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		if st, err := os.Stat(f); err != nil || st.IsDir() {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NotContains(t, strings.ToLower(string(b)), "cumulticast", f)
	}
}

func TestMissingSymbolError(t *testing.T) {
	e := &MissingSymbolError{Symbol: "cuMemCreate", Purpose: purposeVMM, Library: "libcuda.so.1"}
	require.Equal(t, "cuda: driver libcuda.so.1 lacks cuMemCreate (needed for virtual memory management (expandable segments, symmetric memory))", e.Error())
	e.Library = ""
	require.Equal(t, "cuda: driver lacks cuMemCreate (needed for virtual memory management (expandable segments, symmetric memory))", e.Error())
}

// A zero driver has no functions and no devices: every entry point must
// return an error before reaching C.
func TestUnloadedDriverErrors(t *testing.T) {
	d := &driver{}

	err := d.streamValue32(fnStreamWriteValue32, 0, 0, 0, 1, 0)
	var missing *MissingSymbolError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, "cuStreamWriteValue32", missing.Symbol)
	require.ErrorContains(t, d.streamValue32(fnStreamWaitValue32, 0, 0, 0, 1, 0), "cuStreamWaitValue32")
	require.ErrorContains(t, d.vmmAvailable(), "cuda: driver lacks cuMemCreate")

	// The VMM functions, the stream query and the peer query too.
	_, err = d.memCreate(0, 2<<20)
	require.ErrorAs(t, err, &missing)
	require.Equal(t, "cuMemCreate", missing.Symbol)
	_, _, err = d.granularity(0)
	require.ErrorContains(t, err, "lacks cuMemGetAllocationGranularity")
	require.ErrorContains(t, d.memRelease(0, 1), "lacks cuMemRelease")
	_, err = d.exportFD(0, 1)
	require.ErrorContains(t, err, "lacks cuMemExportToShareableHandle")
	_, err = d.importFD(0, 0)
	require.ErrorContains(t, err, "lacks cuMemImportFromShareableHandle")
	_, err = d.mapNew(0, 1, 2<<20, nil)
	require.ErrorContains(t, err, "lacks cuMemAddressReserve")
	require.ErrorContains(t, d.unmapFree(0, 0x200000, 2<<20), "lacks cuMemUnmap")
	require.ErrorContains(t, d.setAccess(0, 0x200000, 2<<20, []int{0}), "lacks cuMemSetAccess")
	_, err = d.retainAllocationHandle(0, 0x200000)
	require.ErrorContains(t, err, "lacks cuMemRetainAllocationHandle")
	_, err = d.streamQuery(0, 0)
	require.ErrorContains(t, err, "lacks cuStreamQuery (needed for stream queries")
	_, err = d.canAccessPeer(0, 0)
	require.ErrorContains(t, err, "lacks cuDeviceCanAccessPeer")

	_, err = d.memAlloc(0, 512)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	require.ErrorContains(t, err, "device 0 does not exist (0 visible)")
	_, err = d.primaryContext(-1)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	_, err = d.deviceName(3)
	require.ErrorIs(t, err, ErrorInvalidDevice)
}

func TestConfigPath(t *testing.T) {
	t.Setenv(settings.CUDALib.Name, "")
	require.Equal(t, DefaultLibrary, newConfig(nil).path)

	t.Setenv(settings.CUDALib.Name, "/opt/driver/libcuda.so.1")
	require.Equal(t, "/opt/driver/libcuda.so.1", newConfig(nil).path)
	require.Equal(t, "/elsewhere/libcuda.so", newConfig([]Option{WithLibrary("/elsewhere/libcuda.so")}).path,
		"an explicit option beats the environment")
}

func TestLibraryFromEnvMissing(t *testing.T) {
	const path = "/nonexistent/symm-test/libcuda.so.1"
	t.Setenv(settings.CUDALib.Name, path)
	d, err := openDriver(newConfig(nil).path)
	require.Nil(t, d)
	require.ErrorContains(t, err, "cuda: dlopen "+path+": ")
	require.ErrorContains(t, err, path+": cannot open shared object file")
}

// driverLoads reports whether the process-wide driver loads here.
func driverLoads() bool { return Load() == nil }

func TestLoadWithoutDriver(t *testing.T) {
	if driverLoads() {
		t.Skip("a CUDA driver is present")
	}
	if os.Getenv(settings.CUDALib.Name) != "" {
		t.Skipf("%s is set", settings.CUDALib.Name)
	}
	err := Load()
	require.ErrorContains(t, err, "cuda: dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file")
	require.Equal(t, err, Load(), "a failed load returns the same error every time")
	require.True(t, err == Load())

	// The helpers report the load error too.
	_, err2 := DeviceCount()
	require.Equal(t, err, err2)
	require.Equal(t, err, MemcpyHtoD(0, 0x1000, []byte{1}))
	_, _, err2 = Granularity(0)
	require.Equal(t, err, err2)
	_, err2 = MemCreate(0, 2<<20)
	require.Equal(t, err, err2)
	_, err2 = MapNew(0, 1, 2<<20, nil)
	require.Equal(t, err, err2)
	require.Equal(t, err, UnmapFree(0, 0x200000, 2<<20))
	require.Equal(t, err, MemRelease(0, 1))
	_, err2 = ImportFD(0, 0)
	require.Equal(t, err, err2)
	_, err2 = StreamQuery(0, 0)
	require.Equal(t, err, err2)
	_, err2 = CanAccessPeer(0, 0)
	require.Equal(t, err, err2)

	// Another library cannot be loaded once the first attempt is decided.
	err = Load(WithLibrary("/nonexistent/other/libcuda.so.1"))
	require.ErrorContains(t, err, "loaded once per process, from libcuda.so.1")
}

func TestNewBackendWithoutDriver(t *testing.T) {
	if driverLoads() {
		t.Skip("a CUDA driver is present")
	}
	b, err := NewBackend()
	require.Nil(t, b)
	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorContains(t, err, "SYMM_DEVICE=host")
	if os.Getenv(settings.CUDALib.Name) == "" {
		require.ErrorContains(t, err, "libcuda.so.1")
		require.True(t, strings.HasPrefix(err.Error(), "no CUDA device: cuda: dlopen libcuda.so.1: "), err.Error())
	}
}

// ---- the fake driver ---------------------------------------------------------

var fakeBuilds struct {
	sync.Mutex
	dir  string
	libs map[string]string // variant → built library
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeBuilds.dir != "" {
		os.RemoveAll(fakeBuilds.dir)
	}
	os.Exit(code)
}

// fakeLib builds testdata/fakecuda.c (variant "v2", or "v1" for a CUDA 11.8
// driver) once per test binary, and returns a private copy: dlopen shares
// one instance per file, and each test wants a fresh driver state.
func fakeLib(t *testing.T, variant string) string {
	t.Helper()
	fakeBuilds.Lock()
	defer fakeBuilds.Unlock()
	if fakeBuilds.libs == nil {
		fakeBuilds.libs = map[string]string{}
	}
	lib, ok := fakeBuilds.libs[variant]
	if !ok {
		if _, err := os.Stat("testdata/fakecuda.c"); err != nil {
			t.Skipf("fake driver source not found (run from the package directory): %v", err)
		}
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		if _, err := exec.LookPath(cc); err != nil {
			t.Skipf("no C compiler (%s) to build the fake driver", cc)
		}
		if fakeBuilds.dir == "" {
			dir, err := os.MkdirTemp("", "symm-fakecuda-")
			require.NoError(t, err)
			fakeBuilds.dir = dir
		}
		lib = filepath.Join(fakeBuilds.dir, "libfakecuda-"+variant+".so")
		args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", lib, "testdata/fakecuda.c", "-lpthread"}
		if variant == "v1" {
			args = append(args, "-DFAKE_V1")
		}
		out, err := exec.Command(cc, args...).CombinedOutput()
		require.NoError(t, err, "building the fake driver: %s", out)
		fakeBuilds.libs[variant] = lib
	}
	cp := filepath.Join(t.TempDir(), "libcuda.so.1")
	src, err := os.Open(lib)
	require.NoError(t, err)
	defer src.Close()
	dst, err := os.Create(cp)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	return cp
}

func openFake(t *testing.T, variant string) *driver {
	t.Helper()
	d, err := openDriver(fakeLib(t, variant))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.close()) })
	return d
}

func TestFakeLoadV2(t *testing.T) {
	d := openFake(t, "v2")
	require.True(t, d.getProc, "cuGetProcAddress_v2 is preferred")
	require.Equal(t, 12000, d.abi)
	require.Equal(t, 12040, d.version)
	require.Len(t, d.devs, 2)
	for id, s := range symbols {
		if s.required {
			require.NotNil(t, d.fn[id], s.name)
		}
	}
	require.NotNil(t, d.fn[fnStreamWriteValue32])
	require.NotNil(t, d.fn[fnStreamQuery])
	require.NotNil(t, d.fn[fnDeviceCanAccessPeer])
	require.NoError(t, d.vmmAvailable(), "the fake has every VMM function")

	// The fake hands out CUdevice = ordinal + 10: devs must hold handles.
	require.EqualValues(t, 10, d.devs[0])
	require.EqualValues(t, 11, d.devs[1])
	name, err := d.deviceName(1)
	require.NoError(t, err)
	require.Equal(t, "Fake GPU 1", name)
	total, err := d.totalMem(0)
	require.NoError(t, err)
	require.EqualValues(t, 1<<30, total)
	cc, err := d.deviceAttribute(1, AttrComputeCapabilityMajor)
	require.NoError(t, err)
	require.Equal(t, 9, cc)
	n, err := d.deviceCount()
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

func TestFakeLoadV1(t *testing.T) {
	d := openFake(t, "v1")
	require.False(t, d.getProc)
	require.Equal(t, 11080, d.abi, "an 11.x driver is asked at its own version")
	require.Equal(t, 11080, d.version)
	require.NotNil(t, d.fn[fnMemAlloc])
	require.NotNil(t, d.fn[fnMemCreate], "CUDA 11 drivers have VMM too")
}

func TestFakeErrorText(t *testing.T) {
	d := openFake(t, "v2")
	name, desc, ok := d.errorText(ErrorOutOfMemory)
	require.True(t, ok)
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", name)
	require.Equal(t, "fake out of memory", desc)
	_, _, ok = d.errorText(12345)
	require.False(t, ok)
}

func TestFakeMissingRequiredSymbol(t *testing.T) {
	for _, variant := range []string{"v2", "v1"} {
		t.Run(variant, func(t *testing.T) {
			t.Setenv("FAKE_CUDA_OMIT", "cuEventQuery,cuMemFree")
			path := fakeLib(t, variant)
			d, err := openDriver(path)
			require.Nil(t, d)
			var missing *MissingSymbolError
			require.ErrorAs(t, err, &missing)
			require.Equal(t, "cuMemFree", missing.Symbol, "the first missing one in table order")
			require.Equal(t, "cuda: driver "+path+" lacks cuMemFree (needed for every CUDA backend operation)", err.Error())
		})
	}
}

func TestFakeMissingOptionalSymbol(t *testing.T) {
	t.Setenv("FAKE_CUDA_OMIT", "cuStreamWriteValue32")
	d := openFake(t, "v2")
	require.Nil(t, d.fn[fnStreamWriteValue32])
	err := d.streamValue32(fnStreamWriteValue32, 0, 0, 0x1000, 1, 0)
	require.ErrorContains(t, err, "lacks cuStreamWriteValue32 (needed for stream memory operations (signal pads))")
}

func TestFakeInitFails(t *testing.T) {
	t.Setenv("FAKE_CUDA_INIT_RESULT", "100")
	path := fakeLib(t, "v2")
	d, err := openDriver(path)
	require.Nil(t, d)
	require.ErrorIs(t, err, Result(100))
	require.ErrorContains(t, err, "cuda: "+path+": cuInit(0): CUDA_ERROR_NO_DEVICE")
}

func TestFakeNoDevices(t *testing.T) {
	t.Setenv("FAKE_CUDA_DEVICES", "0")
	d := openFake(t, "v2")
	b, err := newBackend(d)
	require.Nil(t, b)
	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorContains(t, err, "0 devices")
	require.ErrorContains(t, err, "SYMM_DEVICE=host")
}

func TestFakeBackend(t *testing.T) {
	d := openFake(t, "v2")
	b, err := newBackend(d)
	require.NoError(t, err)
	require.Equal(t, "cuda", b.Name())
	n, err := b.DeviceCount()
	require.NoError(t, err)
	require.Equal(t, 2, n)

	for dev := 0; dev < 2; dev++ {
		free0, total, err := b.MemInfo(dev)
		require.NoError(t, err)
		require.EqualValues(t, 1<<30, total)
		require.Equal(t, total, free0)

		const size = 1 << 20
		p, err := b.Alloc(dev, size)
		require.NoError(t, err)
		require.Zero(t, p%512)
		free1, _, err := b.MemInfo(dev)
		require.NoError(t, err)
		require.Equal(t, free0-size, free1)
		owner, err := d.pointerDevice(p)
		require.NoError(t, err)
		require.Equal(t, dev, owner)

		src := make([]byte, size)
		for i := range src {
			src[i] = byte(i*7 + dev)
		}
		require.NoError(t, d.memcpyHtoD(dev, p, src))
		dst := make([]byte, size)
		require.NoError(t, d.memcpyDtoH(dev, dst, p))
		require.True(t, bytes.Equal(src, dst))

		require.NoError(t, d.memset(dev, p+100, 0xAB, 50))
		require.NoError(t, d.memcpyDtoH(dev, dst[:200], p))
		require.Equal(t, src[:100], dst[:100])
		require.Equal(t, bytes.Repeat([]byte{0xAB}, 50), dst[100:150])
		require.Equal(t, src[150:200], dst[150:200])

		require.NoError(t, b.Free(dev, p, size))
		free2, _, err := b.MemInfo(dev)
		require.NoError(t, err)
		require.Equal(t, free0, free2)

		err = b.Free(dev, p, size)
		require.ErrorIs(t, err, ErrorInvalidValue, "double free")
		require.ErrorContains(t, err, fmt.Sprintf("cuMemFree(%#x) on device %d", p, dev))
	}

	// Out of memory is recognizable by the allocator.
	_, err = b.Alloc(1, 2<<30)
	require.True(t, allocator.IsOutOfMemory(err), "%v", err)
	require.ErrorContains(t, err, "cuMemAlloc(2147483648 bytes) on device 1: ")

	// Devices out of range.
	for _, dev := range []int{-1, 2, 100} {
		_, err = b.Alloc(dev, 512)
		require.ErrorIs(t, err, ErrorInvalidDevice)
		_, _, err = b.MemInfo(dev)
		require.ErrorIs(t, err, ErrorInvalidDevice)
		_, err = b.NewEvent(dev)
		require.ErrorIs(t, err, ErrorInvalidDevice)
	}
}

func TestFakeEvents(t *testing.T) {
	d := openFake(t, "v2")
	b, err := newBackend(d)
	require.NoError(t, err)

	ev, err := b.NewEvent(0)
	require.NoError(t, err)
	require.NotZero(t, ev)

	// Stream 0 is sent as CU_STREAM_LEGACY (the fake refuses NULL).
	require.NoError(t, b.Record(0, ev, 0))
	done, err := b.Query(0, ev)
	require.NoError(t, err)
	require.False(t, done, "CUDA_ERROR_NOT_READY is false, nil")
	done, err = b.Query(0, ev)
	require.NoError(t, err)
	require.True(t, done)

	s, err := d.streamCreate(0)
	require.NoError(t, err)
	require.NoError(t, b.Record(0, ev, s))
	require.NoError(t, b.Sync(0, ev))
	done, err = b.Query(0, ev)
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, d.streamSync(0, s))
	require.NoError(t, d.streamSync(0, 0))
	require.NoError(t, d.ctxSync(0), "every stream of the device")

	// A stream of device 0 cannot be used with device 1's context.
	ev1, err := b.NewEvent(1)
	require.NoError(t, err)
	require.ErrorIs(t, b.Record(1, ev1, s), ErrorInvalidHandle)
	require.NoError(t, b.DestroyEvent(1, ev1))

	require.NoError(t, d.streamDestroy(0, s))
	require.ErrorIs(t, d.streamDestroy(0, 0), ErrorInvalidHandle)
	require.NoError(t, b.DestroyEvent(0, ev))
}

func TestFakeStreamValue32(t *testing.T) {
	d := openFake(t, "v2")
	p, err := d.memAlloc(1, 512)
	require.NoError(t, err)
	require.NoError(t, d.streamValue32(fnStreamWriteValue32, 1, 0, p+4, 0xdeadbeef, 0))
	buf := make([]byte, 8)
	require.NoError(t, d.memcpyDtoH(1, buf, p))
	require.Equal(t, []byte{0, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde}, buf[:8], "little-endian 32-bit write at +4")
	require.NoError(t, d.streamValue32(fnStreamWaitValue32, 1, 0, p+4, 1, WaitValueGEQ))
	require.NoError(t, d.memFree(1, p))
}

func TestFakeMisalignedAlloc(t *testing.T) {
	t.Setenv("FAKE_CUDA_MISALIGN", "1")
	d := openFake(t, "v2")
	b, err := newBackend(d)
	require.NoError(t, err)
	_, err = b.Alloc(0, 4096)
	require.ErrorContains(t, err, "not 512-byte aligned")
	free, total, err := b.MemInfo(0)
	require.NoError(t, err)
	require.Equal(t, total, free, "the misaligned block was freed")
}

// An operation leaves the calling thread's current context as it was: none,
// another device's, or the device's own (which it then uses, pushing nothing).
func TestFakeContextRestored(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := openFake(t, "v2")

	cur, err := d.currentContext()
	require.NoError(t, err)
	require.Zero(t, cur)

	p0, err := d.memAlloc(0, 4096)
	require.NoError(t, err)
	cur, err = d.currentContext()
	require.NoError(t, err)
	require.Zero(t, cur, "no context before, none after")

	ctx1, err := d.primaryContext(1)
	require.NoError(t, err)
	ctx0, err := d.primaryContext(0)
	require.NoError(t, err)
	require.NotEqual(t, ctx0, ctx1)
	again, err := d.primaryContext(1)
	require.NoError(t, err)
	require.Equal(t, ctx1, again, "retained once, cached")

	require.NoError(t, d.setCurrentContext(ctx1))
	p, err := d.memAlloc(0, 4096) // device 0 while device 1 is current
	require.NoError(t, err)
	owner, err := d.pointerDevice(p)
	require.NoError(t, err)
	require.Equal(t, 0, owner, "allocated in device 0's context")
	cur, err = d.currentContext()
	require.NoError(t, err)
	require.Equal(t, ctx1, cur, "the caller's context is current again")

	q, err := d.memAlloc(1, 4096) // device 1 in the caller's context
	require.NoError(t, err)
	owner, err = d.pointerDevice(q)
	require.NoError(t, err)
	require.Equal(t, 1, owner)
	cur, err = d.currentContext()
	require.NoError(t, err)
	require.Equal(t, ctx1, cur)

	// A current context of the right device that is not the cached primary
	// one is found through cuCtxGetDevice and used as is: nothing is pushed,
	// so the primary context is not looked up again.
	d.primary[1].Store(0)
	q2, err := d.memAlloc(1, 4096)
	require.NoError(t, err)
	require.Zero(t, d.primary[1].Load(), "the caller's context of device 1 was used")
	d.primary[1].Store(ctx1)
	require.NoError(t, d.memFree(1, q2))

	// Errors restore the context too.
	require.Error(t, d.memFree(0, 0xbad000))
	cur, err = d.currentContext()
	require.NoError(t, err)
	require.Equal(t, ctx1, cur)

	for _, f := range []struct {
		dev int
		p   uintptr
	}{{0, p0}, {0, p}, {1, q}} {
		require.NoError(t, d.memFree(f.dev, f.p))
	}
	require.NoError(t, d.setCurrentContext(0))
	cur, err = d.currentContext()
	require.NoError(t, err)
	require.Zero(t, cur)
}

func TestFakeConcurrent(t *testing.T) {
	d := openFake(t, "v2")
	b, err := newBackend(d)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				dev := (g + i) % 2
				p, err := b.Alloc(dev, 512*uint64(1+i%8))
				if err != nil {
					errs <- err
					return
				}
				if owner, err := d.pointerDevice(p); err != nil || owner != dev {
					errs <- fmt.Errorf("pointer %#x: device %d, want %d (%v)", p, owner, dev, err)
					return
				}
				if err := b.Free(dev, p, 0); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// ---- the real driver (skipped without one) -----------------------------------

// gpu returns a Backend over the real driver, or skips the test.
func gpu(t testing.TB) (*Backend, int) {
	t.Helper()
	if err := Load(); err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	b, err := NewBackend()
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	n, err := b.DeviceCount()
	require.NoError(t, err)
	return b, n
}

func TestGPUDriverInfo(t *testing.T) {
	_, n := gpu(t)
	require.Positive(t, n)
	v, err := DriverVersion()
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 11030)
	require.NotNil(t, errorTextDriver.Load())
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY: out of memory", ErrorOutOfMemory.Error(), "from cuGetErrorName/String")
	require.Equal(t, "CUDA_ERROR_NOT_READY", ErrorNotReady.Name())
	if v >= 12000 {
		require.NoError(t, VMMAvailable(), "a CUDA 12 driver has every VMM function")
	}
	for dev := 0; dev < n; dev++ {
		name, err := DeviceName(dev)
		require.NoError(t, err)
		require.NotEmpty(t, name)
		total, err := TotalMem(dev)
		require.NoError(t, err)
		require.Greater(t, total, uint64(1<<30))
		major, err := DeviceAttribute(dev, AttrComputeCapabilityMajor)
		require.NoError(t, err)
		require.GreaterOrEqual(t, major, 3)
		t.Logf("device %d: %s, %d MiB, sm_%d, driver %d", dev, name, total>>20, major, v)
	}
}

func TestGPUAllocRoundTrip(t *testing.T) {
	b, n := gpu(t)
	for dev := 0; dev < n; dev++ {
		for _, size := range []uint64{512, 4096, 2 << 20, 20<<20 + 512} {
			p, err := b.Alloc(dev, size)
			require.NoError(t, err)
			require.Zero(t, p%512)
			owner, err := PointerDevice(p)
			require.NoError(t, err)
			require.Equal(t, dev, owner)
			owner, err = PointerDevice(p + uintptr(size) - 1)
			require.NoError(t, err, "interior pointer")
			require.Equal(t, dev, owner)

			src := make([]byte, size)
			for i := range src {
				src[i] = byte(i*31 + dev + int(size))
			}
			require.NoError(t, MemcpyHtoD(dev, p, src))
			dst := make([]byte, size)
			require.NoError(t, MemcpyDtoH(dev, dst, p))
			require.True(t, bytes.Equal(src, dst), "round trip of %d bytes on device %d", size, dev)

			// Memset of a middle range, seen by a copy of the whole block.
			lo, hi := size/4, size/2
			require.NoError(t, Memset(dev, p+uintptr(lo), 0x5A, hi-lo))
			require.NoError(t, MemcpyDtoH(dev, dst, p))
			require.Equal(t, src[:lo], dst[:lo])
			require.Equal(t, bytes.Repeat([]byte{0x5A}, int(hi-lo)), dst[lo:hi])
			require.Equal(t, src[hi:], dst[hi:])

			// A copy at an offset.
			require.NoError(t, MemcpyHtoD(dev, p+8, []byte{1, 2, 3}))
			small := make([]byte, 12)
			require.NoError(t, MemcpyDtoH(dev, small, p))
			require.Equal(t, []byte{1, 2, 3}, small[8:11])

			require.NoError(t, b.Free(dev, p, size))
		}
	}
}

func TestGPUMemInfo(t *testing.T) {
	b, n := gpu(t)
	for dev := 0; dev < n; dev++ {
		free, total, err := b.MemInfo(dev)
		require.NoError(t, err)
		require.Positive(t, total)
		require.LessOrEqual(t, free, total)
		devTotal, err := TotalMem(dev)
		require.NoError(t, err)
		require.LessOrEqual(t, total, devTotal)

		const size = 256 << 20
		p, err := b.Alloc(dev, size)
		require.NoError(t, err)
		free2, _, err := b.MemInfo(dev)
		require.NoError(t, err)
		require.Less(t, free2, free, "256 MiB allocated on device %d", dev)
		require.NoError(t, b.Free(dev, p, size))
	}
}

func TestGPUOutOfMemory(t *testing.T) {
	b, n := gpu(t)
	for dev := 0; dev < n; dev++ {
		_, total, err := b.MemInfo(dev)
		require.NoError(t, err)
		_, err = b.Alloc(dev, 2*total)
		require.Error(t, err)
		require.True(t, allocator.IsOutOfMemory(err), "%v", err)
		require.ErrorIs(t, err, ErrorOutOfMemory)
		require.ErrorContains(t, err, fmt.Sprintf("cuMemAlloc(%d bytes) on device %d: CUDA_ERROR_OUT_OF_MEMORY", 2*total, dev))

		// The device still works afterwards.
		p, err := b.Alloc(dev, 4096)
		require.NoError(t, err)
		require.NoError(t, b.Free(dev, p, 4096))
	}
}

func TestGPUBadInput(t *testing.T) {
	b, n := gpu(t)
	for _, dev := range []int{-1, n, n + 7} {
		_, err := b.Alloc(dev, 512)
		require.ErrorIs(t, err, ErrorInvalidDevice)
		_, _, err = b.MemInfo(dev)
		require.ErrorIs(t, err, ErrorInvalidDevice)
		_, err = b.NewEvent(dev)
		require.ErrorIs(t, err, ErrorInvalidDevice)
		_, err = DeviceName(dev)
		require.ErrorIs(t, err, ErrorInvalidDevice)
		_, err = StreamCreate(dev)
		require.ErrorIs(t, err, ErrorInvalidDevice)
	}

	_, err := b.Alloc(0, 0)
	require.ErrorIs(t, err, ErrorInvalidValue, "cuMemAlloc of 0 bytes")

	// A pointer the driver never handed out.
	host := make([]byte, 64)
	_, err = PointerDevice(uintptr(unsafe.Pointer(&host[0])))
	require.Error(t, err)

	// A double free is reported, and the device keeps working.
	p, err := b.Alloc(0, 4096)
	require.NoError(t, err)
	require.NoError(t, b.Free(0, p, 4096))
	require.Error(t, b.Free(0, p, 4096))
	p, err = b.Alloc(0, 4096)
	require.NoError(t, err)
	require.NoError(t, b.Free(0, p, 4096))

	require.ErrorIs(t, StreamDestroy(0, 0), ErrorInvalidHandle)
}

func TestGPUEvents(t *testing.T) {
	b, n := gpu(t)
	for dev := 0; dev < n; dev++ {
		ev, err := b.NewEvent(dev)
		require.NoError(t, err)
		done, err := b.Query(dev, ev)
		require.NoError(t, err)
		require.True(t, done, "an event never recorded counts as completed")

		s, err := StreamCreate(dev)
		require.NoError(t, err)
		for _, stream := range []uintptr{s, 0, 0x1 /* CU_STREAM_LEGACY */, 0x2 /* CU_STREAM_PER_THREAD */} {
			require.NoError(t, b.Record(dev, ev, stream), "stream %#x", stream)
			require.NoError(t, b.Sync(dev, ev))
			done, err := b.Query(dev, ev)
			require.NoError(t, err)
			require.True(t, done, "stream %#x", stream)
		}
		require.NoError(t, StreamSynchronize(dev, s))
		require.NoError(t, StreamSynchronize(dev, 0))
		require.NoError(t, StreamDestroy(dev, s))
		require.NoError(t, b.DestroyEvent(dev, ev))
	}
}

// An event recorded behind a stream wait that is not yet satisfied must
// query as not ready; it completes once another stream writes the value.
func TestGPUEventNotReady(t *testing.T) {
	b, _ := gpu(t)
	const dev = 0
	if err := VMMAvailable(); err != nil {
		t.Logf("note: %v", err)
	}
	flag, err := b.Alloc(dev, 512)
	require.NoError(t, err)
	defer b.Free(dev, flag, 512)
	require.NoError(t, Memset(dev, flag, 0, 512))

	waiter, err := StreamCreate(dev)
	require.NoError(t, err)
	defer StreamDestroy(dev, waiter)
	writer, err := StreamCreate(dev)
	require.NoError(t, err)
	defer StreamDestroy(dev, writer)

	err = StreamWaitValue32(dev, waiter, flag, 1, WaitValueGEQ)
	var missing *MissingSymbolError
	if errors.As(err, &missing) || errors.Is(err, ErrorNotSupported) {
		t.Skipf("stream memory operations unavailable: %v", err)
	}
	require.NoError(t, err)

	ev, err := b.NewEvent(dev)
	require.NoError(t, err)
	defer b.DestroyEvent(dev, ev)
	require.NoError(t, b.Record(dev, ev, waiter))
	done, err := b.Query(dev, ev)
	require.NoError(t, err)
	require.False(t, done, "the waiter stream is blocked on the flag")

	require.NoError(t, StreamWriteValue32(dev, writer, flag, 1))
	deadline := time.Now().Add(20 * time.Second)
	for !done && time.Now().Before(deadline) {
		done, err = b.Query(dev, ev)
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
	}
	require.True(t, done, "event completes once the flag is written")
	require.NoError(t, b.Sync(dev, ev))

	word := make([]byte, 4)
	require.NoError(t, MemcpyDtoH(dev, word, flag))
	require.Equal(t, []byte{1, 0, 0, 0}, word)
}

// Operations leave the thread's current context as they found it, whether
// that is none, the device's primary context, or another device's.
func TestGPUContextRestored(t *testing.T) {
	b, n := gpu(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	orig, err := CurrentContext()
	require.NoError(t, err)
	defer func() { require.NoError(t, SetCurrentContext(orig)) }()

	check := func(want uintptr, what string) {
		t.Helper()
		cur, err := CurrentContext()
		require.NoError(t, err)
		require.Equal(t, want, cur, what)
	}
	roundTrip := func(dev int) {
		t.Helper()
		p, err := b.Alloc(dev, 4096)
		require.NoError(t, err)
		owner, err := PointerDevice(p)
		require.NoError(t, err)
		require.Equal(t, dev, owner)
		ev, err := b.NewEvent(dev)
		require.NoError(t, err)
		require.NoError(t, b.Record(dev, ev, 0))
		require.NoError(t, b.Sync(dev, ev))
		require.NoError(t, b.DestroyEvent(dev, ev))
		_, _, err = b.MemInfo(dev)
		require.NoError(t, err)
		require.NoError(t, b.Free(dev, p, 4096))
		_, err = b.Alloc(dev+n, 4096) // an error path
		require.Error(t, err)
	}

	for dev := 0; dev < n; dev++ {
		roundTrip(dev)
		check(orig, "after operations on device "+fmt.Sprint(dev))
	}

	// No context current at all.
	require.NoError(t, SetCurrentContext(0))
	cur, err := CurrentContext()
	require.NoError(t, err)
	if cur == 0 {
		for dev := 0; dev < n; dev++ {
			roundTrip(dev)
			check(0, "no context before, none after")
		}
	}

	// Each device's primary context current, operations on every device.
	for cdev := 0; cdev < n; cdev++ {
		ctx, err := PrimaryContext(cdev)
		require.NoError(t, err)
		require.NotZero(t, ctx)
		require.NoError(t, SetCurrentContext(ctx))
		for dev := 0; dev < n; dev++ {
			roundTrip(dev)
			check(ctx, fmt.Sprintf("device %d's context current, operation on device %d", cdev, dev))
		}
	}
}

func TestGPUStreamMemops(t *testing.T) {
	b, _ := gpu(t)
	const dev = 0
	p, err := b.Alloc(dev, 512)
	require.NoError(t, err)
	defer b.Free(dev, p, 512)
	require.NoError(t, Memset(dev, p, 0, 512))
	s, err := StreamCreate(dev)
	require.NoError(t, err)
	defer StreamDestroy(dev, s)

	err = StreamWriteValue32(dev, s, p+8, 0xdeadbeef)
	var missing *MissingSymbolError
	if errors.As(err, &missing) || errors.Is(err, ErrorNotSupported) {
		t.Skipf("stream memory operations unavailable: %v", err)
	}
	require.NoError(t, err)
	require.NoError(t, StreamSynchronize(dev, s))
	buf := make([]byte, 16)
	require.NoError(t, MemcpyDtoH(dev, buf, p))
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0}, buf)

	require.NoError(t, StreamWaitValue32(dev, s, p+8, 0xdeadbeef, WaitValueEQ))
	require.NoError(t, StreamSynchronize(dev, s))
}

func TestGPUConcurrent(t *testing.T) {
	b, n := gpu(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < 50; i++ {
				dev := (g + i) % n
				p, err := b.Alloc(dev, 4096)
				if err != nil {
					errs <- err
					return
				}
				buf[0], buf[4095] = byte(g), byte(i)
				if err := MemcpyHtoD(dev, p, buf); err != nil {
					errs <- err
					return
				}
				out := make([]byte, 4096)
				if err := MemcpyDtoH(dev, out, p); err != nil {
					errs <- err
					return
				}
				if out[0] != byte(g) || out[4095] != byte(i) {
					errs <- fmt.Errorf("goroutine %d: data mismatch on device %d", g, dev)
					return
				}
				if err := b.Free(dev, p, 4096); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func ExampleNewBackend() {
	b, err := NewBackend()
	if err != nil {
		// No driver or no GPU: the message says to set SYMM_DEVICE=host.
		fmt.Println(err)
		return
	}
	p, err := b.Alloc(0, 2<<20)
	if err != nil {
		fmt.Println(err) // e.g. "cuMemAlloc(2097152 bytes) on device 0: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
		return
	}
	defer b.Free(0, p, 2<<20)
}

// TestSettingDocumentsTheLibrary holds the README's default of SYMM_CUDA_LIB
// to DefaultLibrary.
func TestSettingDocumentsTheLibrary(t *testing.T) {
	require.Equal(t, "`"+DefaultLibrary+"`", settings.CUDALib.Default)
}
