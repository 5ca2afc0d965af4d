package cuda

// Tests of the virtual memory management wrappers (vmm.go), cuStreamQuery and
// cuDeviceCanAccessPeer: the layout of shim.h's declarations, the fake driver
// (TestFake*) and the real one (TestGPU*, skipped without it).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// ---- layout -------------------------------------------------------------------

// The declarations of shim.h must have exactly cuda.h's layout (CUDA 12,
// LP64): the driver reads CUmemAllocationProp and CUmemAccessDesc through
// pointers. The expected values are those of cuda.h:
//
//	typedef struct CUmemLocation_st { CUmemLocationType type; int id; } CUmemLocation;
//	typedef struct CUmemAllocationProp_st {
//	    CUmemAllocationType type;
//	    CUmemAllocationHandleType requestedHandleTypes;
//	    CUmemLocation location;
//	    void *win32HandleMetaData;
//	    struct {
//	        unsigned char compressionType;
//	        unsigned char gpuDirectRDMACapable;
//	        unsigned short usage;
//	        unsigned char reserved[4];
//	    } allocFlags;
//	} CUmemAllocationProp;
//	typedef struct CUmemAccessDesc_st { CUmemLocation location; CUmemAccess_flags flags; } CUmemAccessDesc;
//	typedef unsigned long long CUmemGenericAllocationHandle;
func TestVMMLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the expected layout is that of 64-bit platforms")
	}
	want := map[string]uintptr{
		"CUmemAllocationProp":                                 32,
		"align(CUmemAllocationProp)":                          8,
		"CUmemAllocationProp.type":                            0,
		"CUmemAllocationProp.requestedHandleTypes":            4,
		"CUmemAllocationProp.location":                        8,
		"CUmemAllocationProp.location.type":                   8,
		"CUmemAllocationProp.location.id":                     12,
		"CUmemAllocationProp.win32HandleMetaData":             16,
		"CUmemAllocationProp.allocFlags":                      24,
		"sizeof(CUmemAllocationProp.allocFlags)":              8,
		"CUmemAllocationProp.allocFlags.compressionType":      24,
		"CUmemAllocationProp.allocFlags.gpuDirectRDMACapable": 25,
		"CUmemAllocationProp.allocFlags.usage":                26,
		"CUmemAllocationProp.allocFlags.reserved":             28,
		"CUmemLocation":                                       8,
		"CUmemAccessDesc":                                     12,
		"align(CUmemAccessDesc)":                              4,
		"CUmemAccessDesc.location":                            0,
		"CUmemAccessDesc.flags":                               8,
		"CUmemGenericAllocationHandle":                        8,
	}
	c, g := vmmLayout()
	require.Equal(t, want, c, "shim.h as the C compiler lays it out")
	require.Equal(t, want, g, "shim.h as cgo presents it to Go")
}

// ---- helpers --------------------------------------------------------------------

// openFDs returns the number of open file descriptors of the process.
func openFDs(t *testing.T) int {
	t.Helper()
	// The first directory read may start the runtime's poller (an epoll
	// descriptor and an event descriptor, kept for good): read once first.
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// pattern returns n bytes that differ with seed and along the buffer.
func pattern(n uint64, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13+i>>11) ^ seed
	}
	return b
}

func closeOnExec(t *testing.T, fd int) bool {
	t.Helper()
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err)
	return flags&unix.FD_CLOEXEC != 0
}

// A file descriptor number that is not open.
func closedFD(t *testing.T) int {
	t.Helper()
	f, err := os.Open(os.DevNull)
	require.NoError(t, err)
	fd := int(f.Fd())
	require.NoError(t, f.Close())
	return fd
}

// ---- the fake driver ---------------------------------------------------------------

// Device attributes of the fake (not CUDA's) that count its live objects.
const (
	fakeLiveRanges = 90001
	fakeLiveMaps   = 90002
	fakeLiveAllocs = 90003
)

func fakeLive(t *testing.T, d *driver) (ranges, maps, allocs int) {
	t.Helper()
	var err error
	ranges, err = d.deviceAttribute(0, fakeLiveRanges)
	require.NoError(t, err)
	maps, err = d.deviceAttribute(0, fakeLiveMaps)
	require.NoError(t, err)
	allocs, err = d.deviceAttribute(0, fakeLiveAllocs)
	require.NoError(t, err)
	return ranges, maps, allocs
}

func requireFakeEmpty(t *testing.T, d *driver) {
	t.Helper()
	r, m, a := fakeLive(t, d)
	require.Equal(t, [3]int{0, 0, 0}, [3]int{r, m, a}, "live reservations, mappings, allocations")
	require.Zero(t, d.heldHandles(), "handle references held")
	for dev := range d.devs {
		free, total, err := d.memGetInfo(dev)
		require.NoError(t, err)
		require.Equal(t, total, free, "device %d memory all free", dev)
	}
}

