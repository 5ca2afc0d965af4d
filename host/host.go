package host

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/allocator"
)

// Backend implements allocator.Backend over memfd + mmap.
type Backend struct {
	devices  int
	capacity uint64 // bytes per device

	mu   sync.Mutex
	used []uint64
	segs map[uintptr]uint64 // base -> size, per live segment
	// ranges: reserved ranges of expandable segments (expand.go), by base.
	ranges map[uintptr]hostRange
	// spareOf: bytes of chunks kept per device and chunk size
	// (ChunkKeeper, expand.go), counted in used.
	spareOf map[[2]uint64]uint64
	// starts: each physical chunk mapped in the ranges (its start and
	// size), which unmaps only whole, as on a GPU.
	starts allocator.ChunkStarts

	nextEvent atomic.Uintptr

	// Fault injection (WithFaults): nil, or set once before first use.
	faults   *Faults
	faultOps FaultOps
}

// FaultOps chooses the operations that fault injection may fail.
type FaultOps uint8

const (
	FaultAlloc  FaultOps = 1 << iota // Alloc, at any of its steps (before, or after the memfd or the mapping is made)
	FaultEvents                      // NewEvent
	FaultUnmap                       // UnmapChunks and KeepChunks: a prefix of the chunks is unmapped, then it fails
)

// WithFaults makes the operations in ops fail at random with probability
// rate, deterministically from seed (see Faults), with an error wrapping
// ErrInjectedFault: "host: injected fault (SYMM_HOST_FAULTS): ...". A failed
// Alloc leaves nothing behind: no mapping, no descriptor, no bytes counted.
// It is for tests (and SYMM_HOST_FAULTS); call it before the backend is used.
func (h *Backend) WithFaults(rate float64, seed uint64, ops FaultOps) error {
	f, err := NewFaults(rate, seed)
	if err != nil {
		return err
	}
	h.faults, h.faultOps = f, ops
	return nil
}

// Faults is the backend's fault source (nil without WithFaults), to count
// the failures injected.
func (h *Backend) Faults() *Faults { return h.faults }

// pick decides whether an operation of kind op fails, and at which of its
// n steps (-1: it does not).
func (h *Backend) pick(op FaultOps, n int) int {
	if h.faultOps&op == 0 {
		return -1
	}
	return h.faults.Pick(n)
}

// New returns a host backend of devices devices, each holding at most
// capacity bytes (0: the machine's physical memory). The cap makes an
// oversized request fail the way a GPU's would, instead of succeeding lazily
// on a sparse mapping.
func New(devices int, capacity uint64) (*Backend, error) {
	if devices <= 0 {
		return nil, fmt.Errorf("host backend: %d devices: need at least 1", devices)
	}
	if capacity == 0 {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			return nil, fmt.Errorf("host backend: sysinfo: %w", err)
		}
		capacity = uint64(si.Totalram) * uint64(si.Unit)
	}
	return &Backend{devices: devices, capacity: capacity, used: make([]uint64, devices), segs: map[uintptr]uint64{}, ranges: map[uintptr]hostRange{},
		spareOf: map[[2]uint64]uint64{}, starts: allocator.ChunkStarts{}}, nil
}

// OutOfMemoryError is a refused segment; the allocator recognizes it by its
// OutOfMemory method.
type OutOfMemoryError struct {
	Dev             int
	Want, Used, Cap uint64
	Cause           error
}

func (e *OutOfMemoryError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("host: out of memory: %d bytes on device %d: %v", e.Want, e.Dev, e.Cause)
	}
	return fmt.Sprintf("host: out of memory: %d bytes on device %d (%d of %d bytes in use)", e.Want, e.Dev, e.Used, e.Cap)
}
func (e *OutOfMemoryError) OutOfMemory() bool { return true }

func (h *Backend) Name() string              { return "host" }
func (h *Backend) DeviceCount() (int, error) { return h.devices, nil }

func (h *Backend) check(dev int) error {
	if dev < 0 || dev >= h.devices {
		return fmt.Errorf("host: device %d out of range [0, %d)", dev, h.devices)
	}
	return nil
}

