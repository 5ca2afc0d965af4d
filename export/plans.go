package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "plans.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/symmetric"
)

// Launch plans (plans.h): Go makes and withdraws them, C reads them.
// planMu makes Go the table's one writer: publish and retire of a slot
// never run at the same time.
var planMu sync.Mutex

// launchPlan is symm_plan_t in Go's words: the handle's plan, its id and
// the context its kernels were loaded into.
type launchPlan struct {
	HID int64
	Ctx uint64
	symmetric.Plan
}

func (p launchPlan) c() C.symm_plan_t {
	var c C.symm_plan_t
	c.hid, c.ctx = C.int64_t(p.HID), C.uint64_t(p.Ctx)
	c.device, c.rank, c.world, c.channels = C.int32_t(p.Device), C.int32_t(p.Rank), C.int32_t(p.World), C.int32_t(p.Channels)
	c.max_blocks, c.meet_barrier = C.uint32_t(p.MaxBlocks), C.int32_t(p.MeetBarrier)
	c.buffers, c.pads, c.epochs, c.status = C.uint64_t(p.Buffers), C.uint64_t(p.Pads), C.uint64_t(p.Epochs), C.uint64_t(p.Status)
	c.buffer, c.buffer_size, c.timeout_ns = C.uint64_t(p.Buffer), C.uint64_t(p.BufferSize), C.uint64_t(p.Timeout.Nanoseconds())
	c.push_state, c.push_lines, c.push_ready = C.uint64_t(p.PushState), C.uint64_t(p.PushLines), C.uint64_t(p.PushReady)
	c.push_max_blocks = C.uint32_t(p.PushMaxBlocks)
	for i, f := range p.fns() {
		c.fn[i] = C.uint64_t(*f)
	}
	return c
}

// fns are the plan's kernels in symm_plan_t.fn's order.
func (p *launchPlan) fns() [C.SYMM_PLAN_KERNELS]*uintptr {
	var f [C.SYMM_PLAN_KERNELS]*uintptr
	f[C.SYMM_PLAN_BARRIER], f[C.SYMM_PLAN_PUT], f[C.SYMM_PLAN_WAIT] = &p.Barrier, &p.Put, &p.Wait
	for d := range int(C.SYMM_PLAN_DTYPES) {
		for v := range 2 {
			f[C.SYMM_PLAN_ONE_SHOT+2*d+v] = &p.OneShot[d][v]
			f[C.SYMM_PLAN_TWO_SHOT+2*d+v] = &p.TwoShot[d][v]
			f[C.SYMM_PLAN_REDUCE_SCATTER+2*d+v] = &p.ReduceScatter[d][v]
		}
	}
	f[C.SYMM_PLAN_ALL_GATHER], f[C.SYMM_PLAN_ALL_GATHER+1] = &p.AllGather[0], &p.AllGather[1]
	for d := range int(C.SYMM_PLAN_DTYPES) {
		f[C.SYMM_PLAN_PUSH+d] = &p.Push[d]
	}
	return f
}

// publishPlan makes p its handle's plan; false when the handle's slot
// holds another handle's plan or its id does not fit (its calls go
// through Go).
func publishPlan(p launchPlan) bool {
	c := p.c()
	planMu.Lock()
	defer planMu.Unlock()
	return C.libsymm_plan_publish(&c) == 1
}

// retirePlan withdraws hid's plan and returns once no C caller is inside
// it; false if it had none.
func retirePlan(hid int64) bool {
	planMu.Lock()
	defer planMu.Unlock()
	return C.libsymm_plan_retire(C.int64_t(hid)) == 1
}

// planDriver gives the launches the driver's functions, once; false where
// the driver lacks one (no plan is published then).
var planDriver = sync.OnceValue(func() bool {
	var f [5]unsafe.Pointer
	for i, name := range []string{"cuLaunchKernel", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent"} {
		p, err := cuda.Proc(name)
		if err != nil || p == nil {
			return false
		}
		f[i] = p
	}
	C.libsymm_plan_set_driver(f[0], f[1], f[2], f[3], f[4])
	return true
})

// offerPlan publishes handle hid's launch plan after a call that went
// through Go, if the handle can have one (symmetric.Handle.PublishPlan:
// once per handle). A handle without one keeps going through Go; so does
// one whose plan could not be made (the reason is left to its calls).
func offerPlan(hid int64, h *symmetric.Handle) {
	if h.PlanOffered() {
		return // no closures made: the calls through Go allocate nothing
	}
	h.PublishPlan(func(p symmetric.Plan) bool {
		if !planDriver() {
			return false
		}
		ctx, err := cuda.PrimaryContext(p.Device)
		if err != nil {
			return false
		}
		return publishPlan(launchPlan{HID: hid, Ctx: uint64(ctx), Plan: p})
	}, func() { retirePlan(hid) })
}
