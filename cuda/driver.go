package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/libsymm/libsymm/internal/dl"
	"github.com/libsymm/libsymm/internal/env"
	"github.com/libsymm/libsymm/internal/settings"
)

// DefaultLibrary is the driver library opened when neither WithLibrary nor
// SYMM_CUDA_LIB names another. It is the soname the driver installs (the
// unversioned libcuda.so exists only with a development install, and may be
// the toolkit's stub, which fails every call with CUDA_ERROR_STUB_LIBRARY).
const DefaultLibrary = "libcuda.so.1"

// abiVersion is the CUDA version whose ABI every function is requested at,
// as c10/cuda/driver_api.h does: cuGetProcAddress("cuMemAlloc", 12000)
// returns cuMemAlloc_v2, and keeps returning it from newer drivers even if
// they add a cuMemAlloc_v3 with another prototype. The trampolines in shim.h
// are written for exactly this ABI.
const abiVersion = 12000

// getProcDefault is CU_GET_PROC_ADDRESS_DEFAULT. Stream arguments are passed
// explicitly (0 is sent as CU_STREAM_LEGACY, see streamArg), so whether the
// driver hands out the legacy or the per-thread-default-stream variant does
// not change what any call here means.
const getProcDefault = 0

// fnID indexes the driver's function table.
type fnID int

const (
	fnInit fnID = iota
	fnDriverGetVersion
	fnDeviceGetCount
	fnDeviceGet
	fnDeviceGetName
	fnDeviceTotalMem
	fnDeviceGetAttribute
	fnDevicePrimaryCtxRetain
	fnDevicePrimaryCtxRelease
	fnCtxGetCurrent
	fnCtxSetCurrent
	fnCtxPushCurrent
	fnCtxPopCurrent
	fnCtxGetDevice
	fnCtxSynchronize
	fnMemAlloc
	fnMemFree
	fnMemGetInfo
	fnMemcpyHtoD
	fnMemcpyDtoH
	fnMemsetD8
	fnEventCreate
	fnEventRecord
	fnEventQuery
	fnEventSynchronize
	fnEventDestroy
	fnStreamCreate
	fnStreamDestroy
	fnStreamSynchronize
	fnGetErrorName
	fnGetErrorString
	fnPointerGetAttribute

	// Optional: resolved at load when the driver has them, left nil when it
	// does not; a call through a nil one returns a *MissingSymbolError.
	fnMemCreate
	fnMemRelease
	fnMemAddressReserve
	fnMemAddressFree
	fnMemMap
	fnMemUnmap
	fnMemSetAccess
	fnMemExportToShareableHandle
	fnMemImportFromShareableHandle
	fnMemGetAllocationGranularity
	fnMemRetainAllocationHandle
	fnStreamWriteValue32
	fnStreamWaitValue32
	fnStreamQuery
	fnDeviceCanAccessPeer
	fnThreadExchangeStreamCaptureMode
	fnModuleLoadData
	fnModuleUnload
	fnModuleGetFunction
	fnLaunchKernel
	fnMemHostAlloc
	fnMemHostGetDevicePointer
	fnMemFreeHost
	fnStreamGetCaptureInfo
	fnGraphNodeGetDependencies
	fnStreamUpdateCaptureDependencies
	fnGraphAddEmptyNode
	fnStreamBeginCapture
	fnStreamEndCapture
	fnGraphDestroy
	fnStreamWaitEvent
	// The same functions at CUDA 12.3's ABI, with edge data (symbol.ver);
	// after the 12.0 ones, so that Proc, which returns the first entry of a
	// name, answers at the table's ABI.
	fnStreamGetCaptureInfoEdges
	fnGraphNodeGetDependenciesEdges
	fnStreamUpdateCaptureDependenciesEdges

	numFns
)

// symbol describes one entry of the function table.
type symbol struct {
	name     string // base name given to cuGetProcAddress, without _v2
	required bool   // load fails without it
	purpose  string // for MissingSymbolError
}

// symbolVersion is, for the entries that need a newer prototype than the
// table's ABI, the CUDA version to ask for; nil on drivers that lack it.
var symbolVersion = map[fnID]int{
	fnStreamGetCaptureInfoEdges:            abiEdges,
	fnGraphNodeGetDependenciesEdges:        abiEdges,
	fnStreamUpdateCaptureDependenciesEdges: abiEdges,
}

