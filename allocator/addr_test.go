package allocator

import "unsafe"

// addrOf is the address of b's first byte. The fake keeps b alive in its
// segment map, and Go's heap does not move objects.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
