package symmetric

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/store"
)

// Provider makes exportable memory and maps peers' memory. One per backend:
// hostProvider (memfd + mmap, atomics) and cudaProvider (cuMemCreate with
// POSIX file descriptors, cuMemMap, stream memory operations).
// Peering is implemented by providers whose devices may be unable to reach
// each other. Rendezvous uses it to refuse a group it cannot map, with an
// error naming both devices, before anything is exchanged.
type Peering interface {
	// DeviceID names device dev the same way in every process of the host.
	DeviceID(dev int) (string, error)
	// CanMap returns nil when the device named a may map memory of the
	// device named b, or when this process cannot tell (it does not see
	// one of them); otherwise an error naming both and their link.
	CanMap(a, b string) error
}

type Provider interface {
	Name() string
	// Granularity is the unit of block sizes on dev.
	Granularity(dev int) (uint64, error)
	// Create makes size bytes (a multiple of Granularity) on dev, mapped here.
	Create(dev int, size uint64) (*Mem, error)
	// Export returns a new descriptor for m; the caller closes it.
	Export(m *Mem) (int, error)
	// Import maps a peer's block, given by fd (not closed), on local device dev.
	Import(dev int, fd int, size uint64) (*Mem, error)
	// Release unmaps m and frees what Create or Import made.
	Release(m *Mem) error
	// PutSignal waits, in stream order, until the uint32 at addr is 0, then
	// sets it to 1. With timeout > 0 it returns ErrSignalTimeout if the slot
	// has not been consumed by then. A provider whose signals are stream
	// operations (a streamMarker) only queues them, whatever the timeout:
	// the handle waits for them itself, between two markers
	// (Handle.streamSignal).
	PutSignal(dev int, stream, addr uintptr, timeout time.Duration) error
	// WaitSignal waits, in stream order, until the uint32 at addr is 1, then
	// sets it to 0. With timeout > 0 the call returns ErrSignalTimeout if the
	// wait has not completed by then (a streamMarker only queues, as for
	// PutSignal).
	WaitSignal(dev int, stream, addr uintptr, timeout time.Duration) error
}

// Mem is memory of a Provider, mapped in this process.
type Mem struct {
	Ptr  uintptr
	Size uint64
	Dev  int
	// provider-specific: a memfd (host) or a CUmemGenericAllocationHandle (cuda).
	fd     int
	handle uint64
	// view: a peer's memory seen through a mapping its owner made (NVSHMEM's
	// heap): there is nothing of ours to release.
	view bool
	// ncclOwned: made by ncclMemAlloc here; handle is a retained reference.
	ncclOwned bool
}

// Registrar is implemented by providers that register a block with their
// collective library once every rank of a group has mapped it (NCCL's
// symmetric windows). Register is collective over the group; the returned
// function undoes it (collective too) and runs when the handle is released.
type Registrar interface {
	Register(m *Mem, rank, world int) (undo func() error, err error)
}

// PeerMapper is implemented by providers whose blocks every peer has mapped
// already (NVSHMEM's symmetric heap): a rendezvous asks for a peer's address
// instead of exchanging descriptors.
type PeerMapper interface {
	// PeerID is this process's id in the provider's world (its PE).
	PeerID() (int, error)
	// PeerPtr is where the block of peer id that matches m is mapped here,
	// or an error when it cannot be reached with loads and stores.
	PeerPtr(m *Mem, id int) (uintptr, error)
}

// Bootstrapper is implemented by providers that must join their world
// before the first allocation (NVSHMEM). Every rank calls Bootstrap once.
type Bootstrapper interface {
	Bootstrap(st store.Store, rank, world, dev int, timeout time.Duration) error
}

// LabelDevices is implemented by providers whose devices are labels of one
// memory (host memory): no driver checks a device, so the manager asks
// CheckDevice before it makes a block of size bytes on dev (size 0: before
// it joins a backend's world there), and two ranks of a group may use the
// same label.
type LabelDevices interface {
	CheckDevice(dev int, size uint64) error
}

// Zeroer is implemented by providers whose memory does not start zeroed
// (cuMemCreate's): Zero clears n bytes at ptr on dev and returns once they
// are clear for every stream. Memory of the other providers is host memory
// (memfd mappings), cleared in place.
type Zeroer interface {
	Zero(dev int, ptr uintptr, n uint64) error
}

// EarlyExporter is implemented by providers whose Export goes through a
// driver and takes up to a millisecond (CUDA's
// cuMemExportToShareableHandle): the manager starts the export at Alloc,
// in the background, so that the block's first rendezvous finds its
// descriptor ready. Other providers export when a rendezvous asks.
type EarlyExporter interface {
	ExportEarly()
}

// Quiescer is implemented by providers whose devices run queued work:
// Quiesce returns once every stream of dev has completed what was queued
// on it. Work of the other providers is done when its call returns.
type Quiescer interface {
	Quiesce(dev int) error
}

// ErrSignalTimeout marks a wait_signal or barrier that did not complete.
var ErrSignalTimeout = errors.New("signal wait timed out")

// NewHostProvider returns the host-memory provider (NewProvider makes it
// with its limits and fault injection from a Config).
func NewHostProvider() Provider { return hostProvider{} }

