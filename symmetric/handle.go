package symmetric

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/store"
)

// Handle is one block joined with one group: the peers' blocks mapped
// here, the arrays of their pointers, and the state of its signals. It is
// made by a rendezvous (rendezvous.go) and lives until its block is freed
// (release, under the block's locks); every call that uses its mappings
// holds Acquire's hold meanwhile.
type Handle struct {
	m     *Manager
	b     *Block
	group string
	rank  int
	world int
	peers []*Mem // peers[j] maps rank j's block; nil for our own

	// store and metas are the group's store and every rank's metadata from
	// the rendezvous: the later steps the group takes together
	// (ResetSignalPad) meet through the group's link (link.go), found by
	// them.
	store store.Store
	metas []meta

	// arrays: world buffer pointers then world signal-pad pointers, in host
	// memory outside Go's heap (C callers keep these pointers) and, for
	// devices, in device memory; then the push all-reduce's state
	// (pushStateWords, zero: push.go) and the epoch meetings' counts per
	// channel (epochWords, zero), which only this rank uses.
	hostArr, devArr uintptr
	hostSize        uint64
	freeDev         func() error
	newDev          chan deviceArray // startArrays' allocation, until taken

	importTime atomic.Int64 // ns spent importing and mapping peers (trace)
	unregister func() error // undoes Registrar.Register (NCCL window)

	// asyncErr is the handle's first asynchronous failure: a signal the
	// watchdog saw time out (watchdog.go) or a kernel's report
	// (kernelsig.go). Once set, every signal call on the handle fails with it.
	asyncErr atomic.Pointer[error]

	// sig is the handle's signal path (signals.go): nil until its first
	// signal chooses one, then never changed, so that the calls of one
	// handle never mix kernels and stream memory operations on its pads.
	sig atomic.Pointer[signaler]

	kstat kernelStatus // its kernels' function handles and status word (kernelsig.go)

	plan planState // its launch plan for C callers (plan.go)

	push pushSetUp // the push all-reduce's workspace set-up (push.go)

	// epochSync: the handle's group owns its block's sync area (every rank's
	// block agreed at the rendezvous), so its kernels meet through it.
	epochSync bool
	// resetOnGPU: ResetSignalPad agrees by kernel barriers (resetOnDevice),
	// not through the store; decided at the rendezvous from every rank's
	// metadata (the group meets through the sync area and the kernels run
	// on every rank's device), so every rank takes the same way.
	resetOnGPU bool
	// maxBlocks caps the blocks of the collectives that meet their peers:
	// the smallest Config.CollectiveBlocks of the group's ranks (block b
	// meets block b of every peer, so every rank must launch the same grid).
	maxBlocks uint32
}

// epochWords is the size, in 8-byte words, of a handle's epoch counts: one
// uint32 per channel, SignalPadSize/4 channels at most (world 1).
const epochWords = SignalPadSize / 4 / 2

// epochsArg is the kernels' epochs argument: the handle's counts in device
// memory when it owns its block's sync area, else 0 (meet through the signal
// pad).
func (h *Handle) epochsArg() uintptr {
	if !h.epochSync {
		return 0
	}
	return h.devArr + uintptr(8*(2*h.world+pushStateWords))
}

// Acquire keeps the handle's block from being freed until release is
// called, and fails (ErrUnknownPointer) if it was freed already. Every call
// that touches the handle's mappings or arrays holds it; a free waits for
// such calls to return.
func (h *Handle) Acquire() (release func(), err error) {
	h.b.life.RLock()
	if h.b.freedLocked() {
		h.b.life.RUnlock()
		return nil, fmt.Errorf("%w: a handle of group %q whose block %#x was freed", ErrUnknownPointer, h.group, h.b.Ptr())
	}
	if testHookAcquired != nil {
		testHookAcquired()
	}
	return h.b.runlock, nil
}

// testHookAcquired, set only by tests, runs inside Acquire's hold: it widens
// the window in which a free racing the call would unmap what it uses.
var testHookAcquired func()

func (h *Handle) Rank() int          { return h.rank }
func (h *Handle) World() int         { return h.world }
func (h *Handle) BufferSize() uint64 { return h.b.bufSize }
func (h *Handle) Block() *Block      { return h.b }

// BufferPtr is rank r's buffer as mapped here; PadPtr its signal pad.
func (h *Handle) BufferPtr(r int) uintptr {
	if r == h.rank {
		return h.b.Ptr()
	}
	return h.peers[r].Ptr
}
func (h *Handle) PadPtr(r int) uintptr { return h.BufferPtr(r) + uintptr(h.b.padOff) }

