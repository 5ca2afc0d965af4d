package host

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/allocator"
)

// Expandable segments on host memory: a range reserved with PROT_NONE and
// MAP_NORESERVE (address space only), chunks mapped over it with MAP_FIXED
// as anonymous read-write memory, and unmapped by mapping PROT_NONE over them
// again, which gives their pages back to the kernel and keeps the range
// reserved. The granularity is 2 MiB, as on current GPUs, so that CI runs the
// pool's chunk arithmetic as it runs on a GPU.

// Granularity is the chunk of expandable segments: 2 MiB.
const Granularity = 2 << 20

var (
	_ allocator.Expander     = (*Backend)(nil)
	_ allocator.ChunkKeeper  = (*Backend)(nil)
	_ allocator.ChunkAuditor = (*Backend)(nil)
)

// Granularity returns the chunk size (2 MiB).
func (h *Backend) Granularity(dev int) (uint64, error) { return Granularity, h.check(dev) }

// ReserveRange reserves size bytes of address space, 2 MiB-aligned.
func (h *Backend) ReserveRange(dev int, size uint64) (uintptr, error) {
	if err := h.check(dev); err != nil {
		return 0, err
	}
	if size == 0 || size%Granularity != 0 {
		return 0, fmt.Errorf("host: reserve of %d bytes on device %d: not a positive multiple of %d", size, dev, Granularity)
	}
	// Reserve one chunk more and trim, for the alignment.
	raw, _, errno := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(size+Granularity), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, ^uintptr(0), 0)
	if errno == unix.ENOMEM {
		return 0, &OutOfMemoryError{Dev: dev, Want: size, Cause: fmt.Errorf("reserving address space: %w", errno)}
	} else if errno != 0 {
		return 0, fmt.Errorf("host: reserving %d bytes of address space on device %d: %w", size, dev, errno)
	}
	ptr := (raw + Granularity - 1) &^ (Granularity - 1)
	if head := ptr - raw; head > 0 {
		munmap(raw, uint64(head))
	}
	if tail := raw + uintptr(size+Granularity) - (ptr + uintptr(size)); tail > 0 {
		munmap(ptr+uintptr(size), uint64(tail))
	}
	h.mu.Lock()
	h.ranges[ptr] = hostRange{dev: dev, size: size, chunks: make([]bool, size/Granularity)}
	h.mu.Unlock()
	return ptr, nil
}

// hostRange is a reserved range, the bytes mapped in it and which of its
// chunks are mapped: a second map over a live chunk, or an unmap of one
// not mapped, is refused (on a GPU the first would leak and the second
// fail), so that the pool's fuzzers see such bugs.
type hostRange struct {
	dev          int
	size, mapped uint64
	chunks       []bool // shares its array with every copy of the value
}

// mark sets the chunks of [ptr, ptr+size) of r (at base) mapped or not.
func (r hostRange) mark(base, ptr uintptr, size uint64, on bool) {
	for i := uint64(ptr-base) / Granularity; i < uint64(ptr-base+uintptr(size))/Granularity; i++ {
		r.chunks[i] = on
	}
}

// checkChunks reports the first chunk of [ptr, ptr+size) of r (at base)
// whose state is not want.
func (r hostRange) checkChunks(base, ptr uintptr, size uint64, want bool, op string) error {
	for i := uint64(ptr-base) / Granularity; i < uint64(ptr-base+uintptr(size))/Granularity; i++ {
		if r.chunks[i] != want {
			state := "already mapped"
			if want {
				state = "not mapped"
			}
			return fmt.Errorf("host: %s of %#x+%d on device %d: chunk %#x is %s", op, ptr, size, r.dev, base+uintptr(i*Granularity), state)
		}
	}
	return nil
}

func munmap(ptr uintptr, size uint64) error {
	if _, _, errno := unix.Syscall(unix.SYS_MUNMAP, ptr, uintptr(size), 0); errno != 0 {
		return errno
	}
	return nil
}

// FreeRange gives back a range with nothing mapped in it.
func (h *Backend) FreeRange(dev int, ptr uintptr, size uint64) error {
	if err := h.check(dev); err != nil {
		return err
	}
	h.mu.Lock()
	r, ok := h.ranges[ptr]
	if !ok || r.size != size || r.dev != dev {
		h.mu.Unlock()
		return fmt.Errorf("host: free of range %#x (%d bytes) on device %d: not reserved here", ptr, size, dev)
	}
	if r.mapped != 0 {
		h.mu.Unlock()
		return fmt.Errorf("host: free of range %#x: %d bytes are still mapped", ptr, r.mapped)
	}
	delete(h.ranges, ptr)
	h.mu.Unlock()
	if err := munmap(ptr, size); err != nil {
		return fmt.Errorf("host: munmap of range %#x: %w", ptr, err)
	}
	return nil
}

