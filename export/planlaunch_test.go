package main

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/symmetric"
)

// The per-call launches from a plan (plans.cpp), through the recording
// driver: the kernel, grid, block, stream and every parameter word each
// entry point queues, the context it queues in, and the calls it passes
// on to Go (no plan, arguments Go must refuse, a launch the driver
// refused) having queued nothing.

const (
	lpBuffer = uintptr(0x7000_0000_0000)
	lpSize   = uint64(1 << 20)
)

// launchTestPlan is a world-4 plan of rank 1 over a 1 MiB buffer.
func launchTestPlan(hid int64) launchPlan {
	p := planFor(hid)
	p.World, p.Rank, p.Channels, p.MaxBlocks, p.MeetBarrier = 4, 1, symmetric.SignalPadSize/4/4, 96, kernels.MeetBarrier
	p.Buffer, p.BufferSize = lpBuffer, lpSize
	p.PushLines, p.PushMaxBlocks, p.PushReady = lpSize/(2*16*4), kernels.PushMaxBlocks, recordReady(1)
	return p
}

// withPlan publishes p with the recording driver on a locked thread (its
// context is per thread) and retires it when the test ends.
func withPlan(t *testing.T, p launchPlan) {
	runtime.LockOSThread()
	recordLaunches()
	require.True(t, publishPlan(p))
	t.Cleanup(func() {
		retirePlan(p.HID)
		runtime.UnlockOSThread()
	})
}

func TestPlanSignalLaunches(t *testing.T) {
	p := launchTestPlan(planBase + 501)
	withPlan(t, p)
	tail := []uint64{uint64(p.Timeout.Nanoseconds()), uint64(p.Status)}

	recordReset(8, uintptr(p.Ctx), false)
	require.Equal(t, 0, planBarrier(p.HID, 3, 0x1234))
	l, n, _ := recorded()
	require.Equal(t, 1, n)
	require.Equal(t, planLaunch{Fn: uint64(p.Barrier), Stream: 0x1234, Grid: 1, Block: 32,
		Words: append([]uint64{uint64(p.Pads), uint64(p.Epochs), 1, 4, 3, kernels.MeetBarrier}, tail...)}, l)

	recordReset(7, uintptr(p.Ctx), false)
	require.Equal(t, 0, planPut(p.HID, 2, 5, 0))
	l, _, _ = recorded()
	require.Equal(t, planLaunch{Fn: uint64(p.Put), Stream: 1, Grid: 1, Block: 32, // stream 0: CU_STREAM_LEGACY, as Go passes it
		Words: append([]uint64{uint64(p.Pads), 1, 4, 2, 5}, tail...)}, l)

	recordReset(7, uintptr(p.Ctx), false)
	require.Equal(t, 0, planWait(p.HID, 0, p.Channels-1, 0x99))
	l, _, _ = recorded()
	require.Equal(t, planLaunch{Fn: uint64(p.Wait), Stream: 0x99, Grid: 1, Block: 32,
		Words: append([]uint64{uint64(p.Pads), 1, 4, 0, uint64(p.Channels - 1)}, tail...)}, l)
}

// Calls the plan does not take go to Go, which words their errors (the
// same checks as symmetric's kernelCheck), with nothing queued.
func TestPlanSignalsPassedOn(t *testing.T) {
	p := launchTestPlan(planBase + 502)
	withPlan(t, p)
	for name, call := range map[string]func() int{
		"channel -1":            func() int { return planBarrier(p.HID, -1, 0) },
		"channel past the pad":  func() int { return planBarrier(p.HID, p.Channels, 0) },
		"put to rank -1":        func() int { return planPut(p.HID, -1, 0, 0) },
		"put to rank 4 of 4":    func() int { return planPut(p.HID, 4, 0, 0) },
		"wait on channel past":  func() int { return planWait(p.HID, 0, p.Channels, 0) },
		"wait from rank 4 of 4": func() int { return planWait(p.HID, 4, 0, 0) },
		"another handle":        func() int { return planBarrier(p.HID+1, 0, 0) },
	} {
		recordReset(8, uintptr(p.Ctx), false)
		require.Equal(t, 1, call(), name)
		_, n, _ := recorded()
		require.Zero(t, n, "%s: queued", name)
	}
	recordReset(8, uintptr(p.Ctx), true)
	require.Equal(t, 1, planBarrier(p.HID, 0, 0), "a launch the driver refused goes to Go, which reports it")
	require.True(t, retirePlan(p.HID))
	recordReset(8, uintptr(p.Ctx), false)
	require.Equal(t, 1, planBarrier(p.HID, 0, 0), "a retired plan is never launched from")
	_, n, _ := recorded()
	require.Zero(t, n)
}

