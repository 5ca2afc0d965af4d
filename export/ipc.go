package main

/*
#include <stdint.h>
*/
import "C"

// goPoolSegmentOf is symm_pool_segment_of (export/ipc.cpp): the segment of
// the allocated block holding ptr, for PyTorch's CUDA IPC.
//
//export goPoolSegmentOf
func goPoolSegmentOf(ptr C.uintptr_t, base, size *C.uint64_t, expandable *C.int) (rc C.int) {
	const fn = "symm_pool_segment_of"
	defer func() {
		if recovered(fn, recover()) {
			rc = C.int(7) // SYMM_ERR_INTERNAL
		}
	}()
	p, err := getPool()
	if err != nil {
		return fail(fn, err)
	}
	b, n, exp, err := p.SegmentOf(uintptr(ptr))
	if err != nil {
		return fail(fn, err)
	}
	*base, *size = C.uint64_t(b), C.uint64_t(n)
	*expandable = 0
	if exp {
		*expandable = 1
	}
	return 0
}