// Create, export, import (on another device), map both handles, write through
// one mapping, read through the other, signal through them, tear down: no
// allocation, mapping, reservation, handle or descriptor left.
func TestFakeVMMRoundTrip(t *testing.T) {
	d := openFake(t, "v2")
	fds := openFDs(t)

	minimum, recommended, err := d.granularity(0)
	require.NoError(t, err)
	require.EqualValues(t, 2<<20, minimum)
	require.EqualValues(t, 4<<20, recommended)
	size := recommended

	h, err := d.memCreate(0, size)
	require.NoError(t, err)
	require.NotZero(t, h)
	free, total, err := d.memGetInfo(0)
	require.NoError(t, err)
	require.Equal(t, total-size, free, "counted against device 0")

	fd, err := d.exportFD(0, h)
	require.NoError(t, err)
	require.Greater(t, fd, 2)
	require.True(t, closeOnExec(t, fd), "ExportFD sets close-on-exec")
	h2, err := d.importFD(1, fd)
	require.NoError(t, err)
	require.NotEqual(t, h, h2)
	require.NoError(t, syscall.Close(fd), "the imported handle does not need the descriptor")
	require.Equal(t, 2, d.heldHandles())

	p1, err := d.mapNew(0, h, size, nil) // device 0 alone
	require.NoError(t, err)
	p2, err := d.mapNew(1, h2, size, []int{1, 0, 1})
	require.NoError(t, err)
	require.NotEqual(t, p1, p2)
	require.Zero(t, p1%uintptr(minimum))
	r, m, a := fakeLive(t, d)
	require.Equal(t, [3]int{2, 2, 2}, [3]int{r, m, a})
	owner, err := d.pointerDevice(p2)
	require.NoError(t, err)
	require.Equal(t, 0, owner, "the memory lives on device 0, whoever maps it")

	// Written through one mapping in device 0's context, read through the
	// other in device 1's.
	data := pattern(size, 7)
	require.NoError(t, d.memcpyHtoD(0, p1, data))
	got := make([]byte, size)
	require.NoError(t, d.memcpyDtoH(1, got, p2))
	require.True(t, bytes.Equal(data, got))
	// And the other way.
	half := uintptr(size / 2)
	require.NoError(t, d.memset(0, p2+half, 0x5A, 4096))
	require.NoError(t, d.memcpyDtoH(0, got[:8192], p1+half-4096))
	require.Equal(t, data[half-4096:half], got[:4096])
	require.Equal(t, bytes.Repeat([]byte{0x5A}, 4096), got[4096:8192])

	// Access is per device and per mapping: device 1 was not granted p1.
	err = d.memcpyDtoH(1, got[:16], p1)
	require.ErrorIs(t, err, ErrorInvalidValue)
	require.NoError(t, d.setAccess(0, p1, size, []int{0, 1}))
	require.NoError(t, d.memcpyDtoH(1, got[:16], p1))

	// A signal pad in symmetric memory: a stream of device 1 waits on the
	// word through p2; device 0 writes it through p1.
	word := uintptr(size) - 64
	s, err := d.streamCreate(1)
	require.NoError(t, err)
	require.NoError(t, d.streamValue32(fnStreamWriteValue32, 0, 0, p1+word, 0, 0))
	require.NoError(t, d.streamValue32(fnStreamWaitValue32, 1, s, p2+word, 1, WaitValueEQ))
	done, err := d.streamQuery(1, s)
	require.NoError(t, err)
	require.False(t, done, "the word is 0")
	require.NoError(t, d.streamValue32(fnStreamWriteValue32, 0, 0, p1+word, 1, 0))
	done, err = d.streamQuery(1, s)
	require.NoError(t, err)
	require.True(t, done, "the word is 1")
	require.NoError(t, d.streamDestroy(1, s))

	// Handles may go before the mappings: the mappings keep the memory.
	require.NoError(t, d.memRelease(0, h))
	require.NoError(t, d.memRelease(1, h2))
	require.Zero(t, d.heldHandles())
	require.NoError(t, d.memcpyDtoH(1, got[:4096], p2))
	require.Equal(t, data[:4096], got[:4096])
	require.NoError(t, d.unmapFree(0, p1, size))
	require.NoError(t, d.unmapFree(1, p2, size))

	requireFakeEmpty(t, d)
	require.Equal(t, fds, openFDs(t), "no descriptor leaked")
}

