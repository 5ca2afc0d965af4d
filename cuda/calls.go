package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Driver constants used below (values from cuda.h).
const (
	eventDisableTiming = 0x2 // CU_EVENT_DISABLE_TIMING
	streamNonBlocking  = 0x1 // CU_STREAM_NON_BLOCKING
	streamLegacy       = 0x1 // CU_STREAM_LEGACY, a handle value, not an address
	pointerAttrOrdinal = 9   // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
)

// streamArg turns the stream a caller passes into the one handed to the
// driver. 0 means the legacy default stream everywhere in libsymm (PyTorch
// builds without per-thread default streams, so its default stream is the
// legacy one); it is sent as CU_STREAM_LEGACY so that the meaning does not
// depend on which variant of a function cuGetProcAddress returned.
func streamArg(s uintptr) C.uintptr_t {
	if s == 0 {
		return streamLegacy
	}
	return C.uintptr_t(s)
}

// errorText returns the driver's name and description of r; ok is false
// when the driver does not know the code.
func (d *driver) errorText(r Result) (name, desc string, ok bool) {
	if d.fn[fnGetErrorName] == nil || d.fn[fnGetErrorString] == nil {
		return "", "", false
	}
	n := C.symm_cuGetErrorText(d.fn[fnGetErrorName], C.CUresult(r))
	if n.r != 0 || n.s == nil {
		return "", "", false
	}
	s := C.symm_cuGetErrorText(d.fn[fnGetErrorString], C.CUresult(r))
	if s.r != 0 || s.s == nil {
		return C.GoString(n.s), "", true
	}
	return C.GoString(n.s), C.GoString(s.s), true
}

// ---- devices ----------------------------------------------------------------

// checkDevice reports an error unless dev is a visible device ordinal.
func (d *driver) checkDevice(dev int) error {
	if dev < 0 || dev >= len(d.devs) {
		return fmt.Errorf("cuda: device %d does not exist (%d visible): %w", dev, len(d.devs), ErrorInvalidDevice)
	}
	return nil
}

func (d *driver) deviceCount() (int, error) {
	n := C.symm_cuDeviceGetCount(d.fn[fnDeviceGetCount])
	if n.r != 0 {
		return 0, fmt.Errorf("cuDeviceGetCount: %w", Result(n.r))
	}
	return int(n.v), nil
}

func (d *driver) deviceName(dev int) (string, error) {
	if err := d.checkDevice(dev); err != nil {
		return "", err
	}
	var buf [256]C.char
	if r := Result(C.symm_cuDeviceGetName(d.fn[fnDeviceGetName], &buf[0], C.int(len(buf)), d.devs[dev])); r != Success {
		return "", fmt.Errorf("cuDeviceGetName(device %d): %w", dev, r)
	}
	buf[len(buf)-1] = 0 // the driver terminates within len; make sure
	return C.GoString(&buf[0]), nil
}

func (d *driver) totalMem(dev int) (uint64, error) {
	if err := d.checkDevice(dev); err != nil {
		return 0, err
	}
	o := C.symm_cuDeviceTotalMem(d.fn[fnDeviceTotalMem], d.devs[dev])
	if o.r != 0 {
		return 0, fmt.Errorf("cuDeviceTotalMem(device %d): %w", dev, Result(o.r))
	}
	return uint64(o.a), nil
}

func (d *driver) deviceAttribute(dev, attr int) (int, error) {
	if err := d.checkDevice(dev); err != nil {
		return 0, err
	}
	o := C.symm_cuDeviceGetAttribute(d.fn[fnDeviceGetAttribute], C.int(attr), d.devs[dev])
	if o.r != 0 {
		return 0, fmt.Errorf("cuDeviceGetAttribute(%d, device %d): %w", attr, dev, Result(o.r))
	}
	return int(o.v), nil
}

// ---- contexts ---------------------------------------------------------------

// primaryContext returns device dev's primary context, retaining it on first
// use. It stays retained while the driver is open: the segments handed out
// live in it, and PyTorch's runtime shares the same context.
func (d *driver) primaryContext(dev int) (uintptr, error) {
	if err := d.checkDevice(dev); err != nil {
		return 0, err
	}
	if c := d.primary[dev].Load(); c != 0 {
		return c, nil
	}
	d.primaryMu.Lock()
	defer d.primaryMu.Unlock()
	if c := d.primary[dev].Load(); c != 0 {
		return c, nil
	}
	o := C.symm_cuDevicePrimaryCtxRetain(d.fn[fnDevicePrimaryCtxRetain], d.devs[dev])
	if o.r != 0 {
		return 0, fmt.Errorf("cuDevicePrimaryCtxRetain(device %d): %w", dev, Result(o.r))
	}
	d.primary[dev].Store(uintptr(o.v))
	return uintptr(o.v), nil
}

