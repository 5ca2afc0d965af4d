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
