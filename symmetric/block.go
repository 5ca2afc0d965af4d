package symmetric

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/internal/errs"
	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// SignalPadSize is the size of each block's signal pad: kernels.PadSlots
// (512) uint32 slots, so channels × world size ≤ 512 (PyTorch uses the same
// size).
const SignalPadSize = 4 * kernels.PadSlots

// padChannels is the number of signal-pad channels of a group of world
// ranks: a channel holds one uint32 slot per rank. Block b of a collective
// meets on channel b, so it also caps the collectives' grids.
func padChannels(world int) int { return kernels.PadSlots / world }

// SyncAreaSize is the size of the sync area that follows each block's
// signal pad: kernels.PadSlots (512) uint32 slots of the epoch meetings of
// the block's collectives and barrier (kernels/symm.cu: epoch sync), slot
// channel × world + src written only by rank src. One group per block uses
// it (Handle.epochSync); it is not part of the signal pad users see.
const SyncAreaSize = 4 * kernels.PadSlots

// ErrInvalid marks bad arguments; ErrUnknownPointer a pointer that is not in
// a live block. Both are internal/errs' values, allocator's as well.
var (
	ErrInvalid        = errs.ErrInvalid
	ErrUnknownPointer = errs.ErrUnknownPointer
	// ErrPeerFailed is wrapped by a rendezvous error caused by another rank:
	// it reported a failure, or died.
	ErrPeerFailed = errors.New("peer failed")
)

// Block is one symmetric allocation: buffer then signal pad.
type Block struct {
	mem     *Mem
	bufSize uint64 // bytes the caller asked for
	padOff  uint64 // offset of the signal pad

	// Lock order: life, then mu. life is read-held by every call on a
	// handle of the block (signals, handle info: Handle.Acquire) and
	// write-held by Free while it unmaps, so a handle is never used while
	// its memory goes away; mu guards the fields below.
	life     sync.RWMutex
	runlock  func() // life.RUnlock, bound once: Acquire hands it out without allocating
	mu       sync.Mutex
	handles  map[string]*Handle // by group name
	freed    bool
	exportFD int           // the block's exported descriptor, once a rendezvous took it; -1 before
	export   chan exported // the export started at Alloc, until a rendezvous or Free takes it
	// syncOwner is the group whose handle meets through the block's sync
	// area ("" while none does): the first group whose every rank found its
	// own block's area free at the rendezvous.
	syncOwner string
}

// Ptr is the buffer's address; Dev its device; Size the buffer's size.
func (b *Block) Ptr() uintptr    { return b.mem.Ptr }
func (b *Block) Dev() int        { return b.mem.Dev }
func (b *Block) Size() uint64    { return b.bufSize }
func (b *Block) PadPtr() uintptr { return b.mem.Ptr + uintptr(b.padOff) }

// freedLocked is Freed for a caller holding life (which Free write-holds
// while it sets freed).
func (b *Block) freedLocked() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.freed
}

// Freed reports whether the block was freed (its handles are dead).
func (b *Block) Freed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.freed
}

// Manager owns the blocks of one process and the provider that backs them.
type Manager struct {
	prov Provider
	cfg  Config

	mu     sync.RWMutex
	blocks []*Block         // sorted by address, disjoint: interval lookup by binary search
	seq    map[seqKey]int64 // handshakes numbered per group and kind (nextSeq)
	links  map[string]*link // by group name (link.go)

	dog  watchdog    // background watch of queued signals (watchdog.go)
	kern kernelState // kernels compiled at run time (kernelsig.go)

	// usage is what Usage reports, changed where blocks, handles and peer
	// mappings come and go (Alloc, Free, Rendezvous). usageMu is a leaf
	// lock held for nothing else, so that Usage (the statistics page, every
	// 250 ms) never waits for a block's lock, which a rendezvous holds for
	// its whole handshake (up to Config.Timeout).
	usageMu sync.Mutex
	usage   Usage
}

// NewManager returns a manager over prov.
func NewManager(prov Provider, cfg Config) *Manager {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Manager{prov: prov, cfg: cfg, seq: map[seqKey]int64{}}
}

// Provider returns the manager's provider.
func (m *Manager) Provider() Provider { return m.prov }

// Config returns the settings the manager runs with.
func (m *Manager) Config() Config { return m.cfg }

// Alloc makes a block with a buffer of size bytes on dev.
func (m *Manager) Alloc(dev int, size uint64) (*Block, error) {
	if err := m.checkDevice(dev, size); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, fmt.Errorf("%w: symmetric allocation of 0 bytes", ErrInvalid)
	}
	g, err := m.prov.Granularity(dev)
	if err != nil {
		return nil, err
	}
	padOff := (size + 15) &^ 15
	total := (padOff + SignalPadSize + SyncAreaSize + g - 1) / g * g
	if total < size {
		return nil, fmt.Errorf("%w: symmetric allocation of %d bytes overflows", ErrInvalid, size)
	}
	mem, err := m.prov.Create(dev, total)
	if err != nil {
		return nil, fmt.Errorf("symmetric allocation of %d bytes on %s device %d: %w", size, m.prov.Name(), dev, err)
	}
	b := &Block{mem: mem, bufSize: size, padOff: padOff, handles: map[string]*Handle{}, exportFD: -1}
	b.runlock = b.life.RUnlock
	if err := m.zeroPad(b); err != nil {
		m.prov.Release(mem)
		return nil, err
	}
	if _, early := m.prov.(EarlyExporter); early {
		m.startExport(b) // every symmetric block is made to be joined
	}
	m.mu.Lock()
	i := sort.Search(len(m.blocks), func(i int) bool { return m.blocks[i].mem.Ptr > mem.Ptr })
	m.blocks = append(m.blocks, nil)
	copy(m.blocks[i+1:], m.blocks[i:])
	m.blocks[i] = b
	m.mu.Unlock()
	m.count(1, Usage{Blocks: 1, Bytes: size})
	return b, nil
}

