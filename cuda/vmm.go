package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Virtual memory management: physical allocations (cuMemCreate) exportable as
// POSIX file descriptors, imported by other processes, and mapped into
// address ranges reserved for them, as PyTorch's CUDASymmetricMemory does.
//
// Every call runs in the context of the device it is given (see enter),
// including those whose driver function takes no device (cuMemRelease,
// cuMemMap, ...): every driver call but a few device queries needs a current
// context, and a thread that has none must not get one by accident.
//
// Allocation handles are counted on this side (driver.handles): a handle that
// this process does not hold (never made here, or released already) is refused
// before it reaches the driver, since what the driver does with a stale or
// invented handle is not documented.

// vmmLayout returns the sizes and offsets of the declarations of shim.h, as
// the C compiler lays them out (c) and as cgo presents them to Go (g), for a
// test that compares them with those of cuda.h.
func vmmLayout() (c, g map[string]uintptr) {
	l := C.symm_vmm_layout_get()
	c = map[string]uintptr{
		"CUmemAllocationProp":                                 uintptr(l.prop_size),
		"align(CUmemAllocationProp)":                          uintptr(l.prop_align),
		"CUmemAllocationProp.type":                            uintptr(l.prop_type),
		"CUmemAllocationProp.requestedHandleTypes":            uintptr(l.prop_handle_types),
		"CUmemAllocationProp.location":                        uintptr(l.prop_location),
		"CUmemAllocationProp.location.type":                   uintptr(l.prop_location_type),
		"CUmemAllocationProp.location.id":                     uintptr(l.prop_location_id),
		"CUmemAllocationProp.win32HandleMetaData":             uintptr(l.prop_win32),
		"CUmemAllocationProp.allocFlags":                      uintptr(l.prop_alloc_flags),
		"sizeof(CUmemAllocationProp.allocFlags)":              uintptr(l.prop_alloc_flags_size),
		"CUmemAllocationProp.allocFlags.compressionType":      uintptr(l.prop_compression),
		"CUmemAllocationProp.allocFlags.gpuDirectRDMACapable": uintptr(l.prop_rdma),
		"CUmemAllocationProp.allocFlags.usage":                uintptr(l.prop_usage),
		"CUmemAllocationProp.allocFlags.reserved":             uintptr(l.prop_reserved),
		"CUmemLocation":                                       uintptr(l.loc_size),
		"CUmemAccessDesc":                                     uintptr(l.access_size),
		"align(CUmemAccessDesc)":                              uintptr(l.access_align),
		"CUmemAccessDesc.location":                            uintptr(l.access_location),
		"CUmemAccessDesc.flags":                               uintptr(l.access_flags),
		"CUmemGenericAllocationHandle":                        uintptr(l.handle_size),
	}
	var p C.CUmemAllocationProp
	var a C.CUmemAccessDesc
	af := unsafe.Offsetof(p.allocFlags)
	g = map[string]uintptr{
		"CUmemAllocationProp":                                 unsafe.Sizeof(p),
		"align(CUmemAllocationProp)":                          unsafe.Alignof(p),
		"CUmemAllocationProp.type":                            unsafe.Offsetof(p._type),
		"CUmemAllocationProp.requestedHandleTypes":            unsafe.Offsetof(p.requestedHandleTypes),
		"CUmemAllocationProp.location":                        unsafe.Offsetof(p.location),
		"CUmemAllocationProp.location.type":                   unsafe.Offsetof(p.location) + unsafe.Offsetof(p.location._type),
		"CUmemAllocationProp.location.id":                     unsafe.Offsetof(p.location) + unsafe.Offsetof(p.location.id),
		"CUmemAllocationProp.win32HandleMetaData":             unsafe.Offsetof(p.win32HandleMetaData),
		"CUmemAllocationProp.allocFlags":                      af,
		"sizeof(CUmemAllocationProp.allocFlags)":              unsafe.Sizeof(p.allocFlags),
		"CUmemAllocationProp.allocFlags.compressionType":      af + unsafe.Offsetof(p.allocFlags.compressionType),
		"CUmemAllocationProp.allocFlags.gpuDirectRDMACapable": af + unsafe.Offsetof(p.allocFlags.gpuDirectRDMACapable),
		"CUmemAllocationProp.allocFlags.usage":                af + unsafe.Offsetof(p.allocFlags.usage),
		"CUmemAllocationProp.allocFlags.reserved":             af + unsafe.Offsetof(p.allocFlags.reserved),
		"CUmemLocation":                                       unsafe.Sizeof(p.location),
		"CUmemAccessDesc":                                     unsafe.Sizeof(a),
		"align(CUmemAccessDesc)":                              unsafe.Alignof(a),
		"CUmemAccessDesc.location":                            unsafe.Offsetof(a.location),
		"CUmemAccessDesc.flags":                               unsafe.Offsetof(a.flags),
		"CUmemGenericAllocationHandle":                        unsafe.Sizeof(C.CUmemGenericAllocationHandle(0)),
	}
	return c, g
}