// The step-by-step functions, as MapNew and UnmapFree use them.
func TestFakeVMMSteps(t *testing.T) {
	d := openFake(t, "v2")
	minimum, _, err := d.granularity(1)
	require.NoError(t, err)

	h, err := d.memCreate(1, minimum)
	require.NoError(t, err)
	const align = 64 << 20
	p, err := d.addressReserve(1, 2*minimum, align)
	require.NoError(t, err)
	require.Zero(t, p%align)
	require.NoError(t, d.memMap(1, p+uintptr(minimum), minimum, h))
	require.ErrorIs(t, d.memcpyHtoD(1, p+uintptr(minimum), []byte{1}), ErrorInvalidValue, "no access yet")
	require.NoError(t, d.setAccess(1, p+uintptr(minimum), minimum, []int{1}))
	require.NoError(t, d.memcpyHtoD(1, p+uintptr(minimum), []byte{1, 2, 3}))
	require.ErrorIs(t, d.memcpyHtoD(1, p, []byte{1}), ErrorInvalidValue, "the first half is not mapped")

	// A second reference through the mapping.
	h2, err := d.retainAllocationHandle(1, p+uintptr(minimum)+12345)
	require.NoError(t, err)
	require.Equal(t, h, h2, "the handle that was mapped there")
	require.Equal(t, 2, d.heldHandles())
	_, err = d.retainAllocationHandle(1, p+100)
	require.ErrorIs(t, err, ErrorInvalidValue, "nothing mapped there")

	err = d.addressFree(1, p, 2*minimum)
	require.ErrorIs(t, err, ErrorInvalidValue, "still mapped")
	require.ErrorContains(t, err, fmt.Sprintf("cuMemAddressFree(%#x, %d bytes) on device 1: ", p, 2*minimum))
	require.NoError(t, d.memUnmap(1, p+uintptr(minimum), minimum))
	require.NoError(t, d.addressFree(1, p, 2*minimum))
	require.NoError(t, d.memRelease(1, h))
	require.NoError(t, d.memRelease(1, h2))
	err = d.memRelease(1, h)
	require.ErrorIs(t, err, ErrorInvalidValue, "three releases for two references")
	requireFakeEmpty(t, d)
}

func TestFakeVMMBadInput(t *testing.T) {
	d := openFake(t, "v2")
	fds := openFDs(t)
	minimum, _, err := d.granularity(0)
	require.NoError(t, err)
	_, _, err = d.granularity(2)
	require.ErrorIs(t, err, ErrorInvalidDevice)

	// Sizes that are not multiples of the granularity, and devices that do
	// not exist.
	for _, size := range []uint64{0, minimum / 2, minimum + 4096} {
		_, err := d.memCreate(0, size)
		require.ErrorIs(t, err, ErrorInvalidValue, "size %d", size)
		require.ErrorContains(t, err, fmt.Sprintf("cuMemCreate(%d bytes, POSIX_FILE_DESCRIPTOR) on device 0: ", size))
	}
	_, err = d.memCreate(2, minimum)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	_, err = d.memCreate(0, 2<<30)
	require.ErrorIs(t, err, ErrorOutOfMemory)

	// Handles this process does not hold never reach the driver.
	h, err := d.memCreate(0, minimum)
	require.NoError(t, err)
	for _, bad := range []uint64{0, 0x1234, h + 1} {
		err := d.memRelease(0, bad)
		require.ErrorIs(t, err, ErrorInvalidValue)
		require.ErrorContains(t, err, "is not an allocation handle this process holds")
		_, err = d.exportFD(0, bad)
		require.ErrorIs(t, err, ErrorInvalidValue)
		_, err = d.mapNew(0, bad, minimum, nil)
		require.ErrorIs(t, err, ErrorInvalidValue)
	}

	// Descriptors that are not exported memory.
	_, err = d.importFD(0, -1)
	require.ErrorIs(t, err, ErrorInvalidValue)
	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	_, err = d.importFD(0, int(null.Fd()))
	require.ErrorIs(t, err, ErrorInvalidValue)
	require.ErrorContains(t, err, fmt.Sprintf("cuMemImportFromShareableHandle(fd %d, POSIX_FILE_DESCRIPTOR) on device 0: ", null.Fd()))
	require.NoError(t, null.Close())
	_, err = d.importFD(0, closedFD(t))
	require.ErrorIs(t, err, ErrorInvalidValue)

	// MapNew undoes what it did when a step fails.
	_, err = d.mapNew(0, h, 2*minimum, nil) // more than the allocation
	require.ErrorIs(t, err, ErrorInvalidValue)
	require.ErrorContains(t, err, "cuMemMap(")
	_, err = d.mapNew(0, h, minimum, []int{0, 7})
	require.ErrorIs(t, err, ErrorInvalidDevice)
	t.Setenv("FAKE_CUDA_FAIL", "cuMemSetAccess")
	_, err = d.mapNew(0, h, minimum, []int{0, 1})
	require.ErrorIs(t, err, Result(999))
	require.ErrorContains(t, err, "cuMemSetAccess(")
	require.ErrorContains(t, err, "read-write for devices [0 1]) on device 0: ")
	require.NotContains(t, err.Error(), "undoing")
	t.Setenv("FAKE_CUDA_FAIL", "cuMemMap")
	_, err = d.mapNew(0, h, minimum, nil)
	require.ErrorIs(t, err, Result(999))
	t.Setenv("FAKE_CUDA_FAIL", "cuMemMap,cuMemAddressFree")
	_, err = d.mapNew(0, h, minimum, nil)
	require.ErrorContains(t, err, "(undoing it: cuMemAddressFree(")
	t.Setenv("FAKE_CUDA_FAIL", "")
	r, m, _ := fakeLive(t, d)
	require.Equal(t, 1, r, "only the reservation whose free was made to fail")
	require.Zero(t, m)

	// Access lists.
	p, err := d.mapNew(0, h, minimum, nil)
	require.NoError(t, err)
	err = d.setAccess(0, p, minimum, nil)
	require.ErrorIs(t, err, ErrorInvalidValue)
	require.ErrorContains(t, err, "no device to grant access to")
	require.ErrorIs(t, d.setAccess(0, p, minimum, []int{-1}), ErrorInvalidDevice)
	require.ErrorIs(t, d.setAccess(0, p, 2*minimum, []int{0}), ErrorInvalidValue, "beyond the mapping")

	// Ranges that are not mapped or not reserved.
	const nowhere = 0x200000
	require.ErrorIs(t, d.memUnmap(0, nowhere, minimum), ErrorInvalidValue)
	require.ErrorIs(t, d.addressFree(0, nowhere, minimum), ErrorInvalidValue)
	err = d.unmapFree(0, nowhere, minimum)
	require.ErrorIs(t, err, ErrorInvalidValue)
	require.ErrorContains(t, err, "cuMemUnmap(0x200000, 2097152 bytes) on device 0: ")
	require.ErrorContains(t, err, "; then cuMemAddressFree(0x200000, 2097152 bytes) on device 0: ")
	require.ErrorIs(t, d.memMap(0, p, minimum, h), ErrorInvalidValue, "already mapped")

	// Everything still works, and goes away.
	require.NoError(t, d.memcpyHtoD(0, p, []byte{1}))
	require.NoError(t, d.unmapFree(0, p, minimum))
	require.Error(t, d.unmapFree(0, p, minimum), "twice")
	require.NoError(t, d.memRelease(0, h))
	r, m, a := fakeLive(t, d)
	require.Equal(t, [3]int{1, 0, 0}, [3]int{r, m, a}, "the reservation leaked on purpose above")
	require.Equal(t, fds, openFDs(t))
}