// A barrier in a world of one queues nothing, as in Go.
func TestPlanBarrierWorldOfOne(t *testing.T) {
	p := launchTestPlan(planBase + 503)
	p.World, p.Rank, p.Channels = 1, 0, symmetric.SignalPadSize/4
	withPlan(t, p)
	recordReset(8, uintptr(p.Ctx), false)
	require.Equal(t, 0, planBarrier(p.HID, 7, 0))
	require.Equal(t, 1, planBarrier(p.HID, p.Channels, 0), "its channel is still checked")
	_, n, _ := recorded()
	require.Zero(t, n)
}

// The launch's context: the plan's when current (nothing changes); bound
// to a thread that had none, and kept there; pushed over another and
// popped, leaving the caller's current.
func TestPlanLaunchContext(t *testing.T) {
	p := launchTestPlan(planBase + 504)
	withPlan(t, p)
	recordReset(7, uintptr(p.Ctx), false)
	require.Equal(t, 0, planPut(p.HID, 0, 0, 0))
	l, _, pushes := recorded()
	require.False(t, l.CtxSet)
	require.Zero(t, pushes)

	recordReset(7, 0, false)
	require.Equal(t, 0, planPut(p.HID, 0, 0, 0))
	l, _, pushes = recorded()
	require.True(t, l.CtxSet, "a thread without a context gets the plan's")
	require.Zero(t, pushes)
	require.Equal(t, uintptr(p.Ctx), recordCurrent(), "bound once: the next call finds it current")

	recordReset(7, 0xdead0, false)
	require.Equal(t, 0, planPut(p.HID, 0, 0, 0))
	l, _, pushes = recorded()
	require.False(t, l.CtxSet)
	require.Equal(t, 1, pushes)
	require.True(t, l.Pushed, "pushed and popped")
	require.Equal(t, uintptr(0xdead0), recordCurrent(), "the caller's context is current again")
}

// collKinds are the collectives by C kind, with their name in symmetric.
var collKinds = []struct {
	kind int
	name string
}{{0, symmetric.OneShotAllReduce}, {1, symmetric.TwoShotAllReduce}, {2, symmetric.ReduceScatterShare},
	{3, symmetric.AllGatherShare}}

// expectCollective is the launch Go makes for a on plan p (kind's kernel
// by dtype and words per thread, the shape, the words), for an a Go takes.
func expectCollective(t *testing.T, p launchPlan, kind int, a symmetric.AllReduce) planLaunch {
	nbytes, err := symmetric.CheckPlanCall(p.Plan, collKinds[kind].name, a)
	require.NoError(t, err)
	v, blocks, threads := symmetric.LaunchShape(a.Offset, nbytes, p.World, p.MaxBlocks)
	i := 0
	if v != 4 {
		i = 1
	}
	fn := [...]uintptr{p.OneShot[a.Dtype][i], p.TwoShot[a.Dtype][i], p.ReduceScatter[a.Dtype][i], p.AllGather[i]}[kind]
	stream := uint64(a.Stream)
	if stream == 0 {
		stream = 1
	}
	return planLaunch{Fn: uint64(fn), Stream: stream, Grid: blocks, Block: threads, Words: []uint64{
		uint64(p.Buffers), a.Offset, nbytes / 4, uint64(a.Out), uint64(a.Local), uint64(p.Pads), uint64(p.Epochs), 1, 4,
		uint64(p.Timeout.Nanoseconds()), uint64(p.Status)}}
}

func TestPlanCollectiveLaunches(t *testing.T) {
	p := launchTestPlan(planBase + 505)
	withPlan(t, p)
	out := uintptr(0x9000_0000_0000)
	for _, c := range []struct {
		kind  int
		a     symmetric.AllReduce
		label string
	}{
		{0, symmetric.AllReduce{Offset: 0, Count: 1024, Dtype: kernels.Float32, Out: out, Stream: 7}, "one-shot f32, 4 words"},
		{0, symmetric.AllReduce{Offset: 4, Count: 6, Dtype: kernels.BFloat16, Out: out}, "one-shot bf16, 1 word"},
		{0, symmetric.AllReduce{Offset: 0, Count: 1 << 17, Dtype: kernels.Float16, Out: out, Local: out + 1<<20}, "one-shot f16, copy-in, many blocks"},
		{1, symmetric.AllReduce{Offset: 4096, Count: 4096, Dtype: kernels.Float32, Out: lpBuffer + 4096}, "two-shot in place"},
		{2, symmetric.AllReduce{Offset: 0, Count: 512, Dtype: kernels.BFloat16, Out: out}, "reduce-scatter"},
		{3, symmetric.AllReduce{Offset: 0, Count: 512, Dtype: kernels.Float16, Out: out}, "all-gather"},
		{3, symmetric.AllReduce{Offset: 0, Count: 2, Dtype: kernels.Float32, Out: lpBuffer, Local: lpBuffer + 8}, "all-gather in place, 1 word"},
	} {
		want := expectCollective(t, p, c.kind, withSum(c.kind, c.a))
		recordReset(11, uintptr(p.Ctx), false)
		op := 0
		if c.kind == 3 {
			op = -1
		}
		require.Equal(t, 0, planCollective(c.kind, p.HID, c.a.Offset, c.a.Count, int(c.a.Dtype), op, c.a.Out, c.a.Local, c.a.Stream), c.label)
		l, n, _ := recorded()
		require.Equal(t, 1, n, c.label)
		require.Equal(t, want, l, c.label)
	}
}