// ---- handle references ------------------------------------------------------

func errNotLive(h uint64) error {
	return fmt.Errorf("cuda: %#x is not an allocation handle this process holds (not made by MemCreate, ImportFD or RetainAllocationHandle, or released already): %w", h, ErrorInvalidValue)
}

// addHandleRef records one more reference to h, just obtained from the driver.
func (d *driver) addHandleRef(h uint64) {
	d.handles.Lock()
	defer d.handles.Unlock()
	if d.handles.refs == nil {
		d.handles.refs = map[uint64]int{}
	}
	d.handles.refs[h]++
}

// checkHandle returns an error unless this process holds a reference to h.
func (d *driver) checkHandle(h uint64) error {
	d.handles.Lock()
	defer d.handles.Unlock()
	if d.handles.refs[h] > 0 {
		return nil
	}
	return errNotLive(h)
}

// dropHandleRef takes away one reference to h before it is released, so that
// two concurrent releases of one reference cannot both reach the driver;
// addHandleRef puts it back if the release fails.
func (d *driver) dropHandleRef(h uint64) error {
	d.handles.Lock()
	defer d.handles.Unlock()
	switch n := d.handles.refs[h]; {
	case n <= 0:
		return errNotLive(h)
	case n == 1:
		delete(d.handles.refs, h)
	default:
		d.handles.refs[h] = n - 1
	}
	return nil
}

// heldHandles returns the number of handle references this process holds.
func (d *driver) heldHandles() int {
	d.handles.Lock()
	defer d.handles.Unlock()
	n := 0
	for _, r := range d.handles.refs {
		n += r
	}
	return n
}

// ---- single driver calls, in a context entered by the caller ----------------

func reserveIn(fn unsafe.Pointer, dev int, size, alignment uint64) (uintptr, error) {
	o := C.symm_cuMemAddressReserve(fn, C.size_t(size), C.size_t(alignment))
	if o.r != 0 {
		return 0, fmt.Errorf("cuMemAddressReserve(%d bytes, alignment %d) on device %d: %w", size, alignment, dev, Result(o.r))
	}
	return uintptr(o.v), nil
}

func addressFreeIn(fn unsafe.Pointer, dev int, ptr uintptr, size uint64) error {
	if r := Result(C.symm_cuMemAddressFree(fn, C.uintptr_t(ptr), C.size_t(size))); r != Success {
		return fmt.Errorf("cuMemAddressFree(%#x, %d bytes) on device %d: %w", ptr, size, dev, r)
	}
	return nil
}

func mapIn(fn unsafe.Pointer, dev int, ptr uintptr, size, h uint64) error {
	if r := Result(C.symm_cuMemMap(fn, C.uintptr_t(ptr), C.size_t(size), C.CUmemGenericAllocationHandle(h))); r != Success {
		return fmt.Errorf("cuMemMap(%#x, %d bytes, offset 0, handle %#x) on device %d: %w", ptr, size, h, dev, r)
	}
	return nil
}

