package allocator

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Memory history and snapshots in the shape of PyTorch's
// torch.cuda.memory._snapshot(), so that PyTorch's memory viewer
// (torch.cuda._memory_viz, pytorch.org/memory_viz) reads them unchanged.

// TraceAction is what a history entry records; its String is PyTorch's name.
type TraceAction uint8

const (
	ActAlloc         TraceAction = iota // a block handed out
	ActFreeRequested                    // the caller freed it
	ActFreeCompleted                    // it is reusable (after record_stream events)
	ActSegmentAlloc                     // a segment taken from the backend
	ActSegmentFree                      // a segment given back
	ActOOM                              // a request refused; Addr holds the device's free bytes
	ActSnapshot                         // a snapshot was taken
	ActSegmentMap                       // chunks mapped into an expandable segment
	ActSegmentUnmap                     // chunks of an expandable segment unmapped
)

func (a TraceAction) String() string {
	return [...]string{"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot", "segment_map", "segment_unmap"}[a]
}

// TraceEntry is one event of a device's history. Size is, as in PyTorch's
// history, the requested size for alloc, free_requested and free_completed
// (a block's size may be larger), the run's size for segment events, the
// request's (rounded) for oom, and the device's active bytes for snapshot.
type TraceEntry struct {
	Action TraceAction
	Ann    uint32 // the annotation current when recorded (annotations.go)
	Addr   uintptr
	Size   uint64
	Stream uintptr
	TimeUS int64 // microseconds since the Unix epoch
}

// history is a device's ring of trace entries. When off (the default) the
// pool pays one atomic load per operation; when on, a mutex per device.
type history struct {
	on  atomic.Bool
	ann *annotations // the pool's; the current index is read under mu (compaction renumbers under it)
	mu  sync.Mutex
	buf []TraceEntry // ring once len(buf) == max
	pos int          // next slot to overwrite once full
	max int
	// watch queues the device's segment events for a watcher (segevents.go).
	watch segmentWatch
}

func (h *history) record(a TraceAction, addr uintptr, size uint64, stream uintptr) {
	if !h.on.Load() {
		return
	}
	e := TraceEntry{Action: a, Addr: addr, Size: size, Stream: stream, TimeUS: time.Now().UnixMicro()}
	h.mu.Lock()
	if !h.on.Load() { // turned off (and emptied) while this waited
		h.mu.Unlock()
		return
	}
	if h.ann != nil {
		e.Ann = h.ann.current()
	}
	switch {
	case h.max <= 0:
	case len(h.buf) < h.max:
		h.buf = append(h.buf, e)
	default:
		h.buf[h.pos] = e
		h.pos = (h.pos + 1) % h.max
	}
	h.mu.Unlock()
}

func (h *history) entries() []TraceEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]TraceEntry, 0, len(h.buf))
	out = append(out, h.buf[h.pos:]...)
	return append(out, h.buf[:h.pos]...)
}

// RecordHistory turns the history of every device on or off. maxEntries
// bounds each device's ring (older entries are overwritten). As in
// PyTorch's recordHistory, turning it off, or clear, empties every ring
// (a program that records, snapshots and records again sees nothing of the
// first round); turning it on again without clear keeps what was recorded.
func (p *Pool) RecordHistory(enabled bool, maxEntries int, clear bool) error {
	if enabled && maxEntries <= 0 {
		return fmt.Errorf("%w: history of %d entries: need at least 1", ErrInvalid, maxEntries)
	}
	clear = clear || !enabled
	// All rings at once, under the annotations' lock: once they are empty
	// no entry refers to any annotation, and the table can start again.
	p.annots.mu.Lock()
	defer p.annots.mu.Unlock()
	for _, d := range p.devs {
		d.hist.mu.Lock()
		defer d.hist.mu.Unlock()
	}
	for _, d := range p.devs {
		h := &d.hist
		if clear {
			h.buf, h.pos = nil, 0
		}
		if enabled && maxEntries != h.max {
			// Keep the newest entries that fit, oldest first.
			old := append(append([]TraceEntry(nil), h.buf[h.pos:]...), h.buf[:h.pos]...)
			if len(old) > maxEntries {
				old = old[len(old)-maxEntries:]
			}
			h.buf, h.pos, h.max = old, 0, maxEntries
		}
		h.on.Store(enabled)
	}
	if clear {
		p.annots.reset()
	}
	return nil
}

// History returns device dev's recorded entries, oldest first.
func (p *Pool) History(dev int) ([]TraceEntry, error) {
	d, err := p.device(dev)
	if err != nil {
		return nil, err
	}
	return d.hist.entries(), nil
}