func TestFakeVMMMissing(t *testing.T) {
	t.Setenv("FAKE_CUDA_OMIT", "cuMemRelease")
	d := openFake(t, "v2")
	_, err := d.memCreate(0, 2<<20)
	var missing *MissingSymbolError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, "cuMemRelease", missing.Symbol, "no allocation that could not be released")
	err = d.vmmAvailable()
	require.ErrorAs(t, err, &missing)
	require.Equal(t, "cuMemRelease", missing.Symbol)
	requireFakeEmpty(t, d)
}

func TestFakeCanAccessPeer(t *testing.T) {
	d := openFake(t, "v2")
	ok, err := d.canAccessPeer(0, 1)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = d.canAccessPeer(1, 1)
	require.NoError(t, err)
	require.False(t, ok, "the fake's answer for a device and itself")
	_, err = d.canAccessPeer(0, 2)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	_, err = d.canAccessPeer(-1, 0)
	require.ErrorIs(t, err, ErrorInvalidDevice)
	t.Setenv("FAKE_CUDA_NO_PEER", "1")
	ok, err = d.canAccessPeer(0, 1)
	require.NoError(t, err)
	require.False(t, ok)
}

// StreamQuery sees a wait that is not satisfied, and the wait flags reach the
// driver with their cuda.h values (the fake evaluates them as documented).
func TestFakeStreamQuery(t *testing.T) {
	d := openFake(t, "v2")
	p, err := d.memAlloc(0, 512)
	require.NoError(t, err)
	defer d.memFree(0, p)
	done, err := d.streamQuery(0, 0)
	require.NoError(t, err)
	require.True(t, done, "the legacy stream, nothing queued")

	require.NoError(t, d.streamValue32(fnStreamWriteValue32, 0, 0, p, 5, 0))
	for _, c := range []struct {
		flags, value uint32
		done         bool
	}{
		{WaitValueGEQ, 1, true},
		{WaitValueGEQ, 6, false},
		{WaitValueGEQ, 0xFFFFFFF0, true}, // cyclic: 5 is 21 past -16
		{WaitValueEQ, 5, true},
		{WaitValueEQ, 1, false},
		{WaitValueAND, 2, false},
		{WaitValueAND, 4, true},
		{WaitValueNOR, 0xFFFFFFFA, false},
		{WaitValueNOR, 0, true},
	} {
		s, err := d.streamCreate(0)
		require.NoError(t, err)
		require.NoError(t, d.streamValue32(fnStreamWaitValue32, 0, s, p, c.value, c.flags))
		done, err := d.streamQuery(0, s)
		require.NoError(t, err)
		require.Equal(t, c.done, done, "word 5, flags %d, value %#x", c.flags, c.value)
		require.NoError(t, d.streamDestroy(0, s))
	}

	// A wait completes once the value comes.
	s, err := d.streamCreate(0)
	require.NoError(t, err)
	require.NoError(t, d.streamValue32(fnStreamWaitValue32, 0, s, p, 1, WaitValueEQ))
	done, err = d.streamQuery(0, s)
	require.NoError(t, err)
	require.False(t, done)
	require.NoError(t, d.streamValue32(fnStreamWriteValue32, 0, 0, p, 1, 0))
	done, err = d.streamQuery(0, s)
	require.NoError(t, err)
	require.True(t, done)

	// A stream of another device's context is refused.
	_, err = d.streamQuery(1, s)
	require.ErrorIs(t, err, ErrorInvalidHandle)
	require.ErrorContains(t, err, fmt.Sprintf("cuStreamQuery(%#x) on device 1: ", s))
	require.NoError(t, d.streamDestroy(0, s))

	t.Setenv("FAKE_CUDA_OMIT", "cuStreamQuery")
	d2 := openFake(t, "v2")
	_, err = d2.streamQuery(0, 0)
	var missing *MissingSymbolError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, "cuStreamQuery", missing.Symbol)
}