func unmapIn(fn unsafe.Pointer, dev int, ptr uintptr, size uint64) error {
	if r := Result(C.symm_cuMemUnmap(fn, C.uintptr_t(ptr), C.size_t(size))); r != Success {
		return fmt.Errorf("cuMemUnmap(%#x, %d bytes) on device %d: %w", ptr, size, dev, r)
	}
	return nil
}

func setAccessIn(fn unsafe.Pointer, dev int, ptr uintptr, size uint64, descs []C.CUmemAccessDesc, devs []int) error {
	// descs holds no Go pointer, so cgo lets C read it in place.
	if r := Result(C.symm_cuMemSetAccess(fn, C.uintptr_t(ptr), C.size_t(size), &descs[0], C.size_t(len(descs)))); r != Success {
		return fmt.Errorf("cuMemSetAccess(%#x, %d bytes, read-write for devices %v) on device %d: %w", ptr, size, devs, dev, r)
	}
	return nil
}

// accessDescs returns one read-write descriptor per distinct device of devs,
// or an error if devs is empty or names a device that does not exist.
func (d *driver) accessDescs(devs []int) ([]C.CUmemAccessDesc, error) {
	if len(devs) == 0 {
		return nil, fmt.Errorf("cuda: no device to grant access to: %w", ErrorInvalidValue)
	}
	descs := make([]C.CUmemAccessDesc, 0, len(devs))
next:
	for i, dev := range devs {
		if err := d.checkDevice(dev); err != nil {
			return nil, err
		}
		for _, prev := range devs[:i] {
			if prev == dev {
				continue next
			}
		}
		var a C.CUmemAccessDesc
		a.location._type = C.CU_MEM_LOCATION_TYPE_DEVICE
		a.location.id = C.int(dev) // an ordinal, not a CUdevice (cuda.h)
		a.flags = C.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
		descs = append(descs, a)
	}
	return descs, nil
}

// undone returns err, completed with the error of undoing what led to it.
func undone(err, undoErr error) error {
	if undoErr == nil {
		return err
	}
	return fmt.Errorf("%w (undoing it: %w)", err, undoErr)
}

// ---- the operations ---------------------------------------------------------

