package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/libsymm/libsymm/allocator"
)

// ErrNoDevice is wrapped by NewBackend's error when there is no usable CUDA
// device: no driver, a driver that fails to initialize, or zero devices.
// The C ABI maps it to SYMM_ERR_NO_DEVICE.
var ErrNoDevice = errors.New("no CUDA device")

// segmentAlign is the alignment allocator.Backend promises for segments.
const segmentAlign = 512

// Backend serves the allocator's segments and events from the CUDA driver:
// cuMemAlloc/cuMemFree and cuEvent*, each in the device's context (see
// enter). It is safe for concurrent use; it holds no state of its own beyond
// the process-wide driver.
type Backend struct {
	d *driver

	// spare holds, per device, the chunks kept by KeepChunks (expand.go)
	// with their sizes; mapped counts the bytes of chunks
	// mapped through the Expander. Under spareMu.
	spareMu sync.Mutex
	spare   map[int][]spareChunk
	mapped  map[int]uint64
	// unreleased holds, per device, handles of mapped chunks whose extra
	// reference MapKept could not drop; dropped again later. Under spareMu.
	unreleased map[int][]uint64

	// vm is the driver as expandable segments use it (expand.go): d,
	// except in tests of their failure paths.
	vm chunkDriver
}

var _ allocator.Backend = (*Backend)(nil)

// NewBackend loads the driver (see Load for opts) and returns a Backend over
// it. It fails, with an error wrapping ErrNoDevice that says how to run
// without a GPU, when the driver cannot be loaded or sees no device.
func NewBackend(opts ...Option) (*Backend, error) {
	d, err := load(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w (set SYMM_DEVICE=host to run on host memory)", ErrNoDevice, err)
	}
	return newBackend(d)
}

func newBackend(d *driver) (*Backend, error) {
	n, err := d.deviceCount()
	if err != nil {
		return nil, fmt.Errorf("%w: %w (set SYMM_DEVICE=host to run on host memory)", ErrNoDevice, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: the driver reports 0 devices (check CUDA_VISIBLE_DEVICES; set SYMM_DEVICE=host to run on host memory)", ErrNoDevice)
	}
	return &Backend{d: d, vm: d, spare: map[int][]spareChunk{}, mapped: map[int]uint64{}, unreleased: map[int][]uint64{}}, nil
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// DeviceCount returns the number of visible devices (cuDeviceGetCount).
func (b *Backend) DeviceCount() (int, error) { return b.d.deviceCount() }

// MemInfo returns cuMemGetInfo of device dev: free and total bytes as the
// driver sees them, for every process on the device.
func (b *Backend) MemInfo(dev int) (free, total uint64, err error) {
	return b.d.memGetInfo(dev)
}

// Alloc returns size bytes from cuMemAlloc on device dev. When the device is
// out of memory the error wraps ErrorOutOfMemory (allocator.IsOutOfMemory
// is true for it).
//
// cuMemAlloc documents 256-byte alignment; allocations have always been
// aligned further in practice. The 512 bytes the pool relies on are checked
// rather than assumed: a misaligned block is freed and reported.
func (b *Backend) Alloc(dev int, size uint64) (uintptr, error) {
	p, err := b.d.memAlloc(dev, size)
	if err != nil {
		return 0, err
	}
	if p%segmentAlign != 0 {
		ferr := b.d.memFree(dev, p)
		return 0, errors.Join(fmt.Errorf("cuda: cuMemAlloc(%d bytes) on device %d returned %#x, not %d-byte aligned", size, dev, p, segmentAlign), ferr)
	}
	return p, nil
}

// Free returns a segment to the driver. cuMemFree waits for work already
// submitted to the device, so the pool need not order it after anything.
func (b *Backend) Free(dev int, ptr uintptr, size uint64) error {
	if err := b.d.memFree(dev, ptr); err != nil {
		return fmt.Errorf("%w (segment of %d bytes)", err, size)
	}
	return nil
}

// NewEvent creates an event without timing (CU_EVENT_DISABLE_TIMING).
func (b *Backend) NewEvent(dev int) (allocator.Event, error) {
	ev, err := b.d.eventCreate(dev)
	return allocator.Event(ev), err
}

// Record records ev on stream; 0 is the legacy default stream.
func (b *Backend) Record(dev int, ev allocator.Event, stream uintptr) error {
	return b.d.eventRecord(dev, uintptr(ev), stream)
}

// Query reports whether the work captured by ev's last Record has completed
// (an event never recorded counts as completed, as in CUDA).
func (b *Backend) Query(dev int, ev allocator.Event) (bool, error) {
	return b.d.eventQuery(dev, uintptr(ev))
}

// Sync blocks until the work captured by ev has completed.
func (b *Backend) Sync(dev int, ev allocator.Event) error {
	return b.d.eventSync(dev, uintptr(ev))
}

// DestroyEvent releases ev; a pending record still completes.
func (b *Backend) DestroyEvent(dev int, ev allocator.Event) error {
	return b.d.eventDestroy(dev, uintptr(ev))
}