// currentContext returns the calling OS thread's current context (0: none).
func (d *driver) currentContext() (uintptr, error) {
	o := C.symm_cuCtxGetCurrent(d.fn[fnCtxGetCurrent])
	if o.r != 0 {
		return 0, fmt.Errorf("cuCtxGetCurrent: %w", Result(o.r))
	}
	return uintptr(o.v), nil
}

// setCurrentContext makes ctx current on the calling OS thread (0: pop).
func (d *driver) setCurrentContext(ctx uintptr) error {
	if r := Result(C.symm_cuCtxSetCurrent(d.fn[fnCtxSetCurrent], C.uintptr_t(ctx))); r != Success {
		return fmt.Errorf("cuCtxSetCurrent(%#x): %w", ctx, r)
	}
	return nil
}

// ctxScope is an operation's hold on a device's context, from enter to leave.
// The goroutine is locked to its OS thread in between, because the current
// context belongs to the thread.
type ctxScope struct {
	d      *driver
	pushed uintptr // the context enter pushed; 0 when the caller's was used
}

// enter makes a context of device dev current on a locked OS thread.
//
// If the thread's current context already belongs to dev (PyTorch's, when it
// calls us from its allocator) it is used as is. Otherwise dev's primary
// context is pushed, and leave pops it, so that whatever context the caller
// had (another device's, or none) is current again afterwards. The caller
// must call leave exactly once when enter succeeds.
func (d *driver) enter(dev int) (ctxScope, error) {
	if err := d.checkDevice(dev); err != nil {
		return ctxScope{}, err
	}
	runtime.LockOSThread()
	cur := C.symm_cuCtxGetCurrent(d.fn[fnCtxGetCurrent])
	if cur.r != 0 {
		runtime.UnlockOSThread()
		return ctxScope{}, fmt.Errorf("cuCtxGetCurrent: %w", Result(cur.r))
	}
	if cur.v != 0 {
		if uintptr(cur.v) == d.primary[dev].Load() {
			return ctxScope{d: d}, nil
		}
		g := C.symm_cuCtxGetDevice(d.fn[fnCtxGetDevice])
		if g.r == 0 && g.v == d.devs[dev] {
			return ctxScope{d: d}, nil
		}
		// Another device's context, or one that can no longer be used (it
		// was destroyed): push ours over it; leave restores it untouched.
	}
	ctx, err := d.primaryContext(dev)
	if err != nil {
		runtime.UnlockOSThread()
		return ctxScope{}, err
	}
	if r := Result(C.symm_cuCtxPushCurrent(d.fn[fnCtxPushCurrent], C.uintptr_t(ctx))); r != Success {
		runtime.UnlockOSThread()
		return ctxScope{}, fmt.Errorf("cuCtxPushCurrent(device %d): %w", dev, r)
	}
	return ctxScope{d: d, pushed: ctx}, nil
}

// leave undoes enter and returns err, or the error of restoring the caller's
// context when err is nil.
func (s ctxScope) leave(err error) error {
	defer runtime.UnlockOSThread()
	if s.pushed == 0 {
		return err
	}
	o := C.symm_cuCtxPopCurrent(s.d.fn[fnCtxPopCurrent])
	if err != nil {
		return err
	}
	if o.r != 0 {
		return fmt.Errorf("cuCtxPopCurrent: %w", Result(o.r))
	}
	if uintptr(o.v) != s.pushed {
		// Nothing between enter and leave changes the stack, so this is a bug.
		return fmt.Errorf("cuda: context stack changed during a call: pushed %#x, popped %#x", s.pushed, uintptr(o.v))
	}
	return nil
}

// ---- memory -----------------------------------------------------------------

func (d *driver) memGetInfo(dev int) (free, total uint64, err error) {
	s, err := d.enter(dev)
	if err != nil {
		return 0, 0, err
	}
	o := C.symm_cuMemGetInfo(d.fn[fnMemGetInfo])
	if o.r != 0 {
		err = fmt.Errorf("cuMemGetInfo on device %d: %w", dev, Result(o.r))
	}
	return uint64(o.a), uint64(o.b), s.leave(err)
}

func (d *driver) memAlloc(dev int, size uint64) (uintptr, error) {
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	o := C.symm_cuMemAlloc(d.fn[fnMemAlloc], d.fn[fnThreadExchangeStreamCaptureMode], C.size_t(size))
	if o.r != 0 {
		return 0, s.leave(fmt.Errorf("cuMemAlloc(%d bytes) on device %d: %w", size, dev, Result(o.r)))
	}
	if err := s.leave(nil); err != nil {
		// The allocation succeeded but the caller's context may be wrong now;
		// report it, and free the block rather than leak it.
		d.memFree(dev, uintptr(o.v))
		return 0, err
	}
	return uintptr(o.v), nil
}

