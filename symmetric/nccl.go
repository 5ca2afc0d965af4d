package symmetric

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/nccl"
	"github.com/libsymm/libsymm/store"
)

// ncclProvider serves blocks from ncclMemAlloc (VMM memory exportable as a
// POSIX file descriptor) and registers them as NCCL symmetric windows
// (NCCL_WIN_COLL_SYMMETRIC) on the world communicator when a rendezvous
// covers it, so NCCL's collectives on them take the symmetric-memory paths.
// Peers are mapped through the CUDA backend's descriptor path (the
// allocation's handle retained with cuMemRetainAllocationHandle and
// exported), so peer pointers, signals and pads are the CUDA backend's.
type ncclProvider struct {
	*cudaProvider
	lib *nccl.Lib

	mu          sync.Mutex
	comm        uintptr
	rank, world int
	dev         int // -1 before Bootstrap or Adopt
}

// NewNCCLProvider opens NCCL (2.27 or later) and the CUDA driver.
func NewNCCLProvider(dirs []string) (Provider, error) {
	lib, err := nccl.Open(dirs)
	if err != nil {
		return nil, err
	}
	c, err := NewCUDAProvider()
	if err != nil {
		return nil, err
	}
	return &ncclProvider{cudaProvider: c.(*cudaProvider), lib: lib, dev: -1}, nil
}

func (p *ncclProvider) Name() string { return "nccl" }

// Bootstrap makes the world communicator: rank 0's unique id goes through
// the store, every rank calls ncclCommInitRank on dev. It lives as long as
// the process, as PyTorch's do.
func (p *ncclProvider) Bootstrap(st store.Store, rank, world, dev int, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dev >= 0 {
		if p.rank == rank && p.world == world && p.dev == dev {
			return nil
		}
		return fmt.Errorf("%w: the NCCL communicator is rank %d of %d on device %d, now asked as %d of %d on device %d",
			ErrInvalid, p.rank, p.world, p.dev, rank, world, dev)
	}
	var mine []byte
	if rank == 0 {
		var err error
		if mine, err = p.lib.UniqueID(); err != nil {
			return err
		}
	}
	ids, err := store.AllGather(st, "symm/nccl/uid/", rank, world, mine, timeout)
	if err != nil {
		return fmt.Errorf("NCCL bootstrap: exchanging rank 0's unique id: %w", err)
	}
	var comm uintptr
	if err := onDevice(dev, func() (err error) { comm, err = p.lib.CommInitRank(rank, world, ids[0]); return err }); err != nil {
		return fmt.Errorf("NCCL %s: %w", p.lib.Version(), err)
	}
	p.comm, p.rank, p.world, p.dev = comm, rank, world, dev
	return nil
}

// Adopt uses a communicator the caller made (PyTorch's, for one) with the
// same NCCL library: its rank and size become the world's.
func (p *ncclProvider) Adopt(comm uintptr, dev int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if comm == 0 {
		return fmt.Errorf("%w: NULL NCCL communicator", ErrInvalid)
	}
	if p.dev >= 0 {
		if p.comm == comm {
			return nil
		}
		return fmt.Errorf("%w: the NCCL backend already has a communicator", ErrInvalid)
	}
	rank, world, err := p.lib.CommRankCount(comm)
	if err != nil {
		return fmt.Errorf("adopting NCCL communicator %#x: %w", comm, err)
	}
	p.comm, p.rank, p.world, p.dev = comm, rank, world, dev
	return nil
}

func (p *ncclProvider) ready(dev int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.dev < 0:
		return errors.New("the NCCL backend has no communicator: call symm_backend_init(store, rank, world_size, device) on every rank first (Python: symm.empty does it with the default process group)")
	case dev != p.dev:
		return fmt.Errorf("%w: the NCCL communicator is on device %d; this process cannot allocate on device %d", ErrInvalid, p.dev, dev)
	}
	return nil
}

func (p *ncclProvider) Granularity(dev int) (uint64, error) {
	if err := p.ready(dev); err != nil {
		return 0, err
	}
	return p.cudaProvider.Granularity(dev)
}

func (p *ncclProvider) Create(dev int, size uint64) (*Mem, error) {
	var ptr uintptr
	if err := onDevice(dev, func() (err error) { ptr, err = p.lib.MemAlloc(size); return err }); err != nil {
		return nil, err
	}
	h, err := cuda.RetainAllocationHandle(dev, ptr)
	if err != nil {
		onDevice(dev, func() error { return p.lib.MemFree(ptr) })
		return nil, fmt.Errorf("ncclMemAlloc memory without a VMM handle (NCCL_CUMEM_ENABLE=0?): %w", err)
	}
	return &Mem{Ptr: ptr, Size: size, Dev: dev, handle: h, fd: -1, ncclOwned: true}, nil
}

func (p *ncclProvider) Release(m *Mem) error {
	if !m.ncclOwned {
		return p.cudaProvider.Release(m) // a peer's block, imported
	}
	return errors.Join(cuda.MemRelease(m.Dev, m.handle), onDevice(m.Dev, func() error { return p.lib.MemFree(m.Ptr) }))
}

// Register makes m a symmetric window when the group is the communicator's
// world (windows are collective over the communicator; a subgroup's blocks
// stay plain NCCL memory, still mapped by every member).
func (p *ncclProvider) Register(m *Mem, rank, world int) (func() error, error) {
	p.mu.Lock()
	comm, crank, cworld := p.comm, p.rank, p.world
	p.mu.Unlock()
	if comm == 0 || world != cworld || rank != crank {
		return nil, nil
	}
	var win uintptr
	if err := onDevice(m.Dev, func() (err error) {
		win, err = p.lib.WindowRegister(comm, m.Ptr, m.Size, nccl.WinCollSymmetric)
		return err
	}); err != nil {
		return nil, err
	}
	return func() error {
		return onDevice(m.Dev, func() error { return p.lib.WindowDeregister(comm, win) })
	}, nil
}

// IsNCCLAvailable says whether an NCCL with symmetric windows can be opened
// (nil), or why not. It creates nothing.
func IsNCCLAvailable(dirs []string) error {
	_, err := nccl.Open(dirs)
	return err
}

// AdoptNCCLComm hands the NCCL backend a communicator made by the caller.
func (m *Manager) AdoptNCCLComm(comm uintptr, dev int) error {
	p, ok := m.prov.(*ncclProvider)
	if !ok {
		return fmt.Errorf("%w: the %s backend has no NCCL communicator to adopt (choose the nccl backend first)", ErrInvalid, m.prov.Name())
	}
	return p.Adopt(comm, dev)
}
