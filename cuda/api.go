package cuda

// Package-level helpers over the process-wide driver. Each loads the driver
// on first use (as Load() does) and returns the load error if that failed.
// Device arguments are ordinals as PyTorch numbers them (after
// CUDA_VISIBLE_DEVICES); every call runs in that device's context and leaves
// the calling thread's current context as it found it.

// Device attributes for DeviceAttribute (CUdevice_attribute values).
const (
	AttrPCIBusID                         = 33
	AttrPCIDeviceID                      = 34
	AttrComputeCapabilityMajor           = 75
	AttrComputeCapabilityMinor           = 76
	AttrVirtualMemoryManagementSupported = 102
	AttrHandleTypePosixFDSupported       = 103
)

// Flags for StreamWaitValue32 (CUstreamWaitValue_flags).
const (
	WaitValueGEQ = 0x0 // wait until *addr >= value (cyclic comparison)
	WaitValueEQ  = 0x1 // wait until *addr == value
	WaitValueAND = 0x2 // wait until (*addr & value) != 0
	WaitValueNOR = 0x3 // wait until ^(*addr | value) != 0
)

// DriverVersion returns the driver's CUDA version, 1000*major + 10*minor
// (12040 for CUDA 12.4).
func DriverVersion() (int, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.version, nil
}

// DeviceCount returns the number of visible CUDA devices.
func DeviceCount() (int, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.deviceCount()
}

// DeviceName returns the product name of device dev, e.g. "NVIDIA H100 80GB HBM3".
func DeviceName(dev int) (string, error) {
	d, err := loaded()
	if err != nil {
		return "", err
	}
	return d.deviceName(dev)
}

// TotalMem returns the memory size of device dev in bytes.
func TotalMem(dev int) (uint64, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.totalMem(dev)
}

// DeviceAttribute returns attribute attr (a CUdevice_attribute, e.g.
// AttrComputeCapabilityMajor) of device dev.
func DeviceAttribute(dev, attr int) (int, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.deviceAttribute(dev, attr)
}

// MemcpyHtoD copies src to device memory at dst on device dev. It returns
// once src has been read; the copy is ordered on the legacy default stream.
func MemcpyHtoD(dev int, dst uintptr, src []byte) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.memcpyHtoD(dev, dst, src)
}

// MemcpyDtoH copies len(dst) bytes from device memory at src on device dev
// into dst, and returns when they have arrived.
func MemcpyDtoH(dev int, dst []byte, src uintptr) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.memcpyDtoH(dev, dst, src)
}

// Memset sets n bytes of device memory at ptr on device dev to val, and
// returns when they are set (it synchronizes the device's context).
func Memset(dev int, ptr uintptr, val byte, n uint64) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.memset(dev, ptr, val, n)
}

// PointerDevice returns the ordinal of the device that owns device pointer
// ptr; an error (CUDA_ERROR_INVALID_VALUE) for memory the driver did not make.
func PointerDevice(ptr uintptr) (int, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.pointerDevice(ptr)
}

// StreamCreate creates a non-blocking stream on device dev (no implicit
// ordering with the legacy default stream, like PyTorch's side streams).
func StreamCreate(dev int) (uintptr, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.streamCreate(dev)
}

// StreamDestroy destroys a stream made by StreamCreate. Work already queued
// on it still completes.
func StreamDestroy(dev int, stream uintptr) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.streamDestroy(dev, stream)
}

// Synchronize waits until all work queued on every stream of device dev's
// primary context has completed (cuCtxSynchronize).
func Synchronize(dev int) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.ctxSync(dev)
}

// StreamSynchronize waits until all work queued on stream has completed
// (stream 0 is the legacy default stream of device dev).
func StreamSynchronize(dev int, stream uintptr) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.streamSync(dev, stream)
}

// StreamWriteValue32 enqueues on stream a write of value to the 4-byte
// aligned device address addr. It needs cuStreamWriteValue32, which a driver
// may lack (a *MissingSymbolError then).
func StreamWriteValue32(dev int, stream, addr uintptr, value uint32) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.streamValue32(fnStreamWriteValue32, dev, stream, addr, value, 0)
}