const (
	purposeCore    = "every CUDA backend operation"
	purposeErrors  = "error messages"
	purposeVMM     = "virtual memory management (expandable segments, symmetric memory)"
	purposeMemops  = "stream memory operations (signal pads)"
	purposeQuery   = "stream queries (detecting signal waits that do not complete)"
	purposePeer    = "peer access queries (symmetric memory)"
	purposeCapture = "relaxed capture mode around allocations (CUDA graph capture)"
	purposeKernels = "kernels compiled at run time (package kernels)"
	purposeGraphs  = "reuse of record_stream blocks during CUDA graph capture (graph_capture_record_stream_reuse)"
)

// symbols is the complete list of driver functions this package may resolve.
// Nothing else is ever looked up: in particular no multicast object function
// (see DESIGN.md: on the shared GPU machines creating one can take the host's
// GPUs out of service), which a test checks.
var symbols = [numFns]symbol{
	fnInit:                    {"cuInit", true, purposeCore},
	fnDriverGetVersion:        {"cuDriverGetVersion", true, purposeCore},
	fnDeviceGetCount:          {"cuDeviceGetCount", true, purposeCore},
	fnDeviceGet:               {"cuDeviceGet", true, purposeCore},
	fnDeviceGetName:           {"cuDeviceGetName", true, purposeCore},
	fnDeviceTotalMem:          {"cuDeviceTotalMem", true, purposeCore},
	fnDeviceGetAttribute:      {"cuDeviceGetAttribute", true, purposeCore},
	fnDevicePrimaryCtxRetain:  {"cuDevicePrimaryCtxRetain", true, purposeCore},
	fnDevicePrimaryCtxRelease: {"cuDevicePrimaryCtxRelease", true, purposeCore},
	fnCtxGetCurrent:           {"cuCtxGetCurrent", true, purposeCore},
	fnCtxSetCurrent:           {"cuCtxSetCurrent", true, purposeCore},
	fnCtxPushCurrent:          {"cuCtxPushCurrent", true, purposeCore},
	fnCtxPopCurrent:           {"cuCtxPopCurrent", true, purposeCore},
	fnCtxGetDevice:            {"cuCtxGetDevice", true, purposeCore},
	fnCtxSynchronize:          {"cuCtxSynchronize", true, purposeCore},
	fnMemAlloc:                {"cuMemAlloc", true, purposeCore},
	fnMemFree:                 {"cuMemFree", true, purposeCore},
	fnMemGetInfo:              {"cuMemGetInfo", true, purposeCore},
	fnMemcpyHtoD:              {"cuMemcpyHtoD", true, purposeCore},
	fnMemcpyDtoH:              {"cuMemcpyDtoH", true, purposeCore},
	fnMemsetD8:                {"cuMemsetD8", true, purposeCore},
	fnEventCreate:             {"cuEventCreate", true, purposeCore},
	fnEventRecord:             {"cuEventRecord", true, purposeCore},
	fnEventQuery:              {"cuEventQuery", true, purposeCore},
	fnEventSynchronize:        {"cuEventSynchronize", true, purposeCore},
	fnEventDestroy:            {"cuEventDestroy", true, purposeCore},
	fnStreamCreate:            {"cuStreamCreate", true, purposeCore},
	fnStreamDestroy:           {"cuStreamDestroy", true, purposeCore},
	fnStreamSynchronize:       {"cuStreamSynchronize", true, purposeCore},
	fnGetErrorName:            {"cuGetErrorName", true, purposeErrors},
	fnGetErrorString:          {"cuGetErrorString", true, purposeErrors},
	fnPointerGetAttribute:     {"cuPointerGetAttribute", true, purposeCore},

	fnMemCreate:                    {"cuMemCreate", false, purposeVMM},
	fnMemRelease:                   {"cuMemRelease", false, purposeVMM},
	fnMemAddressReserve:            {"cuMemAddressReserve", false, purposeVMM},
	fnMemAddressFree:               {"cuMemAddressFree", false, purposeVMM},
	fnMemMap:                       {"cuMemMap", false, purposeVMM},
	fnMemUnmap:                     {"cuMemUnmap", false, purposeVMM},
	fnMemSetAccess:                 {"cuMemSetAccess", false, purposeVMM},
	fnMemExportToShareableHandle:   {"cuMemExportToShareableHandle", false, purposeVMM},
	fnMemImportFromShareableHandle: {"cuMemImportFromShareableHandle", false, purposeVMM},
	fnMemGetAllocationGranularity:  {"cuMemGetAllocationGranularity", false, purposeVMM},
	fnMemRetainAllocationHandle:    {"cuMemRetainAllocationHandle", false, purposeVMM},
	fnStreamWriteValue32:           {"cuStreamWriteValue32", false, purposeMemops},
	fnStreamWaitValue32:            {"cuStreamWaitValue32", false, purposeMemops},
	fnStreamQuery:                  {"cuStreamQuery", false, purposeQuery},
	fnDeviceCanAccessPeer:          {"cuDeviceCanAccessPeer", false, purposePeer},
	// Segments are allocated and freed in relaxed capture mode, so that a
	// CUDA graph capture under way in the process is not invalidated.
	fnThreadExchangeStreamCaptureMode: {"cuThreadExchangeStreamCaptureMode", false, purposeCapture},
	fnModuleLoadData:                  {"cuModuleLoadData", false, purposeKernels},
	fnModuleUnload:                    {"cuModuleUnload", false, purposeKernels},
	fnModuleGetFunction:               {"cuModuleGetFunction", false, purposeKernels},
	fnLaunchKernel:                    {"cuLaunchKernel", false, purposeKernels},
	fnMemHostAlloc:                    {"cuMemHostAlloc", false, purposeKernels},
	fnMemHostGetDevicePointer:         {"cuMemHostGetDevicePointer", false, purposeKernels},
	fnMemFreeHost:                     {"cuMemFreeHost", false, purposeKernels},
	// Capture graphs (graphs.go). cuStreamGetCaptureInfo at 12.0 is _v2;
	// CUDA 13 declares only the edge-data prototypes, but its driver still
	// serves the 12.0 ones to programs built for 12.x; the Edges entries are
	// preferred where the driver has them.
	fnStreamGetCaptureInfo:                 {"cuStreamGetCaptureInfo", false, purposeGraphs},
	fnGraphNodeGetDependencies:             {"cuGraphNodeGetDependencies", false, purposeGraphs},
	fnStreamUpdateCaptureDependencies:      {"cuStreamUpdateCaptureDependencies", false, purposeGraphs},
	fnGraphAddEmptyNode:                    {"cuGraphAddEmptyNode", false, purposeGraphs},
	fnStreamBeginCapture:                   {"cuStreamBeginCapture", false, purposeGraphs},
	fnStreamEndCapture:                     {"cuStreamEndCapture", false, purposeGraphs},
	fnGraphDestroy:                         {"cuGraphDestroy", false, purposeGraphs},
	fnStreamWaitEvent:                      {"cuStreamWaitEvent", false, purposeGraphs},
	fnStreamGetCaptureInfoEdges:            {"cuStreamGetCaptureInfo", false, purposeGraphs},
	fnGraphNodeGetDependenciesEdges:        {"cuGraphNodeGetDependencies", false, purposeGraphs},
	fnStreamUpdateCaptureDependenciesEdges: {"cuStreamUpdateCaptureDependencies", false, purposeGraphs},
}

