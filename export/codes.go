package main

/*
#include "shim_internal.h"
*/
import "C"

import "github.com/libsymm/libsymm/allocator"

// The numbers that the C++ shim and Go pass each other: shim_internal.h
// defines them (its C part), Go reads them here, by name. And the numbers
// that include/symm.h and a Go package each define because that package is
// pure Go (no cgo: allocator): checked equal here, so that libsymm does not
// build when they differ.
const (
	// goPoolRoute's operations (routes.cpp).
	routeBegin   = C.SYMMSHIM_ROUTE_BEGIN
	routeEnd     = C.SYMMSHIM_ROUTE_END
	routeRelease = C.SYMMSHIM_ROUTE_RELEASE

	// goPoolSetPool's operations (wrappers.cpp).
	setPoolUseOnOOM = C.SYMMSHIM_SET_POOL_USE_ON_OOM
	setPoolNoSplit  = C.SYMMSHIM_SET_POOL_NO_SPLIT

	// The pool's backend: lib.backend, goPoolBackend (wrappers.cpp's
	// symm_pool_backend names them).
	backendNone = C.SYMMSHIM_BACKEND_NONE
	backendCUDA = C.SYMMSHIM_BACKEND_CUDA
	backendHost = C.SYMMSHIM_BACKEND_HOST
)

// allocAPIs names the public entry points of an allocation, by the api
// number the shim passes (SYMMSHIM_API_*): the names the errors carry, read
// once from shim_internal.h (no allocation on the calls).
var allocAPIs = func() (names [C.SYMMSHIM_APIS]string) {
	for i := range names {
		names[i] = C.GoString(C.symmshim_api_name(C.int(i)))
	}
	return names
}()

// The statistics types are the allocator's (stAll is 0 there as well):
// these fail to compile when shim_internal.h's SYMMSHIM_STAT_* differ.
const (
	_ = uint(C.SYMMSHIM_STAT_SMALL_POOL-allocator.StatSmallPool) + uint(allocator.StatSmallPool-C.SYMMSHIM_STAT_SMALL_POOL)
	_ = uint(C.SYMMSHIM_STAT_LARGE_POOL-allocator.StatLargePool) + uint(allocator.StatLargePool-C.SYMMSHIM_STAT_LARGE_POOL)
	_ = uint(C.SYMMSHIM_STAT_ALL) + uint(-C.SYMMSHIM_STAT_ALL)
	_ = uint(C.SYMMSHIM_STAT_TYPES-len(allocator.FrontCounts{})) + uint(len(allocator.FrontCounts{})-C.SYMMSHIM_STAT_TYPES)
)

// The block states of include/symm.h are allocator.BlockStatus's values
// (export/pools.go converts one into the other as they are).
const (
	_ = uint(C.SYMM_BLOCK_FREE-allocator.StatusFree) + uint(allocator.StatusFree-C.SYMM_BLOCK_FREE)
	_ = uint(C.SYMM_BLOCK_ALLOCATED-allocator.StatusAllocated) + uint(allocator.StatusAllocated-C.SYMM_BLOCK_ALLOCATED)
	_ = uint(C.SYMM_BLOCK_PENDING-allocator.StatusPending) + uint(allocator.StatusPending-C.SYMM_BLOCK_PENDING)
)

// backendNames names each backend as symm_pool_backend and the statistics
// page do.
var backendNames = map[int32]string{backendCUDA: "cuda", backendHost: "host"}