func (d *driver) memFree(dev int, ptr uintptr) error {
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuMemFree(d.fn[fnMemFree], d.fn[fnThreadExchangeStreamCaptureMode], C.uintptr_t(ptr))); r != Success {
		err = fmt.Errorf("cuMemFree(%#x) on device %d: %w", ptr, dev, r)
	}
	return s.leave(err)
}

func (d *driver) memcpyHtoD(dev int, dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	// The call returns once src has been read (pageable host memory is
	// staged before the call returns), so Go may move or reuse src after.
	if r := Result(C.symm_cuMemcpyHtoD(d.fn[fnMemcpyHtoD], C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)))); r != Success {
		err = fmt.Errorf("cuMemcpyHtoD(%#x, %d bytes) on device %d: %w", dst, len(src), dev, r)
	}
	return s.leave(err)
}

func (d *driver) memcpyDtoH(dev int, dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	// Device-to-host copies return only when the data has arrived in dst.
	if r := Result(C.symm_cuMemcpyDtoH(d.fn[fnMemcpyDtoH], unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst)))); r != Success {
		err = fmt.Errorf("cuMemcpyDtoH(%#x, %d bytes) on device %d: %w", src, len(dst), dev, r)
	}
	return s.leave(err)
}

func (d *driver) memset(dev int, ptr uintptr, val byte, n uint64) error {
	if n == 0 {
		return nil
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuMemsetD8(d.fn[fnMemsetD8], C.uintptr_t(ptr), C.uchar(val), C.size_t(n))); r != Success {
		err = fmt.Errorf("cuMemsetD8(%#x, %d, %d bytes) on device %d: %w", ptr, val, n, dev, r)
	} else if r := Result(C.symm_cuCtxSynchronize(d.fn[fnCtxSynchronize])); r != Success {
		// A memset of device memory may return before it is done; wait, so
		// that Memset's contract (done on return) holds for every stream.
		err = fmt.Errorf("cuCtxSynchronize after cuMemsetD8 on device %d: %w", dev, r)
	}
	return s.leave(err)
}

// pointerDevice returns the ordinal of the device that holds ptr. It needs no
// context: with unified addressing the driver knows every pointer it made.
func (d *driver) pointerDevice(ptr uintptr) (int, error) {
	o := C.symm_cuPointerGetAttributeInt(d.fn[fnPointerGetAttribute], pointerAttrOrdinal, C.uintptr_t(ptr))
	if o.r != 0 {
		return 0, fmt.Errorf("cuPointerGetAttribute(DEVICE_ORDINAL, %#x): %w", ptr, Result(o.r))
	}
	return int(o.v), nil
}

// ---- events -----------------------------------------------------------------

func (d *driver) eventCreate(dev int) (uintptr, error) {
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	// Timing is disabled: these events only order work, and timing events
	// cost more to record and to query.
	o := C.symm_cuEventCreate(d.fn[fnEventCreate], eventDisableTiming)
	if o.r != 0 {
		return 0, s.leave(fmt.Errorf("cuEventCreate on device %d: %w", dev, Result(o.r)))
	}
	if err := s.leave(nil); err != nil {
		d.eventDestroy(dev, uintptr(o.v))
		return 0, err
	}
	return uintptr(o.v), nil
}

func (d *driver) eventRecord(dev int, ev, stream uintptr) error {
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuEventRecord(d.fn[fnEventRecord], C.uintptr_t(ev), streamArg(stream))); r != Success {
		err = fmt.Errorf("cuEventRecord(event %#x, stream %#x) on device %d: %w", ev, stream, dev, r)
	}
	return s.leave(err)
}

// eventQuery reports whether the work captured by ev has completed;
// CUDA_ERROR_NOT_READY is the answer "not yet", not an error.
func (d *driver) eventQuery(dev int, ev uintptr) (bool, error) {
	s, err := d.enter(dev)
	if err != nil {
		return false, err
	}
	done := false
	switch r := Result(C.symm_cuEventQuery(d.fn[fnEventQuery], C.uintptr_t(ev))); r {
	case Success:
		done = true
	case ErrorNotReady:
	default:
		err = fmt.Errorf("cuEventQuery(event %#x) on device %d: %w", ev, dev, r)
	}
	return done, s.leave(err)
}

