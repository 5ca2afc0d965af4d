package main

/*
#include <stdint.h>
#include <string.h>
#include "plans.h"

// For the tests of the plans (export/plans_test.go, planlaunch_test.go):
// a driver that records launches instead of making them, and the table read
// back as a caller reads it. The driver: one thread's context, one
// pushed context deep, the last launch's arguments. rec_words is how many
// parameters the test expects the kernel to take (the driver cannot know).
static __thread void *rec_cur;
static __thread void *rec_saved;
static int rec_words, rec_fail_launch;
typedef struct {
  uint64_t fn, stream, words[16];
  unsigned grid, block;
  int ctx_set, pushed, popped, launches, nwords;
} rec_t;
static rec_t rec;
static uint64_t rec_ready_word; // a push workspace's ready word, for the tests' plans

static int rec_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned shmem, void *stream, void **params, void **extra) {
  (void)gy; (void)gz; (void)by; (void)bz; (void)shmem; (void)extra;
  if (rec_fail_launch) return 1; // CUDA_ERROR_INVALID_VALUE
  rec.fn = (uint64_t)(uintptr_t)f;
  rec.stream = (uint64_t)(uintptr_t)stream;
  rec.grid = gx;
  rec.block = bx;
  for (int i = 0; i < rec_words && i < 16; i++) rec.words[i] = *(uint64_t *)params[i];
  rec.launches++;
  return 0;
}
static int rec_ctx_get(void **c) { *c = rec_cur; return 0; }
static int rec_ctx_set(void *c) { rec_cur = c; rec.ctx_set++; return 0; }
static int rec_ctx_push(void *c) { rec_saved = rec_cur; rec_cur = c; rec.pushed++; return 0; }
static int rec_ctx_pop(void **c) { *c = rec_cur; rec_cur = rec_saved; rec.popped++; return 0; }

static void rec_install(void) { libsymm_plan_set_driver(rec_launch, rec_ctx_get, rec_ctx_set, rec_ctx_push, rec_ctx_pop); }
static void rec_reset(int words, uintptr_t cur, int fail) {
  memset(&rec, 0, sizeof rec);
  rec_words = words;
  rec_cur = (void *)cur;
  rec_fail_launch = fail;
}
static rec_t rec_get(void) { rec_t r = rec; r.nwords = rec_words; return r; }
static uintptr_t rec_ready(uint64_t v) { __atomic_store_n(&rec_ready_word, v, __ATOMIC_RELEASE); return (uintptr_t)&rec_ready_word; }
static uintptr_t rec_current(void) { return (uintptr_t)rec_cur; }

// The launches with the stream as an integer (Go passes no pointers it made up).
static int rec_barrier(int64_t hid, int channel, uintptr_t s) { return libsymm_plan_barrier(hid, channel, (void *)s); }
static int rec_put(int64_t hid, int dst, int channel, uintptr_t s) { return libsymm_plan_put(hid, dst, channel, (void *)s); }
static int rec_wait(int64_t hid, int src, int channel, uintptr_t s) { return libsymm_plan_wait(hid, src, channel, (void *)s); }
static int rec_collective(int kind, int64_t hid, uint64_t offset, uint64_t count, int dtype, int op, uint64_t out,
                          uint64_t local, uintptr_t s) {
  return libsymm_plan_collective(kind, hid, offset, count, dtype, op, out, local, (void *)s);
}
static int rec_push(int64_t hid, uint64_t in, uint64_t out, uint64_t count, int dtype, int op, uintptr_t s) {
  return libsymm_plan_push(hid, in, out, count, dtype, op, (void *)s);
}
*/
import "C"

import (
	"time"

	"github.com/libsymm/libsymm/symmetric"
)

// planLaunch is what the recording driver saw of one launch.
type planLaunch struct {
	Fn, Stream     uint64
	Grid, Block    uint32
	Words          []uint64
	CtxSet, Pushed bool // the context bound to the thread, or pushed and popped
}