// abiEdges is the CUDA version whose graph functions take edge data
// (cuStreamGetCaptureInfo_v3, cuGraphNodeGetDependencies_v2,
// cuStreamUpdateCaptureDependencies_v2).
const abiEdges = 12030

// driver is an opened libcuda with its function table filled.
//
// Invariants once openDriver has returned it without error:
//   - fn[id] != nil for every required symbol; optional ones may be nil;
//   - cuInit(0) has succeeded;
//   - devs[i] is the CUdevice of ordinal i, for i < len(devs);
//   - primary[i] is 0 or device i's primary context, retained exactly once
//     by this driver and never released while it is open.
type driver struct {
	lib     *dl.Lib
	abi     int  // the CUDA version functions were requested at
	getProc bool // true: cuGetProcAddress_v2; false: the 4-argument one
	version int  // cuDriverGetVersion, e.g. 12040 for CUDA 12.4

	fn [numFns]unsafe.Pointer // C function pointers into libcuda, never Go memory

	devs      []C.CUdevice
	primary   []atomic.Uintptr
	primaryMu sync.Mutex // serializes retaining a primary context

	// handles counts the references this process holds to each allocation
	// handle (see vmm.go): one per MemCreate, ImportFD and
	// RetainAllocationHandle not yet matched by a MemRelease.
	handles struct {
		sync.Mutex
		refs map[uint64]int
	}
}

// Option configures Load and NewBackend.
type Option func(*config)

type config struct {
	path string
}

// WithLibrary opens the driver from path instead of SYMM_CUDA_LIB or
// DefaultLibrary. A bare name is searched as dlopen(3) does; a path with a
// slash is used as is.
func WithLibrary(path string) Option {
	return func(c *config) { c.path = path }
}

