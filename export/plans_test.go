package main

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/symmetric"
)

// planFor is a plan whose every field is derived from hid, so that a reader
// can tell a plan torn between two handles from a whole one.
func planFor(hid int64) launchPlan {
	u := uintptr(hid)
	p := launchPlan{HID: hid, Ctx: uint64(u * 13), Plan: symmetric.Plan{
		Device: int(hid % 8), Rank: int(hid % 3), World: 4, Channels: int(hid % 512), MaxBlocks: uint32(hid % 96),
		MeetBarrier: int(hid % 5), Buffers: u * 2, Pads: u * 3, Epochs: u * 5, Status: u * 7, Buffer: u * 17,
		BufferSize: uint64(u * 19), Timeout: time.Duration(hid * 11),
	}}
	for i, f := range p.fns() {
		*f = u*100 + uintptr(i)
	}
	return p
}

const planBase = 0x5180_0000 // the symmetric-memory handles' ids start there

func TestPlanPublishEnterRetire(t *testing.T) {
	hid := int64(planBase + 17)
	_, _, ok := holdPlan(hid)
	require.False(t, ok, "no plan before one is published")
	require.True(t, publishPlan(planFor(hid)))
	p, release, ok := holdPlan(hid)
	require.True(t, ok)
	require.Equal(t, planFor(hid), p)
	release()
	require.True(t, publishPlan(planFor(hid)), "published again over its own")
	require.True(t, retirePlan(hid))
	_, _, ok = holdPlan(hid)
	require.False(t, ok, "a retired plan is refused: the call goes through Go")
	require.False(t, retirePlan(hid), "retired once")
}

// Two handles whose ids share a slot: the second gets no plan while the
// first's is live, and its callers never read the first's.
func TestPlanSlotShared(t *testing.T) {
	a, b := int64(planBase+40), int64(planBase+40+1024)
	require.True(t, publishPlan(planFor(a)))
	require.False(t, publishPlan(planFor(b)), "the slot holds a's")
	_, _, ok := holdPlan(b)
	require.False(t, ok)
	require.False(t, retirePlan(b), "b has none to retire; a's stays")
	p, release, ok := holdPlan(a)
	require.True(t, ok)
	require.Equal(t, a, p.HID)
	release()
	require.True(t, retirePlan(a))
	require.True(t, publishPlan(planFor(b)), "free again")
	_, _, ok = holdPlan(a)
	require.False(t, ok, "a's id no longer enters")
	require.True(t, retirePlan(b))
}

func TestPlanIDsThatDoNotFit(t *testing.T) {
	for _, hid := range []int64{-1, 1 << 32, 1<<62 + 5} {
		require.False(t, publishPlan(planFor(hid)), "%d", hid)
		_, _, ok := holdPlan(hid)
		require.False(t, ok)
		require.False(t, retirePlan(hid))
	}
}

// A retire returns only once every caller inside has left: after it, Go
// may free what the plan points to.
func TestPlanRetireWaitsForCallers(t *testing.T) {
	hid := int64(planBase + 99)
	require.True(t, publishPlan(planFor(hid)))
	_, release, ok := holdPlan(hid)
	require.True(t, ok)
	done := make(chan struct{})
	go func() {
		retirePlan(hid)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("retire returned while a caller was inside")
	case <-time.After(50 * time.Millisecond):
	}
	_, _, ok = holdPlan(hid)
	require.False(t, ok, "no new caller enters while it retires")
	release()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("retire did not return once the caller left")
	}
}

// Callers on many threads while the slot's plan is retired and another
// handle's published over and over: every plan read is whole and its own
// handle's, and no caller is inside a plan once its retire returned.
func TestPlanConcurrentCallers(t *testing.T) {
	a, b := int64(planBase+300), int64(planBase+300+1024)
	var inside [2]atomic.Int64 // callers inside a's and b's plans
	var retired [2]atomic.Bool
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := [2]int64{a, b}
			for i := 0; !stop.Load(); i++ {
				k := (i + w) % 2
				p, release, ok := holdPlan(ids[k])
				if !ok {
					continue
				}
				inside[k].Add(1)
				if retired[k].Load() {
					select {
					case errs <- "a caller entered a retired plan":
					default:
					}
				}
				if p != planFor(ids[k]) {
					select {
					case errs <- "a plan read torn or another handle's":
					default:
					}
				}
				inside[k].Add(-1)
				release()
				reads.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		k := i % 2
		id := [2]int64{a, b}[k]
		retired[k].Store(false)
		require.True(t, publishPlan(planFor(id)))
		time.Sleep(50 * time.Microsecond)
		// Marked before the retire: a caller that sees the mark still inside
		// afterwards entered a plan whose retire had returned.
		require.True(t, retirePlan(id))
		retired[k].Store(true)
		require.Zero(t, inside[k].Load(), "a caller inside after its plan's retire returned")
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	require.NotZero(t, reads.Load(), "callers read plans")
}
