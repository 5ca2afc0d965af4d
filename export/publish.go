package main

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/publish"
	"github.com/libsymm/libsymm/symmetric"
)

// publishInterval is how often the statistics page is refreshed.
const publishInterval = 250 * time.Millisecond

// publishOnce makes the process's statistics page (package publish) with
// the pool, unless SYMM_PUBLISH=0 (initPool reads it). Its refresh runs on its own goroutine and
// reads each device's statistics the way symm_pool_stats does: the front
// cache's blocks of the device go back to the pool first (Pool.Stats; the
// pool counts a parked block as allocated), so the page equals the
// process's own memory_stats(). The cost is the parked blocks at each refresh (every
// publishInterval): the next request of their sizes goes to the pool once.
var publishOnce sync.Once

// startPublishing makes the page for pool p (once per process). A failure
// is not the pool's: it is printed once and the program goes on.
func startPublishing(p *allocator.Pool, backend string) {
	publishOnce.Do(func() {
		w, err := publish.Create(publish.Dir(getenv), publish.Source{
			Devices: p.DeviceCount(), Names: allocator.StatNames(), Backend: backend,
			Stats: p.Stats,
			Streams: func(dev int) ([]publish.Stream, error) {
				us, err := p.StreamUsage(dev)
				out := make([]publish.Stream, len(us))
				for i, u := range us {
					out[i] = publish.Stream{Stream: uint64(u.Stream), Private: u.Private,
						Allocated: u.Allocated, Reserved: u.Reserved, Segments: int64(u.Segments)}
				}
				return out, err
			},
			Symmetric: symmetricUsage,
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "symm: statistics for symm top are not published: %v (SYMM_PUBLISH=0 turns this off)\n", err)
			return
		}
		cs := C.CString(w.Path())
		C.symmshim_publish_path(cs)
		C.free(unsafe.Pointer(cs))
		w.Run(publishInterval)
	})
}

// lastSymm is the symmetric memory last read: kept while the manager is
// being made (its lock held), so the refresh never waits for a rendezvous.
var lastSymm publish.Symmetric

func symmetricUsage() publish.Symmetric {
	if !symmLib.mu.TryLock() {
		return lastSymm
	}
	m := symmLib.mgr
	symmLib.mu.Unlock()
	if m == nil {
		return lastSymm
	}
	u := m.Usage()
	lastSymm = toPublished(u)
	return lastSymm
}

func toPublished(u symmetric.Usage) publish.Symmetric {
	return publish.Symmetric{Blocks: u.Blocks, Bytes: u.Bytes, Handles: u.Handles, PeerMappings: u.PeerMappings}
}
