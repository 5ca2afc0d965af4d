package allocator

import "errors"

// Backend is the memory provider under a Pool: it hands out whole segments and
// stream events. The pool never calls it on the cached path; every call is on
// a slow path (new segment, release, cross-stream reuse, record_stream).
//
// Implementations: cuda.Backend (cuMemAlloc/cuMemFree on the device's context),
// host.Backend (memfd + mmap), and fakes in tests.
//
// A future expandable-segment backend serves Alloc by reserving a large address
// range once and mapping physical chunks into it as it grows; the pool only
// sees segments, so its callers do not change.
type Backend interface {
	// Name is a short word for messages: "cuda", "host".
	Name() string
	// DeviceCount is the number of devices this backend serves.
	DeviceCount() (int, error)
	// MemInfo reports free and total bytes of device dev.
	MemInfo(dev int) (free, total uint64, err error)
	// Alloc returns a new segment of exactly size bytes on device dev,
	// aligned to at least 512 bytes. size is a multiple of 512.
	// When the device is out of memory the error satisfies IsOutOfMemory.
	Alloc(dev int, size uint64) (uintptr, error)
	// Free returns a segment obtained from Alloc. The backend orders it after
	// all work already submitted to the device (cuMemFree synchronizes).
	Free(dev int, ptr uintptr, size uint64) error

	// NewEvent creates an event on device dev that can be recorded on its streams.
	NewEvent(dev int) (Event, error)
	// Record records ev on stream (a cudaStream_t / CUstream value; 0 is the
	// legacy default stream).
	Record(dev int, ev Event, stream uintptr) error
	// Query reports whether all work captured by the last Record of ev has completed.
	Query(dev int, ev Event) (bool, error)
	// Sync blocks until the work captured by ev has completed.
	Sync(dev int, ev Event) error
	// DestroyEvent releases ev.
	DestroyEvent(dev int, ev Event) error
}

// Event is a backend's event handle (a CUevent for CUDA).
type Event uintptr

// ErrOutOfMemory is returned (wrapped) when a request cannot be served:
// the backend is out of memory or the pool's limit is reached, after
// releasing cached segments and retrying once.
var ErrOutOfMemory = errors.New("out of memory")

// IsOutOfMemory reports whether err means the provider had no memory left.
// Backends mark such errors with an OutOfMemory() bool method, so that they
// need not import this package.
func IsOutOfMemory(err error) bool {
	if errors.Is(err, ErrOutOfMemory) {
		return true
	}
	var o interface{ OutOfMemory() bool }
	return errors.As(err, &o) && o.OutOfMemory()
}
