package symmetric

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/topology"
)

// cudaProvider makes blocks with the driver's virtual memory management:
// physical memory from cuMemCreate, exportable as a POSIX file descriptor,
// mapped with cuMemAddressReserve + cuMemMap + cuMemSetAccess, as PyTorch's
// CUDASymmetricMemory does. Signals are stream memory operations.
type cudaProvider struct {
	arrays *cuda.Backend // device memory for the pointer arrays
	drv    streamDriver  // stream memory operations and events

	evMu   sync.Mutex
	events map[int][]uintptr // idle watchdog markers per device
}

// NewCUDAProvider loads the driver and checks that it has the VMM API.
func NewCUDAProvider() (Provider, error) {
	b, err := cuda.NewBackend()
	if err != nil {
		return nil, err
	}
	if err := cuda.VMMAvailable(); err != nil {
		return nil, fmt.Errorf("symmetric memory needs the CUDA virtual memory API: %w", err)
	}
	return &cudaProvider{arrays: b, drv: cudaDriver{}}, nil
}

func (p *cudaProvider) Name() string { return "cuda" }

// DeviceID is dev's PCI bus id: ranks with different CUDA_VISIBLE_DEVICES
// still name a device the same way.
func (p *cudaProvider) DeviceID(dev int) (string, error) { return topology.BusID(dev) }

func (p *cudaProvider) CanMap(a, b string) error { return topology.CheckPeerAccess(a, b) }

func (p *cudaProvider) Granularity(dev int) (uint64, error) {
	_, rec, err := cuda.Granularity(dev)
	return rec, err
}

func (p *cudaProvider) Create(dev int, size uint64) (*Mem, error) {
	h, err := cuda.MemCreate(dev, size)
	return mapHandle(dev, h, size, err)
}

// ExportEarly: cuMemExportToShareableHandle is slow (EarlyExporter).
func (p *cudaProvider) ExportEarly() {}

func (p *cudaProvider) Export(m *Mem) (int, error) { return cuda.ExportFD(m.Dev, m.handle) }

func (p *cudaProvider) Import(dev int, fd int, size uint64) (*Mem, error) {
	h, err := cuda.ImportFD(dev, fd)
	return mapHandle(dev, h, size, err)
}

// mapHandle maps physical memory handle h (made or imported, unless err) into
// a new address range that device dev may read and write; on failure the
// handle is released, so nothing is left behind.
func mapHandle(dev int, h, size uint64, err error) (*Mem, error) {
	if err != nil {
		return nil, err
	}
	ptr, err := cuda.MapNew(dev, h, size, []int{dev})
	if err != nil {
		cuda.MemRelease(dev, h)
		return nil, err
	}
	return &Mem{Ptr: ptr, Size: size, Dev: dev, handle: h, fd: -1}, nil
}

func (p *cudaProvider) Release(m *Mem) error {
	if err := cuda.UnmapFree(m.Dev, m.Ptr, m.Size); err != nil {
		return err
	}
	return cuda.MemRelease(m.Dev, m.handle)
}

// Zero clears a new block's signal pad (cuMemCreate memory is not zeroed).
func (p *cudaProvider) Zero(dev int, ptr uintptr, n uint64) error { return cuda.Memset(dev, ptr, 0, n) }

// Quiesce waits for every stream of dev (Quiescer).
func (p *cudaProvider) Quiesce(dev int) error { return cuda.Synchronize(dev) }

// PutSignal: wait for the peer to have consumed the slot, then set it. Only
// this rank writes 1 there and only the peer writes 0, so the two stream
// operations need no atomicity between them. Signals are stream operations
// (a streamMarker): the call only queues them, whatever the timeout; a
// timed call is waited for by the handle (Handle.streamSignal).
func (p *cudaProvider) PutSignal(dev int, stream, addr uintptr, _ time.Duration) error {
	if err := p.drv.StreamWaitValue32(dev, stream, addr, 0, cuda.WaitValueEQ); err != nil {
		return err
	}
	return p.drv.StreamWriteValue32(dev, stream, addr, 1)
}