// rangeOf returns the base of the reserved range of dev holding [ptr,
// ptr+size), checking that it is whole chunks of chunk bytes (a multiple of
// the granularity); called with h.mu held.
func (h *Backend) rangeOf(dev int, ptr uintptr, size, chunk uint64) (uintptr, error) {
	if chunk == 0 || chunk%Granularity != 0 || size == 0 || size%chunk != 0 || ptr%Granularity != 0 {
		return 0, fmt.Errorf("host: range %#x+%d on device %d: not whole %d-byte chunks of the %d-byte granularity", ptr, size, dev, chunk, Granularity)
	}
	for base, r := range h.ranges {
		if r.dev == dev && ptr >= base && ptr+uintptr(size) <= base+uintptr(r.size) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("host: range %#x+%d on device %d: not inside a reserved range", ptr, size, dev)
}

// MapChunks maps size bytes of new memory at ptr, counted against the
// device's capacity. Fault injection (FaultAlloc) fails it before or after
// the mapping is made; either way nothing stays mapped or counted.
func (h *Backend) MapChunks(dev int, ptr uintptr, size, chunk uint64) error {
	if err := h.check(dev); err != nil {
		return err
	}
	failAt := h.pick(FaultAlloc, 2) // 0: at once; 1: after mapping
	if failAt == 0 {
		return h.faults.Err(fmt.Sprintf("map of %d bytes on device %d", size, dev))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	base, err := h.rangeOf(dev, ptr, size, chunk)
	if err != nil {
		return err
	}
	if err := h.ranges[base].checkChunks(base, ptr, size, false, "map"); err != nil {
		return err
	}
	if h.used[dev]+size > h.capacity || size > h.capacity {
		return &OutOfMemoryError{Dev: dev, Want: size, Used: h.used[dev], Cap: h.capacity}
	}
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, ptr, uintptr(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0); errno != 0 {
		if errno == unix.ENOMEM {
			return &OutOfMemoryError{Dev: dev, Want: size, Cause: errno}
		}
		return fmt.Errorf("host: mapping %d bytes at %#x on device %d: %w", size, ptr, dev, errno)
	}
	if failAt == 1 {
		if err := reserveAgain(ptr, size); err != nil {
			return fmt.Errorf("host: undoing a map after an injected fault: %w", err)
		}
		return h.faults.Err(fmt.Sprintf("map of %d bytes on device %d (after mmap)", size, dev))
	}
	r := h.ranges[base]
	r.mapped += size
	r.mark(base, ptr, size, true)
	h.ranges[base] = r
	h.starts.Add(ptr, size, chunk)
	h.used[dev] += size
	return nil
}

// reserveAgain drops the pages of [ptr, ptr+size) and leaves it reserved.
func reserveAgain(ptr uintptr, size uint64) error {
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, ptr, uintptr(size), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE, ^uintptr(0), 0); errno != 0 {
		return errno
	}
	return nil
}

// UnmapChunks gives the pages of [ptr, ptr+size) back; the range stays
// reserved. It returns the bytes unmapped: size, or with an injected fault
// (FaultUnmap) a prefix of whole chunks, the rest staying mapped.
func (h *Backend) UnmapChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	return h.unmap(dev, ptr, size, chunk, false)
}

// Spare chunks (allocator.ChunkKeeper). Anonymous memory belongs to its
// address, so a kept chunk's pages go back to the kernel as an unmapped
// one's do; what is kept is its place in the device's capacity, as a CUDA
// backend keeps the physical allocation: mapping it again cannot fail for
// lack of memory, and the memory counts as the device's until released.

// KeepChunks unmaps [ptr, ptr+size), keeping its size in the capacity as
// spare chunks of dev; on error a prefix is kept and the rest stays mapped.
func (h *Backend) KeepChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	return h.unmap(dev, ptr, size, chunk, true)
}

