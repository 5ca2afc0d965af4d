package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/libsymm/libsymm/allocator"
)

// Expandable segments (allocator.Expander) over the driver's virtual memory
// management: an address range reserved once (cuMemAddressReserve), physical
// chunks created and mapped into it as the pool grows (cuMemCreate, cuMemMap,
// cuMemSetAccess), unmapped when it shrinks.
//
// Each chunk of the granularity is its own physical allocation, so that any
// chunk-aligned part of what was mapped can be unmapped alone (cuMemUnmap
// takes whole mappings). The handle is released right after the mapping is
// made: the mapping keeps the memory, and unmapping frees it, so no handle
// has to be remembered.

var _ allocator.Expander = (*Backend)(nil)

// Granularity is the driver's minimum allocation granularity on dev (2 MiB
// on current GPUs).
func (b *Backend) Granularity(dev int) (uint64, error) {
	m, _, err := b.d.granularity(dev)
	return m, err
}

// ReserveRange reserves size bytes of dev's address space, aligned to the
// granularity, with nothing mapped.
func (b *Backend) ReserveRange(dev int, size uint64) (uintptr, error) {
	g, err := b.Granularity(dev)
	if err != nil {
		return 0, err
	}
	return b.d.addressReserve(dev, size, g)
}

// FreeRange gives back a range from ReserveRange.
func (b *Backend) FreeRange(dev int, ptr uintptr, size uint64) error {
	return b.d.addressFree(dev, ptr, size)
}

// MapChunks maps new memory of dev at [ptr, ptr+size), readable and
// writable by dev. Out of memory wraps CUDA_ERROR_OUT_OF_MEMORY. On any
// failure what was mapped is unmapped again.
func (b *Backend) MapChunks(dev int, ptr uintptr, size uint64) error {
	g, err := b.Granularity(dev)
	if err != nil {
		return err
	}
	if size == 0 || size%g != 0 || uint64(ptr)%g != 0 {
		return fmt.Errorf("cuda: map of %#x+%d on device %d: not whole %d-byte chunks", ptr, size, dev, g)
	}
	for off := uint64(0); off < size; off += g {
		if err := b.mapChunk(dev, ptr+uintptr(off), g); err != nil {
			return undone(err, b.unmapEach(dev, ptr, off, g))
		}
	}
	if err := b.d.setAccess(dev, ptr, size, []int{dev}); err != nil {
		return undone(err, b.unmapEach(dev, ptr, size, g))
	}
	return nil
}

func (b *Backend) mapChunk(dev int, at uintptr, g uint64) error {
	h, err := b.d.memCreate(dev, g)
	if err != nil {
		return err
	}
	err = b.d.memMap(dev, at, g, h)
	if rerr := b.d.memRelease(dev, h); rerr != nil {
		if err == nil {
			// Mapped, but the handle stays held: unmap it so nothing leaks
			// unaccounted, and report the release failure.
			return undone(rerr, b.d.memUnmap(dev, at, g))
		}
		return undone(err, rerr)
	}
	return err
}

// unmapEach unmaps [ptr, ptr+size) chunk by chunk, going on past failures.
func (b *Backend) unmapEach(dev int, ptr uintptr, size, g uint64) error {
	var first error
	for off := uint64(0); off < size; off += g {
		if err := b.d.memUnmap(dev, ptr+uintptr(off), g); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// UnmapChunks frees the memory mapped at [ptr, ptr+size). cuMemUnmap does
// not wait for work that may still use the memory: the pool waits for the
// segment's stream before it calls this (PyTorch synchronizes the segment's
// stream for the same reason), so nothing here synchronizes the device.
func (b *Backend) UnmapChunks(dev int, ptr uintptr, size uint64) error {
	g, err := b.Granularity(dev)
	if err != nil {
		return err
	}
	if size == 0 || size%g != 0 || uint64(ptr)%g != 0 {
		return fmt.Errorf("cuda: unmap of %#x+%d on device %d: not whole %d-byte chunks", ptr, size, dev, g)
	}
	return b.unmapEach(dev, ptr, size, g)
}
