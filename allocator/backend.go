package allocator

import (
	"errors"
	"fmt"
)

// Backend is the memory provider under a Pool: it hands out whole segments and
// stream events. The pool never calls it on the cached path; every call is on
// a slow path (new segment, release, cross-stream reuse, record_stream).
//
// Implementations: cuda.Backend (cuMemAlloc/cuMemFree on the device's context),
// host.Backend (memfd + mmap), and fakes in tests.
//
// A backend that also implements Expander can serve expandable segments
// (Config.Expandable): a large reserved address range into which physical
// chunks are mapped as the pool grows. The pool's callers do not change.
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

// Expander is the optional part of a Backend that expandable segments need:
// address space reserved without memory behind it, and physical chunks mapped
// into it and unmapped again. Like the rest of Backend, the pool calls it only
// on slow paths (growth, release).
//
// Ranges given to MapChunks and UnmapChunks lie inside one range from
// ReserveRange and start and end on multiples of Granularity from its base;
// a range unmapped is one that was mapped (in one or several MapChunks calls).
type Expander interface {
	// Granularity is the size of the smallest physical chunk on dev (the
	// driver's allocation granularity: 2 MiB on current GPUs); a power of
	// two, at least 512.
	Granularity(dev int) (uint64, error)
	// ReserveRange reserves size bytes of address space on dev, aligned to
	// Granularity, with nothing mapped. size is a multiple of Granularity.
	ReserveRange(dev int, size uint64) (uintptr, error)
	// FreeRange gives back a range from ReserveRange; nothing in it is mapped.
	FreeRange(dev int, ptr uintptr, size uint64) error
	// MapChunks backs [ptr, ptr+size) with new physical memory that dev can
	// read and write, one physical allocation per chunk of chunk bytes (a
	// multiple of Granularity; size is a multiple of chunk), so that any
	// chunk can later be unmapped alone while fewer, larger allocations
	// keep the driver's per-allocation cost down. When the device is out of
	// memory the error satisfies IsOutOfMemory. On any error nothing of the
	// range is mapped.
	MapChunks(dev int, ptr uintptr, size, chunk uint64) error
	// UnmapChunks releases the memory of [ptr, ptr+size), which MapChunks
	// or MapKept mapped with the same chunk. The pool calls it only once no
	// work can still use the range (it waits for an event on the segment's
	// stream first), so the backend does not wait: no device-wide
	// synchronize. It returns how many bytes from ptr were unmapped: size,
	// or on error a prefix of whole chunks (the rest stays mapped), so that
	// the pool's books can follow exactly what is mapped.
	UnmapChunks(dev int, ptr uintptr, size, chunk uint64) (unmapped uint64, err error)
}

// ChunkAuditor is an optional part of an Expander that can say which chunks
// of a reserved range are mapped (the host backend and the test fakes):
// CheckInvariants then proves, chunk by chunk, that the pool's books equal
// what the backend really has mapped.
type ChunkAuditor interface {
	// MappedChunks reports, for the first size bytes of the range reserved
	// at base on dev, one entry per chunk of the backend's granularity,
	// true where it is mapped; and how many bytes of the whole range are.
	MappedChunks(dev int, base uintptr, size uint64) (chunks []bool, rangeMapped uint64, err error)
}

