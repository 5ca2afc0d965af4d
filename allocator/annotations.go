package allocator

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Annotations of history entries: PyTorch's TraceEntry carries the user
// metadata (torch.cuda.memory._set_memory_metadata) and the top of the
// compile-context stack (torch.compile's regions, with
// _record_memory_history(compile_context=True)) current when the event was
// recorded. The pool keeps one current pair, set by its user (libsymm's
// PyTorch extension passes PyTorch's); each history entry records the index
// of that pair in an interned table (TraceEntry.Ann), so recording costs no
// allocation and no string copy, and an entry keeps its 40 bytes (the index
// sits in the padding after Action).
//
// PyTorch keeps both per thread; libsymm keeps one pair per process: the one
// most recently set by any thread.
//
// Invariants:
//   - index 0 is the empty pair (no metadata, no compile context);
//   - texts only grows (append) between compactions, and a compaction builds
//     a new slice: a copy of the slice header taken under mu resolves every
//     index it covered, after mu is released;
//   - every index recorded in a ring, and cur, is below len(texts);
//   - lock order: annotations.mu, then any device's history.mu.

// MaxAnnotationLen bounds each text of an annotation, in bytes.
const MaxAnnotationLen = 1 << 20

// maxAnnotations bounds the interned table; beyond it, the pairs no ring
// refers to are dropped (compact).
const maxAnnotations = 1 << 12

// annotation is one interned pair; immutable once interned.
type annotation struct {
	meta, compile string
}

type annotations struct {
	mu    sync.Mutex
	texts []annotation // by index; texts[0] is the empty pair
	index map[annotation]uint32
	cur   atomic.Uint32              // index of the current pair
	curP  atomic.Pointer[annotation] // the current pair (segment events copy its strings)
}

var emptyAnnotation = &annotation{}

// current returns the current pair's index; one atomic load.
func (a *annotations) current() uint32 { return a.cur.Load() }

// currentPair returns the current pair.
func (a *annotations) currentPair() *annotation {
	if c := a.curP.Load(); c != nil {
		return c
	}
	return emptyAnnotation
}

// intern returns the index of pair v, adding it; called with mu held and
// room in the table.
func (a *annotations) intern(v annotation) uint32 {
	if a.index == nil {
		a.texts, a.index = []annotation{{}}, map[annotation]uint32{{}: 0}
	}
	if i, ok := a.index[v]; ok {
		return i
	}
	i := uint32(len(a.texts))
	a.texts = append(a.texts, v)
	a.index[v] = i
	return i
}

// SetAnnotation makes (userMetadata, compileContext) the annotation of the
// history entries recorded from now on, on every device. "" is none: an
// entry without compile context reports "N/A", as PyTorch's do. A text over
// MaxAnnotationLen bytes is ErrInvalid (nothing changes).
func (p *Pool) SetAnnotation(userMetadata, compileContext string) error {
	if len(userMetadata) > MaxAnnotationLen || len(compileContext) > MaxAnnotationLen {
		return fmt.Errorf("%w: annotation of %d and %d bytes: at most %d each", ErrInvalid,
			len(userMetadata), len(compileContext), MaxAnnotationLen)
	}
	a := &p.annots
	a.mu.Lock()
	defer a.mu.Unlock()
	v := annotation{meta: userMetadata, compile: compileContext}
	if _, ok := a.index[v]; !ok && len(a.texts) >= maxAnnotations {
		p.compactAnnotations(v)
	}
	i := a.intern(v)
	a.cur.Store(i)
	a.curP.Store(&a.texts[i])
	return nil
}

// Annotation returns the current annotation (SetAnnotation's texts).
func (p *Pool) Annotation() (userMetadata, compileContext string) {
	c := p.annots.currentPair()
	return c.meta, c.compile
}

// compactAnnotations rebuilds the table with the pairs some ring refers to
// and the current one (and next, about to be set), renumbering the rings'
// entries. Called with annots.mu held; takes every device's history lock,
// so no entry is recorded meanwhile.
func (p *Pool) compactAnnotations(next annotation) {
	a := &p.annots
	for _, d := range p.devs {
		d.hist.mu.Lock()
		defer d.hist.mu.Unlock()
	}
	old := a.texts
	a.texts, a.index = nil, nil
	remap := make(map[uint32]uint32)
	keep := func(i uint32) uint32 {
		if j, ok := remap[i]; ok {
			return j
		}
		j := a.intern(old[i])
		remap[i] = j
		return j
	}
	cur := keep(a.cur.Load())
	a.cur.Store(cur)
	a.curP.Store(&a.texts[cur])
	for _, d := range p.devs {
		for k := range d.hist.buf {
			d.hist.buf[k].Ann = keep(d.hist.buf[k].Ann)
		}
	}
	a.intern(next)
}

// reset drops every pair but the current one, once no ring refers to any
// (history cleared or off). Called with mu and every device's history lock
// held, the rings empty.
func (a *annotations) reset() {
	cur := a.currentPair()
	a.texts, a.index = nil, nil
	i := a.intern(*cur)
	a.cur.Store(i)
	a.curP.Store(&a.texts[i])
}

// textsOf returns the user metadata and compile context of index i in
// table t (nil: only the empty pair was ever set), the compile context
// "N/A" when none, as PyTorch reports it.
func textsOf(t []annotation, i uint32) (meta, compile string) {
	if int(i) >= len(t) {
		return "", "N/A"
	}
	meta, compile = t[i].meta, t[i].compile
	if compile == "" {
		compile = "N/A"
	}
	return meta, compile
}
