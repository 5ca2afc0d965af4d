package allocator

import "fmt"

// SegmentOf returns the segment that holds the allocated block at, or
// containing, ptr: its base address, its mapped size and whether it is an
// expandable segment. PyTorch's CUDA IPC (torch.multiprocessing) shares a
// whole segment, cuMemAlloc's unit, and sends the block's offset in it.
// A pointer in no allocated block of the pool is ErrUnknownPointer.
func (p *Pool) SegmentOf(ptr uintptr) (base uintptr, size uint64, expandable bool, err error) {
	s, b := p.findContaining(ptr)
	if b == nil {
		return 0, 0, false, fmt.Errorf("%w: %#x is not in a block this pool has allocated", ErrUnknownPointer, ptr)
	}
	seg := b.seg
	base, size, expandable = seg.ptr, seg.size, seg.vsize != 0
	s.mu.Unlock()
	return base, size, expandable, nil
}
