package main

/*
#include "plans.h"
*/
import "C"

import "sync"

// Launch plans (plans.h): Go makes and withdraws them, C reads them.
// planMu makes Go the table's one writer: publish and retire of a slot
// never run at the same time.
var planMu sync.Mutex

// launchPlan is symm_plan_t in Go's words.
type launchPlan struct {
	HID                           int64
	Device, Rank, World, Channels int32
	Pads, Epochs, Status, Timeout uint64 // device addresses; the kernels' deadline in ns
	Ctx                           uint64
	Barrier, Put, Wait            uint64 // the kernels' function handles
	BarrierThreads                uint32
}

func (p launchPlan) c() C.symm_plan_t {
	var c C.symm_plan_t
	c.hid = C.int64_t(p.HID)
	c.device, c.rank, c.world, c.channels = C.int32_t(p.Device), C.int32_t(p.Rank), C.int32_t(p.World), C.int32_t(p.Channels)
	c.pads, c.epochs, c.status, c.timeout_ns = C.uint64_t(p.Pads), C.uint64_t(p.Epochs), C.uint64_t(p.Status), C.uint64_t(p.Timeout)
	c.ctx = C.uint64_t(p.Ctx)
	c.fn[C.SYMM_PLAN_BARRIER], c.fn[C.SYMM_PLAN_PUT], c.fn[C.SYMM_PLAN_WAIT] = C.uint64_t(p.Barrier), C.uint64_t(p.Put), C.uint64_t(p.Wait)
	c.barrier_threads = C.uint32_t(p.BarrierThreads)
	return c
}

func planOf(c *C.symm_plan_t) launchPlan {
	return launchPlan{
		HID: int64(c.hid), Device: int32(c.device), Rank: int32(c.rank), World: int32(c.world), Channels: int32(c.channels),
		Pads: uint64(c.pads), Epochs: uint64(c.epochs), Status: uint64(c.status), Timeout: uint64(c.timeout_ns),
		Ctx: uint64(c.ctx), Barrier: uint64(c.fn[C.SYMM_PLAN_BARRIER]), Put: uint64(c.fn[C.SYMM_PLAN_PUT]),
		Wait: uint64(c.fn[C.SYMM_PLAN_WAIT]), BarrierThreads: uint32(c.barrier_threads),
	}
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

// holdPlan enters hid's plan as a C entry point does: it stays in use (a
// retire waits) until release is called. ok is false when hid has none.
func holdPlan(hid int64) (p launchPlan, release func(), ok bool) {
	c := C.libsymm_plan_enter(C.int64_t(hid))
	if c == nil {
		return launchPlan{}, nil, false
	}
	return planOf(c), func() { C.libsymm_plan_leave(c) }, true
}
