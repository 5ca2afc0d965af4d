package main

/*
#include <stdint.h>
#include "../include/symm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/store"
	"github.com/libsymm/libsymm/symmetric"
)

// Symmetric memory: the manager is made on first use, over the provider of
// the backend symm_set_backend chose, else SYMM_BACKEND, else SYMM_DEVICE's
// (symmetric.ConfigFromEnv reads every setting).
var symmLib struct {
	mu      sync.Mutex
	mgr     *symmetric.Manager
	backend string // set by symm_set_backend before the manager exists
}

// symmEnv is the environment symmetric memory reads: the C environment,
// with symm_set_backend's choice as SYMM_BACKEND. Called under symmLib.mu.
func symmEnv() func(string) string {
	if chosen := symmLib.backend; chosen != "" {
		return func(k string) string {
			if k == settings.Backend.Name {
				return chosen
			}
			return getenv(k)
		}
	}
	return getenv
}

// madeManager is the symmetric manager if one was made, else nil (no
// backend is opened for the asking).
func madeManager() *symmetric.Manager {
	symmLib.mu.Lock()
	defer symmLib.mu.Unlock()
	return symmLib.mgr
}

func getManager() (*symmetric.Manager, error) {
	symmLib.mu.Lock()
	defer symmLib.mu.Unlock()
	if symmLib.mgr != nil {
		return symmLib.mgr, nil
	}
	cfg, err := symmetric.ConfigFromEnv(symmEnv())
	if err != nil {
		return nil, err
	}
	cfg.HostLimits = hostLimits
	prov, err := symmetric.NewProvider(cfg)
	if err != nil {
		return nil, err
	}
	symmLib.mgr = symmetric.NewManager(prov, cfg)
	return symmLib.mgr, nil
}

// ---- handle tables -----------------------------------------------------------

// table maps small integers to objects for C. Numbers start far from 0 so a
// stray 0 or 1 is caught, and are never reused.
type table[T any] struct {
	mu   sync.Mutex
	next int64
	m    map[int64]T
	kind string
}

func newTable[T any](kind string, base int64) *table[T] {
	return &table[T]{next: base, m: map[int64]T{}, kind: kind}
}

func (t *table[T]) put(v T) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.m[t.next] = v
	return t.next
}

func (t *table[T]) get(id int64) (T, error) { return t.lookup(id, false) }

// take removes id from the table and returns its object.
func (t *table[T]) take(id int64) (T, error) { return t.lookup(id, true) }

func (t *table[T]) lookup(id int64, remove bool) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[id]
	if !ok {
		var zero T
		return zero, fmt.Errorf("%w: %d is not a live %s handle", symmetric.ErrInvalid, id, t.kind)
	}
	if remove {
		delete(t.m, id)
	}
	return v, nil
}

func (t *table[T]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// storeEntry is a client or a server (a server also serves as a store: an
// in-process client of itself).
type storeEntry struct {
	s      store.Store
	server *store.Server
}

var (
	stores  = newTable[*storeEntry]("store", 0x5170_0000)
	handles = newTable[*symmetric.Handle]("symmetric-memory", 0x5180_0000)
)

// failStore is fail for the store calls. The store marks only a timeout
// and a closed store; what else it returns refuses the caller's arguments (an
// address that does not parse or cannot be listened on, a wrong or too long
// token, a key too long or not UTF-8, a value too large, an add to a value
// that is not an int64 or past its range): SYMM_ERR_INVALID, not
// SYMM_ERR_INTERNAL, which says libsymm has a bug. A connect that found no
// server listening by its timeout is SYMM_ERR_TIMEOUT.
func failStore(fn string, err error) C.int {
	code := errCode(err)
	if code == C.SYMM_ERR_INTERNAL {
		var ae *net.AddrError
		var oe *net.OpError
		switch {
		case errors.As(err, &ae):
			code = C.SYMM_ERR_INVALID
		case errors.As(err, &oe) && oe.Op == "dial":
			code = C.SYMM_ERR_TIMEOUT
		default:
			code = C.SYMM_ERR_INVALID
		}
	}
	setError(code, fn+": "+err.Error())
	return code
}

// cBytes is the C buffer p of capacity n as a Go slice, without copying, cut
// to the most bytes the caller will write: a capacity beyond what an int
// holds (SIZE_MAX from C) would make unsafe.Slice panic, and no more than
// most bytes are ever touched.
func cBytes(p unsafe.Pointer, n C.size_t, most int) []byte {
	if uint64(n) > uint64(most) {
		n = C.size_t(most)
	}
	return unsafe.Slice((*byte)(p), int(n))
}

// hostLimits is the host backend's Config.HostLimits: a symmetric block's
// device is one of the host pool's (SYMM_HOST_DEVICES) and it fits in one
// (SYMM_HOST_MEMORY), as the pool's segments must (the provider maps a
// sparse memfd, which would otherwise take any device label and any size).
func hostLimits(dev int, size uint64) error {
	p, err := getPool()
	if err != nil {
		return err
	}
	if dev < 0 || dev >= p.DeviceCount() {
		return fmt.Errorf("%w: device %d out of range [0, %d)", symmetric.ErrInvalid, dev, p.DeviceCount())
	}
	if _, total, err := p.Backend().MemInfo(dev); err == nil && size > total {
		return fmt.Errorf("%w: symmetric allocation of %d bytes on host device %d: larger than the device (%d bytes, SYMM_HOST_MEMORY)",
			allocator.ErrOutOfMemory, size, dev, total)
	}
	return nil
}

func guard(fn string, code *C.int) {
	if recovered(fn, recover()) {
		*code = C.SYMM_ERR_INTERNAL
	}
}

func ms(t C.int) time.Duration { return time.Duration(t) * time.Millisecond }

// ---- allocation ------------------------------------------------------------

//export goSymmAlloc
func goSymmAlloc(size C.size_t, device C.int) (ptr C.uintptr_t) {
	defer func() {
		if recovered("symm_alloc", recover()) {
			ptr = 0
		}
	}()
	m, err := getManager()
	if err != nil {
		fail("symm_alloc", err)
		return 0
	}
	b, err := m.Alloc(int(device), uint64(size))
	if err != nil {
		fail("symm_alloc", err)
		return 0
	}
	return C.uintptr_t(b.Ptr())
}

//export goSymmFree
func goSymmFree(ptr C.uintptr_t) {
	defer func() { recovered("symm_free", recover()) }()
	m, err := getManager()
	if err == nil {
		err = m.Free(uintptr(ptr))
	}
	if err != nil {
		fail("symm_free", err)
	}
	dropFreedHandles()
}

// dropFreedHandles removes the C handles of freed blocks from the tables, so
// a long-running program that allocates and rendezvouses in a loop keeps no
// entries for dead handles (their numbers stay invalid: never reused).
func dropFreedHandles() {
	handleIDs.Range(func(k, v any) bool {
		if h := k.(*symmetric.Handle); h.Block().Freed() {
			handles.take(v.(int64))
			handleIDs.Delete(k)
		}
		return true
	})
}

// ---- rendezvous and signals ---------------------------------------------------

//export goRendezvous
func goRendezvous(ptr C.uintptr_t, s C.int64_t, group *C.char, rank, world C.int, out *C.int64_t) (code C.int) {
	defer guard("symm_rendezvous", &code)
	m, err := getManager()
	if err != nil {
		return fail("symm_rendezvous", err)
	}
	e, err := stores.get(int64(s))
	if err != nil {
		return fail("symm_rendezvous", err)
	}
	h, err := m.Rendezvous(uintptr(ptr), symmetric.Group{Name: C.GoString(group), Rank: int(rank), World: int(world), Store: e.s})
	if err != nil {
		return fail("symm_rendezvous", err)
	}
	*out = C.int64_t(handleID(h))
	return C.SYMM_OK
}

// handleIDs gives one C handle per Handle, so a repeated rendezvous returns
// the same number.
var handleIDs sync.Map // *symmetric.Handle -> int64

func handleID(h *symmetric.Handle) int64 {
	if id, ok := handleIDs.Load(h); ok {
		return id.(int64)
	}
	id := handles.put(h)
	if prev, loaded := handleIDs.LoadOrStore(h, id); loaded {
		handles.take(id)
		return prev.(int64)
	}
	return id
}

//export goHandleInfo
func goHandleInfo(hid C.int64_t, out *C.symm_handle_info_t) (code C.int) {
	defer guard("symm_handle_info", &code)
	h, err := handles.get(int64(hid))
	if err != nil {
		return fail("symm_handle_info", err)
	}
	release, err := h.Acquire() // the arrays stay mapped while they are copied out
	if err != nil {
		return fail("symm_handle_info", fmt.Errorf("handle %d: %w", int64(hid), err))
	}
	defer release()
	out.rank = C.int(h.Rank())
	out.world_size = C.int(h.World())
	out.buffer_size = C.size_t(h.BufferSize())
	out.buffer_ptrs = C.uintptr_t(h.BufferPtrsHost())
	out.signal_pad_ptrs = C.uintptr_t(h.PadPtrsHost())
	out.buffer_ptrs_dev = C.uintptr_t(h.BufferPtrsDev())
	out.signal_pad_ptrs_dev = C.uintptr_t(h.PadPtrsDev())
	out.signal_pad_size = C.size_t(symmetric.SignalPadSize)
	return C.SYMM_OK
}

func liveHandle(fn string, hid C.int64_t) (*symmetric.Handle, C.int) {
	h, err := handles.get(int64(hid))
	if err == nil && h.Block().Freed() {
		err = fmt.Errorf("%w: handle %d: its block was freed", symmetric.ErrUnknownPointer, int64(hid))
	}
	if err != nil {
		return nil, fail(fn, err)
	}
	return h, C.SYMM_OK
}

//export goPutSignal
func goPutSignal(hid C.int64_t, dst, channel C.int, stream C.uintptr_t) (code C.int) {
	defer guard("symm_put_signal", &code)
	h, code := liveHandle("symm_put_signal", hid)
	if h == nil {
		return code
	}
	if err := h.PutSignal(int(dst), int(channel), uintptr(stream), 0); err != nil {
		return fail("symm_put_signal", err)
	}
	offerPlan(int64(hid), h)
	return C.SYMM_OK
}

//export goWaitSignal
func goWaitSignal(hid C.int64_t, src, channel C.int, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	defer guard("symm_wait_signal", &code)
	h, code := liveHandle("symm_wait_signal", hid)
	if h == nil {
		return code
	}
	if timeoutMS < 0 {
		return fail("symm_wait_signal", fmt.Errorf("%w: timeout_ms %d is negative (0: no timeout)", symmetric.ErrInvalid, int(timeoutMS)))
	}
	if err := h.WaitSignal(int(src), int(channel), uintptr(stream), ms(timeoutMS)); err != nil {
		return fail("symm_wait_signal", err)
	}
	offerPlan(int64(hid), h)
	return C.SYMM_OK
}

//export goBarrier
func goBarrier(hid C.int64_t, channel C.int, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	defer guard("symm_barrier", &code)
	h, code := liveHandle("symm_barrier", hid)
	if h == nil {
		return code
	}
	if timeoutMS < 0 {
		return fail("symm_barrier", fmt.Errorf("%w: timeout_ms %d is negative (0: no timeout)", symmetric.ErrInvalid, int(timeoutMS)))
	}
	if err := h.Barrier(int(channel), uintptr(stream), ms(timeoutMS)); err != nil {
		return fail("symm_barrier", err)
	}
	offerPlan(int64(hid), h)
	return C.SYMM_OK
}

//export goResetSignalPad
func goResetSignalPad(hid C.int64_t, timeoutMS C.int) (code C.int) {
	defer guard("symm_reset_signal_pad", &code)
	h, code := liveHandle("symm_reset_signal_pad", hid)
	if h == nil {
		return code
	}
	if timeoutMS < 0 {
		return fail("symm_reset_signal_pad", fmt.Errorf("%w: timeout_ms %d is negative (0: SYMM_TIMEOUT_MS)", symmetric.ErrInvalid, int(timeoutMS)))
	}
	if err := h.ResetSignalPad(ms(timeoutMS)); err != nil {
		return fail("symm_reset_signal_pad", err)
	}
	return C.SYMM_OK
}

//export goResetSignalPadIfAny
func goResetSignalPadIfAny(hid C.int64_t, want, timeoutMS C.int, reset *C.int) (code C.int) {
	const name = "symm_reset_signal_pad_if_any"
	defer guard(name, &code)
	h, code := liveHandle(name, hid)
	if h == nil {
		return code
	}
	switch {
	case want != 0 && want != 1:
		return fail(name, fmt.Errorf("%w: want %d is neither 0 nor 1", symmetric.ErrInvalid, int(want)))
	case timeoutMS < 0:
		return fail(name, fmt.Errorf("%w: timeout_ms %d is negative (0: SYMM_TIMEOUT_MS)", symmetric.ErrInvalid, int(timeoutMS)))
	}
	did, err := h.ResetSignalPadIfAny(want == 1, ms(timeoutMS))
	if reset != nil {
		*reset = 0
		if did && err == nil {
			*reset = 1
		}
	}
	if err != nil {
		return fail(name, err)
	}
	return C.SYMM_OK
}

//export goKernelsReady
func goKernelsReady(device C.int) (ready C.int) {
	const fn = "symm_kernels_ready"
	var code C.int
	defer guard(fn, &code)
	m, err := getManager()
	if err == nil {
		err = m.KernelsReady(int(device))
	}
	if err != nil {
		fail(fn, err)
		return 0
	}
	return 1
}

// ---- backend choice -----------------------------------------------------------

//export goSetBackend
func goSetBackend(name *C.char) (code C.int) {
	defer guard("symm_set_backend", &code)
	n := C.GoString(name)
	if err := symmetric.CheckBackend(n); err != nil {
		return fail("symm_set_backend", err)
	}
	symmLib.mu.Lock()
	defer symmLib.mu.Unlock()
	if symmLib.mgr != nil {
		if cur := symmLib.mgr.ProviderName(); cur != n {
			return fail("symm_set_backend", fmt.Errorf("%w: symmetric memory already runs on the %s backend (it is chosen once, before the first symmetric allocation or rendezvous)", symmetric.ErrInvalid, cur))
		}
		return C.SYMM_OK
	}
	symmLib.backend = n
	return C.SYMM_OK
}

// goGetBackend writes the backend's name ("cuda", "nvshmem", "nccl",
// "host"): the one in use, else the one that will be used.
//
//export goGetBackend
func goGetBackend(buf *C.char, capacity C.size_t) (code C.int) {
	defer guard("symm_get_backend", &code)
	symmLib.mu.Lock()
	var name string
	var err error
	if symmLib.mgr != nil {
		name = symmLib.mgr.ProviderName()
	} else {
		name, err = symmetric.BackendFromEnv(symmEnv())
	}
	symmLib.mu.Unlock()
	if err != nil {
		return fail("symm_get_backend", err)
	}
	dst := cBytes(unsafe.Pointer(buf), capacity, len(name)+1)
	dst[copy(dst[:len(dst)-1], name)] = 0
	return C.SYMM_OK
}

//export goNVSHMEMAvailable
func goNVSHMEMAvailable() (code C.int) {
	defer guard("symm_nvshmem_available", &code)
	if err := symmetric.IsNVSHMEMAvailable(nil); err != nil {
		fail("symm_nvshmem_available", noDevice{err}) // the backend cannot run here
		return 0
	}
	return 1
}

//export goNCCLAvailable
func goNCCLAvailable() (code C.int) {
	defer guard("symm_nccl_available", &code)
	if err := symmetric.IsNCCLAvailable(nil); err != nil {
		fail("symm_nccl_available", noDevice{err}) // the backend cannot run here
		return 0
	}
	return 1
}

//export goNCCLAdoptComm
func goNCCLAdoptComm(comm C.uintptr_t, device C.int) (code C.int) {
	defer guard("symm_nccl_adopt_comm", &code)
	m, err := getManager()
	if err != nil {
		return fail("symm_nccl_adopt_comm", err)
	}
	if err := m.AdoptNCCLComm(uintptr(comm), int(device)); err != nil {
		return fail("symm_nccl_adopt_comm", err)
	}
	return C.SYMM_OK
}

//export goBackendInit
func goBackendInit(s C.int64_t, rank, world, device C.int) (code C.int) {
	defer guard("symm_backend_init", &code)
	m, err := getManager()
	if err != nil {
		return fail("symm_backend_init", err)
	}
	e, err := stores.get(int64(s))
	if err != nil {
		return fail("symm_backend_init", err)
	}
	if err := m.Bootstrap(e.s, int(rank), int(world), int(device)); err != nil {
		return fail("symm_backend_init", err)
	}
	return C.SYMM_OK
}