func TestFakeVMMContextRestored(t *testing.T) {
	d := openFake(t, "v2")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx1, err := d.primaryContext(1)
	require.NoError(t, err)
	require.NoError(t, d.setCurrentContext(ctx1))
	defer d.setCurrentContext(0)

	h, err := d.memCreate(0, 2<<20)
	require.NoError(t, err)
	p, err := d.mapNew(0, h, 2<<20, nil)
	require.NoError(t, err)
	_, err = d.mapNew(0, h, 4<<20, nil) // an error path
	require.Error(t, err)
	require.NoError(t, d.unmapFree(0, p, 2<<20))
	require.NoError(t, d.memRelease(0, h))
	cur, err := d.currentContext()
	require.NoError(t, err)
	require.Equal(t, ctx1, cur, "the caller's context is current again")
}

// The protocol of TestGPUVMMCrossProcess on the fake: another process, which
// loads its own copy of the fake, imports the descriptor as descriptor 3,
// maps it, reads what this process wrote and writes back.
func TestFakeVMMCrossProcess(t *testing.T) {
	d := openFake(t, "v2")
	fds := openFDs(t)
	minimum, _, err := d.granularity(0)
	require.NoError(t, err)
	size := 2 * minimum
	h, err := d.memCreate(0, size)
	require.NoError(t, err)
	p, err := d.mapNew(0, h, size, nil)
	require.NoError(t, err)
	require.NoError(t, d.memcpyHtoD(0, p, pattern(size/2, 1)))
	require.NoError(t, d.memset(0, p+uintptr(size/2), 0, size/2))

	fd, err := d.exportFD(0, h)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "symm-vmm")
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeVMMChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d,%s", envFakeVMMChild, 1, size, fakeLib(t, "v2")))
	cmd.ExtraFiles = []*os.File{f} // descriptor 3 in the child
	out, err := cmd.CombinedOutput()
	require.NoError(t, f.Close())
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestFakeVMMChild", "%s", out)

	got := make([]byte, size/2)
	require.NoError(t, d.memcpyDtoH(0, got, p+uintptr(size/2)))
	require.True(t, bytes.Equal(pattern(size/2, 2), got), "the child's write is visible here")
	require.NoError(t, d.unmapFree(0, p, size))
	require.NoError(t, d.memRelease(0, h))
	requireFakeEmpty(t, d)
	require.Equal(t, fds, openFDs(t))
}

const envFakeVMMChild = "SYMM_TEST_FAKE_VMM_CHILD" // "device,size,library"

// The child half of TestFakeVMMCrossProcess; skipped when run on its own.
func TestFakeVMMChild(t *testing.T) {
	spec := os.Getenv(envFakeVMMChild)
	if spec == "" {
		t.Skip("run by TestFakeVMMCrossProcess")
	}
	parts := strings.SplitN(spec, ",", 3)
	require.Len(t, parts, 3)
	var dev int
	var size uint64
	_, err := fmt.Sscanf(parts[0]+","+parts[1], "%d,%d", &dev, &size)
	require.NoError(t, err)
	d, err := openDriver(parts[2])
	require.NoError(t, err)
	defer d.close()

	const fd = 3
	h, err := d.importFD(dev, fd)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))
	p, err := d.mapNew(dev, h, size, []int{dev})
	require.NoError(t, err)
	got := make([]byte, size/2)
	require.NoError(t, d.memcpyDtoH(dev, got, p))
	require.True(t, bytes.Equal(pattern(size/2, 1), got), "the parent's write is visible here")
	require.NoError(t, d.memcpyHtoD(dev, p+uintptr(size/2), pattern(size/2, 2)))
	require.NoError(t, d.unmapFree(dev, p, size))
	require.NoError(t, d.memRelease(dev, h))
	requireFakeEmpty(t, d)
}

// ---- the real driver ------------------------------------------------------------------

// vmmGPU skips unless the driver has the VMM functions and device 0 supports
// them with POSIX file descriptors; it returns the number of devices.
func vmmGPU(t *testing.T) int {
	t.Helper()
	_, n := gpu(t)
	if err := VMMAvailable(); err != nil {
		t.Skipf("no virtual memory management: %v", err)
	}
	for _, attr := range []int{AttrVirtualMemoryManagementSupported, AttrHandleTypePosixFDSupported} {
		v, err := DeviceAttribute(0, attr)
		require.NoError(t, err)
		if v == 0 {
			t.Skipf("device 0 lacks attribute %d", attr)
		}
	}
	return n
}

// peersOf returns dev and every device that can access dev's memory.
func peersOf(t *testing.T, dev, n int) []int {
	t.Helper()
	devs := []int{dev}
	for k := 0; k < n; k++ {
		if k == dev {
			continue
		}
		ok, err := CanAccessPeer(k, dev)
		require.NoError(t, err)
		if ok {
			devs = append(devs, k)
		}
	}
	return devs
}