// BufferPtrsHost and PadPtrsHost are arrays of world pointers in host memory.
func (h *Handle) BufferPtrsHost() uintptr { return h.hostArr }
func (h *Handle) PadPtrsHost() uintptr    { return h.hostArr + uintptr(8*h.world) }

// BufferPtrsDev and PadPtrsDev are the same arrays in device memory.
func (h *Handle) BufferPtrsDev() uintptr { return h.devArr }
func (h *Handle) PadPtrsDev() uintptr    { return h.devArr + uintptr(8*h.world) }

// DeviceArrays is implemented by providers whose devices cannot read host
// memory: NewDeviceArray makes device memory for words uint64 values,
// FillDeviceArray copies vals into it.
type DeviceArrays interface {
	NewDeviceArray(dev, words int) (ptr uintptr, free func() error, err error)
	FillDeviceArray(dev int, ptr uintptr, vals []uint64) error
}

// deviceArray is the outcome of NewDeviceArray.
type deviceArray struct {
	ptr  uintptr
	free func() error
	err  error
}

// arrayWords is the length of a handle's pointer arrays and state.
func (h *Handle) arrayWords() int { return 2*h.world + pushStateWords + epochWords }

// startArrays makes the handle's device arrays in the background, while
// the rendezvous exchanges its notes (the driver's allocation takes tens of
// microseconds); buildArrays or release takes the outcome.
func (h *Handle) startArrays() {
	da, ok := h.m.prov.(DeviceArrays)
	if !ok {
		return
	}
	h.newDev = make(chan deviceArray, 1)
	go func() {
		var a deviceArray
		a.ptr, a.free, a.err = da.NewDeviceArray(h.b.Dev(), h.arrayWords())
		h.newDev <- a
	}()
}

// takeDeviceArray waits for startArrays' outcome and makes the handle own
// the memory (freeDev), or returns why there is none.
func (h *Handle) takeDeviceArray() (uintptr, error) {
	if h.newDev == nil {
		return 0, fmt.Errorf("device pointer arrays: none started")
	}
	a := <-h.newDev
	h.newDev = nil
	if a.err != nil {
		return 0, fmt.Errorf("device pointer arrays: %w", a.err)
	}
	h.freeDev = a.free
	return a.ptr, nil
}

func (h *Handle) buildArrays() error {
	vals := make([]uint64, h.arrayWords())
	for r := 0; r < h.world; r++ {
		vals[r] = uint64(h.BufferPtr(r))
		vals[h.world+r] = uint64(h.PadPtr(r))
	}
	size := uint64(len(vals) * 8)
	p, _, e := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0), 0)
	if e != 0 {
		return fmt.Errorf("mapping the pointer arrays: %w", e)
	}
	h.hostArr, h.hostSize = p, size
	copy(unsafe.Slice((*uint64)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), len(vals)), vals)
	h.devArr = h.hostArr
	if da, ok := h.m.prov.(DeviceArrays); ok {
		ptr, err := h.takeDeviceArray()
		if err != nil {
			return err
		}
		if err := da.FillDeviceArray(h.b.Dev(), ptr, vals); err != nil {
			return fmt.Errorf("device pointer arrays: %w", err)
		}
		h.devArr = ptr
	}
	return nil
}

// release unmaps every peer and frees the arrays. Called with b.mu held.
func (h *Handle) release() error {
	// First: no C caller may launch on what goes below.
	h.retirePlan()
	var errs []error
	if h.unregister != nil {
		errs = append(errs, h.unregister())
		h.unregister = nil
	}
	for j, p := range h.peers {
		if p != nil {
			errs = append(errs, h.m.prov.Release(p))
			h.peers[j] = nil
		}
	}
	errs = append(errs, h.freeStatus())
	if h.newDev != nil { // a failed rendezvous: the arrays were never built
		if _, err := h.takeDeviceArray(); err == nil {
			errs = append(errs, h.freeDev())
		}
		h.freeDev = nil
	}
	if h.freeDev != nil {
		errs = append(errs, h.freeDev())
		h.freeDev = nil
	}
	if h.hostArr != 0 {
		if _, _, e := unix.Syscall(unix.SYS_MUNMAP, h.hostArr, uintptr(h.hostSize), 0); e != 0 {
			errs = append(errs, e)
		}
		h.hostArr, h.devArr = 0, 0
	}
	return errors.Join(errs...)
}