// WaitSignal enqueues wait-for-1 then reset-to-0. The stream, not the host,
// waits (a queued stream wait cannot be withdrawn: the stream stays blocked
// until the peer signals). It only queues them, as PutSignal does.
func (p *cudaProvider) WaitSignal(dev int, stream, addr uintptr, _ time.Duration) error {
	if err := p.drv.StreamWaitValue32(dev, stream, addr, 1, cuda.WaitValueEQ); err != nil {
		return err
	}
	return p.drv.StreamWriteValue32(dev, stream, addr, 0)
}

// NewDeviceArray makes device memory for words values, for kernels
// (DeviceArrays).
func (p *cudaProvider) NewDeviceArray(dev, words int) (uintptr, func() error, error) {
	alloc := (uint64(words*8) + 511) &^ 511
	ptr, err := p.arrays.Alloc(dev, alloc)
	if err != nil {
		return 0, nil, err
	}
	return ptr, func() error { return p.arrays.Free(dev, ptr, alloc) }, nil
}

// FillDeviceArray copies vals into the array at ptr (DeviceArrays).
func (p *cudaProvider) FillDeviceArray(dev int, ptr uintptr, vals []uint64) error {
	buf := make([]byte, len(vals)*8)
	for i, v := range vals {
		binary.LittleEndian.PutUint64(buf[8*i:], v)
	}
	return cuda.MemcpyHtoD(dev, ptr, buf)
}

// Mark records an event after the work queued on stream (streamMarker).
func (p *cudaProvider) Mark(dev int, stream uintptr) (uintptr, error) {
	p.evMu.Lock()
	var ev uintptr
	if n := len(p.events[dev]); n > 0 {
		ev = p.events[dev][n-1]
		p.events[dev] = p.events[dev][:n-1]
	}
	p.evMu.Unlock()
	if ev == 0 {
		var err error
		if ev, err = p.drv.EventCreate(dev); err != nil {
			return 0, err
		}
	}
	if err := p.drv.EventRecord(dev, ev, stream); err != nil {
		p.drv.EventDestroy(dev, ev)
		return 0, err
	}
	return ev, nil
}

// Passed reports whether the stream has run past marker.
func (p *cudaProvider) Passed(dev int, marker uintptr) (bool, error) {
	return p.drv.EventQuery(dev, marker)
}

// Forget returns a passed marker to the idle events. One whose stream is
// still blocked is destroyed instead (its record completes on its own), so
// that a reused event never reports another stream's progress.
func (p *cudaProvider) Forget(dev int, marker uintptr, passed bool) {
	if !passed {
		p.drv.EventDestroy(dev, marker)
		return
	}
	p.evMu.Lock()
	if p.events == nil {
		p.events = map[int][]uintptr{}
	}
	p.events[dev] = append(p.events[dev], marker)
	p.evMu.Unlock()
}

// streamDriver is what cudaProvider's signals and markers ask of the
// driver: stream memory operations and events. cudaDriver is the CUDA
// driver; the tests give a simulated device (kernelwait_test.go).
type streamDriver interface {
	StreamWaitValue32(dev int, stream, addr uintptr, value, flags uint32) error
	StreamWriteValue32(dev int, stream, addr uintptr, value uint32) error
	EventCreate(dev int) (uintptr, error)
	EventRecord(dev int, ev, stream uintptr) error
	EventQuery(dev int, ev uintptr) (bool, error)
	EventDestroy(dev int, ev uintptr) error
}

type cudaDriver struct{}

func (cudaDriver) StreamWaitValue32(dev int, stream, addr uintptr, value, flags uint32) error {
	return cuda.StreamWaitValue32(dev, stream, addr, value, flags)
}

func (cudaDriver) StreamWriteValue32(dev int, stream, addr uintptr, value uint32) error {
	return cuda.StreamWriteValue32(dev, stream, addr, value)
}

func (cudaDriver) StreamQuery(dev int, stream uintptr) (bool, error) {
	return cuda.StreamQuery(dev, stream)
}
func (cudaDriver) EventCreate(dev int) (uintptr, error) { return cuda.EventCreate(dev) }
func (cudaDriver) EventRecord(dev int, ev, stream uintptr) error {
	return cuda.EventRecord(dev, ev, stream)
}
func (cudaDriver) EventQuery(dev int, ev uintptr) (bool, error) { return cuda.EventQuery(dev, ev) }
func (cudaDriver) EventDestroy(dev int, ev uintptr) error       { return cuda.EventDestroy(dev, ev) }
