package symmetric

import (
	"sync/atomic"
	"time"

	"github.com/libsymm/libsymm/kernels"
)

// Launch plans: everything a per-call entry point needs to launch one of a
// handle's kernels without entering Go (export/plans.h keeps them for C).
// Go makes a handle's plan once and withdraws it; the caller that keeps
// it for C passes the two steps in (PublishPlan).
//
// Invariants:
//   - a plan is made only for a handle whose signals run as kernels on a
//     CUDA device (its signaler is kernelSignals and its provider launches
//     through the driver), after its status word is taken and the handle
//     is in the watchdog's set: a call launched from the plan is watched
//     as one launched here;
//   - the plan is withdrawn (retire) before the block's mappings, arrays
//     and status word go (release), and as soon as the handle fails (fail):
//     a plan that can be entered belongs to a live, healthy handle. Publish
//     and the withdrawal hook are set while the block is held (Acquire), so
//     a free cannot pass between them;
//   - a handle is offered a plan once (planState.tried); a handle without one
//     keeps going through Go.

// Plan is a handle's launch plan: its device and group position, the
// device addresses its kernels take, and the kernels' function handles
// (loaded on its device). Sized and indexed as export/plans.h.
type Plan struct {
	Device, Rank, World int
	Channels            int    // signal-pad channels: padChannels(World)
	MaxBlocks           uint32 // the collectives' grid cap (maxBlocks)
	Buffers, Pads       uintptr
	Epochs, Status      uintptr
	Buffer              uintptr // this rank's buffer as mapped here (the overlap checks)
	BufferSize          uint64
	Timeout             time.Duration // the kernels' deadline (SYMM_TIMEOUT_MS)
	MeetBarrier         int           // the barrier's meeting kind (kernels.MeetBarrier)
	Barrier, Put, Wait  uintptr
	// [dtype][0: 4 words per thread, 1: one word]
	OneShot, TwoShot, ReduceScatter [kernels.NumDtypes][2]uintptr
	AllGather                       [2]uintptr
	// The push all-reduce, where the handle serves as its workspace: the
	// state, the slot lines, the host address of the ready word its set-up
	// kernel writes (push.go), the grid cap, the kernels by dtype.
	PushState, PushReady uintptr
	PushLines            uint64
	PushMaxBlocks        uint32
	Push                 [kernels.NumDtypes]uintptr
}

// planState is a handle's part in the plans: whether it was offered one,
// and the hook that withdraws it.
type planState struct {
	tried  atomic.Bool
	retire atomic.Pointer[func()]
}

// PublishPlan makes the handle's launch plan once, if its calls can run
// without Go, and hands it to publish while the block is held; retire is
// kept and called when the plan must be withdrawn (the handle fails or its
// block is freed). It returns at once for a handle offered one before. No
// plan (false, nil) where the calls need Go: the host backend, stream
// memory operations, a runner of its own. An error is a kernel that could
// not be loaded; the handle's calls go through Go, which reports it.
func (h *Handle) PublishPlan(publish func(Plan) bool, retire func()) (bool, error) {
	if h.plan.tried.Load() {
		return false, nil
	}
	_, runner := h.m.prov.(kernelRunner)
	_, device := h.m.prov.(kernelDevice)
	if runner || !device || h.m.cfg.LaunchThroughGo {
		h.plan.tried.Store(true)
		return false, nil
	}
	return h.publishPlan(publish, retire)
}

// PlanOffered reports whether the handle was offered a plan already (one
// atomic load: callers check it before they make PublishPlan's arguments).
func (h *Handle) PlanOffered() bool { return h.plan.tried.Load() }

// publishPlan is PublishPlan past the provider's check (tests call it with
// a simulated device).
func (h *Handle) publishPlan(publish func(Plan) bool, retire func()) (bool, error) {
	release, err := h.Acquire()
	if err != nil {
		return false, err
	}
	defer release()
	if !h.plan.tried.CompareAndSwap(false, true) || h.failed() != nil {
		return false, nil
	}
	s, err := h.signals()
	if err != nil {
		return false, err
	}
	if _, ok := s.(kernelSignals); !ok {
		return false, nil
	}
	p, err := h.makePlan()
	if err != nil {
		return false, err
	}
	h.watchKernels()
	h.plan.retire.Store(&retire)
	if !publish(p) {
		return false, nil
	}
	// A failure racing the publish either saw the hook (and retired) or
	// is seen here.
	if h.failed() != nil {
		retire()
		return false, nil
	}
	return true, nil
}