// StreamWaitValue32 makes stream wait until the 4-byte word at addr meets
// value under flags (WaitValueGEQ, ...). Work queued later on stream starts
// only then; the host does not wait.
func StreamWaitValue32(dev int, stream, addr uintptr, value uint32, flags uint32) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.streamValue32(fnStreamWaitValue32, dev, stream, addr, value, flags)
}

// StreamQuery reports whether all work queued on stream (0: the legacy
// default stream of device dev) has completed, without waiting. A stream
// blocked in StreamWaitValue32 answers false until the value comes, so
// polling StreamQuery with a deadline detects a wait that never completes.
// It needs cuStreamQuery (a *MissingSymbolError without it).
func StreamQuery(dev int, stream uintptr) (done bool, err error) {
	d, err := loaded()
	if err != nil {
		return false, err
	}
	return d.streamQuery(dev, stream)
}

// CanAccessPeer reports whether device dev can access memory that lives on
// device peer (cuDeviceCanAccessPeer), i.e. whether SetAccess may grant dev
// access to a mapping of peer's memory. A device's own memory needs no peer
// access: do not rely on the answer for dev == peer, which the driver does
// not document.
func CanAccessPeer(dev, peer int) (bool, error) {
	d, err := loaded()
	if err != nil {
		return false, err
	}
	return d.canAccessPeer(dev, peer)
}

// ---- virtual memory management ------------------------------------------------
//
// Symmetric memory across processes, as PyTorch's CUDASymmetricMemory makes
// it: MemCreate allocates physical memory on a device, ExportFD turns it into
// a file descriptor that another process (which received it over a Unix
// socket) turns back into a handle with ImportFD, and MapNew maps a handle
// into a new address range that the listed devices may read and write.
// Teardown is UnmapFree for each mapping and MemRelease for each handle, in
// either order: the memory is freed once it is neither mapped nor held.
//
// Every function takes the device whose context it runs in: the memory's
// device for MemCreate and Granularity, the device that maps or uses the
// memory for the others (any visible device works for a release). Handles
// are uint64 (CUmemGenericAllocationHandle); a handle this process does not
// hold is refused with CUDA_ERROR_INVALID_VALUE before it reaches the
// driver. The functions need the driver's virtual memory management
// functions (see VMMAvailable); without one they return a
// *MissingSymbolError.

// Granularity returns the minimum and the recommended allocation granularity
// of device dev for memory that MemCreate makes (pinned device memory,
// exportable as a POSIX file descriptor). MemCreate sizes must be multiples
// of minimum; multiples of recommended perform best.
func Granularity(dev int) (minimum, recommended uint64, err error) {
	d, err := loaded()
	if err != nil {
		return 0, 0, err
	}
	return d.granularity(dev)
}

// MemCreate allocates size bytes of physical memory on device dev, exportable
// as a POSIX file descriptor (cuMemCreate). size must be a non-zero multiple
// of Granularity's minimum. The memory is not zeroed. Release the handle with
// MemRelease.
func MemCreate(dev int, size uint64) (handle uint64, err error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.memCreate(dev, size)
}

// MemRelease drops this process's reference to handle (cuMemRelease), one
// per MemCreate, ImportFD or RetainAllocationHandle. Mappings of it stay
// valid until unmapped.
func MemRelease(dev int, handle uint64) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.memRelease(dev, handle)
}

// ExportFD returns a new file descriptor for the memory of handle
// (cuMemExportToShareableHandle, POSIX_FILE_DESCRIPTOR), with close-on-exec
// set. The caller owns it and closes it once sent: it keeps the memory
// alive while open.
func ExportFD(dev int, handle uint64) (fd int, err error) {
	d, err := loaded()
	if err != nil {
		return -1, err
	}
	return d.exportFD(dev, handle)
}

// ImportFD returns a handle to the memory behind fd, a descriptor made by
// ExportFD in this or another process (cuMemImportFromShareableHandle). It
// does not close fd; the handle stays valid after fd is closed. Release the
// handle with MemRelease.
func ImportFD(dev int, fd int) (handle uint64, err error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.importFD(dev, fd)
}