func (h *Backend) MemInfo(dev int) (free, total uint64, err error) {
	if err := h.check(dev); err != nil {
		return 0, 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.capacity - h.used[dev], h.capacity, nil
}

// Alloc maps a new memfd of size bytes (page-aligned, so 512-aligned).
func (h *Backend) Alloc(dev int, size uint64) (uintptr, error) {
	if err := h.check(dev); err != nil {
		return 0, err
	}
	failAt := h.pick(FaultAlloc, 3) // 0: at once; 1: after the memfd is made; 2: after it is mapped
	if failAt == 0 {
		return 0, h.faults.Err(fmt.Sprintf("alloc of %d bytes on device %d", size, dev))
	}
	h.mu.Lock()
	if h.used[dev]+size > h.capacity || size > h.capacity {
		e := &OutOfMemoryError{Dev: dev, Want: size, Used: h.used[dev], Cap: h.capacity}
		h.mu.Unlock()
		return 0, e
	}
	h.used[dev] += size
	h.mu.Unlock()

	ptr, err := mapMemfd(size, failAt-1)
	if err != nil {
		h.mu.Lock()
		h.used[dev] -= size
		h.mu.Unlock()
		var step faultStep
		if errors.As(err, &step) {
			return 0, h.faults.Err(fmt.Sprintf("alloc of %d bytes on device %d (%s)", size, dev, step))
		}
		if err == unix.ENOMEM || err == unix.ENOSPC {
			return 0, &OutOfMemoryError{Dev: dev, Want: size, Cause: err}
		}
		return 0, fmt.Errorf("host: mapping %d bytes on device %d: %w", size, dev, err)
	}
	h.mu.Lock()
	h.segs[ptr] = size
	h.mu.Unlock()
	return ptr, nil
}

// faultStep is the step of mapMemfd at which an injected fault hit.
type faultStep string

func (s faultStep) Error() string { return string(s) }

// mapMemfd makes and maps a memfd of size bytes. failAt (fault injection)
// fails it after making the memfd (0) or after mapping it (1), undoing what
// was done as a real failure there would; -1: no fault.
func mapMemfd(size uint64, failAt int) (uintptr, error) {
	fd, err := unix.MemfdCreate("symm-pool", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd) // the mapping keeps the memory
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return 0, err
	}
	if failAt == 0 {
		return 0, faultStep("after memfd_create")
	}
	// unix.Mmap returns a []byte we never index: use the raw syscall so no
	// Go slice header pretends to own the memory.
	ptr, _, errno := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED, uintptr(fd), 0)
	if errno != 0 {
		return 0, errno
	}
	if failAt == 1 {
		if _, _, errno := unix.Syscall(unix.SYS_MUNMAP, ptr, uintptr(size), 0); errno != 0 {
			return 0, fmt.Errorf("munmap after an injected fault: %w", errno)
		}
		return 0, faultStep("after mmap")
	}
	return ptr, nil
}

// Free unmaps a segment from Alloc.
func (h *Backend) Free(dev int, ptr uintptr, size uint64) error {
	if err := h.check(dev); err != nil {
		return err
	}
	h.mu.Lock()
	got, ok := h.segs[ptr]
	if !ok || got != size {
		h.mu.Unlock()
		return fmt.Errorf("host: free of %#x (%d bytes): not a segment of this backend", ptr, size)
	}
	delete(h.segs, ptr)
	h.used[dev] -= size
	h.mu.Unlock()
	if _, _, errno := unix.Syscall(unix.SYS_MUNMAP, ptr, uintptr(size), 0); errno != 0 {
		return fmt.Errorf("host: munmap %#x: %w", ptr, errno)
	}
	return nil
}

// Events: host work is synchronous, so events are only identities.
func (h *Backend) NewEvent(dev int) (allocator.Event, error) {
	if err := h.check(dev); err != nil {
		return 0, err
	}
	if h.pick(FaultEvents, 1) >= 0 {
		return 0, h.faults.Err(fmt.Sprintf("new event on device %d", dev))
	}
	return allocator.Event(h.nextEvent.Add(1)), nil
}
func (h *Backend) Record(dev int, ev allocator.Event, stream uintptr) error { return h.check(dev) }
func (h *Backend) Query(dev int, ev allocator.Event) (bool, error)          { return true, h.check(dev) }
func (h *Backend) Sync(dev int, ev allocator.Event) error                   { return h.check(dev) }
func (h *Backend) DestroyEvent(dev int, ev allocator.Event) error           { return h.check(dev) }

// Segments reports how many segments are mapped (for leak checks in tests).
func (h *Backend) Segments() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.segs)
}
