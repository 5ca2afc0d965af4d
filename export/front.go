package main

/*
#include "shim_internal.h"
*/
import "C"
import (
	"fmt"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
)

// The front cache (front.cpp, front.h) as Go sees it: the settings that
// turn it on and bound it (read when the pool is made; initPool passes them
// with symmshim_front_enable), and the level in front of the pool
// (allocator.Front) that the pool asks to give its blocks back.

// Bounds of SYMM_POOL_FRONT_CACHE_MAX, the largest block the front cache
// keeps. The upper one bounds what it can park per CPU (4 blocks).
const (
	frontMaxDefault = 1 << 20
	frontMaxLimit   = 64 << 20
)

// frontCacheWanted reads SYMM_POOL_FRONT_CACHE (off unless "1": it pays
// for multi-threaded C callers, docs/SETTINGS.md says why) and
// SYMM_POOL_FRONT_CACHE_MAX (a size from 512 B to 64 MiB; 1 MiB when unset).
func frontCacheWanted(getenv func(string) string) (on bool, maxBlock uint64, err error) {
	if on, err = settings.PoolFrontCache.Flag(getenv, false); err != nil {
		return false, 0, fmt.Errorf("%w: %w", allocator.ErrInvalid, err)
	}
	maxBlock = frontMaxDefault
	if v := settings.PoolFrontCacheMax.Get(getenv); v != "" {
		n, perr := allocator.ParseSize(v)
		if perr != nil || n < 512 || n > frontMaxLimit {
			return false, 0, fmt.Errorf("%w: %w", allocator.ErrInvalid, settings.PoolFrontCacheMax.Refuse(v))
		}
		maxBlock = n
	}
	return on, maxBlock, nil
}

// cFront is the C front cache (front.cpp) as the pool sees it: the level
// in front of it (allocator.Front).
type cFront struct{}

func (cFront) Holds(dev int) bool { return C.symmshim_front_parked(C.int(dev)) != 0 }
func (cFront) Return(dev int)     { C.symmshim_front_drain(C.int(dev)) }

// Served reports what the front cache served itself on dev.
func (cFront) Served(dev int) (fc allocator.FrontCounts) {
	var out [3 * C.SYMMSHIM_STAT_TYPES]C.int64_t
	C.symmshim_front_served(C.int(dev), &out[0])
	for t := 1; t < len(fc); t++ {
		fc[t].N, fc[t].Bytes, fc[t].Req = int64(out[3*t]), int64(out[3*t+1]), int64(out[3*t+2])
	}
	return fc
}