// RetainAllocationHandle returns a new reference to the handle mapped at ptr
// (any address inside a mapping), as cuMemRetainAllocationHandle does.
// Release it with MemRelease.
func RetainAllocationHandle(dev int, ptr uintptr) (handle uint64, err error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.retainAllocationHandle(dev, ptr)
}

// AddressReserve reserves size bytes of device address space aligned to
// alignment (0: the driver's default), at an address the driver picks
// (cuMemAddressReserve). Free it with AddressFree.
func AddressReserve(dev int, size, alignment uint64) (ptr uintptr, err error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.addressReserve(dev, size, alignment)
}

// AddressFree frees an address range made by AddressReserve; ptr and size
// must be those of the reservation, and nothing may be mapped in it.
func AddressFree(dev int, ptr uintptr, size uint64) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.addressFree(dev, ptr, size)
}

// Map maps the first size bytes of handle's memory at ptr, inside a reserved
// range (cuMemMap, offset 0). The mapping is not accessible until SetAccess.
func Map(dev int, ptr uintptr, size uint64, handle uint64) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.memMap(dev, ptr, size, handle)
}

// Unmap unmaps [ptr, ptr+size), which must be whole mappings (cuMemUnmap).
func Unmap(dev int, ptr uintptr, size uint64) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.memUnmap(dev, ptr, size)
}

// SetAccess grants read-write access to [ptr, ptr+size), which must be
// mapped, from each device in devs (cuMemSetAccess). A device other than the
// memory's own needs peer access to it (see CanAccessPeer).
func SetAccess(dev int, ptr uintptr, size uint64, devs []int) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.setAccess(dev, ptr, size, devs)
}

// MapNew reserves a new address range of size bytes, maps handle's memory
// there and grants read-write access to each device in devs (nil: dev
// alone), all in device dev's context. On any failure it undoes what it did
// and returns the error. Undo it with UnmapFree.
func MapNew(dev int, handle uint64, size uint64, devs []int) (ptr uintptr, err error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.mapNew(dev, handle, size, devs)
}

// UnmapFree unmaps [ptr, ptr+size) and frees the address range, undoing
// MapNew. The range is freed even when unmapping fails; both errors are
// reported.
func UnmapFree(dev int, ptr uintptr, size uint64) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.unmapFree(dev, ptr, size)
}

// VMMAvailable returns nil when the driver has every virtual memory
// management function libsymm uses (cuMemCreate, cuMemMap, ...), else an
// error naming the first one missing. Whether a device supports them is a
// separate question: see AttrVirtualMemoryManagementSupported.
func VMMAvailable() error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.vmmAvailable()
}

// PrimaryContext returns device dev's primary context (the one PyTorch's
// runtime uses), retaining it on first use; it stays retained for the life
// of the process.
func PrimaryContext(dev int) (uintptr, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.primaryContext(dev)
}

// CurrentContext returns the calling OS thread's current CUDA context (0 when
// none). Only meaningful with the goroutine locked to its thread
// (runtime.LockOSThread), since the current context belongs to the thread.
func CurrentContext() (uintptr, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.currentContext()
}

// SetCurrentContext makes ctx current on the calling OS thread (0 pops the
// top of the thread's context stack). Lock the goroutine to its thread first.
func SetCurrentContext(ctx uintptr) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.setCurrentContext(ctx)
}

// EventCreate makes an event without timing on device dev (for ordering and
// completion queries only).
func EventCreate(dev int) (uintptr, error) {
	d, err := loaded()
	if err != nil {
		return 0, err
	}
	return d.eventCreate(dev)
}

// EventRecord records ev after the work queued on stream so far.
func EventRecord(dev int, ev, stream uintptr) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.eventRecord(dev, ev, stream)
}

// EventQuery reports whether the work ev's last record captured has
// completed, without waiting (an event never recorded counts as completed).
func EventQuery(dev int, ev uintptr) (bool, error) {
	d, err := loaded()
	if err != nil {
		return false, err
	}
	return d.eventQuery(dev, ev)
}

// EventDestroy releases ev; a pending record still completes.
func EventDestroy(dev int, ev uintptr) error {
	d, err := loaded()
	if err != nil {
		return err
	}
	return d.eventDestroy(dev, ev)
}