// NewHostProviderWithFaults returns the host-memory provider with fault
// injection (tests, SYMM_HOST_FAULTS): Create, Export and Import fail at
// random with probability rate, deterministically from seed, with an error
// wrapping host.ErrInjectedFault ("host: injected fault (SYMM_HOST_FAULTS)").
// Each fails at one of its steps, after undoing what the earlier steps made,
// so a failed call leaves no descriptor and no mapping behind. The second
// result counts the failures injected.
func NewHostProviderWithFaults(rate float64, seed uint64) (Provider, *host.Faults, error) {
	f, err := host.NewFaults(rate, seed)
	if err != nil {
		return nil, nil, err
	}
	return hostProvider{faults: f}, f, nil
}

// hostProvider serves blocks from memfd mappings. Its "devices" are labels:
// every block is host memory, visible to every process that maps it.
type hostProvider struct {
	faults *host.Faults                     // nil: no fault injection
	limits func(dev int, size uint64) error // Config.HostLimits; nil: any device and size
}

// CheckDevice applies Config.HostLimits (LabelDevices).
func (p hostProvider) CheckDevice(dev int, size uint64) error {
	if p.limits == nil {
		return nil
	}
	return p.limits(dev, size)
}

func (hostProvider) Name() string                    { return "host" }
func (hostProvider) Granularity(int) (uint64, error) { return uint64(unix.Getpagesize()), nil }

func (p hostProvider) Create(dev int, size uint64) (*Mem, error) {
	failAt := p.faults.Pick(3) // 0: at once; 1: after memfd_create; 2: after mmap
	fault := func() error {
		return p.faults.Err(fmt.Sprintf("create of %d bytes on device %d%s", size, dev, [...]string{"", " (after memfd_create)", " (after mmap)"}[failAt]))
	}
	if failAt == 0 {
		return nil, fault()
	}
	fd, err := unix.MemfdCreate("symm-block", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate memfd to %d bytes: %w", size, err)
	}
	if failAt == 1 {
		unix.Close(fd)
		return nil, fault()
	}
	ptr, err := mmapFD(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	m := &Mem{Ptr: ptr, Size: size, Dev: dev, fd: fd}
	if failAt == 2 {
		return nil, errors.Join(fault(), hostProvider{}.Release(m))
	}
	return m, nil
}

func (p hostProvider) Export(m *Mem) (int, error) {
	failAt := p.faults.Pick(2) // 0: at once; 1: after the dup
	if failAt == 0 {
		return -1, p.faults.Err(fmt.Sprintf("export of the %d-byte block at %#x", m.Size, m.Ptr))
	}
	fd, err := unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup block descriptor: %w", err)
	}
	if failAt == 1 {
		return -1, errors.Join(p.faults.Err(fmt.Sprintf("export of the %d-byte block at %#x (after the dup)", m.Size, m.Ptr)), unix.Close(fd))
	}
	return fd, nil
}

func (p hostProvider) Import(dev int, fd int, size uint64) (*Mem, error) {
	failAt := p.faults.Pick(2) // 0: at once; 1: after mmap
	fault := func() error {
		return p.faults.Err(fmt.Sprintf("import of %d bytes on device %d%s", size, dev, [...]string{"", " (after mmap)"}[failAt]))
	}
	if failAt == 0 {
		return nil, fault()
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat peer descriptor: %w", err)
	}
	if uint64(st.Size) < size {
		return nil, fmt.Errorf("peer descriptor holds %d bytes, expected %d", st.Size, size)
	}
	ptr, err := mmapFD(fd, size)
	if err != nil {
		return nil, err
	}
	m := &Mem{Ptr: ptr, Size: size, Dev: dev, fd: -1}
	if failAt == 1 {
		return nil, errors.Join(fault(), hostProvider{}.Release(m))
	}
	return m, nil
}

func (hostProvider) Release(m *Mem) error {
	var errs []error
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, m.Ptr, uintptr(m.Size), 0); e != 0 {
		errs = append(errs, fmt.Errorf("munmap %#x: %w", m.Ptr, e))
	}
	if m.fd >= 0 {
		errs = append(errs, unix.Close(m.fd))
		m.fd = -1
	}
	return errors.Join(errs...)
}

func mmapFD(fd int, size uint64) (uintptr, error) {
	ptr, _, e := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED, uintptr(fd), 0)
	if e != 0 {
		return 0, fmt.Errorf("mmap %d bytes: %w", size, e)
	}
	return ptr, nil
}

// slot views the uint32 at addr, inside a live mapping.
func slot(addr uintptr) *atomic.Uint32 {
	return (*atomic.Uint32)(*(*unsafe.Pointer)(unsafe.Pointer(&addr)))
}

// Host memory has no streams: signals are atomics on the shared mapping.
func (hostProvider) PutSignal(_ int, _ uintptr, addr uintptr, timeout time.Duration) error {
	return swapWhen(slot(addr), 0, 1, timeout)
}

func (hostProvider) WaitSignal(_ int, _ uintptr, addr uintptr, timeout time.Duration) error {
	return swapWhen(slot(addr), 1, 0, timeout)
}

// swapWhen waits until the slot holds from and sets it to to, spinning
// briefly, then sleeping in growing steps. timeout <= 0 waits for ever (as a
// stream would).
func swapWhen(s *atomic.Uint32, from, to uint32, timeout time.Duration) error {
	start := time.Now()
	for i := 0; ; i++ {
		if s.CompareAndSwap(from, to) {
			return nil
		}
		if timeout > 0 && time.Since(start) > timeout {
			return ErrSignalTimeout
		}
		switch {
		case i < 100:
			runtime.Gosched()
		default:
			time.Sleep(min(time.Duration(i-99)*time.Microsecond, time.Millisecond))
		}
	}
}