func TestGPUVMMGranularity(t *testing.T) {
	n := vmmGPU(t)
	for dev := 0; dev < n; dev++ {
		minimum, recommended, err := Granularity(dev)
		require.NoError(t, err)
		require.NotZero(t, minimum)
		require.Zero(t, minimum&(minimum-1), "minimum %d is a power of two", minimum)
		require.GreaterOrEqual(t, recommended, minimum)
		require.Zero(t, recommended%minimum)
		major, err := DeviceAttribute(dev, AttrComputeCapabilityMajor)
		require.NoError(t, err)
		if major >= 9 {
			require.GreaterOrEqual(t, minimum, uint64(2<<20), "Hopper: at least 2 MiB")
		}
		t.Logf("device %d (sm_%d): granularity %d KiB minimum, %d KiB recommended", dev, major, minimum>>10, recommended>>10)
	}
	_, _, err := Granularity(n)
	require.ErrorIs(t, err, ErrorInvalidDevice)
}

func TestGPUCanAccessPeer(t *testing.T) {
	_, n := gpu(t)
	for dev := 0; dev < n; dev++ {
		for peer := 0; peer < n; peer++ {
			ok, err := CanAccessPeer(dev, peer)
			require.NoError(t, err)
			t.Logf("CanAccessPeer(%d, %d) = %v", dev, peer, ok)
		}
	}
	_, err := CanAccessPeer(0, n)
	require.ErrorIs(t, err, ErrorInvalidDevice)
}

// vmmRoundTrip creates memory on device 0, exports and imports it, maps both
// handles, writes through one mapping and reads through the other (from every
// device that can access it), and tears everything down.
func vmmRoundTrip(t *testing.T, n int, size uint64, seed byte) {
	t.Helper()
	devs := peersOf(t, 0, n)

	h, err := MemCreate(0, size)
	require.NoError(t, err)
	fd, err := ExportFD(0, h)
	require.NoError(t, err)
	require.GreaterOrEqual(t, fd, 0)
	require.True(t, closeOnExec(t, fd))
	h2, err := ImportFD(0, fd)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd), "the imported handle does not need the descriptor")

	p1, err := MapNew(0, h, size, devs)
	require.NoError(t, err)
	p2, err := MapNew(0, h2, size, devs)
	require.NoError(t, err)
	require.NotEqual(t, p1, p2)

	data := pattern(size, seed)
	require.NoError(t, MemcpyHtoD(0, p1, data))
	got := make([]byte, size)
	require.NoError(t, MemcpyDtoH(0, got, p2))
	require.True(t, bytes.Equal(data, got), "written through one mapping, read through the other")

	half := uintptr(size / 2)
	require.NoError(t, Memset(0, p2+half, 0x5A, 4096))
	require.NoError(t, MemcpyDtoH(0, got[:8192], p1+half-4096))
	require.Equal(t, data[half-4096:half], got[:4096])
	require.Equal(t, bytes.Repeat([]byte{0x5A}, 4096), got[4096:8192])

	// Peers read through the same mappings, in their own contexts.
	for _, dev := range devs[1:] {
		clear(got[:4096])
		require.NoError(t, MemcpyDtoH(dev, got[:4096], p2))
		require.Equal(t, data[:4096], got[:4096], "device %d reading device 0's memory", dev)
	}

	require.NoError(t, UnmapFree(0, p1, size))
	require.NoError(t, UnmapFree(0, p2, size))
	require.NoError(t, MemRelease(0, h2))
	require.NoError(t, MemRelease(0, h))
}

func TestGPUVMMRoundTrip(t *testing.T) {
	n := vmmGPU(t)
	minimum, recommended, err := Granularity(0)
	require.NoError(t, err)
	// The first round lets the driver open whatever it keeps open; after
	// that, rounds must leave the descriptor count as they found it.
	vmmRoundTrip(t, n, recommended, 1)
	fds := openFDs(t)
	for i, size := range []uint64{minimum, 2 * recommended, 8 * minimum} {
		vmmRoundTrip(t, n, size, byte(i+2))
	}
	require.Equal(t, fds, openFDs(t), "no descriptor leaked")
}

