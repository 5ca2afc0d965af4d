package nvshmem

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// NVSHMEM 3.x's ABI (host/nvshmemx_api.h, device_host/nvshmem_types.h,
// bootstrap_device_host/nvshmem_uniqueid.h), declared here: no NVSHMEM
// headers at build time.
typedef struct { int version; char internal[124]; } symm_nvshmem_uid;
typedef struct { int version; symm_nvshmem_uid *id; int myrank; int nranks; } symm_nvshmem_uid_args;
typedef struct { int version; symm_nvshmem_uid_args uid_args; char content[96]; } symm_nvshmem_init_args;
typedef struct { int version; void *mpi_comm; symm_nvshmem_init_args args; } symm_nvshmem_init_attr;
_Static_assert(sizeof(symm_nvshmem_uid) == 128, "uniqueid_v1");
_Static_assert(sizeof(symm_nvshmem_uid_args) == 24, "uniqueid_args_v1");
_Static_assert(sizeof(symm_nvshmem_init_args) == 128, "init_args_v1");
_Static_assert(sizeof(symm_nvshmem_init_attr) == 144, "init_attr_v1");

#define SYMM_NVSHMEM_INIT_WITH_UNIQUEID (1 << 3)

static inline void symm_nvshmem_version(void *fn, int *a, int *b, int *c) {
  ((void (*)(int *, int *, int *))fn)(a, b, c);
}
static inline int symm_nvshmem_get_uid(void *fn, symm_nvshmem_uid *id) {
  memset(id, 0, sizeof *id);
  id->version = (1 << 16) + sizeof(symm_nvshmem_uid);
  return ((int (*)(symm_nvshmem_uid *))fn)(id);
}
// init sets the uid arguments (nvshmemx_set_attr_uniqueid_args) and calls
// nvshmemx_hostlib_init_attr with the struct versions the inline init sets.
static inline int symm_nvshmem_init(void *setArgs, void *init, int rank, int world, const void *uid) {
  symm_nvshmem_uid id;
  memcpy(&id, uid, sizeof id);
  symm_nvshmem_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.version = (1 << 16) + sizeof(symm_nvshmem_init_attr);
  attr.args.version = (1 << 16) + sizeof(symm_nvshmem_init_args);
  attr.args.uid_args.version = (1 << 16) + sizeof(symm_nvshmem_uid_args);
  int r = ((int (*)(int, int, const symm_nvshmem_uid *, symm_nvshmem_init_attr *))setArgs)(rank, world, &id, &attr);
  if (r != 0) return -1000 + r;
  return ((int (*)(unsigned, symm_nvshmem_init_attr *))init)(SYMM_NVSHMEM_INIT_WITH_UNIQUEID, &attr);
}
static inline int symm_nvshmem_int(void *fn) { return ((int (*)(void))fn)(); }
static inline void symm_nvshmem_void(void *fn) { ((void (*)(void))fn)(); }
static inline uintptr_t symm_nvshmem_malloc(void *fn, size_t n) { return (uintptr_t)((void *(*)(size_t))fn)(n); }
static inline uintptr_t symm_nvshmem_align(void *fn, size_t a, size_t n) {
  return (uintptr_t)((void *(*)(size_t, size_t))fn)(a, n);
}
static inline void symm_nvshmem_free(void *fn, uintptr_t p) { ((void (*)(void *))fn)((void *)p); }
static inline uintptr_t symm_nvshmem_ptr(void *fn, uintptr_t p, int pe) {
  return (uintptr_t)((void *(*)(const void *, int))fn)((const void *)p, pe);
}

// atexit: finalize without entering Go (the runtime may be gone by then).
static void *symm_nvshmem_finalize_fn;
static void symm_nvshmem_atexit(void) {
  if (symm_nvshmem_finalize_fn) symm_nvshmem_void(symm_nvshmem_finalize_fn);
}
static inline int symm_nvshmem_register_finalize(void *fn) {
  symm_nvshmem_finalize_fn = fn;
  return atexit(symm_nvshmem_atexit);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/libsymm/libsymm/internal/dl"
	"github.com/libsymm/libsymm/topology"
)

// UIDSize is the size of a bootstrap unique id (nvshmemx_uniqueid_t).
const UIDSize = 128

// SupportedMajor is the NVSHMEM major version whose ABI this package speaks.
const SupportedMajor = 3

// ErrNotInitialized is returned by heap calls before Init.
var ErrNotInitialized = errors.New("NVSHMEM is not initialized")

var symbols = []string{
	"nvshmemx_vendor_get_version_info", "nvshmemx_get_uniqueid", "nvshmemx_set_attr_uniqueid_args",
	"nvshmemx_hostlib_init_attr", "nvshmemx_hostlib_finalize", "nvshmemx_init_status",
	"nvshmem_my_pe", "nvshmem_n_pes", "nvshmem_malloc", "nvshmem_align", "nvshmem_free", "nvshmem_ptr",
}

// Lib is an opened NVSHMEM host library.
type Lib struct {
	lib     *dl.Lib
	path    string
	version string
	fn      map[string]unsafe.Pointer
	inited  bool
}