// withSum sets the op Go's checks want for kind (the all-gather has none).
func withSum(kind int, a symmetric.AllReduce) symmetric.AllReduce {
	if kind != 3 {
		a.Op = "sum"
	}
	return a
}

// FuzzPlanCollective: the plan's checks accept exactly what Go's accept
// (symmetric.CheckPlanCall: size, alignment, fit, overlaps), and what they
// accept launches as Go would. Outputs and inputs are drawn around the
// rank's buffer, where the overlap rules bite.
func FuzzPlanCollective(f *testing.F) {
	f.Add(uint8(0), uint64(0), uint64(256), uint8(0), int8(0), int64(1<<21), int64(0), false)
	f.Add(uint8(1), uint64(64), uint64(100), uint8(1), int8(0), int64(64), int64(64), true)
	f.Add(uint8(2), uint64(4), uint64(3), uint8(2), int8(0), int64(-4096), int64(12), true)
	f.Add(uint8(3), uint64(0), uint64(64), uint8(0), int8(-1), int64(64), int64(0), true)
	f.Add(uint8(0), uint64(1<<20-8), uint64(4), uint8(1), int8(1), int64(1<<21), int64(0), false)
	p := launchTestPlan(planBase + 506)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	recordLaunches()
	require.True(f, publishPlan(p))
	defer retirePlan(p.HID)
	f.Fuzz(func(t *testing.T, kind uint8, offset, count uint64, dtype uint8, op int8, outAt, localAt int64, withLocal bool) {
		k := int(kind % 4)
		a := symmetric.AllReduce{Offset: offset, Count: count, Dtype: kernels.Dtype(dtype % 4), Out: lpBuffer + uintptr(outAt)}
		if withLocal {
			a.Local = lpBuffer + uintptr(localAt)
		}
		recordReset(11, uintptr(p.Ctx), false)
		got := planCollective(k, p.HID, a.Offset, a.Count, int(a.Dtype), int(op), a.Out, a.Local, 0)
		opOK := (k == 3 && op == -1) || (k != 3 && op == 0)
		nbytes, err := symmetric.CheckPlanCall(p.Plan, collKinds[k].name, withSum(k, a))
		if !opOK || err != nil || nbytes == 0 {
			require.Equal(t, 1, got, "passed on to Go (op ok %v, Go's check: %v, %d bytes)", opOK, err, nbytes)
			_, n, _ := recorded()
			require.Zero(t, n)
			return
		}
		require.Equal(t, 0, got, "Go takes %+v as %s", a, collKinds[k].name)
		l, _, _ := recorded()
		require.Equal(t, expectCollective(t, p, k, withSum(k, a)), l)
	})
}

// The plan's launch shape is Go's, over sizes, offsets, worlds and caps.
func TestPlanShapeIsGos(t *testing.T) {
	for _, world := range []int{1, 2, 3, 4, 8, 16, 72} {
		for _, maxBlocks := range []uint32{0, 1, 24, 96, 512} {
			for nbytes := uint64(4); nbytes < 1<<31; nbytes = nbytes*3 + 4 {
				for _, offset := range []uint64{0, 4, 16} {
					v, b, th := symmetric.LaunchShape(offset, nbytes, world, maxBlocks)
					cv, cb, cth := planShape(offset, nbytes, world, maxBlocks)
					require.Equal(t, [3]uint64{uint64(v), uint64(b), uint64(th)}, [3]uint64{uint64(cv), uint64(cb), uint64(cth)},
						"offset %d, %d bytes, world %d, cap %d", offset, nbytes, world, maxBlocks)
				}
			}
		}
	}
}