// A signal pad in symmetric memory: a stream waits on a word through one
// mapping, another stream writes it through the other; StreamQuery sees the
// wait pending, then done.
func TestGPUVMMSignal(t *testing.T) {
	vmmGPU(t)
	minimum, _, err := Granularity(0)
	require.NoError(t, err)
	h, err := MemCreate(0, minimum)
	require.NoError(t, err)
	defer func() { require.NoError(t, MemRelease(0, h)) }()
	fd, err := ExportFD(0, h)
	require.NoError(t, err)
	h2, err := ImportFD(0, fd)
	syscall.Close(fd)
	require.NoError(t, err)
	defer func() { require.NoError(t, MemRelease(0, h2)) }()
	p1, err := MapNew(0, h, minimum, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, UnmapFree(0, p1, minimum)) }()
	p2, err := MapNew(0, h2, minimum, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, UnmapFree(0, p2, minimum)) }()
	require.NoError(t, Memset(0, p1, 0, 4096))

	waiter, err := StreamCreate(0)
	require.NoError(t, err)
	writer, err := StreamCreate(0)
	require.NoError(t, err)
	defer func() {
		// Whatever happened, release the wait before the streams go.
		require.NoError(t, StreamWriteValue32(0, writer, p1+64, 1))
		require.NoError(t, StreamSynchronize(0, writer))
		require.NoError(t, StreamSynchronize(0, waiter))
		require.NoError(t, StreamDestroy(0, waiter))
		require.NoError(t, StreamDestroy(0, writer))
	}()

	err = StreamWaitValue32(0, waiter, p2+64, 1, WaitValueEQ)
	var missing *MissingSymbolError
	if errors.As(err, &missing) || errors.Is(err, ErrorNotSupported) {
		t.Skipf("stream memory operations unavailable: %v", err)
	}
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	done, err := StreamQuery(0, waiter)
	require.NoError(t, err)
	require.False(t, done, "the waiter is blocked on the word")

	require.NoError(t, StreamWriteValue32(0, writer, p1+64, 1))
	deadline := time.Now().Add(20 * time.Second)
	for !done && time.Now().Before(deadline) {
		done, err = StreamQuery(0, waiter)
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
	}
	require.True(t, done, "the wait completes once the word is written through the other mapping")
}

// The wait flags reach the driver with their cuda.h meaning: with the word at
// 5, GEQ 1 and EQ 5 are satisfied, EQ 1 is not.
func TestGPUStreamWaitFlags(t *testing.T) {
	b, _ := gpu(t)
	const dev = 0
	flag, err := b.Alloc(dev, 512)
	require.NoError(t, err)
	defer b.Free(dev, flag, 512)
	require.NoError(t, MemcpyHtoD(dev, flag, []byte{5, 0, 0, 0}))
	require.NoError(t, StreamSynchronize(dev, 0))
	writer, err := StreamCreate(dev)
	require.NoError(t, err)
	defer StreamDestroy(dev, writer)

	done, err := StreamQuery(dev, 0)
	require.NoError(t, err)
	t.Logf("legacy stream idle: %v", done)

	for _, c := range []struct {
		flags, value uint32
		done         bool
	}{
		{WaitValueGEQ, 1, true},
		{WaitValueEQ, 5, true},
		{WaitValueAND, 4, true},
		{WaitValueEQ, 1, false},
		{WaitValueGEQ, 6, false},
	} {
		s, err := StreamCreate(dev)
		require.NoError(t, err)
		err = StreamWaitValue32(dev, s, flag, c.value, c.flags)
		var missing *MissingSymbolError
		if errors.As(err, &missing) || errors.Is(err, ErrorNotSupported) {
			StreamDestroy(dev, s)
			t.Skipf("stream memory operations unavailable: %v", err)
		}
		require.NoError(t, err)
		done := false
		deadline := time.Now().Add(time.Second)
		for !done && time.Now().Before(deadline) {
			done, err = StreamQuery(dev, s)
			require.NoError(t, err)
			time.Sleep(time.Millisecond)
		}
		require.Equal(t, c.done, done, "word 5, flags %d, value %d", c.flags, c.value)
		if !done {
			// Release it: write a value that meets the condition.
			require.NoError(t, StreamWriteValue32(dev, writer, flag, c.value))
			require.NoError(t, StreamSynchronize(dev, s))
			require.NoError(t, StreamWriteValue32(dev, writer, flag, 5))
			require.NoError(t, StreamSynchronize(dev, writer))
		}
		require.NoError(t, StreamDestroy(dev, s))
	}
}