// unmap gives the pages of [ptr, ptr+size) back, the range staying
// reserved; the bytes leave the device's capacity, or with keep become
// spare chunks of it. Every chunk must be mapped (nothing changes if one
// is not). An injected fault unmaps the chunks before a chosen one and
// fails, as the CUDA backend's chunk-by-chunk unmap does.
func (h *Backend) unmap(dev int, ptr uintptr, size, chunk uint64, keep bool) (uint64, error) {
	if err := h.check(dev); err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	base, err := h.rangeOf(dev, ptr, size, chunk)
	if err != nil {
		return 0, err
	}
	r := h.ranges[base]
	if err := r.checkChunks(base, ptr, size, true, "unmap"); err != nil {
		return 0, err
	}
	if err := h.starts.Check(ptr, size, chunk); err != nil {
		return 0, fmt.Errorf("host: unmap on device %d: %w", dev, err)
	}
	n, failErr := size, error(nil)
	if at := h.pick(FaultUnmap, int(size/chunk)); at >= 0 {
		n = uint64(at) * chunk
		failErr = h.faults.Err(fmt.Sprintf("unmap of %d bytes on device %d after %d bytes", size, dev, n))
	}
	if n > 0 {
		if err := reserveAgain(ptr, n); err != nil {
			return 0, fmt.Errorf("host: unmapping %d bytes at %#x on device %d: %w", n, ptr, dev, err)
		}
	}
	r.mapped -= n
	r.mark(base, ptr, n, false)
	h.ranges[base] = r
	h.starts.Remove(ptr, n, chunk)
	if keep {
		h.spareOf[[2]uint64{uint64(dev), chunk}] += n
	} else {
		h.used[dev] -= n
	}
	return n, failErr
}

// MapKept maps [ptr, ptr+size) with size bytes of dev's spare chunks.
func (h *Backend) MapKept(dev int, ptr uintptr, size, chunk uint64) error {
	if err := h.check(dev); err != nil {
		return err
	}
	if h.pick(FaultAlloc, 2) == 0 {
		return h.faults.Err(fmt.Sprintf("map of %d spare bytes on device %d", size, dev))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	base, err := h.rangeOf(dev, ptr, size, chunk)
	if err != nil {
		return err
	}
	key := [2]uint64{uint64(dev), chunk}
	if h.spareOf[key] < size {
		return fmt.Errorf("host: map of %d spare bytes of %d-byte chunks on device %d, which keeps %d", size, chunk, dev, h.spareOf[key])
	}
	if err := h.ranges[base].checkChunks(base, ptr, size, false, "map of spare chunks"); err != nil {
		return err
	}
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, ptr, uintptr(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0); errno != 0 {
		return fmt.Errorf("host: mapping %d spare bytes at %#x on device %d: %w", size, ptr, dev, errno)
	}
	r := h.ranges[base]
	r.mapped += size
	r.mark(base, ptr, size, true)
	h.ranges[base] = r
	h.starts.Add(ptr, size, chunk)
	h.spareOf[key] -= size
	return nil
}

// ReleaseKept gives size bytes of dev's spare chunks of chunk bytes back to
// its capacity.
func (h *Backend) ReleaseKept(dev int, size, chunk uint64) error {
	if err := h.check(dev); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	key := [2]uint64{uint64(dev), chunk}
	if h.spareOf[key] < size {
		return fmt.Errorf("host: release of %d spare bytes of %d-byte chunks on device %d, which keeps %d", size, chunk, dev, h.spareOf[key])
	}
	h.spareOf[key] -= size
	h.used[dev] -= size
	return nil
}

// Chunks reports dev's chunk bytes mapped in expandable ranges, and spare.
func (h *Backend) Chunks(dev int) (mapped, spare uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.ranges {
		if r.dev == dev {
			mapped += r.mapped
		}
	}
	for k, n := range h.spareOf {
		if k[0] == uint64(dev) {
			spare += n
		}
	}
	return mapped, spare
}

// MappedChunks reports which chunks of the first size bytes of the range
// reserved at base are mapped, and the bytes mapped in all of it
// (allocator.ChunkAuditor).
func (h *Backend) MappedChunks(dev int, base uintptr, size uint64) ([]bool, uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.ranges[base]
	if !ok || r.dev != dev || size > r.size {
		return nil, 0, fmt.Errorf("host: %#x+%d is not the start of a range reserved on device %d", base, size, dev)
	}
	return append([]bool(nil), r.chunks[:size/Granularity]...), r.mapped, nil
}

// Ranges reports how many expandable ranges are reserved (for leak checks).
func (h *Backend) Ranges() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ranges)
}