// newConfig applies opts over the defaults: SYMM_CUDA_LIB when set and not
// empty, else DefaultLibrary.
func newConfig(opts []Option) config {
	c := config{path: DefaultLibrary}
	if p := settings.CUDALib.Get(env.Get); p != "" {
		c.path = p
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// The process-wide driver. It is loaded at most once: CUDA state (contexts,
// allocations handed to PyTorch) cannot be torn down while others use it, so
// it is never closed, and a failed load is not retried (it would fail the
// same way, and a half-initialized driver must not be initialized twice).
var global struct {
	once sync.Once
	path string
	d    *driver
	err  error
}

// Load opens the CUDA driver, resolves its functions and runs cuInit(0). It
// does so once per process; every later call returns the first call's result
// (the same error, for a failed load). It never panics.
//
// Options only matter on the first call. A later call whose WithLibrary names
// a different library gets an error rather than a silently different driver.
// Calls without options accept whatever was loaded.
//
// Loading fails with an error naming what is missing: the library
// ("cuda: dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file:
// ..."), a required function (*MissingSymbolError), or cuInit's Result.
func Load(opts ...Option) error {
	_, err := load(opts...)
	return err
}

func load(opts ...Option) (*driver, error) {
	cfg := newConfig(opts)
	global.once.Do(func() {
		global.path = cfg.path
		global.d, global.err = openDriverNoPanic(cfg.path)
		if global.d != nil {
			errorTextDriver.Store(global.d)
		}
	})
	if len(opts) > 0 && cfg.path != global.path {
		return nil, fmt.Errorf("cuda: the driver is loaded once per process, from %s; cannot load %s as well", global.path, cfg.path)
	}
	return global.d, global.err
}

// loaded returns the process-wide driver, loading it with the defaults if no
// Load has run yet. Once it is loaded this is one atomic load: every driver
// call goes through here (load reads the environment and allocates).
func loaded() (*driver, error) {
	if d := loadedDriver.Load(); d != nil {
		return d, nil
	}
	d, err := load()
	if d != nil {
		loadedDriver.Store(d)
	}
	return d, err
}

var loadedDriver atomic.Pointer[driver]

func openDriverNoPanic(path string) (d *driver, err error) {
	defer func() {
		if p := recover(); p != nil {
			d, err = nil, fmt.Errorf("cuda: loading %s panicked: %v", path, p)
		}
	}()
	return openDriver(path)
}

// openDriver opens the library at path and returns a ready driver. Unlike
// Load it keeps no global state, so tests open fake drivers with it.
func openDriver(path string) (*driver, error) {
	lib, err := dl.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	d := &driver{lib: lib}
	called, err := d.init()
	if err != nil {
		// Once a driver function has run, libcuda may have started threads or
		// registered exit handlers: unloading it then could crash the process
		// later. Keep the handle; only a library never called into is closed.
		if !called {
			lib.Close()
		}
		var missing *MissingSymbolError
		if errors.As(err, &missing) {
			return nil, err // it names the library already
		}
		return nil, fmt.Errorf("cuda: %s: %w", path, err)
	}
	return d, nil
}

// init fills the function table, initializes the driver and lists the
// devices. called reports whether any driver function was run.
func (d *driver) init() (called bool, err error) {
	gpa, err := d.lib.Lookup("cuGetProcAddress_v2")
	if err == nil {
		d.getProc, d.abi = true, abiVersion
	} else {
		// A CUDA 11.3 to 11.8 driver: only the 4-argument cuGetProcAddress.
		// It refuses versions newer than itself, so ask at its own version,
		// clamped to 12000. None of the functions above changed its prototype
		// between CUDA 11.0 and 12.0, so the trampolines' ABI is the same.
		gpa, err = d.lib.Lookup("cuGetProcAddress")
		if err != nil {
			return false, &MissingSymbolError{"cuGetProcAddress", "loading driver functions by ABI version (a driver for CUDA 11.3 or newer)", d.lib.Path()}
		}
		getVersion, err := d.lib.Lookup("cuDriverGetVersion")
		if err != nil {
			return false, &MissingSymbolError{"cuDriverGetVersion", purposeCore, d.lib.Path()}
		}
		called = true
		v := C.symm_cuDriverGetVersion(getVersion)
		if v.r != 0 {
			return called, fmt.Errorf("cuDriverGetVersion: %w", Result(v.r))
		}
		d.abi = min(int(v.v), abiVersion)
	}

	called = true
	for id := range numFns {
		ver := d.abi
		if v := symbolVersion[id]; v != 0 {
			if !d.getProc { // an 11.x driver has no newer prototype
				continue
			}
			ver = v
		}
		p, err := d.procAddress(gpa, symbols[id].name, ver)
		if err != nil && ver != d.abi {
			// A newer prototype the driver will not give: the table's
			// own entry of that name serves instead.
			p, err = nil, nil
		}
		if err != nil {
			return called, err
		}
		if p == nil && symbols[id].required {
			return called, d.missing(id)
		}
		d.fn[id] = p
	}

	if r := Result(C.symm_cuInit(d.fn[fnInit], 0)); r != Success {
		return called, fmt.Errorf("cuInit(0): %w", r)
	}
	v := C.symm_cuDriverGetVersion(d.fn[fnDriverGetVersion])
	if v.r != 0 {
		return called, fmt.Errorf("cuDriverGetVersion: %w", Result(v.r))
	}
	d.version = int(v.v)

	n := C.symm_cuDeviceGetCount(d.fn[fnDeviceGetCount])
	if n.r != 0 {
		return called, fmt.Errorf("cuDeviceGetCount: %w", Result(n.r))
	}
	d.devs = make([]C.CUdevice, int(n.v))
	d.primary = make([]atomic.Uintptr, int(n.v))
	for i := range d.devs {
		g := C.symm_cuDeviceGet(d.fn[fnDeviceGet], C.int(i))
		if g.r != 0 {
			return called, fmt.Errorf("cuDeviceGet(%d): %w", i, Result(g.r))
		}
		d.devs[i] = g.v
	}
	return called, nil
}

// procAddress asks the driver for name at CUDA version ver. It returns nil without an
// error when the driver does not have the function (too old, or not on this
// platform); an error means the query itself failed.
func (d *driver) procAddress(gpa unsafe.Pointer, name string, ver int) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var o C.symm_res_fn
	if d.getProc {
		// The status (CUdriverProcAddressQueryResult) says why a pointer is
		// NULL: symbol not found, or found only at a newer version. Either
		// way the function is unavailable at our ABI; the NULL pointer is the
		// answer that matters.
		var status C.int
		o = C.symm_getproc_v2(gpa, cname, C.int(ver), getProcDefault, &status)
	} else {
		o = C.symm_getproc_v1(gpa, cname, C.int(ver), getProcDefault)
	}
	if r := Result(o.r); r != Success {
		// CUDA 11.x drivers report an unknown symbol as CUDA_ERROR_NOT_FOUND;
		// CUDA 12 ones return success and a NULL pointer.
		if r == ErrorNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("cuGetProcAddress(%s, %d): %w", name, ver, r)
	}
	return o.p, nil
}

// Proc returns the address of the driver function name as this process's
// driver resolves its own functions (cuGetProcAddress at the ABI version the
// table was filled at), loading the driver first if no Load has run. It is
// the one loader of libcuda in libsymm: the C++ parts of libsymm and its
// PyTorch extension take driver functions from here (symm_driver_proc)
// instead of opening the library again. nil without an error: the driver
// has no such function.
func Proc(name string) (unsafe.Pointer, error) {
	d, err := loaded()
	if err != nil {
		return nil, err
	}
	for id := range numFns {
		if symbols[id].name == name {
			return d.fn[id], nil
		}
	}
	gpa, err := d.lib.Lookup(map[bool]string{true: "cuGetProcAddress_v2", false: "cuGetProcAddress"}[d.getProc])
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return d.procAddress(gpa, name, d.abi)
}

// close releases the primary contexts this driver retained and drops its
// library handle. Only tests call it, on fake drivers: the process-wide
// driver is never closed (see global).
func (d *driver) close() error {
	for i := range d.primary {
		if d.primary[i].Load() != 0 {
			C.symm_cuDevicePrimaryCtxRelease(d.fn[fnDevicePrimaryCtxRelease], d.devs[i])
			d.primary[i].Store(0)
		}
	}
	return d.lib.Close()
}

// need returns the function id, or a *MissingSymbolError when the driver
// does not have it. Only optional functions can be missing.
func (d *driver) need(id fnID) (unsafe.Pointer, error) {
	if p := d.fn[id]; p != nil {
		return p, nil
	}
	return nil, d.missing(id)
}

func (d *driver) missing(id fnID) *MissingSymbolError {
	e := &MissingSymbolError{Symbol: symbols[id].name, Purpose: symbols[id].purpose}
	if d.lib != nil {
		e.Library = d.lib.Path()
	}
	return e
}