func (d *driver) eventSync(dev int, ev uintptr) error {
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuEventSynchronize(d.fn[fnEventSynchronize], C.uintptr_t(ev))); r != Success {
		err = fmt.Errorf("cuEventSynchronize(event %#x) on device %d: %w", ev, dev, r)
	}
	return s.leave(err)
}

func (d *driver) eventDestroy(dev int, ev uintptr) error {
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuEventDestroy(d.fn[fnEventDestroy], C.uintptr_t(ev))); r != Success {
		err = fmt.Errorf("cuEventDestroy(event %#x) on device %d: %w", ev, dev, r)
	}
	return s.leave(err)
}

// ---- streams ----------------------------------------------------------------

func (d *driver) streamCreate(dev int) (uintptr, error) {
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	// Non-blocking, like PyTorch's side streams: no implicit ordering with
	// the legacy default stream.
	o := C.symm_cuStreamCreate(d.fn[fnStreamCreate], streamNonBlocking)
	if o.r != 0 {
		return 0, s.leave(fmt.Errorf("cuStreamCreate on device %d: %w", dev, Result(o.r)))
	}
	if err := s.leave(nil); err != nil {
		d.streamDestroy(dev, uintptr(o.v))
		return 0, err
	}
	return uintptr(o.v), nil
}

func (d *driver) streamDestroy(dev int, stream uintptr) error {
	if stream == 0 || stream == streamLegacy || stream == 0x2 {
		return fmt.Errorf("cuda: cannot destroy the default stream %#x: %w", stream, ErrorInvalidHandle)
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuStreamDestroy(d.fn[fnStreamDestroy], C.uintptr_t(stream))); r != Success {
		err = fmt.Errorf("cuStreamDestroy(%#x) on device %d: %w", stream, dev, r)
	}
	return s.leave(err)
}

func (d *driver) ctxSync(dev int) error {
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuCtxSynchronize(d.fn[fnCtxSynchronize])); r != Success {
		err = fmt.Errorf("cuCtxSynchronize on device %d: %w", dev, r)
	}
	return s.leave(err)
}

func (d *driver) streamSync(dev int, stream uintptr) error {
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuStreamSynchronize(d.fn[fnStreamSynchronize], streamArg(stream))); r != Success {
		err = fmt.Errorf("cuStreamSynchronize(%#x) on device %d: %w", stream, dev, r)
	}
	return s.leave(err)
}

// streamValue32 enqueues cuStreamWriteValue32 or cuStreamWaitValue32 (id).
func (d *driver) streamValue32(id fnID, dev int, stream, addr uintptr, value uint32, flags uint32) error {
	fn, err := d.need(id)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if r := Result(C.symm_cuStreamValue32(fn, streamArg(stream), C.uintptr_t(addr), C.cuuint32_t(value), C.uint(flags))); r != Success {
		err = fmt.Errorf("%s(stream %#x, %#x, %d, flags %#x) on device %d: %w", symbols[id].name, stream, addr, value, flags, dev, r)
	}
	return s.leave(err)
}

// streamQuery reports whether all work queued on stream has completed;
// CUDA_ERROR_NOT_READY is the answer "not yet", not an error.
func (d *driver) streamQuery(dev int, stream uintptr) (bool, error) {
	fn, err := d.need(fnStreamQuery)
	if err != nil {
		return false, err
	}
	s, err := d.enter(dev)
	if err != nil {
		return false, err
	}
	done := false
	switch r := Result(C.symm_cuStreamQuery(fn, streamArg(stream))); r {
	case Success:
		done = true
	case ErrorNotReady:
	default:
		err = fmt.Errorf("cuStreamQuery(%#x) on device %d: %w", stream, dev, r)
	}
	return done, s.leave(err)
}

// canAccessPeer reports whether device dev can map and access memory that
// lives on device peer. A device query: no context is needed.
func (d *driver) canAccessPeer(dev, peer int) (bool, error) {
	fn, err := d.need(fnDeviceCanAccessPeer)
	if err != nil {
		return false, err
	}
	if err := d.checkDevice(dev); err != nil {
		return false, err
	}
	if err := d.checkDevice(peer); err != nil {
		return false, err
	}
	o := C.symm_cuDeviceCanAccessPeer(fn, d.devs[dev], d.devs[peer])
	if o.r != 0 {
		return false, fmt.Errorf("cuDeviceCanAccessPeer(device %d, peer %d): %w", dev, peer, Result(o.r))
	}
	return o.v != 0, nil
}

// vmmAvailable returns nil when every virtual-memory function was resolved,
// else the error naming the first missing one.
func (d *driver) vmmAvailable() error {
	for id := fnMemCreate; id <= fnMemRetainAllocationHandle; id++ {
		if _, err := d.need(id); err != nil {
			return err
		}
	}
	return nil
}
