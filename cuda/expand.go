package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"

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

var (
	_ allocator.Expander    = (*Backend)(nil)
	_ allocator.ChunkKeeper = (*Backend)(nil)
)

// chunkDriver is what expandable segments ask of the driver, behind an
// interface so that their failure paths (a chunk that will not unmap, a
// handle that will not release) are tested without a GPU (expand_test.go).
// *driver implements it.
type chunkDriver interface {
	granularity(dev int) (minimum, recommended uint64, err error)
	memCreate(dev int, size uint64) (uint64, error)
	memRelease(dev int, h uint64) error
	memMap(dev int, ptr uintptr, size, h uint64) error
	memUnmap(dev int, ptr uintptr, size uint64) error
	setAccess(dev int, ptr uintptr, size uint64, devs []int) error
	retainAllocationHandle(dev int, ptr uintptr) (uint64, error)
}

var _ chunkDriver = (*driver)(nil)

// Granularity is the driver's minimum allocation granularity on dev (2 MiB
// on current GPUs).
func (b *Backend) Granularity(dev int) (uint64, error) {
	m, _, err := b.vm.granularity(dev)
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

// checkChunks validates a Map/Unmap/Keep request: chunk a multiple of the
// granularity g, size a positive multiple of chunk, ptr aligned to g.
func checkChunks(op string, dev int, ptr uintptr, size, chunk, g uint64) error {
	if chunk == 0 || chunk%g != 0 || size == 0 || size%chunk != 0 || uint64(ptr)%g != 0 {
		return fmt.Errorf("cuda: %s of %#x+%d on device %d: not whole %d-byte chunks of the %d-byte granularity", op, ptr, size, dev, chunk, g)
	}
	return nil
}

// MapChunks maps new memory of dev at [ptr, ptr+size), readable and
// writable by dev, one physical allocation (cuMemCreate) per chunk: the
// driver's cost is mostly per allocation, so a 20 MiB chunk maps its bytes
// several times faster than ten 2 MiB ones. Out of memory wraps
// CUDA_ERROR_OUT_OF_MEMORY. On any failure what was mapped is unmapped
// again.
func (b *Backend) MapChunks(dev int, ptr uintptr, size, chunk uint64) error {
	g, err := b.Granularity(dev)
	if err != nil {
		return err
	}
	if err := checkChunks("map", dev, ptr, size, chunk, g); err != nil {
		return err
	}
	for off := uint64(0); off < size; off += chunk {
		if err := b.mapChunk(dev, ptr+uintptr(off), chunk); err != nil {
			return undone(err, b.unmapEach(dev, ptr, off, chunk))
		}
	}
	if err := b.vm.setAccess(dev, ptr, size, []int{dev}); err != nil {
		return undone(err, b.unmapEach(dev, ptr, size, chunk))
	}
	b.countMapped(dev, int64(size))
	return nil
}

// countMapped adds n to the chunk bytes mapped on dev.
func (b *Backend) countMapped(dev int, n int64) {
	b.spareMu.Lock()
	b.mapped[dev] = uint64(int64(b.mapped[dev]) + n)
	b.spareMu.Unlock()
}

func (b *Backend) mapChunk(dev int, at uintptr, chunk uint64) error {
	h, err := b.vm.memCreate(dev, chunk)
	if err != nil {
		return err
	}
	err = b.vm.memMap(dev, at, chunk, h)
	if rerr := b.vm.memRelease(dev, h); rerr != nil {
		if err == nil {
			// Mapped, but the handle stays held: unmap it so nothing leaks
			// unaccounted, and report the release failure.
			return undone(rerr, b.vm.memUnmap(dev, at, chunk))
		}
		return undone(err, rerr)
	}
	return err
}

// unmapEach unmaps [ptr, ptr+size) chunk by chunk, going on past failures.
func (b *Backend) unmapEach(dev int, ptr uintptr, size, chunk uint64) error {
	var first error
	for off := uint64(0); off < size; off += chunk {
		if err := b.vm.memUnmap(dev, ptr+uintptr(off), chunk); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// UnmapChunks frees the memory mapped at [ptr, ptr+size), chunk by chunk
// (each is its own allocation, and cuMemUnmap takes whole mappings), and
// returns the bytes unmapped: size, or at the first chunk that fails the
// bytes before it, the rest staying mapped, so that the pool books exactly
// what went. cuMemUnmap does not wait for work that may still use the
// memory: the pool waits for the segment's stream before it calls this
// (PyTorch synchronizes the segment's stream for the same reason), so
// nothing here synchronizes the device.
func (b *Backend) UnmapChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	g, err := b.Granularity(dev)
	if err != nil {
		return 0, err
	}
	if err := checkChunks("unmap", dev, ptr, size, chunk, g); err != nil {
		return 0, err
	}
	for off := uint64(0); off < size; off += chunk {
		if err := b.vm.memUnmap(dev, ptr+uintptr(off), chunk); err != nil {
			b.countMapped(dev, -int64(off))
			return off, err
		}
	}
	b.countMapped(dev, -int64(size))
	return size, nil
}

// Spare chunks (allocator.ChunkKeeper). A mapped chunk's handle was
// released when it was mapped, so the mapping alone holds its memory;
// KeepChunks takes a new reference to it (cuMemRetainAllocationHandle)
// before unmapping, which keeps the memory alive without a mapping. MapKept
// maps such a handle again and drops the reference, and ReleaseKept drops
// it without mapping, which frees the memory. Moving a chunk therefore
// costs no cuMemCreate or cuMemRelease of memory: the driver's slow calls.

// spareChunk is a kept chunk: a handle holding size bytes of memory.
type spareChunk struct{ h, size uint64 }

// KeepChunks unmaps [ptr, ptr+size) chunk by chunk, keeping each chunk's
// memory as a spare handle of dev. On error the chunks before the failing
// one are kept and the rest stay mapped. References a mapping of spare
// chunks could not drop are dropped first (a failure there is reported by
// ReleaseKept, which the pool calls after every mapping).
func (b *Backend) KeepChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	g, err := b.Granularity(dev)
	if err != nil {
		return 0, err
	}
	_ = b.releaseLeftover(dev)
	if err := checkChunks("unmap", dev, ptr, size, chunk, g); err != nil {
		return 0, err
	}
	for off := uint64(0); off < size; off += chunk {
		at := ptr + uintptr(off)
		h, err := b.vm.retainAllocationHandle(dev, at)
		if err != nil {
			return off, err
		}
		if err := b.vm.memUnmap(dev, at, chunk); err != nil {
			return off, undone(err, b.vm.memRelease(dev, h))
		}
		b.spareMu.Lock()
		b.spare[dev] = append(b.spare[dev], spareChunk{h, chunk})
		b.mapped[dev] -= chunk
		b.spareMu.Unlock()
	}
	return size, nil
}

// takeSpare removes n spare chunks of chunk bytes from dev's spare and
// returns their handles, or an error naming what dev keeps.
func (b *Backend) takeSpare(dev, n int, chunk uint64) ([]uint64, error) {
	b.spareMu.Lock()
	defer b.spareMu.Unlock()
	have := b.spare[dev]
	hs := make([]uint64, 0, n)
	rest := have[:0:0]
	for i := len(have) - 1; i >= 0; i-- {
		if len(hs) < n && have[i].size == chunk {
			hs = append(hs, have[i].h)
		} else {
			rest = append(rest, have[i])
		}
	}
	if len(hs) < n {
		return nil, fmt.Errorf("cuda: %d spare chunks of %d bytes wanted on device %d, which keeps %d of them", n, chunk, dev, len(hs))
	}
	slices.Reverse(rest)
	b.spare[dev] = rest
	return hs, nil
}

// putSpare gives handles of chunk bytes back to dev's spare.
func (b *Backend) putSpare(dev int, hs []uint64, chunk uint64) {
	b.spareMu.Lock()
	for _, h := range hs {
		b.spare[dev] = append(b.spare[dev], spareChunk{h, chunk})
	}
	b.spareMu.Unlock()
}

// MapKept maps [ptr, ptr+size) with size bytes of dev's spare chunks of
// chunk bytes, readable and writable by dev. On error nothing is mapped and
// the spare is as it was.
func (b *Backend) MapKept(dev int, ptr uintptr, size, chunk uint64) error {
	g, err := b.Granularity(dev)
	if err != nil {
		return err
	}
	if err := checkChunks("map", dev, ptr, size, chunk, g); err != nil {
		return err
	}
	hs, err := b.takeSpare(dev, int(size/chunk), chunk)
	if err != nil {
		return err
	}
	giveBack := func(mapped int, err error) error {
		err = undone(err, b.unmapEach(dev, ptr, uint64(mapped)*chunk, chunk))
		b.putSpare(dev, hs, chunk)
		return err
	}
	for i, h := range hs {
		if err := b.vm.memMap(dev, ptr+uintptr(uint64(i)*chunk), chunk, h); err != nil {
			return giveBack(i, err)
		}
	}
	if err := b.vm.setAccess(dev, ptr, size, []int{dev}); err != nil {
		return giveBack(len(hs), err)
	}
	b.countMapped(dev, int64(size))
	// The mappings hold the memory now: the mapping is made, whatever
	// follows. A reference that cannot be dropped now would keep its chunk
	// alive after the unmap; it is kept and dropped again by the next
	// KeepChunks or ReleaseKept, which report it if it still fails.
	for i, h := range hs {
		if err := b.vm.memRelease(dev, h); err != nil {
			b.spareMu.Lock()
			b.unreleased[dev] = append(b.unreleased[dev], hs[i:]...)
			b.spareMu.Unlock()
			break
		}
	}
	return nil
}

// releaseLeftover drops the references MapKept could not drop. Those that
// fail again stay, and the first error is returned.
func (b *Backend) releaseLeftover(dev int) error {
	b.spareMu.Lock()
	hs := b.unreleased[dev]
	b.unreleased[dev] = nil
	b.spareMu.Unlock()
	for i, h := range hs {
		if err := b.vm.memRelease(dev, h); err != nil {
			b.spareMu.Lock()
			b.unreleased[dev] = append(b.unreleased[dev], hs[i:]...)
			b.spareMu.Unlock()
			return fmt.Errorf("cuda: dropping %d chunk references left by a mapping of spare chunks on device %d (their memory outlives their unmap until then): %w", len(hs)-i, dev, err)
		}
	}
	return nil
}

// ReleaseKept releases size bytes of dev's spare chunks of chunk bytes
// (cuMemRelease of their handles, which frees their memory), the most
// recently kept first. References a mapping of spare chunks left are
// dropped too, and a failure there is reported with the rest.
func (b *Backend) ReleaseKept(dev int, size, chunk uint64) error {
	leftErr := b.releaseLeftover(dev)
	if chunk == 0 || size%chunk != 0 {
		return errors.Join(fmt.Errorf("cuda: release of %d spare bytes on device %d: not whole %d-byte chunks", size, dev, chunk), leftErr)
	}
	hs, err := b.takeSpare(dev, int(size/chunk), chunk)
	if err != nil {
		return errors.Join(err, leftErr)
	}
	var first error
	for j, h := range hs {
		if err := b.vm.memRelease(dev, h); err != nil {
			// Those not released stay spare, to be released later.
			b.putSpare(dev, hs[j:], chunk)
			first = err
			break
		}
	}
	return errors.Join(first, leftErr)
}

func spareBytes(cs []spareChunk) uint64 {
	var n uint64
	for _, c := range cs {
		n += c.size
	}
	return n
}

// Chunks reports dev's chunk bytes mapped through MapChunks and MapKept and
// not unmapped, and its spare chunk bytes.
func (b *Backend) Chunks(dev int) (mapped, spare uint64) {
	b.spareMu.Lock()
	defer b.spareMu.Unlock()
	return b.mapped[dev], spareBytes(b.spare[dev])
}
