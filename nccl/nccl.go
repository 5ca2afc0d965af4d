package nccl

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef struct { char internal[128]; } symm_ncclUniqueId;

static inline ncclResult_t symm_nccl_int(void *fn, int *v) { return ((ncclResult_t(*)(int *))fn)(v); }
static inline ncclResult_t symm_nccl_uid(void *fn, void *id) { return ((ncclResult_t(*)(symm_ncclUniqueId *))fn)((symm_ncclUniqueId *)id); }
// ncclCommInitRank takes the unique id by value.
static inline ncclResult_t symm_nccl_init_rank(void *fn, uintptr_t *comm, int nranks, const void *id, int rank) {
  symm_ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  return ((ncclResult_t(*)(void **, int, symm_ncclUniqueId, int))fn)((void **)comm, nranks, u, rank);
}
static inline ncclResult_t symm_nccl_comm_int(void *fn, uintptr_t comm, int *v) {
  return ((ncclResult_t(*)(void *, int *))fn)((void *)comm, v);
}
static inline ncclResult_t symm_nccl_mem_alloc(void *fn, uintptr_t *p, size_t n) { return ((ncclResult_t(*)(void **, size_t))fn)((void **)p, n); }
static inline ncclResult_t symm_nccl_mem_free(void *fn, uintptr_t p) { return ((ncclResult_t(*)(void *))fn)((void *)p); }
static inline ncclResult_t symm_nccl_win_reg(void *fn, uintptr_t comm, uintptr_t p, size_t n, uintptr_t *win, int flags) {
  return ((ncclResult_t(*)(void *, void *, size_t, void **, int))fn)((void *)comm, (void *)p, n, (void **)win, flags);
}
static inline ncclResult_t symm_nccl_win_dereg(void *fn, uintptr_t comm, uintptr_t win) {
  return ((ncclResult_t(*)(void *, void *))fn)((void *)comm, (void *)win);
}
static inline const char *symm_nccl_errstr(void *fn, ncclResult_t r) { return ((const char *(*)(ncclResult_t))fn)(r); }
static inline const char *symm_nccl_lasterr(void *fn, uintptr_t comm) { return ((const char *(*)(void *))fn)((void *)comm); }
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/libsymm/libsymm/internal/dl"
	"github.com/libsymm/libsymm/topology"
)

// UIDSize is the size of ncclUniqueId.
const UIDSize = 128

// WinCollSymmetric is NCCL_WIN_COLL_SYMMETRIC.
const WinCollSymmetric = 0x01

// Version code of 2.27.0, the first NCCL with symmetric windows.
const minWindowVersion = 22700

var required = []string{
	"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommCount", "ncclCommUserRank",
	"ncclMemAlloc", "ncclMemFree", "ncclGetErrorString", "ncclCommWindowRegister", "ncclCommWindowDeregister",
}

// Lib is an opened NCCL.
type Lib struct {
	lib     *dl.Lib
	path    string
	code    int
	version string
	fn      map[string]unsafe.Pointer
}

// Open opens the first candidate NCCL that loads and checks that it has
// symmetric windows (2.27 or later).
func Open(dirs []string) (*Lib, error) {
	l, path, err := topology.OpenFirst("nccl", dirs)
	if err != nil {
		return nil, fmt.Errorf("NCCL: %w (set SYMM_NCCL_LIB, or pip install nvidia-nccl-cu13)", err)
	}
	n, err := newLib(l, path)
	if err != nil {
		l.Close() // found, but unusable: say so rather than look further
		return nil, err
	}
	return n, nil
}

// VersionString writes an NCCL version code: 22809 is 2.28.9 (before
// 2.9: 2708 is 2.7.8).
func VersionString(code int) string {
	if code >= 10000 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
}

// Features says what NCCL version code gives this backend.
func Features(code int) string {
	switch {
	case code < 21900:
		return "no ncclMemAlloc (2.19+): unusable for symmetric memory"
	case code < minWindowVersion:
		return "ncclMemAlloc, but no symmetric windows (2.27+)"
	case code < 22900:
		return "ncclMemAlloc and symmetric windows; peers mapped through exported VMM handles (ncclGetPeerDevicePointer is 2.29+)"
	}
	return "ncclMemAlloc, symmetric windows, ncclGetPeerDevicePointer"
}