// expectPush is the launch Go makes for a push all-reduce a on plan p.
func expectPush(t *testing.T, p launchPlan, a symmetric.PushAllReduce) planLaunch {
	nbytes, err := symmetric.CheckPlanPush(p.Plan, a)
	require.NoError(t, err)
	blocks, threads := kernels.PushLaunch((nbytes + 7) / 8)
	stream := uint64(a.Stream)
	if stream == 0 {
		stream = 1
	}
	return planLaunch{Fn: uint64(p.Push[a.Dtype]), Stream: stream, Grid: blocks, Block: threads, Words: []uint64{
		uint64(p.Buffers), uint64(p.PushState), uint64(a.In), uint64(a.Out), nbytes, p.PushLines, 1, 4,
		uint64(p.Timeout.Nanoseconds()), uint64(p.Status)}}
}

// The push all-reduce launches from the plan once its workspace is set up
// (the ready word its set-up kernel writes); before, it goes to Go, which
// queues the set-up.
func TestPlanPushLaunch(t *testing.T) {
	p := launchTestPlan(planBase + 507)
	withPlan(t, p)
	in, out := uintptr(0x9000_0000_0000), uintptr(0x9100_0000_0000)
	recordReady(0)
	recordReset(10, uintptr(p.Ctx), false)
	require.Equal(t, 1, planPush(p.HID, in, out, 1000, int(kernels.Float32), 0, 0), "not set up yet")
	_, n, _ := recorded()
	require.Zero(t, n)
	recordReady(1)
	for _, a := range []symmetric.PushAllReduce{
		{In: in, Out: out, Count: 1000, Dtype: kernels.Float32, Stream: 5},
		{In: in, Out: in, Count: 3, Dtype: kernels.BFloat16},
		{In: in + 2, Out: out + 6, Count: 30000, Dtype: kernels.Float16},
	} {
		a.Op = "sum"
		recordReset(10, uintptr(p.Ctx), false)
		require.Equal(t, 0, planPush(p.HID, a.In, a.Out, a.Count, int(a.Dtype), 0, a.Stream))
		l, _, _ := recorded()
		require.Equal(t, expectPush(t, p, a), l)
	}
}

// FuzzPlanPush: the plan takes exactly the push all-reduces Go's checks
// take (symmetric.CheckPlanPush), and launches them as Go would.
func FuzzPlanPush(f *testing.F) {
	f.Add(int64(1<<30), int64(1<<31), uint64(256), uint8(0), int8(0))
	f.Add(int64(1<<30), int64(1<<30), uint64(3), uint8(1), int8(0))
	f.Add(int64(8), int64(1<<30), uint64(100), uint8(2), int8(0))
	f.Add(int64(1<<30), int64(1<<30+2), uint64(100), uint8(2), int8(1))
	f.Add(int64(-64), int64(1<<30), uint64(1<<20), uint8(0), int8(0))
	p := launchTestPlan(planBase + 508)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	recordLaunches()
	recordReady(1)
	require.True(f, publishPlan(p))
	defer retirePlan(p.HID)
	f.Fuzz(func(t *testing.T, inAt, outAt int64, count uint64, dtype uint8, op int8) {
		a := symmetric.PushAllReduce{In: lpBuffer + uintptr(inAt), Out: lpBuffer + uintptr(outAt), Count: count,
			Dtype: kernels.Dtype(dtype % 4), Op: "sum"}
		recordReset(10, uintptr(p.Ctx), false)
		got := planPush(p.HID, a.In, a.Out, a.Count, int(a.Dtype), int(op), 0)
		nbytes, err := symmetric.CheckPlanPush(p.Plan, a)
		if op != 0 || err != nil || nbytes == 0 {
			require.Equal(t, 1, got, "passed on to Go (op %d, Go's check: %v, %d bytes)", op, err, nbytes)
			_, n, _ := recorded()
			require.Zero(t, n)
			return
		}
		require.Equal(t, 0, got, "Go takes %+v", a)
		l, _, _ := recorded()
		require.Equal(t, expectPush(t, p, a), l)
	})
}

// The plan's push launch shape is Go's.
func TestPlanPushShapeIsGos(t *testing.T) {
	for nbytes := uint64(1); nbytes < 1<<32; nbytes = nbytes*3 + 1 {
		b, th := kernels.PushLaunch((nbytes + 7) / 8)
		cb, cth := planPushShape(nbytes, kernels.PushMaxBlocks)
		require.Equal(t, [2]uint32{b, th}, [2]uint32{cb, cth}, "%d bytes", nbytes)
	}
}
