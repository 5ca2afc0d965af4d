package cuda

import (
	"fmt"
	"strconv"
	"sync/atomic"
)

// Result is a CUresult, the status code of every CUDA driver call. Any value
// but Success is an error; callers wrap it with what they were doing, e.g.
//
//	fmt.Errorf("cuMemAlloc(%d bytes) on device %d: %w", size, dev, r)
//
// so that errors.As(err, &r) still finds the code.
type Result int

// The codes this package tests for by value. All others are reported with
// their driver names through Error.
const (
	Success             Result = 0
	ErrorInvalidValue   Result = 1
	ErrorOutOfMemory    Result = 2
	ErrorNotInitialized Result = 3
	ErrorInvalidDevice  Result = 101
	ErrorInvalidContext Result = 201
	ErrorInvalidHandle  Result = 400
	ErrorNotFound       Result = 500
	ErrorNotReady       Result = 600
	ErrorNotSupported   Result = 801
	ErrorUnknown        Result = 999
)

// Error returns the driver's name and description of r, such as
// "CUDA_ERROR_OUT_OF_MEMORY: out of memory". Once the driver is loaded the
// text comes from cuGetErrorName/cuGetErrorString, so codes newer than this
// package are named too; before that (or for a code the driver does not
// know) it comes from a built-in table of the common codes.
func (r Result) Error() string {
	if d := errorTextDriver.Load(); d != nil {
		if name, desc, ok := d.errorText(r); ok {
			return name + ": " + desc
		}
	}
	if e, ok := builtinResults[r]; ok {
		return e.name + ": " + e.desc
	}
	return "CUresult " + strconv.Itoa(int(r)) + ": unrecognized error code"
}

// Name returns the CUDA_ERROR_* name of r ("CUDA_SUCCESS" for 0), or
// "CUresult <n>" when neither the driver nor the built-in table knows it.
func (r Result) Name() string {
	if d := errorTextDriver.Load(); d != nil {
		if name, _, ok := d.errorText(r); ok {
			return name
		}
	}
	if e, ok := builtinResults[r]; ok {
		return e.name
	}
	return "CUresult " + strconv.Itoa(int(r))
}

// OutOfMemory reports whether r is CUDA_ERROR_OUT_OF_MEMORY. The allocator
// recognizes out-of-memory errors by this method (allocator.IsOutOfMemory)
// without importing this package.
func (r Result) OutOfMemory() bool { return r == ErrorOutOfMemory }

// errorTextDriver is the loaded driver whose cuGetErrorName/cuGetErrorString
// Result.Error uses; nil until Load succeeds. Only the process-wide driver is
// stored here, never one opened by a test, so that a Result's text does not
// depend on a library that may be closed.
var errorTextDriver atomic.Pointer[driver]

type resultText struct{ name, desc string }

// builtinResults names the codes a caller is likely to meet before the
// driver's own strings are available (loading and cuInit failures) or in
// this package's tests. Names and values are those of cuda.h; the
// descriptions follow cuGetErrorString.
var builtinResults = map[Result]resultText{
	0:   {"CUDA_SUCCESS", "no error"},
	1:   {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	2:   {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	3:   {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	4:   {"CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	34:  {"CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	46:  {"CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
	100: {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	101: {"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	102: {"CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
	200: {"CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	201: {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	202: {"CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
	205: {"CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
	206: {"CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
	208: {"CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
	211: {"CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
	214: {"CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
	216: {"CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "exclusive-thread device already in use by a different thread"},
	217: {"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
	220: {"CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error detected during the execution"},
	304: {"CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
	400: {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	401: {"CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
	500: {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	600: {"CUDA_ERROR_NOT_READY", "device not ready"},
	700: {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	704: {"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
	705: {"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
	708: {"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
	709: {"CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
	711: {"CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
	719: {"CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	800: {"CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	801: {"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	802: {"CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
	803: {"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
	804: {"CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
	900: {"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
	901: {"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
	909: {"CUDA_ERROR_TIMEOUT", "wait operation timed out"},
	999: {"CUDA_ERROR_UNKNOWN", "unknown error"},
}

// MissingSymbolError reports a driver function that the loaded libcuda does
// not provide (an older driver, or a platform without the feature).
type MissingSymbolError struct {
	Symbol  string // base name, e.g. "cuMemCreate"
	Purpose string // what libsymm needs it for
	Library string // the library that lacks it, e.g. "libcuda.so.1"
}

func (e *MissingSymbolError) Error() string {
	lib := e.Library
	if lib == "" {
		lib = "driver"
	} else {
		lib = "driver " + lib
	}
	return fmt.Sprintf("cuda: %s lacks %s (needed for %s)", lib, e.Symbol, e.Purpose)
}
