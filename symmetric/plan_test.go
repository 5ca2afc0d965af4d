package symmetric

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// planRecorder stands for the table that keeps plans for C
// (export/plans.go): what was published and whether it was withdrawn.
type planRecorder struct {
	plans   []Plan
	retired int
	refuse  bool
}

func (r *planRecorder) publish(p Plan) bool {
	if r.refuse {
		return false
	}
	r.plans = append(r.plans, p)
	return true
}

func (r *planRecorder) retire() { r.retired++ }

// A kernel handle's plan holds what its Go calls launch with: the arrays,
// the status word, the deadline and every kernel of its world; it is
// offered once, and the handle is in the watchdog's set by then.
func TestPublishPlanFields(t *testing.T) {
	h := simHandle(t, newSimGPU(t), 3*time.Second)
	var r planRecorder
	ok, err := h.publishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, r.plans, 1)
	p := r.plans[0]
	st, err := h.statusWord()
	require.NoError(t, err)
	require.Equal(t, Plan{
		Device: 0, Rank: 0, World: 1, Channels: SignalPadSize / 4, MaxBlocks: h.maxBlocks,
		Buffers: h.BufferPtrsDev(), Pads: h.PadPtrsDev(), Epochs: h.epochsArg(), Status: st,
		Buffer: h.BufferPtr(0), BufferSize: 4096, Timeout: 3 * time.Second, MeetBarrier: kernels.MeetBarrier,
		Barrier: kBarrier + 1, Put: kPut + 1, Wait: kWait + 1,
		OneShot: [3][2]uintptr{
			{uintptr(allReduceIndex(kernels.Float32, 4, 1) + 1), uintptr(allReduceIndex(kernels.Float32, 1, 1) + 1)},
			{uintptr(allReduceIndex(kernels.BFloat16, 4, 1) + 1), uintptr(allReduceIndex(kernels.BFloat16, 1, 1) + 1)},
			{uintptr(allReduceIndex(kernels.Float16, 4, 1) + 1), uintptr(allReduceIndex(kernels.Float16, 1, 1) + 1)}},
		TwoShot: [3][2]uintptr{
			{uintptr(twoShotIndex(kernels.Float32, 4, 1) + 1), uintptr(twoShotIndex(kernels.Float32, 1, 1) + 1)},
			{uintptr(twoShotIndex(kernels.BFloat16, 4, 1) + 1), uintptr(twoShotIndex(kernels.BFloat16, 1, 1) + 1)},
			{uintptr(twoShotIndex(kernels.Float16, 4, 1) + 1), uintptr(twoShotIndex(kernels.Float16, 1, 1) + 1)}},
		ReduceScatter: [3][2]uintptr{
			{uintptr(reduceScatterIndex(kernels.Float32, 4, 1) + 1), uintptr(reduceScatterIndex(kernels.Float32, 1, 1) + 1)},
			{uintptr(reduceScatterIndex(kernels.BFloat16, 4, 1) + 1), uintptr(reduceScatterIndex(kernels.BFloat16, 1, 1) + 1)},
			{uintptr(reduceScatterIndex(kernels.Float16, 4, 1) + 1), uintptr(reduceScatterIndex(kernels.Float16, 1, 1) + 1)}},
		AllGather: [2]uintptr{uintptr(allGatherIndex(4) + 1), uintptr(allGatherIndex(1) + 1)},
		PushState: h.pushStateDev(), PushReady: h.kstat.host + 8, PushLines: pushSlotLines(4096, 1),
		PushMaxBlocks: kernels.PushMaxBlocks,
		Push:          [3]uintptr{kPush + 1, kPush + 2, kPush + 3},
	}, p)
	require.True(t, h.kstat.watched.Load(), "its kernels are watched before C launches any")
	require.True(t, h.PlanOffered())
	ok, err = h.publishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.False(t, ok, "offered once")
	require.Len(t, r.plans, 1)
}

// The plan is withdrawn when the handle fails, once, and its block's free
// then has nothing left to withdraw.
func TestPlanRetiredOnFailure(t *testing.T) {
	h := simHandle(t, newSimGPU(t), time.Second)
	var r planRecorder
	ok, err := h.publishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.True(t, ok)
	h.fail(errors.New("a peer did not come"))
	require.Equal(t, 1, r.retired)
	h.fail(errors.New("a second failure"))
	require.Equal(t, 1, r.retired, "withdrawn once")
}

// The plan is withdrawn before the block's mappings and status word go.
func TestPlanRetiredOnFree(t *testing.T) {
	g := newSimGPU(t)
	m := NewManager(g, Config{Timeout: time.Second, Signals: SignalsKernel})
	m.kern.once.Do(func() { m.kern.ready = map[int]error{0: nil} })
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	b, err := m.Alloc(0, 4096)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "solo", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	for id := range h.kstat.fns {
		h.kstat.fns[id].Store(uintptr(id + 1))
	}
	var r planRecorder
	var statusAtRetire uintptr
	ok, err := h.publishPlan(r.publish, func() { statusAtRetire = h.kstat.host; r.retire() })
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, m.Free(b.Ptr()))
	require.Equal(t, 1, r.retired)
	require.NotZero(t, statusAtRetire, "withdrawn while its status word was still the handle's")
	_, err = h.publishPlan(r.publish, r.retire)
	require.ErrorIs(t, err, ErrUnknownPointer, "a freed handle gets no plan")
}

// No plan for a failed handle, for one whose signals are stream memory
// operations, or where the table refuses it (its slot is taken); a
// provider that runs kernels itself, or SYMM_LAUNCH_THROUGH_GO=1, gets
// none from PublishPlan.
func TestPlanRefused(t *testing.T) {
	var r planRecorder
	h := simHandle(t, newSimGPU(t), time.Second)
	h.fail(errors.New("failed before"))
	ok, err := h.publishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.False(t, ok)

	memop := soloHandle(t, kernelHost{NewHostProvider()}, Config{Signals: SignalsMemop})
	ok, err = memop.publishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.False(t, ok)

	h = simHandle(t, newSimGPU(t), time.Second)
	ok, err = h.PublishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.False(t, ok, "the simulated device runs its kernels in Go")

	goOnly := soloHandle(t, kernelHost{NewHostProvider()}, Config{LaunchThroughGo: true})
	ok, err = goOnly.PublishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.False(t, ok, "SYMM_LAUNCH_THROUGH_GO=1")
	require.True(t, goOnly.PlanOffered())

	h = simHandle(t, newSimGPU(t), time.Second)
	r.refuse = true
	ok, err = h.publishPlan(r.publish, r.retire)
	require.NoError(t, err)
	require.False(t, ok)
	require.Empty(t, r.plans)
	require.Zero(t, r.retired)
}