func (d *driver) granularity(dev int) (minimum, recommended uint64, err error) {
	fn, err := d.need(fnMemGetAllocationGranularity)
	if err != nil {
		return 0, 0, err
	}
	s, err := d.enter(dev)
	if err != nil {
		return 0, 0, err
	}
	m := C.symm_cuMemGetAllocationGranularity(fn, C.int(dev), C.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
	if m.r != 0 {
		return 0, 0, s.leave(fmt.Errorf("cuMemGetAllocationGranularity(device %d, POSIX_FILE_DESCRIPTOR, MINIMUM): %w", dev, Result(m.r)))
	}
	r := C.symm_cuMemGetAllocationGranularity(fn, C.int(dev), C.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
	if r.r != 0 {
		return 0, 0, s.leave(fmt.Errorf("cuMemGetAllocationGranularity(device %d, POSIX_FILE_DESCRIPTOR, RECOMMENDED): %w", dev, Result(r.r)))
	}
	return uint64(m.a), uint64(r.a), s.leave(nil)
}

func (d *driver) memCreate(dev int, size uint64) (uint64, error) {
	fn, err := d.need(fnMemCreate)
	if err != nil {
		return 0, err
	}
	if _, err := d.need(fnMemRelease); err != nil {
		return 0, err // a handle that cannot be released would leak
	}
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	o := C.symm_cuMemCreate(fn, C.size_t(size), C.int(dev))
	if o.r != 0 {
		return 0, s.leave(fmt.Errorf("cuMemCreate(%d bytes, POSIX_FILE_DESCRIPTOR) on device %d: %w", size, dev, Result(o.r)))
	}
	return d.keepHandle(dev, s, uint64(o.h))
}

func (d *driver) memRelease(dev int, h uint64) error {
	fn, err := d.need(fnMemRelease)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	if err := d.dropHandleRef(h); err != nil {
		return s.leave(err)
	}
	if r := Result(C.symm_cuMemRelease(fn, C.CUmemGenericAllocationHandle(h))); r != Success {
		d.addHandleRef(h)
		err = fmt.Errorf("cuMemRelease(handle %#x) on device %d: %w", h, dev, r)
	}
	return s.leave(err)
}

func (d *driver) exportFD(dev int, h uint64) (int, error) {
	fn, err := d.need(fnMemExportToShareableHandle)
	if err != nil {
		return -1, err
	}
	if err := d.checkHandle(h); err != nil {
		return -1, err
	}
	s, err := d.enter(dev)
	if err != nil {
		return -1, err
	}
	o := C.symm_cuMemExportToShareableHandle(fn, C.CUmemGenericAllocationHandle(h))
	if o.r != 0 {
		return -1, s.leave(fmt.Errorf("cuMemExportToShareableHandle(handle %#x, POSIX_FILE_DESCRIPTOR) on device %d: %w", h, dev, Result(o.r)))
	}
	fd := int(o.v)
	if err := s.leave(nil); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	// The descriptor keeps the memory alive: a child process started with
	// exec must not inherit it by accident. (Passing it over a Unix socket,
	// or to a child through os/exec's ExtraFiles, still works.)
	syscall.CloseOnExec(fd)
	return fd, nil
}

// keepHandle counts a handle the driver just gave us (created, imported or
// retained) and leaves the context scope s; if leaving fails, the handle is
// released again so that no failed call keeps one.
func (d *driver) keepHandle(dev int, s ctxScope, h uint64) (uint64, error) {
	d.addHandleRef(h)
	if err := s.leave(nil); err != nil {
		d.memRelease(dev, h)
		return 0, err
	}
	return h, nil
}

func (d *driver) importFD(dev int, fd int) (uint64, error) {
	fn, err := d.need(fnMemImportFromShareableHandle)
	if err != nil {
		return 0, err
	}
	if _, err := d.need(fnMemRelease); err != nil {
		return 0, err
	}
	if fd < 0 {
		return 0, fmt.Errorf("cuda: cannot import file descriptor %d: %w", fd, ErrorInvalidValue)
	}
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	o := C.symm_cuMemImportFromShareableHandle(fn, C.int(fd))
	if o.r != 0 {
		return 0, s.leave(fmt.Errorf("cuMemImportFromShareableHandle(fd %d, POSIX_FILE_DESCRIPTOR) on device %d: %w", fd, dev, Result(o.r)))
	}
	return d.keepHandle(dev, s, uint64(o.h))
}

func (d *driver) retainAllocationHandle(dev int, ptr uintptr) (uint64, error) {
	fn, err := d.need(fnMemRetainAllocationHandle)
	if err != nil {
		return 0, err
	}
	if _, err := d.need(fnMemRelease); err != nil {
		return 0, err
	}
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	o := C.symm_cuMemRetainAllocationHandle(fn, C.uintptr_t(ptr))
	if o.r != 0 {
		return 0, s.leave(fmt.Errorf("cuMemRetainAllocationHandle(%#x) on device %d: %w", ptr, dev, Result(o.r)))
	}
	return d.keepHandle(dev, s, uint64(o.h))
}

func (d *driver) addressReserve(dev int, size, alignment uint64) (uintptr, error) {
	fn, err := d.need(fnMemAddressReserve)
	if err != nil {
		return 0, err
	}
	if _, err := d.need(fnMemAddressFree); err != nil {
		return 0, err // a range that cannot be freed would leak
	}
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	ptr, err := reserveIn(fn, dev, size, alignment)
	if err != nil {
		return 0, s.leave(err)
	}
	if err := s.leave(nil); err != nil {
		d.addressFree(dev, ptr, size)
		return 0, err
	}
	return ptr, nil
}

func (d *driver) addressFree(dev int, ptr uintptr, size uint64) error {
	fn, err := d.need(fnMemAddressFree)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	return s.leave(addressFreeIn(fn, dev, ptr, size))
}

func (d *driver) memMap(dev int, ptr uintptr, size, h uint64) error {
	fn, err := d.need(fnMemMap)
	if err != nil {
		return err
	}
	if err := d.checkHandle(h); err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	return s.leave(mapIn(fn, dev, ptr, size, h))
}

func (d *driver) memUnmap(dev int, ptr uintptr, size uint64) error {
	fn, err := d.need(fnMemUnmap)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	return s.leave(unmapIn(fn, dev, ptr, size))
}

func (d *driver) setAccess(dev int, ptr uintptr, size uint64, devs []int) error {
	fn, err := d.need(fnMemSetAccess)
	if err != nil {
		return err
	}
	descs, err := d.accessDescs(devs)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	return s.leave(setAccessIn(fn, dev, ptr, size, descs, devs))
}

// mapNew reserves size bytes of address space, maps all of h there and
// grants devs read-write access, in one entry into dev's context. On failure
// it undoes what it did: nothing stays reserved or mapped.
func (d *driver) mapNew(dev int, h, size uint64, devs []int) (uintptr, error) {
	var fn [5]unsafe.Pointer
	for i, id := range [...]fnID{fnMemAddressReserve, fnMemMap, fnMemSetAccess, fnMemUnmap, fnMemAddressFree} {
		p, err := d.need(id)
		if err != nil {
			return 0, err
		}
		fn[i] = p
	}
	reserve, mmap, access, unmap, free := fn[0], fn[1], fn[2], fn[3], fn[4]
	if len(devs) == 0 {
		devs = []int{dev}
	}
	descs, err := d.accessDescs(devs)
	if err != nil {
		return 0, err
	}
	if err := d.checkHandle(h); err != nil {
		return 0, err
	}
	s, err := d.enter(dev)
	if err != nil {
		return 0, err
	}
	ptr, err := reserveIn(reserve, dev, size, 0)
	if err != nil {
		return 0, s.leave(err)
	}
	if err := mapIn(mmap, dev, ptr, size, h); err != nil {
		return 0, s.leave(undone(err, addressFreeIn(free, dev, ptr, size)))
	}
	if err := setAccessIn(access, dev, ptr, size, descs, devs); err != nil {
		undoErr := unmapIn(unmap, dev, ptr, size)
		if undoErr == nil {
			undoErr = addressFreeIn(free, dev, ptr, size)
		}
		return 0, s.leave(undone(err, undoErr))
	}
	if err := s.leave(nil); err != nil {
		d.unmapFree(dev, ptr, size)
		return 0, err
	}
	return ptr, nil
}

// unmapFree unmaps [ptr, ptr+size) and frees the address range. The range is
// freed even if unmapping fails (it may have been unmapped already); both
// errors are reported.
func (d *driver) unmapFree(dev int, ptr uintptr, size uint64) error {
	unmap, err := d.need(fnMemUnmap)
	if err != nil {
		return err
	}
	free, err := d.need(fnMemAddressFree)
	if err != nil {
		return err
	}
	s, err := d.enter(dev)
	if err != nil {
		return err
	}
	errU := unmapIn(unmap, dev, ptr, size)
	errF := addressFreeIn(free, dev, ptr, size)
	switch {
	case errU != nil && errF != nil:
		err = fmt.Errorf("%w; then %w", errU, errF)
	case errU != nil:
		err = errU
	default:
		err = errF
	}
	return s.leave(err)
}
