package main

/*
#include <stddef.h>
#include <stdint.h>
#include "../include/symm.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"unsafe"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/symmetric"
	"github.com/libsymm/libsymm/topology"
)

//export goTopology
func goTopology(libDirs *C.char, buf *C.char, capacity C.size_t, n *C.size_t) (code C.int) {
	defer guard("symm_topology", &code)
	var dirs []string
	if libDirs != nil {
		dirs = filepath.SplitList(C.GoString(libDirs))
	}
	// No driver is an answer ("driver": {"found": false}), not an error.
	t, _ := topology.Discover(topology.Options{LibraryDirs: dirs})
	kernels.Probe(t, dirs, kernels.CacheDir(getenv), false)
	raw, err := json.Marshal(t)
	if err == nil {
		err = copyOut("topology", raw, buf, capacity, n)
	}
	if err != nil {
		return fail("symm_topology", err)
	}
	return C.SYMM_OK
}

//export goAddLibraryDirs
func goAddLibraryDirs(dirs *C.char) (code C.int) {
	defer guard("symm_add_library_dirs", &code)
	if err := topology.AddLibraryDirs(filepath.SplitList(C.GoString(dirs))); err != nil {
		setError(C.SYMM_ERR_INVALID, "symm_add_library_dirs: "+err.Error())
		return C.SYMM_ERR_INVALID
	}
	return C.SYMM_OK
}

// copyOut hands raw (JSON) to C: its length into *n, and raw with a NUL into
// buf when buf is not NULL and capacity not 0 (else a size query). A buffer
// too small for both is symmetric.ErrInvalid naming what (the "topology").
func copyOut(what string, raw []byte, buf *C.char, capacity C.size_t, n *C.size_t) error {
	*n = C.size_t(len(raw))
	if buf == nil || capacity == 0 {
		return nil
	}
	if uint64(capacity) < uint64(len(raw))+1 {
		return fmt.Errorf("%w: the buffer holds %d bytes; the %s needs %d (and a NUL)", symmetric.ErrInvalid, capacity, what, len(raw))
	}
	dst := cBytes(unsafe.Pointer(buf), capacity, len(raw)+1)
	dst[copy(dst, raw)] = 0
	return nil
}

//export goWorldWithinDirectAccess
func goWorldWithinDirectAccess(s C.int64_t, group *C.char, rank, world, device C.int, out *C.int) (code C.int) {
	defer guard("symm_world_within_direct_access", &code)
	m, err := getManager()
	if err != nil {
		return fail("symm_world_within_direct_access", err)
	}
	e, err := stores.get(int64(s))
	if err != nil {
		return fail("symm_world_within_direct_access", err)
	}
	ok, err := m.WorldWithinDirectAccess(int(device), symmetric.Group{Name: C.GoString(group), Rank: int(rank), World: int(world), Store: e.s})
	if err != nil {
		return fail("symm_world_within_direct_access", err)
	}
	*out = 0
	if ok {
		*out = 1
	}
	return C.SYMM_OK
}