// checkDevice refuses a device (and a block of size bytes on it) that a
// provider whose devices are labels does not have (LabelDevices); a driver
// checks the others' devices.
func (m *Manager) checkDevice(dev int, size uint64) error {
	if l, ok := m.prov.(LabelDevices); ok {
		return l.CheckDevice(dev, size)
	}
	return nil
}

// Find returns the live block holding ptr (its start or any byte inside,
// signal pad included) and ptr's offset in it, in O(log n).
func (m *Manager) Find(ptr uintptr) (*Block, uint64, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.blocks), func(i int) bool { return m.blocks[i].mem.Ptr > ptr }) - 1
	if i >= 0 {
		b := m.blocks[i]
		if ptr < b.mem.Ptr+uintptr(b.mem.Size) {
			return b, uint64(ptr - b.mem.Ptr), nil
		}
	}
	return nil, 0, fmt.Errorf("%w: %#x is not inside a live symmetric block", ErrUnknownPointer, ptr)
}

// Free releases the block that starts at ptr: every peer mapping of every
// handle, the handles' device arrays, and the block's memory.
func (m *Manager) Free(ptr uintptr) error {
	m.mu.Lock()
	i := sort.Search(len(m.blocks), func(i int) bool { return m.blocks[i].mem.Ptr >= ptr })
	if i == len(m.blocks) || m.blocks[i].mem.Ptr != ptr {
		m.mu.Unlock()
		return fmt.Errorf("%w: symm_free of %#x: not the start of a live symmetric block (already freed?)", ErrUnknownPointer, ptr)
	}
	b := m.blocks[i]
	m.blocks = append(m.blocks[:i], m.blocks[i+1:]...)
	m.mu.Unlock()

	b.life.Lock() // waits for the calls on its handles to return
	defer b.life.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freed = true
	gone := Usage{Blocks: 1, Bytes: b.bufSize}
	var errs []error
	for _, h := range b.handles {
		u := h.usage()
		gone.Handles += u.Handles
		gone.PeerMappings += u.PeerMappings
		errs = append(errs, h.release())
	}
	m.count(-1, gone)
	b.handles = nil
	if b.export != nil {
		if e := <-b.export; e.err == nil {
			errs = append(errs, unix.Close(e.fd))
		}
		b.export = nil
	}
	if b.exportFD >= 0 {
		errs = append(errs, unix.Close(b.exportFD))
		b.exportFD = -1
	}
	errs = append(errs, m.prov.Release(b.mem))
	return errors.Join(errs...)
}

// Live is the number of live blocks.
func (m *Manager) Live() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.blocks)
}

// zeroPad clears a new block's signal pad and sync area: slots start at 0.
func (m *Manager) zeroPad(b *Block) error {
	// memfd memory starts zeroed; device memory from cuMemCreate is not
	// promised to, so providers that need it implement Zero.
	if z, ok := m.prov.(Zeroer); ok {
		return z.Zero(b.mem.Dev, b.PadPtr(), SignalPadSize+SyncAreaSize)
	}
	return nil
}

// ProviderName is the name of the backend blocks come from ("cuda", "nvshmem", "nccl", "host").
func (m *Manager) ProviderName() string { return m.prov.Name() }

// Bootstrap joins the provider's world when it has one (NVSHMEM: every rank
// calls it once before allocating); for the others it only checks its
// arguments.
func (m *Manager) Bootstrap(st store.Store, rank, world, dev int) error {
	if err := m.checkDevice(dev, 0); err != nil {
		return err
	}
	if world < 1 || rank < 0 || rank >= world || st == nil {
		return fmt.Errorf("%w: backend init needs 0 <= rank < world and a store (rank %d, world %d)", ErrInvalid, rank, world)
	}
	if b, ok := m.prov.(Bootstrapper); ok {
		return b.Bootstrap(st, rank, world, dev, m.cfg.Timeout)
	}
	return nil
}

// Usage is what a Manager holds now: its live blocks and their bytes (as
// asked), the handles made by rendezvous, and the peers' blocks those map.
type Usage struct {
	Blocks, Handles, PeerMappings int
	Bytes                         uint64
}

// Usage reports the Manager's live blocks, handles and peer mappings. It
// waits for no block: a block being freed counts until its handles are
// released, a rendezvous under way counts once its handle is made.
func (m *Manager) Usage() Usage {
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	return m.usage
}

// count adds sign (1 or -1) times u to the usage figures.
func (m *Manager) count(sign int, u Usage) {
	m.usageMu.Lock()
	defer m.usageMu.Unlock()
	m.usage.Blocks += sign * u.Blocks
	m.usage.Handles += sign * u.Handles
	m.usage.PeerMappings += sign * u.PeerMappings
	if sign > 0 {
		m.usage.Bytes += u.Bytes
	} else {
		m.usage.Bytes -= u.Bytes
	}
}

// usage is what handle h adds to its Manager's usage: itself and the
// peers' blocks it maps. Its peers change only before the rendezvous hands
// it out and in release, under its block's lock (held by the caller).
func (h *Handle) usage() Usage {
	u := Usage{Handles: 1}
	for _, p := range h.peers {
		if p != nil {
			u.PeerMappings++
		}
	}
	return u
}
