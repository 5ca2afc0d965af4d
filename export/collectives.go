package main

/*
#include <stdint.h>
#include "../include/symm.h"
*/
import "C"

import (
	"fmt"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/symmetric"
)

// Collectives on symmetric buffers (symm_one_shot_all_reduce,
// symm_two_shot_all_reduce, symm_reduce_scatter, symm_all_gather), the push
// all-reduce and the choice among them. Each export only converts its C
// arguments; the checks every collective shares are in collective.

// noOp marks a collective without an op argument (all-gather).
const noOp C.int = -1

// collective runs run on handle hid with the arguments every collective on
// a symmetric buffer takes, after the checks they share; fn names the C
// function in errors. Called from an export that has deferred guard(fn).
func collective(fn string, hid C.int64_t, offset, count C.size_t, dtype, op C.int, out, local, stream C.uintptr_t,
	timeoutMS C.int, run func(*symmetric.Handle, symmetric.AllReduce) error) C.int {
	h, code := liveHandle(fn, hid)
	if h == nil {
		return code
	}
	if timeoutMS < 0 {
		return fail(fn, fmt.Errorf("%w: timeout_ms %d is negative (0: no timeout)", symmetric.ErrInvalid, int(timeoutMS)))
	}
	a := symmetric.AllReduce{
		Offset: uint64(offset), Count: uint64(count), Dtype: kernels.Dtype(dtype),
		Out: uintptr(out), Local: uintptr(local), Stream: uintptr(stream), Timeout: ms(timeoutMS),
	}
	if op != noOp {
		if op != C.SYMM_SUM {
			return fail(fn, fmt.Errorf("%w: op %d: only SYMM_SUM (0) is supported", symmetric.ErrInvalid, int(op)))
		}
		a.Op = "sum"
	}
	if err := run(h, a); err != nil {
		return fail(fn, err)
	}
	offerPlan(int64(hid), h)
	return C.SYMM_OK
}

//export goOneShotAllReduce
func goOneShotAllReduce(hid C.int64_t, offset, count C.size_t, dtype, op C.int, out, local, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	const fn = "symm_one_shot_all_reduce"
	defer guard(fn, &code)
	return collective(fn, hid, offset, count, dtype, op, out, local, stream, timeoutMS, (*symmetric.Handle).OneShotAllReduce)
}

//export goTwoShotAllReduce
func goTwoShotAllReduce(hid C.int64_t, offset, count C.size_t, dtype, op C.int, out, local, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	const fn = "symm_two_shot_all_reduce"
	defer guard(fn, &code)
	return collective(fn, hid, offset, count, dtype, op, out, local, stream, timeoutMS, (*symmetric.Handle).TwoShotAllReduce)
}

//export goReduceScatter
func goReduceScatter(hid C.int64_t, offset, count C.size_t, dtype, op C.int, out, local, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	const fn = "symm_reduce_scatter"
	defer guard(fn, &code)
	return collective(fn, hid, offset, count, dtype, op, out, local, stream, timeoutMS, (*symmetric.Handle).ReduceScatter)
}

//export goAllGather
func goAllGather(hid C.int64_t, offset, count C.size_t, dtype C.int, out, local, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	const fn = "symm_all_gather"
	defer guard(fn, &code)
	return collective(fn, hid, offset, count, dtype, noOp, out, local, stream, timeoutMS, (*symmetric.Handle).AllGather)
}

//export goPushAllReduce
func goPushAllReduce(hid C.int64_t, in, out C.uintptr_t, count C.size_t, dtype, op C.int, stream C.uintptr_t, timeoutMS C.int) (code C.int) {
	const fn = "symm_push_all_reduce"
	defer guard(fn, &code)
	h, code := liveHandle(fn, hid)
	if h == nil {
		return code
	}
	if timeoutMS < 0 {
		return fail(fn, fmt.Errorf("%w: timeout_ms %d is negative (0: no timeout)", symmetric.ErrInvalid, int(timeoutMS)))
	}
	if op != C.SYMM_SUM {
		return fail(fn, fmt.Errorf("%w: op %d: only SYMM_SUM (0) is supported", symmetric.ErrInvalid, int(op)))
	}
	err := h.PushAllReduce(symmetric.PushAllReduce{
		In: uintptr(in), Out: uintptr(out), Count: uint64(count), Dtype: kernels.Dtype(dtype), Op: "sum",
		Stream: uintptr(stream), Timeout: ms(timeoutMS),
	})
	if err != nil {
		return fail(fn, err)
	}
	offerPlan(int64(hid), h)
	return C.SYMM_OK
}

//export goPushWorkspaceSize
func goPushWorkspaceSize(world C.int, maxBytes C.size_t) (size C.size_t) {
	const fn = "symm_push_all_reduce_workspace_size"
	var code C.int
	defer guard(fn, &code)
	n, err := symmetric.PushWorkspaceSize(int(world), uint64(maxBytes))
	if err != nil {
		fail(fn, err)
		return 0
	}
	return C.size_t(n)
}

//export goAllReduceAlgorithm
func goAllReduceAlgorithm(world C.int, nbytes, pushMax C.size_t, algorithm C.int, chosen *C.int) (code C.int) {
	const fn = "symm_all_reduce_algorithm"
	defer guard(fn, &code)
	m, err := getManager()
	if err != nil {
		return fail(fn, err)
	}
	a, err := m.AllReduceAlgorithm(int(world), uint64(nbytes), uint64(pushMax), symmetric.Algorithm(algorithm))
	if err != nil {
		return fail(fn, err)
	}
	*chosen = C.int(a)
	return C.SYMM_OK
}

//export goAllReduceSetting
func goAllReduceSetting(algorithm *C.int) (code C.int) {
	const fn = "symm_all_reduce_setting"
	defer guard(fn, &code)
	m, err := getManager()
	if err != nil {
		return fail(fn, err)
	}
	*algorithm = C.int(m.Config().AllReduce)
	return C.SYMM_OK
}

//export goPushMaxBytesSetting
func goPushMaxBytesSetting(bytes *C.size_t) (code C.int) {
	const fn = "symm_push_max_bytes_setting"
	defer guard(fn, &code)
	n, err := symmetric.PushMaxBytesFromEnv(getenv)
	if err != nil {
		return fail(fn, err)
	}
	*bytes = C.size_t(n)
	return C.SYMM_OK
}