// SnapshotBlock is one block of a segment, as PyTorch's snapshot shows it.
type SnapshotBlock struct {
	Address       uintptr `json:"address"`
	Size          uint64  `json:"size"`
	RequestedSize uint64  `json:"requested_size"`
	State         string  `json:"state"` // active_allocated, active_pending_free, inactive
	Frames        []any   `json:"frames"`
}

// SnapshotSegment is one segment with its blocks.
type SnapshotSegment struct {
	Device        int             `json:"device"`
	Address       uintptr         `json:"address"`
	TotalSize     uint64          `json:"total_size"`
	AllocatedSize uint64          `json:"allocated_size"`
	ActiveSize    uint64          `json:"active_size"`
	RequestedSize uint64          `json:"requested_size"`
	Stream        uintptr         `json:"stream"`
	SegmentType   string          `json:"segment_type"` // small or large
	PoolID        [2]uint64       `json:"segment_pool_id"`
	IsExpandable  bool            `json:"is_expandable"`
	Frames        []any           `json:"frames"`
	Blocks        []SnapshotBlock `json:"blocks"`
}

// SnapshotTrace is one history entry in PyTorch's shape. An "oom" entry
// carries the device's free bytes in DeviceFree instead of Addr.
type SnapshotTrace struct {
	Action         string   `json:"action"`
	Addr           *uintptr `json:"addr,omitempty"`
	DeviceFree     *uintptr `json:"device_free,omitempty"`
	Size           uint64   `json:"size"`
	Stream         uintptr  `json:"stream"`
	TimeUS         int64    `json:"time_us"`
	CompileContext string   `json:"compile_context"`
	UserMetadata   string   `json:"user_metadata"`
	Frames         []any    `json:"frames"`
}

// Snapshot is torch.cuda.memory._snapshot()'s structure.
type Snapshot struct {
	Segments          []SnapshotSegment `json:"segments"`
	DeviceTraces      [][]SnapshotTrace `json:"device_traces"`
	AllocatorSettings map[string]any    `json:"allocator_settings"`
}

// Snapshot describes every segment of every device with its blocks, sorted
// by address, and each device's history. As in PyTorch's snapshot, each
// device's history is taken first, and then (history on) the device records
// a "snapshot" event whose size is its active bytes (allocated and pending
// blocks): the event is in the next snapshot's history, not in this one, so
// the last entry of this one is the last event before it. Blocks a cache
// in front of the pool holds go back first (Front), so that they show as
// free.
func (p *Pool) Snapshot() *Snapshot { return p.snapshot(true) }

// PeekSnapshot is Snapshot without recording its "snapshot" events: the
// same listing, and the next snapshot's history does not show this one.
func (p *Pool) PeekSnapshot() *Snapshot { return p.snapshot(false) }

// HistoryOn reports whether the devices' histories are recording.
func (p *Pool) HistoryOn() bool { return len(p.devs) > 0 && p.devs[0].hist.on.Load() }

func (p *Pool) snapshot(record bool) *Snapshot {
	p.observe(-1)
	snap := &Snapshot{
		Segments:          []SnapshotSegment{},
		DeviceTraces:      make([][]SnapshotTrace, len(p.devs)),
		AllocatorSettings: p.allocatorSettings(),
	}
	for _, d := range p.devs {
		snap.DeviceTraces[d.idx] = p.snapshotTraces(d)
		first := len(snap.Segments)
		for _, s := range d.shardList() {
			s.mu.Lock()
			for seg := s.segs; seg != nil; seg = seg.snext {
				snap.Segments = s.snapshotSegments(seg, snap.Segments)
			}
			s.mu.Unlock()
		}
		if record {
			var active uint64
			for _, sg := range snap.Segments[first:] {
				active += sg.ActiveSize
			}
			d.hist.record(ActSnapshot, 0, active, 0)
		}
	}
	sort.Slice(snap.Segments, func(i, j int) bool {
		a, b := snap.Segments[i], snap.Segments[j]
		if a.Device != b.Device {
			return a.Device < b.Device
		}
		return a.Address < b.Address
	})
	return snap
}

// snapshotTraces is device d's history in PyTorch's shape, with each
// entry's annotation resolved.
func (p *Pool) snapshotTraces(d *device) []SnapshotTrace {
	// Under the annotations' lock, so that no compaction renumbers the
	// entries between their copy and the table's (annotations.go).
	p.annots.mu.Lock()
	entries := d.hist.entries()
	tab := p.annots.texts
	p.annots.mu.Unlock()
	traces := make([]SnapshotTrace, 0, len(entries))
	for _, e := range entries {
		t := SnapshotTrace{Action: e.Action.String(), Size: e.Size, Stream: e.Stream, TimeUS: e.TimeUS, Frames: []any{}}
		t.UserMetadata, t.CompileContext = textsOf(tab, e.Ann)
		addr := e.Addr
		if e.Action == ActOOM {
			t.DeviceFree = &addr
		} else {
			t.Addr = &addr
		}
		traces = append(traces, t)
	}
	return traces
}