func newLib(l *dl.Lib, path string) (*Lib, error) {
	n := &Lib{lib: l, path: path, fn: map[string]unsafe.Pointer{}}
	f, err := l.Lookup("ncclGetVersion")
	if err != nil {
		return nil, fmt.Errorf("NCCL at %s has no ncclGetVersion: not an NCCL library", path)
	}
	var v C.int
	if r := C.symm_nccl_int(f, &v); r != 0 {
		return nil, fmt.Errorf("NCCL at %s: ncclGetVersion returned %d", path, r)
	}
	n.code, n.version = int(v), VersionString(int(v))
	if n.code < minWindowVersion {
		return nil, fmt.Errorf("NCCL %s at %s is too old for the NCCL backend: it needs symmetric windows, NCCL 2.27 or later (%s)",
			n.version, path, Features(n.code))
	}
	var missing []string
	for _, s := range required {
		p, err := l.Lookup(s)
		if err != nil {
			missing = append(missing, s)
			continue
		}
		n.fn[s] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("NCCL %s at %s lacks %s", n.version, path, strings.Join(missing, ", "))
	}
	return n, nil
}

func (n *Lib) Path() string    { return n.path }
func (n *Lib) Version() string { return n.version }

func (n *Lib) err(call string, r C.ncclResult_t, comm uintptr) error {
	if r == 0 {
		return nil
	}
	msg := C.GoString(C.symm_nccl_errstr(n.fn["ncclGetErrorString"], r))
	if f, err := n.lib.Lookup("ncclGetLastError"); err == nil {
		if last := C.symm_nccl_lasterr(f, C.uintptr_t(comm)); last != nil && C.GoString(last) != "" {
			msg += ": " + C.GoString(last)
		}
	}
	return fmt.Errorf("%s: %s (NCCL error %d)", call, msg, int(r))
}

// UniqueID makes a communicator id (rank 0 does, and hands it to every rank).
func (n *Lib) UniqueID() ([]byte, error) {
	buf := C.calloc(1, UIDSize)
	defer C.free(buf)
	if err := n.err("ncclGetUniqueId", C.symm_nccl_uid(n.fn["ncclGetUniqueId"], buf), 0); err != nil {
		return nil, err
	}
	return C.GoBytes(buf, UIDSize), nil
}

// CommInitRank makes rank's communicator of world from rank 0's id
// (collective), on the device whose context is current.
func (n *Lib) CommInitRank(rank, world int, uid []byte) (uintptr, error) {
	if len(uid) != UIDSize {
		return 0, fmt.Errorf("NCCL unique id of %d bytes, expected %d", len(uid), UIDSize)
	}
	if err := os.Setenv("NCCL_NVLS_ENABLE", "0"); err != nil { // never multicast
		return 0, err
	}
	cuid := C.CBytes(uid)
	defer C.free(cuid)
	var comm C.uintptr_t
	r := C.symm_nccl_init_rank(n.fn["ncclCommInitRank"], &comm, C.int(world), cuid, C.int(rank))
	return uintptr(comm), n.err(fmt.Sprintf("ncclCommInitRank(rank %d of %d)", rank, world), r, 0)
}

// CommRankCount returns the communicator's rank and size.
func (n *Lib) CommRankCount(comm uintptr) (rank, count int, err error) {
	var r, c C.int
	if err := n.err("ncclCommUserRank", C.symm_nccl_comm_int(n.fn["ncclCommUserRank"], C.uintptr_t(comm), &r), comm); err != nil {
		return 0, 0, err
	}
	if err := n.err("ncclCommCount", C.symm_nccl_comm_int(n.fn["ncclCommCount"], C.uintptr_t(comm), &c), comm); err != nil {
		return 0, 0, err
	}
	return int(r), int(c), nil
}

// MemAlloc allocates size bytes with ncclMemAlloc on the current device.
func (n *Lib) MemAlloc(size uint64) (uintptr, error) {
	var p C.uintptr_t
	err := n.err(fmt.Sprintf("ncclMemAlloc(%d bytes)", size), C.symm_nccl_mem_alloc(n.fn["ncclMemAlloc"], &p, C.size_t(size)), 0)
	return uintptr(p), err
}

// MemFree frees memory from MemAlloc.
func (n *Lib) MemFree(p uintptr) error {
	return n.err("ncclMemFree", C.symm_nccl_mem_free(n.fn["ncclMemFree"], C.uintptr_t(p)), 0)
}

// WindowRegister registers [p, p+size) as a window of comm (collective over
// comm) with flags (WinCollSymmetric).
func (n *Lib) WindowRegister(comm, p uintptr, size uint64, flags int) (uintptr, error) {
	var win C.uintptr_t
	r := C.symm_nccl_win_reg(n.fn["ncclCommWindowRegister"], C.uintptr_t(comm), C.uintptr_t(p), C.size_t(size), &win, C.int(flags))
	return uintptr(win), n.err(fmt.Sprintf("ncclCommWindowRegister(%d bytes)", size), r, comm)
}

// WindowDeregister undoes WindowRegister (collective over comm).
func (n *Lib) WindowDeregister(comm, win uintptr) error {
	return n.err("ncclCommWindowDeregister", C.symm_nccl_win_dereg(n.fn["ncclCommWindowDeregister"], C.uintptr_t(comm), C.uintptr_t(win)), comm)
}