func TestGPUVMMBadInput(t *testing.T) {
	n := vmmGPU(t)
	minimum, _, err := Granularity(0)
	require.NoError(t, err)
	vmmRoundTrip(t, n, minimum, 9) // the driver opens what it keeps open
	fds := openFDs(t)

	for _, size := range []uint64{0, minimum / 2, minimum + 4096} {
		h, err := MemCreate(0, size)
		if err == nil {
			MemRelease(0, h) // not to leak it when the test fails
		}
		require.Error(t, err, "size %d", size)
		t.Logf("MemCreate(%d bytes): %v", size, err)
	}
	_, err = MemCreate(n, minimum)
	require.ErrorIs(t, err, ErrorInvalidDevice)

	h, err := MemCreate(0, minimum)
	require.NoError(t, err)

	// Handles this process does not hold are refused before the driver.
	for _, bad := range []uint64{0, 0x1234, h ^ 0xFF00} {
		require.ErrorIs(t, MemRelease(0, bad), ErrorInvalidValue)
		_, err := ExportFD(0, bad)
		require.ErrorIs(t, err, ErrorInvalidValue)
		_, err = MapNew(0, bad, minimum, nil)
		require.ErrorIs(t, err, ErrorInvalidValue)
	}

	// Descriptors that are not exported memory: errors from the driver.
	_, err = ImportFD(0, -1)
	require.ErrorIs(t, err, ErrorInvalidValue)
	null, err := os.Open(os.DevNull)
	require.NoError(t, err)
	for _, c := range []struct {
		what string
		fd   int
	}{{"/dev/null", int(null.Fd())}, {"a descriptor that is not open", 999999}} {
		what := c.what
		bad, err := ImportFD(0, c.fd)
		if err == nil {
			MemRelease(0, bad)
		}
		require.Error(t, err, what)
		t.Logf("ImportFD(%s): %v", what, err)
	}
	require.NoError(t, null.Close())

	// Mapping more than the allocation fails, and MapNew leaves nothing.
	_, err = MapNew(0, h, 2*minimum, nil)
	require.Error(t, err)
	t.Logf("MapNew(2 x the allocation): %v", err)
	_, err = MapNew(0, h, minimum, []int{0, n})
	require.ErrorIs(t, err, ErrorInvalidDevice)

	p, err := MapNew(0, h, minimum, nil)
	require.NoError(t, err)
	require.Error(t, SetAccess(0, p, minimum, nil))
	require.ErrorIs(t, SetAccess(0, p, minimum, []int{n}), ErrorInvalidDevice)
	const nowhere = 0x200000 // far below the driver's address ranges
	err = Unmap(0, nowhere, minimum)
	require.Error(t, err)
	t.Logf("Unmap(nowhere): %v", err)
	err = AddressFree(0, nowhere, minimum)
	require.Error(t, err)
	t.Logf("AddressFree(nowhere): %v", err)
	require.NoError(t, MemcpyHtoD(0, p, []byte{1, 2, 3}))

	// A second reference through the mapping.
	h2, err := RetainAllocationHandle(0, p+100)
	require.NoError(t, err)
	require.Equal(t, h, h2, "the driver returns the mapped handle")
	require.NoError(t, MemRelease(0, h2))

	require.NoError(t, UnmapFree(0, p, minimum))
	require.Error(t, UnmapFree(0, p, minimum), "twice")
	require.NoError(t, MemRelease(0, h))
	require.ErrorIs(t, MemRelease(0, h), ErrorInvalidValue, "twice")

	// The device still works, and nothing leaked.
	vmmRoundTrip(t, n, minimum, 10)
	require.Equal(t, fds, openFDs(t), "no descriptor leaked")
}

// The real use: another process imports the descriptor, maps it (on another
// device when there is one with peer access), reads what this process wrote
// and writes back.
func TestGPUVMMCrossProcess(t *testing.T) {
	n := vmmGPU(t)
	minimum, _, err := Granularity(0)
	require.NoError(t, err)
	size := 2 * minimum
	h, err := MemCreate(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, MemRelease(0, h)) }()
	p, err := MapNew(0, h, size, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, UnmapFree(0, p, size)) }()
	require.NoError(t, MemcpyHtoD(0, p, pattern(size/2, 1)))
	require.NoError(t, Memset(0, p+uintptr(size/2), 0, size/2)) // synchronizes

	childDev := 0
	if n > 1 {
		if ok, err := CanAccessPeer(n-1, 0); err == nil && ok {
			childDev = n - 1
		}
	}
	fd, err := ExportFD(0, h)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "symm-vmm")
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUVMMChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d", envVMMChild, childDev, size))
	cmd.ExtraFiles = []*os.File{f} // descriptor 3 in the child
	out, err := cmd.CombinedOutput()
	require.NoError(t, f.Close())
	require.NoError(t, err, "child on device %d:\n%s", childDev, out)
	require.Contains(t, string(out), "--- PASS: TestGPUVMMChild", "%s", out)

	got := make([]byte, size/2)
	require.NoError(t, MemcpyDtoH(0, got, p+uintptr(size/2)))
	require.True(t, bytes.Equal(pattern(size/2, 2), got), "the child's write is visible here")
	t.Logf("child on device %d", childDev)
}

const envVMMChild = "SYMM_TEST_VMM_CHILD" // "device,size" for TestGPUVMMChild

// The child half of TestGPUVMMCrossProcess; skipped when run on its own.
func TestGPUVMMChild(t *testing.T) {
	spec := os.Getenv(envVMMChild)
	if spec == "" {
		t.Skip("run by TestGPUVMMCrossProcess")
	}
	var dev int
	var size uint64
	_, err := fmt.Sscanf(strings.TrimSpace(spec), "%d,%d", &dev, &size)
	require.NoError(t, err)
	const fd = 3
	h, err := ImportFD(dev, fd)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))
	p, err := MapNew(dev, h, size, []int{dev})
	require.NoError(t, err)
	got := make([]byte, size/2)
	require.NoError(t, MemcpyDtoH(dev, got, p))
	require.True(t, bytes.Equal(pattern(size/2, 1), got), "the parent's write is visible here")
	require.NoError(t, MemcpyHtoD(dev, p+uintptr(size/2), pattern(size/2, 2)))
	require.NoError(t, StreamSynchronize(dev, 0)) // the copy has landed
	require.NoError(t, UnmapFree(dev, p, size))
	require.NoError(t, MemRelease(dev, h))
}
