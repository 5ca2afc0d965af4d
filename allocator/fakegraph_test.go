package allocator

import (
	"errors"
	"slices"
	"sync"
)

// fakeGraph is a fakeBackend that is also a CaptureGrapher: it models CUDA
// stream capture as a DAG. Each capturing stream has a capture id and its
// current capture dependencies (the nodes its next work follows); work
// (kernel) and free markers (MarkFree) are nodes after those dependencies,
// which then become the new node alone; wait (cudaStreamWaitEvent on an
// event of another stream) adds the other stream's dependencies, and makes
// a stream that was not capturing join the capture (a fork).
type fakeGraph struct {
	*fakeBackend
	gmu     sync.Mutex
	capture map[uintptr]uint64
	deps    map[uintptr][]GraphNode
	parents map[GraphNode][]GraphNode
	next    GraphNode
	// fail["mark"|"deps"|"node"]: the next such call fails, once.
	fail  map[string]error
	calls map[string]int
	// failAt[op]: the call of op with this count fails with failErr.
	failAt  map[string]int
	failErr error
}

func newFakeGraph(devices int) *fakeGraph {
	return &fakeGraph{fakeBackend: newFake(devices), capture: map[uintptr]uint64{},
		deps: map[uintptr][]GraphNode{}, parents: map[GraphNode][]GraphNode{}, next: 0x100,
		fail: map[string]error{}, calls: map[string]int{}}
}

var _ CaptureGrapher = (*fakeGraph)(nil)

func (g *fakeGraph) failing(op string) error {
	g.calls[op]++
	if n, ok := g.failAt[op]; ok && n == g.calls[op] {
		return g.failErr
	}
	if err := g.fail[op]; err != nil {
		delete(g.fail, op)
		return err
	}
	return nil
}

// node adds a node after st's dependencies and makes it st's only one.
func (g *fakeGraph) node(st uintptr) GraphNode {
	g.next++
	n := g.next
	g.parents[n] = slices.Clone(g.deps[st])
	g.deps[st] = []GraphNode{n}
	return n
}

func (g *fakeGraph) begin(st uintptr, id uint64) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	g.capture[st], g.deps[st] = id, nil
}

func (g *fakeGraph) kernel(st uintptr) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	if _, ok := g.capture[st]; !ok {
		panic("kernel on a stream that is not capturing")
	}
	g.node(st)
}

// wait makes dst wait for what src captured so far.
func (g *fakeGraph) wait(dst, src uintptr) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	id, ok := g.capture[src]
	if !ok {
		panic("wait on a stream that is not capturing")
	}
	if _, ok := g.capture[dst]; !ok {
		g.capture[dst] = id
	}
	for _, n := range g.deps[src] {
		if !slices.Contains(g.deps[dst], n) {
			g.deps[dst] = append(g.deps[dst], n)
		}
	}
}

// end ends the capture of every stream in capture id.
func (g *fakeGraph) end(id uint64) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	for st, c := range g.capture {
		if c == id {
			delete(g.capture, st)
			delete(g.deps, st)
		}
	}
}

func (g *fakeGraph) MarkFree(dev int, st uintptr) (GraphNode, uint64, bool, error) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	if err := g.failing("mark"); err != nil {
		return 0, 0, false, err
	}
	id, ok := g.capture[st]
	if !ok {
		return 0, 0, false, nil
	}
	return g.node(st), id, true, nil
}

func (g *fakeGraph) CaptureDeps(dev int, st uintptr, deps []GraphNode) ([]GraphNode, uint64, bool, error) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	if err := g.failing("deps"); err != nil {
		return deps, 0, false, err
	}
	id, ok := g.capture[st]
	if !ok {
		return deps, 0, false, nil
	}
	return append(deps, g.deps[st]...), id, true, nil
}

func (g *fakeGraph) NodeDeps(dev int, n GraphNode, deps []GraphNode) ([]GraphNode, error) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	if err := g.failing("node"); err != nil {
		return deps, err
	}
	p, ok := g.parents[n]
	if !ok {
		return deps, errors.New("FAKE_ERROR_INVALID_VALUE: no such node")
	}
	return append(deps, p...), nil
}

// failNth makes the nth next call of op (1: the next) fail with err.
func (g *fakeGraph) failNth(op string, n int, err error) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	g.failAt = map[string]int{op: g.calls[op] + n}
	g.failErr = err
}