// planOf reads a plan back from the table's C form (launchPlan.c's
// inverse), as a caller inside it sees it.
func planOf(c *C.symm_plan_t) launchPlan {
	p := launchPlan{HID: int64(c.hid), Ctx: uint64(c.ctx), Plan: symmetric.Plan{
		Device: int(c.device), Rank: int(c.rank), World: int(c.world), Channels: int(c.channels),
		MaxBlocks: uint32(c.max_blocks), MeetBarrier: int(c.meet_barrier),
		Buffers: uintptr(c.buffers), Pads: uintptr(c.pads), Epochs: uintptr(c.epochs), Status: uintptr(c.status),
		Buffer: uintptr(c.buffer), BufferSize: uint64(c.buffer_size), Timeout: time.Duration(c.timeout_ns),
		PushState: uintptr(c.push_state), PushLines: uint64(c.push_lines), PushReady: uintptr(c.push_ready),
		PushMaxBlocks: uint32(c.push_max_blocks),
	}}
	for i, f := range p.fns() {
		*f = uintptr(c.fn[i])
	}
	return p
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

// recordLaunches makes the per-call launches record into the test driver
// instead of calling the real one. Tests only.
func recordLaunches() { C.rec_install() }

// recordReset clears the record; the next launch's kernel takes words
// parameters, and the calling thread's current context is cur (fail: the
// launch is refused).
func recordReset(words int, cur uintptr, fail bool) {
	f := 0
	if fail {
		f = 1
	}
	C.rec_reset(C.int(words), C.uintptr_t(cur), C.int(f))
}

// recorded is the last launch, and how many there were.
func recorded() (planLaunch, int, int) {
	r := C.rec_get()
	l := planLaunch{Fn: uint64(r.fn), Stream: uint64(r.stream), Grid: uint32(r.grid), Block: uint32(r.block),
		CtxSet: r.ctx_set != 0, Pushed: r.pushed != 0 && r.popped == r.pushed}
	for i := 0; i < int(r.nwords) && i < 16; i++ {
		l.Words = append(l.Words, uint64(r.words[i]))
	}
	return l, int(r.launches), int(r.pushed)
}

// recordReady sets the tests' push ready word to v and returns its
// address (C memory: a plan may hold it).
func recordReady(v uint64) uintptr { return uintptr(C.rec_ready(C.uint64_t(v))) }

// recordCurrent is the calling thread's context in the test driver.
func recordCurrent() uintptr { return uintptr(C.rec_current()) }

// planBarrier, planPut, planWait, planCollective and planPush run the per-call
// launches from C as the entry points do (SYMM_PLAN_DONE or _PASS).
func planBarrier(hid int64, channel int, stream uintptr) int {
	return int(C.rec_barrier(C.int64_t(hid), C.int(channel), C.uintptr_t(stream)))
}

func planPut(hid int64, dst, channel int, stream uintptr) int {
	return int(C.rec_put(C.int64_t(hid), C.int(dst), C.int(channel), C.uintptr_t(stream)))
}

func planWait(hid int64, src, channel int, stream uintptr) int {
	return int(C.rec_wait(C.int64_t(hid), C.int(src), C.int(channel), C.uintptr_t(stream)))
}

func planCollective(kind int, hid int64, offset, count uint64, dtype, op int, out, local, stream uintptr) int {
	return int(C.rec_collective(C.int(kind), C.int64_t(hid), C.uint64_t(offset), C.uint64_t(count), C.int(dtype),
		C.int(op), C.uint64_t(out), C.uint64_t(local), C.uintptr_t(stream)))
}

func planPush(hid int64, in, out uintptr, count uint64, dtype, op int, stream uintptr) int {
	return int(C.rec_push(C.int64_t(hid), C.uint64_t(in), C.uint64_t(out), C.uint64_t(count), C.int(dtype), C.int(op),
		C.uintptr_t(stream)))
}

// planPushShape is libsymm_plan_push_shape.
func planPushShape(nbytes uint64, maxBlocks uint32) (blocks, threads uint32) {
	var cb, ct C.uint32_t
	C.libsymm_plan_push_shape(C.uint64_t(nbytes), C.uint32_t(maxBlocks), &cb, &ct)
	return uint32(cb), uint32(ct)
}

// planShape is libsymm_plan_shape.
func planShape(offset, nbytes uint64, world int, maxBlocks uint32) (v int, blocks, threads uint32) {
	var cv C.int
	var cb, ct C.uint32_t
	C.libsymm_plan_shape(C.uint64_t(offset), C.uint64_t(nbytes), C.int(world), C.int(symmetric.SignalPadSize/4/world),
		C.uint32_t(maxBlocks), &cv, &cb, &ct)
	return int(cv), uint32(cb), uint32(ct)
}