// Open opens the first of the candidate libraries that loads (see
// topology.Candidates; dirs are searched as site-packages), checks its
// version and that it exports every function used.
func Open(dirs []string) (*Lib, error) {
	l, path, err := topology.OpenFirst("nvshmem", dirs)
	if err != nil {
		return nil, fmt.Errorf("NVSHMEM: %w (set SYMM_NVSHMEM_LIB, or pip install nvidia-nvshmem-cu13)", err)
	}
	n, err := newLib(l, path)
	if err != nil {
		l.Close() // found, but unusable: say so rather than look further
		return nil, err
	}
	return n, nil
}

func newLib(l *dl.Lib, path string) (*Lib, error) {
	n := &Lib{lib: l, path: path, fn: map[string]unsafe.Pointer{}}
	var missing []string
	for _, s := range symbols {
		p, err := l.Lookup(s)
		if err != nil {
			missing = append(missing, s)
			continue
		}
		n.fn[s] = p
	}
	if f := n.fn["nvshmemx_vendor_get_version_info"]; f != nil {
		var a, b, c C.int
		C.symm_nvshmem_version(f, &a, &b, &c)
		n.version = fmt.Sprintf("%d.%d.%d", a, b, c)
		if a != SupportedMajor {
			return nil, fmt.Errorf("NVSHMEM %s at %s is not supported: libsymm speaks the ABI of NVSHMEM %d.x", n.version, path, SupportedMajor)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("NVSHMEM at %s (version %q) lacks %s: not a supported NVSHMEM 3.x host library",
			path, n.version, strings.Join(missing, ", "))
	}
	return n, nil
}

// Path is where the library was found; Version its version ("3.4.5").
func (n *Lib) Path() string    { return n.path }
func (n *Lib) Version() string { return n.version }

// UniqueID makes a bootstrap id (rank 0 does, and hands it to every rank).
func (n *Lib) UniqueID() ([]byte, error) {
	var id C.symm_nvshmem_uid
	if r := C.symm_nvshmem_get_uid(n.fn["nvshmemx_get_uniqueid"], &id); r != 0 {
		return nil, fmt.Errorf("nvshmemx_get_uniqueid returned %d", r)
	}
	return C.GoBytes(unsafe.Pointer(&id), UIDSize), nil
}

// Init joins rank of world through uid (collective: every rank calls it),
// with the caller's CUDA context current on this thread, and registers
// finalization at process exit.
func (n *Lib) Init(rank, world int, uid []byte) error {
	if n.inited {
		return errors.New("NVSHMEM is already initialized in this process")
	}
	if len(uid) != UIDSize {
		return fmt.Errorf("NVSHMEM unique id of %d bytes, expected %d", len(uid), UIDSize)
	}
	if err := os.Setenv("NVSHMEM_DISABLE_NVLS", "1"); err != nil { // never multicast
		return err
	}
	cuid := C.CBytes(uid)
	defer C.free(cuid)
	r := C.symm_nvshmem_init(n.fn["nvshmemx_set_attr_uniqueid_args"], n.fn["nvshmemx_hostlib_init_attr"], C.int(rank), C.int(world), cuid)
	switch {
	case r <= -1000:
		return fmt.Errorf("nvshmemx_set_attr_uniqueid_args(rank %d, world %d) returned %d", rank, world, r+1000)
	case r != 0:
		return fmt.Errorf("nvshmemx_hostlib_init_attr(rank %d of %d) returned %d (NVSHMEM_DEBUG=INFO says why; across hosts set NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME)", rank, world, r)
	}
	n.inited = true
	if pe, npes := n.MyPE(), n.NPEs(); pe != rank || npes != world {
		return fmt.Errorf("NVSHMEM made this process PE %d of %d, expected %d of %d", pe, npes, rank, world)
	}
	C.symm_nvshmem_register_finalize(n.fn["nvshmemx_hostlib_finalize"])
	return nil
}

// Initialized reports whether Init succeeded.
func (n *Lib) Initialized() bool { return n.inited }

func (n *Lib) MyPE() int { return int(C.symm_nvshmem_int(n.fn["nvshmem_my_pe"])) }
func (n *Lib) NPEs() int { return int(C.symm_nvshmem_int(n.fn["nvshmem_n_pes"])) }

// Malloc allocates size bytes aligned to align from the symmetric heap.
// Collective: every PE calls it with the same arguments, in the same order.
func (n *Lib) Malloc(size, align uint64) (uintptr, error) {
	if !n.inited {
		return 0, ErrNotInitialized
	}
	p := uintptr(C.symm_nvshmem_align(n.fn["nvshmem_align"], C.size_t(align), C.size_t(size)))
	if p == 0 {
		return 0, fmt.Errorf("nvshmem_align(%d, %d bytes) failed: the symmetric heap is full or the call was not collective (NVSHMEM_SYMMETRIC_SIZE sets the heap size)", align, size)
	}
	return p, nil
}

// Free returns p to the symmetric heap. Collective, like Malloc.
func (n *Lib) Free(p uintptr) error {
	if !n.inited {
		return ErrNotInitialized
	}
	C.symm_nvshmem_free(n.fn["nvshmem_free"], C.uintptr_t(p))
	return nil
}

// Ptr is PE pe's copy of symmetric address p, mapped in this process, or 0
// when that PE's memory cannot be reached with loads and stores (another
// node, or no peer access).
func (n *Lib) Ptr(p uintptr, pe int) uintptr {
	return uintptr(C.symm_nvshmem_ptr(n.fn["nvshmem_ptr"], C.uintptr_t(p), C.int(pe)))
}