// SnapshotJSON is Snapshot encoded as JSON.
func (p *Pool) SnapshotJSON() ([]byte, error) { return json.Marshal(p.Snapshot()) }

// snapshotSegments describes seg; called with s.mu held. As in PyTorch, an
// expandable segment is described as one segment per contiguous mapped
// range: chunks unmapped inside free blocks (free pages, or what a failed
// release left) split it, and appear in no segment, so total_size adds up
// to reserved_bytes.
func (s *shard) snapshotSegments(seg *segment, out []SnapshotSegment) []SnapshotSegment {
	var cur *SnapshotSegment
	piece := func(b *block, ptr uintptr, size uint64) {
		if cur == nil {
			out = append(out, SnapshotSegment{
				Device: s.dev.idx, Address: ptr, Stream: s.stream, SegmentType: "large",
				Frames: []any{}, Blocks: []SnapshotBlock{}, IsExpandable: seg.expSeg != nil,
			})
			cur = &out[len(out)-1]
			if seg.kind == smallPool {
				cur.SegmentType = "small"
			}
			if s.pool != nil && !s.pool.direct {
				cur.PoolID = [2]uint64{s.pool.id.First, s.pool.id.Second}
			}
		}
		// A free block's requested size is that of its last allocation (0
		// if it never had one); a segment's counts its active blocks', as
		// PyTorch's snapshot has them.
		sb := SnapshotBlock{Address: ptr, Size: size, RequestedSize: b.req, State: "inactive", Frames: []any{}}
		switch b.state {
		case blockAllocated:
			sb.State = "active_allocated"
			cur.AllocatedSize += size
			cur.ActiveSize += size
			cur.RequestedSize += b.req
		case blockPending:
			sb.State = "active_pending_free"
			cur.ActiveSize += size
			cur.RequestedSize += b.req
		}
		cur.TotalSize += size
		cur.Blocks = append(cur.Blocks, sb)
	}
	split, c := seg.hasHoles(), s.dev.expand.chunk
	for b := seg.head; b != nil; b = b.next {
		if !split || b.state != blockFree {
			piece(b, b.ptr, b.size) // only free blocks hold unmapped chunks
			continue
		}
		holes := &seg.holes
		// Cut the free block at its unmapped chunks (wholly inside it).
		lo, hi := uint64(b.ptr-seg.ptr), uint64(b.ptr-seg.ptr)+b.size
		for pos := lo; pos < hi; {
			if i := pos / c; pos%c == 0 && holes.has(i) {
				cur = nil // a gap: the next mapped piece starts a segment
				pos += c
				continue
			}
			end := min(hi, (pos/c+1)*c)
			for end < hi && !holes.has(end/c) {
				end = min(hi, end+c)
			}
			piece(b, seg.ptr+uintptr(pos), end-pos)
			pos = end
		}
	}
	return out
}

// Settings are the pool's settings that a snapshot's allocator_settings
// reports.
type Settings struct {
	Expandable  bool
	MaxSplit    uint64 // 0: off
	GCThreshold float64
	AllocConf   string // the PyTorch settings text read, whichever variable it came from
}

// Settings returns the pool's settings.
func (p *Pool) Settings() Settings {
	return Settings{Expandable: p.Expandable(), MaxSplit: p.maxSplit(), GCThreshold: p.gcThreshold(), AllocConf: *p.tun.allocConf.Load()}
}

// allocatorSettings is the snapshot's allocator_settings, with PyTorch's keys
// (torch/csrc/cuda/Module.cpp): the settings text under
// "PYTORCH_CUDA_ALLOC_CONF" whichever variable it came from, and
// roundup_power2_divisions by interval, keyed "1", "2", … "32768" (MiB).
func (p *Pool) allocatorSettings() map[string]any {
	st := p.Settings()
	roundup := make(map[string]any, RoundupIntervals)
	for i, d := range p.roundupDivisions() {
		roundup[strconv.Itoa(1<<i)] = int64(d)
	}
	return map[string]any{
		"PYTORCH_CUDA_ALLOC_CONF":      st.AllocConf,
		"expandable_segments":          st.Expandable,
		"max_split_size":               int64(st.MaxSplit),
		"garbage_collection_threshold": st.GCThreshold,
		"roundup_power2_divisions":     roundup,
	}
}