// makePlan gathers the plan; the caller holds the block.
func (h *Handle) makePlan() (Plan, error) {
	st, err := h.statusWord()
	if err != nil {
		return Plan{}, err
	}
	dev := h.b.Dev()
	p := Plan{
		Device: dev, Rank: h.rank, World: h.world, Channels: padChannels(h.world), MaxBlocks: h.maxBlocks,
		Buffers: h.BufferPtrsDev(), Pads: h.PadPtrsDev(), Epochs: h.epochsArg(), Status: st,
		Buffer: h.BufferPtr(h.rank), BufferSize: h.b.bufSize, Timeout: h.kernelTimeout(0),
		MeetBarrier: kernels.MeetBarrier,
		PushState:   h.pushStateDev(), PushReady: h.kstat.host + 8, PushLines: pushSlotLines(h.b.bufSize, h.world),
		PushMaxBlocks: kernels.PushMaxBlocks,
	}
	fns := []planFn{{&p.Barrier, kBarrier}, {&p.Put, kPut}, {&p.Wait, kWait},
		{&p.AllGather[0], allGatherIndex(4)}, {&p.AllGather[1], allGatherIndex(1)}}
	for _, d := range kernels.Dtypes() {
		fns = append(fns, planFn{&p.Push[d], kPush + int(d)})
		for i, v := range []int{4, 1} {
			fns = append(fns, planFn{&p.OneShot[d][i], allReduceIndex(d, v, h.world)},
				planFn{&p.TwoShot[d][i], twoShotIndex(d, v, h.world)},
				planFn{&p.ReduceScatter[d][i], reduceScatterIndex(d, v, h.world)})
		}
	}
	for _, f := range fns {
		if *f.to, err = h.function(f.id); err != nil {
			return Plan{}, err
		}
	}
	return p, nil
}

// planFn is a plan's field and the kernel loaded into it.
type planFn struct {
	to *uintptr
	id int
}

// retirePlan withdraws the handle's plan, if it has one: before its block
// goes (release) and when it fails (fail). The hook is taken once.
func (h *Handle) retirePlan() {
	if r := h.plan.retire.Swap(nil); r != nil {
		(*r)()
	}
}

// geometry is what the collectives' checks need of a handle: its place in
// the group and its own buffer.
type geometry struct {
	rank, world int
	buf         uintptr // this rank's buffer as mapped here
	bufSize     uint64
}

func (h *Handle) geometry() geometry {
	return geometry{rank: h.rank, world: h.world, buf: h.BufferPtr(h.rank), bufSize: h.b.bufSize}
}

// Collective names, as CheckPlanCall takes them.
const (
	OneShotAllReduce   = oneShotName
	TwoShotAllReduce   = twoShotName
	ReduceScatterShare = reduceScatterName
	AllGatherShare     = allGatherName
)

// CheckPlanCall is the check a collective fn (OneShotAllReduce, ...) makes
// of a on a handle with plan p: the message's (or one share's) size in
// bytes, or why a is refused. A plan's C caller launches only calls this
// accepts (its tests compare the two).
func CheckPlanCall(p Plan, fn string, a AllReduce) (uint64, error) {
	g := geometry{rank: p.Rank, world: p.World, buf: p.Buffer, bufSize: p.BufferSize}
	if fn == oneShotName || fn == twoShotName {
		return g.checkAllReduce(a, fn)
	}
	return g.checkCollective(a, fn)
}

// CheckPlanPush is the check a push all-reduce makes of a on a workspace
// with plan p: its size in bytes, or why it is refused (what a plan's C
// caller must agree with).
func CheckPlanPush(p Plan, a PushAllReduce) (uint64, error) {
	return geometry{rank: p.Rank, world: p.World, buf: p.Buffer, bufSize: p.BufferSize}.checkPush(a)
}

// LaunchShape is the collectives' launch shape (words per thread, blocks,
// threads) for nbytes at offset in a world of world ranks whose grids are
// capped at maxBlocks: what a plan's caller launches.
func LaunchShape(offset, nbytes uint64, world int, maxBlocks uint32) (v int, blocks, threads uint32) {
	return allReduceShape(offset, nbytes, world, maxBlocks)
}
