package symmetric

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/nvshmem"
	"github.com/libsymm/libsymm/store"
)

// nvshmemProvider serves blocks from NVSHMEM's symmetric heap: Create is
// nvshmem_align (collective: every rank allocates the same sizes in the same
// order, as with PyTorch's NVSHMEM backend), peers are found with
// nvshmem_ptr, Release is nvshmem_free (collective too). Signals, pads and
// the device pointer arrays work as on the CUDA backend (stream memory
// operations on the peer-mapped pads), so every check of the CUDA backend
// holds here.
type nvshmemProvider struct {
	*cudaProvider
	lib *nvshmem.Lib

	mu  sync.Mutex
	dev int // the device NVSHMEM was initialized on; -1 before Bootstrap
}

// NewNVSHMEMProvider opens NVSHMEM (dirs: extra site-packages to look in)
// and the CUDA driver. Nothing is allocated before Bootstrap.
func NewNVSHMEMProvider(dirs []string) (Provider, error) {
	lib, err := nvshmem.Open(dirs)
	if err != nil {
		return nil, err
	}
	c, err := NewCUDAProvider()
	if err != nil {
		return nil, err
	}
	return &nvshmemProvider{cudaProvider: c.(*cudaProvider), lib: lib, dev: -1}, nil
}

func (p *nvshmemProvider) Name() string { return "nvshmem" }

// Version is the NVSHMEM library's version and path, for messages.
func (p *nvshmemProvider) Version() string { return p.lib.Version() + " (" + p.lib.Path() + ")" }

// onDevice runs fn on a locked thread with dev's primary context current:
// NVSHMEM works in the context current at its calls.
func onDevice(dev int, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx, err := cuda.PrimaryContext(dev)
	if err != nil {
		return err
	}
	prev, err := cuda.CurrentContext()
	if err != nil {
		return err
	}
	if err := cuda.SetCurrentContext(ctx); err != nil {
		return err
	}
	defer cuda.SetCurrentContext(prev)
	return fn()
}

// Bootstrap initializes NVSHMEM as PE rank of world on device dev: rank 0
// makes a unique id, the store carries it to every rank.
func (p *nvshmemProvider) Bootstrap(st store.Store, rank, world, dev int, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dev >= 0 {
		if p.lib.MyPE() == rank && p.lib.NPEs() == world && p.dev == dev {
			return nil // again, the same way: nothing to do
		}
		return fmt.Errorf("%w: NVSHMEM was initialized as PE %d of %d on device %d, now asked as %d of %d on device %d",
			ErrInvalid, p.lib.MyPE(), p.lib.NPEs(), p.dev, rank, world, dev)
	}
	if world < 1 || rank < 0 || rank >= world || st == nil {
		return fmt.Errorf("%w: NVSHMEM bootstrap needs 0 <= rank < world and a store (rank %d, world %d)", ErrInvalid, rank, world)
	}
	var mine []byte
	if rank == 0 {
		err := onDevice(dev, func() (err error) { mine, err = p.lib.UniqueID(); return err })
		if err != nil {
			return err
		}
	}
	ids, err := store.AllGather(st, "symm/nvshmem/uid/", rank, world, mine, timeout)
	if err != nil {
		return fmt.Errorf("NVSHMEM bootstrap: exchanging rank 0's unique id: %w", err)
	}
	if err := onDevice(dev, func() error { return p.lib.Init(rank, world, ids[0]) }); err != nil {
		return fmt.Errorf("NVSHMEM %s: %w", p.lib.Version(), err)
	}
	p.dev = dev
	return nil
}

func (p *nvshmemProvider) ready(dev int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.dev < 0:
		return errors.New("the NVSHMEM backend is not initialized: call symm_backend_init(store, rank, world_size, device) on every rank first (Python: symm.empty does it with the default process group)")
	case dev != p.dev:
		return fmt.Errorf("%w: NVSHMEM was initialized on device %d; this process cannot allocate on device %d", ErrInvalid, p.dev, dev)
	}
	return nil
}

// Granularity: the heap takes any size; 4 KiB keeps blocks page-aligned.
func (p *nvshmemProvider) Granularity(dev int) (uint64, error) {
	if err := p.ready(dev); err != nil {
		return 0, err
	}
	return 4096, nil
}

func (p *nvshmemProvider) Create(dev int, size uint64) (*Mem, error) {
	var ptr uintptr
	err := onDevice(dev, func() (err error) { ptr, err = p.lib.Malloc(size, 4096); return err })
	if err != nil {
		return nil, err
	}
	return &Mem{Ptr: ptr, Size: size, Dev: dev, fd: -1}, nil
}

func (p *nvshmemProvider) Release(m *Mem) error {
	if m.view {
		return nil
	}
	return onDevice(m.Dev, func() error { return p.lib.Free(m.Ptr) })
}

func (p *nvshmemProvider) Export(*Mem) (int, error) {
	return -1, errors.New("NVSHMEM blocks are not exported: peers reach them through nvshmem_ptr")
}

func (p *nvshmemProvider) Import(int, int, uint64) (*Mem, error) {
	return nil, errors.New("NVSHMEM blocks are not imported: peers reach them through nvshmem_ptr")
}

func (p *nvshmemProvider) PeerID() (int, error) {
	if err := p.ready(p.dev); err != nil {
		return 0, err
	}
	return p.lib.MyPE(), nil
}

func (p *nvshmemProvider) PeerPtr(m *Mem, pe int) (uintptr, error) {
	var ptr uintptr
	err := onDevice(m.Dev, func() error { ptr = p.lib.Ptr(m.Ptr, pe); return nil })
	if err == nil && ptr == 0 {
		err = fmt.Errorf("nvshmem_ptr gives no address for PE %d: its memory cannot be reached with loads and stores from here (another node, or no peer access)", pe)
	}
	return ptr, err
}

// IsNVSHMEMAvailable says whether NVSHMEM's host library can be opened and
// is a supported version (nil), or why not. It initializes nothing.
func IsNVSHMEMAvailable(dirs []string) error {
	_, err := nvshmem.Open(dirs)
	return err
}