// ChunkKeeper is the optional part of an Expander that keeps the physical
// memory of unmapped chunks for later mappings (spare handles). With
// Config.UnmapFreePages the pool moves memory from free holes to where it
// is needed: unmapping into spare chunks and mapping those again costs an
// unmap and a map per chunk, where unmapping and mapping new memory also
// releases and creates a physical allocation (cuMemRelease, cuMemCreate:
// the slow part).
//
// The pool keeps chunks only for the mapping it is about to make and
// releases whatever that mapping did not take before it returns, so a
// device's spare is empty between pool operations. Spare chunks of the same
// size are interchangeable between ranges of the same device.
type ChunkKeeper interface {
	// KeepChunks unmaps [ptr, ptr+size) as UnmapChunks does, keeping its
	// memory as spare chunks of dev. It returns how many bytes from ptr
	// were unmapped and kept: size, or on error a prefix (the rest stays
	// mapped).
	KeepChunks(dev int, ptr uintptr, size, chunk uint64) (kept uint64, err error)
	// MapKept maps [ptr, ptr+size), unmapped, with size bytes of dev's
	// spare chunks of chunk bytes, readable and writable by dev. On error
	// nothing is mapped and the spare is unchanged.
	MapKept(dev int, ptr uintptr, size, chunk uint64) error
	// ReleaseKept releases size bytes of dev's spare chunks of chunk
	// bytes.
	ReleaseKept(dev int, size, chunk uint64) error
	// Chunks reports the chunk memory dev holds: mapped in ranges, and
	// spare. Every chunk the backend created and has not released is one of
	// the two (the fuzz tests check this after every step).
	Chunks(dev int) (mapped, spare uint64)
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

// GraphNode is a node of a CUDA graph under capture (a CUgraphNode for
// CUDA); 0 is no node.
type GraphNode uintptr

// CaptureGrapher is the optional part of a Backend that can see the graph a
// stream is capturing into (CUDA's stream capture). With it and
// Config.CaptureReuse, a block freed during a capture after record_stream
// can serve the capture again once the graph proves its uses are over
// (capture_reuse.go). The pool calls it only while a capture may be under
// way, on the slow paths of a free with record_stream streams and of an
// allocation that finds such frees pending; never an event call.
//
// A capture is named by an id that no other capture of the process shares
// (CUDA's capture id); nodes are compared only within one capture.
type CaptureGrapher interface {
	// MarkFree adds an empty node to the graph stream is capturing into,
	// after the stream's current capture dependencies, and makes it the
	// stream's only dependency: work the stream captures later follows it,
	// and it follows everything the stream captured so far. capturing is
	// false (and nothing is added) when the stream is not capturing, or
	// its capture is no longer valid.
	MarkFree(dev int, stream uintptr) (node GraphNode, capture uint64, capturing bool, err error)
	// CaptureDeps appends to deps the stream's current capture
	// dependencies (the nodes its next captured work will follow) and
	// returns them with the capture's id; capturing false when the stream
	// is not capturing.
	CaptureDeps(dev int, stream uintptr, deps []GraphNode) (out []GraphNode, capture uint64, capturing bool, err error)
	// NodeDeps appends to deps the nodes node depends on directly.
	NodeDeps(dev int, node GraphNode, deps []GraphNode) ([]GraphNode, error)
}

// ChunkStarts records where each physical chunk mapped in expandable ranges
// begins and its size, for the backends that model the driver's rule that
// an unmap takes whole mappings (the host backend, Virtual, the tests'
// fakes): an unmap, or a keep, of part of a chunk or with another chunk
// size is refused, as cuMemUnmap refuses it, so that the pool's fuzzers see
// a wrong chunk size where CI has no GPU. The caller checks separately
// that a mapping goes over unmapped memory only.
type ChunkStarts map[uintptr]uint64

// Check reports the first chunk of chunk bytes of [ptr, ptr+size) that is
// not one physical chunk of that size.
func (m ChunkStarts) Check(ptr uintptr, size, chunk uint64) error {
	for p := ptr; p < ptr+uintptr(size); p += uintptr(chunk) {
		if have := m[p]; have != chunk {
			return fmt.Errorf("%#x+%d is not a mapped chunk of %d bytes (a chunk of %d bytes starts there; 0: none)", p, chunk, chunk, have)
		}
	}
	return nil
}

// Add records [ptr, ptr+size) as mapped in chunks of chunk bytes.
func (m ChunkStarts) Add(ptr uintptr, size, chunk uint64) {
	for p := ptr; p < ptr+uintptr(size); p += uintptr(chunk) {
		m[p] = chunk
	}
}

// Remove forgets the chunks of chunk bytes of [ptr, ptr+size).
func (m ChunkStarts) Remove(ptr uintptr, size, chunk uint64) {
	for p := ptr; p < ptr+uintptr(size); p += uintptr(chunk) {
		delete(m, p)
	}
}
