package trace

import (
	"fmt"

	"github.com/libsymm/libsymm/allocator"
)

// Result is what a replay measured.
type Result struct {
	// PeakAllocated and PeakReserved are the pool's allocated_bytes.all.peak
	// and reserved_bytes.all.peak: block sizes (requests rounded up) and
	// segment memory.
	PeakAllocated uint64 `json:"peak_allocated_bytes"`
	PeakReserved  uint64 `json:"peak_reserved_bytes"`
	// Ratio is PeakReserved / PeakAllocated (0 when nothing was allocated):
	// 1 means no memory was lost to fragmentation or caching at the peak.
	Ratio float64 `json:"reserved_per_allocated"`
	// BackendPeak is the most memory the virtual backend had handed out at
	// once (segments plus mapped chunks).
	BackendPeak uint64 `json:"backend_peak_bytes"`
	// TimeAveraged is the time-averaged reserved over allocated: the
	// device memory the pool held (the backend's) after each replayed row,
	// summed over the rows, over the program's live bytes (its requests)
	// summed the same way; each row is one tick of the clock (a trace has
	// no times). Where PeakReserved/PeakAllocated says what a peak costs,
	// this says what the whole run holds beyond what it uses.
	TimeAveraged float64 `json:"time_averaged_reserved_per_allocated"`
	// ChunkMaps and ChunkUnmaps count the calls mapping and unmapping
	// chunks of expandable segments (the num_chunk_maps and
	// num_chunk_unmaps statistics): what Config.UnmapFreePages adds.
	ChunkMaps   int64 `json:"chunk_maps"`
	ChunkUnmaps int64 `json:"chunk_unmaps"`
	// ChunksCreated counts the physical chunks mapped, by their size in
	// bytes: what a GPU driver's per-allocation cost is paid for.
	ChunksCreated map[uint64]int `json:"chunks_created,omitempty"`
	// Rows counts the alloc and free_completed rows replayed (those of size
	// 0 and unmatched frees are not).
	Rows int `json:"rows_replayed"`
	// PreExisting counts blocks allocated at the start because the trace
	// frees them without allocating them; LostFrees, allocs of an address
	// still live (its block was freed first); UnmatchedFrees,
	// free_completed rows of an address allocated before but no longer
	// live (skipped).
	PreExisting    int `json:"pre_existing"`
	LostFrees      int `json:"lost_frees"`
	UnmatchedFrees int `json:"unmatched_frees"`
	// OOMs counts allocations the pool refused for lack of memory (the
	// replay goes on; the block's free is then skipped).
	OOMs int `json:"ooms"`
	// FrontHits counts allocations the front cache model served (Options.
	// FrontMax), FrontWholeHits those of them on a fixed segment of its
	// own, FrontUnchangedHits those on a larger block reused because its
	// shard had not changed since it was placed (allocator.Placement).
	FrontHits          int `json:"front_cache_hits,omitempty"`
	FrontWholeHits     int `json:"front_cache_whole_hits,omitempty"`
	FrontUnchangedHits int `json:"front_cache_unchanged_hits,omitempty"`
	// FrontAside counts allocations made while the front cache model had
	// stepped aside (served by the pool as with it off), FrontAsides how
	// many times it stepped aside (export/front.cpp: where it serves fewer
	// than 1 in 8 of 4,096 requests, the next 65,536 go to the pool).
	FrontAside  int `json:"front_cache_aside_allocations,omitempty"`
	FrontAsides int `json:"front_cache_steps_aside,omitempty"`
	// Series is the pool's allocated and reserved bytes over the trace,
	// in at most Options.Samples points (series.go); not in JSON.
	Series []Point `json:"-"`
}

// Replay runs t's alloc and free_completed rows, in order, through a pool
// of configuration cfg on one virtual device of capacity bytes (0: 1 PiB),
// as play describes, and reports the pool's peaks. Each row's stream is the
// stream given to Alloc or Free. An error other than out of memory stops
// the replay and names the row; so does a broken pool invariant at the end.
func Replay(t *Trace, cfg allocator.Config, capacity uint64) (Result, error) {
	return ReplayWith(t, cfg, Options{Capacity: capacity})
}

// Options of ReplayWith.
type Options struct {
	// Capacity of the virtual device in bytes (0: 1 PiB).
	Capacity uint64
	// FrontMax, if not 0, puts in front of the pool a model of libsymm's
	// front cache (export/front.cpp) on one CPU: the last 64 freed blocks of
	// each pool (small, large) of at most FrontMax bytes, or of any size when they are a fixed
	// segment of their own or their shard has not changed since they were
	// placed (allocator.Placement), stay parked, allocated as far as the
	// pool can see, and serve a request of the same size and stream (a
	// larger one only while its shard is still unchanged and no other
	// large block of its stream is parked). Any other request is served by
	// allocator.Pool.AllocAround, which takes back the parked blocks of the
	// bins it reads (its stream and pool, small or large) and all of them
	// before it steals, collects, grows or could raise a peak; the end of
	// the trace gives back the rest before stats are read. Like the
	// library's, the model steps aside where it serves few requests: after
	// 4,096 of which it served fewer than 1 in 8, its parked blocks go
	// back, and the next 65,536 allocations and every free meanwhile go to
	// the pool as with it off; a block allocated before or meanwhile is
	// never parked.
	FrontMax uint64
	// Samples, if positive, is the most points of Result.Series (0: none).
	Samples int
	// StreamLag, if positive, makes the device's streams lag the host by
	// that many rows of the trace (allocator.Virtual.SetStreamLag): a free
	// page is known passed only that many rows after its free, unless the
	// pool waits for it. 0: every event completes at once.
	StreamLag int
}

// ReplayWith is Replay with the options above.
func ReplayWith(t *Trace, cfg allocator.Config, o Options) (Result, error) {
	v := allocator.NewVirtual(1, o.Capacity)
	if o.StreamLag > 0 {
		v.SetStreamLag(o.StreamLag)
	}
	p, err := allocator.New(v, cfg)
	if err != nil {
		return Result{}, err
	}
	// Nothing is parked while the pool serves a request (alloc drains
	// first), so the model needs none of Config's front-cache hooks.
	r := &replayer{pool: p, v: v, ptrs: map[uint64]uintptr{}, placed: map[uintptr]allocator.Placement{}, frontMax: o.FrontMax,
		series: newSampler(len(t.Events), o.Samples)}
	if err := t.play(r); err != nil {
		return Result{}, err
	}
	r.drain()
	r.row = len(t.Events)
	r.sample()
	if r.err != nil {
		return Result{}, r.err
	}
	if err := p.CheckInvariants(); err != nil {
		return Result{}, fmt.Errorf("pool invariant broken after the replay: %w", err)
	}
	m, err := p.StatsMap(0)
	if err != nil {
		return Result{}, err
	}
	res := r.res
	res.PeakAllocated = uint64(m["allocated_bytes.all.peak"])
	res.PeakReserved = uint64(m["reserved_bytes.all.peak"])
	if res.PeakAllocated > 0 {
		res.Ratio = float64(res.PeakReserved) / float64(res.PeakAllocated)
	}
	res.BackendPeak = v.Peak(0)
	if c := v.Created(); len(c) > 0 {
		res.ChunksCreated = c
	}
	if r.series != nil {
		res.Series = r.series.finish()
	}
	res.ChunkMaps, res.ChunkUnmaps = m["num_chunk_maps"], m["num_chunk_unmaps"]
	if r.liveArea > 0 {
		res.TimeAveraged = r.heldArea / r.liveArea
	}
	return res, nil
}

// replayer plays a trace into a pool on device 0.
type replayer struct {
	pool *allocator.Pool
	v    *allocator.Virtual
	// live is the program's live bytes (the trace's sizes); heldArea and
	// liveArea sum the backend's bytes and live after each row (Result.
	// TimeAveraged).
	live               uint64
	heldArea, liveArea float64
	ptrs               map[uint64]uintptr // trace address -> the pool's block; 0: its alloc ran out of memory
	// placed says where the pool placed each live block it handed out
	// (kept only with a front cache).
	placed map[uintptr]allocator.Placement
	res    Result

	frontMax uint64             // 0: no front cache
	front    []frontEntry       // parked blocks, oldest first; at most frontEntries
	parked   []allocator.Parked // frontMiss's, reused
	err      error              // a failure giving a parked block back
	// aside: the front cache has stepped aside (judge); judged and
	// judgedHits count the allocations and hits since its last judgement.
	aside              bool
	judged, judgedHits uint64

	row    int      // the row being played (series.go)
	series *sampler // nil: no Result.Series
}

// frontEntries is export/front.cpp's kEntries: blocks parked per CPU and
// pool (small, large).
const frontEntries = 64

// export/front.cpp's kSample, kMinShare and kAside: the front cache steps
// aside after frontSample allocations of which it served fewer than 1 in
// frontMinShare, for the next frontAside.
const (
	frontSample   = 4096
	frontMinShare = 8
	frontAside    = 65536
)

// judge counts an allocation (hit: the front cache served it) and, as
// export/front.cpp's judge does once enough are counted, steps the front
// cache aside or back: aside, the parked blocks go back and no block
// allocated so far is parked when freed (the library empties its live set).
func (r *replayer) judge(hit bool) {
	r.judged++
	if hit {
		r.judgedHits++
	}
	limit := uint64(frontSample)
	if r.aside {
		limit = frontAside
	}
	if r.judged < limit {
		return
	}
	stepAside := !r.aside && r.judgedHits*frontMinShare < r.judged
	r.judged, r.judgedHits = 0, 0
	switch {
	case r.aside:
		r.aside = false
	case stepAside:
		r.aside = true
		r.res.FrontAsides++
		r.drain()
		clear(r.placed)
	}
}

type frontEntry struct {
	ptr    uintptr
	size   uint64
	stream uintptr
	// pl is where the pool placed the block; large: it is parked for its
	// shard's being unchanged, and may be handed out only while that holds.
	pl    allocator.Placement
	large bool
}

// drain gives every parked block back to the pool.
func (r *replayer) drain() {
	back := r.front
	r.front = nil
	for _, e := range back {
		delete(r.placed, e.ptr)
		if err := r.pool.Free(0, e.stream, e.ptr, e.size); err != nil && r.err == nil {
			r.err = fmt.Errorf("giving back a parked block: %w", err)
		}
	}
}

// frontAlloc takes the newest parked block of this size and stream, if any.
func (r *replayer) frontAlloc(size uint64, stream uintptr) uintptr {
	for i := len(r.front) - 1; i >= 0; i-- {
		if e := r.front[i]; e.size == size && e.stream == stream && (!e.large || r.soleLarge(i)) {
			r.front = append(r.front[:i], r.front[i+1:]...)
			r.res.FrontHits++
			switch {
			case e.pl.Whole:
				r.res.FrontWholeHits++
			case e.large:
				r.res.FrontUnchangedHits++
			}
			return e.ptr
		}
	}
	return 0
}

// soleLarge says whether large entry i may be handed out: its shard is
// unchanged and no other large-pool block of its stream is parked
// (export/front.cpp: the pool would have merged that one's free, and might
// now place elsewhere).
func (r *replayer) soleLarge(i int) bool {
	e := r.front[i]
	if !e.pl.Unchanged() {
		return false
	}
	for j, o := range r.front {
		if j != i && o.stream == e.stream && o.pl.Type == 2 {
			return false
		}
	}
	return true
}

// frontMiss serves a request the parked blocks could not: the pool takes
// back those that could change where it places it (allocator.AllocAround's
// rule), and the others stay parked.
func (r *replayer) frontMiss(size uint64, stream uintptr) (uintptr, allocator.Placement, error) {
	parked := r.parked[:0]
	for _, e := range r.front {
		parked = append(parked, allocator.Parked{Ptr: e.ptr, Req: e.size, Stream: e.stream, Type: e.pl.Type})
	}
	ptr, pl, err := r.pool.AllocAround(0, stream, size, parked)
	keep := r.front[:0]
	for i, e := range r.front {
		if parked[i].Back {
			delete(r.placed, e.ptr)
		} else {
			keep = append(keep, e)
		}
	}
	r.front, r.parked = keep, parked
	return ptr, pl, err
}

// oldestIfFull returns the index of the oldest parked block of the small
// pool (small) or of the large one when frontEntries of them are parked,
// else -1.
func (r *replayer) oldestIfFull(small bool) int {
	n, oldest := 0, -1
	for i, e := range r.front {
		if (e.pl.Type == 1) == small {
			if oldest < 0 {
				oldest = i
			}
			n++
		}
	}
	if n < frontEntries {
		return -1
	}
	return oldest
}

// frontFree parks a block of at most frontMax bytes (its size rounded to
// 512 B, as the pool rounds), a fixed segment of its own, or one whose shard
// has not changed since it was placed, evicting the oldest when full; it
// reports whether it parked the block.
func (r *replayer) frontFree(ptr uintptr, size uint64, stream uintptr) (bool, error) {
	if r.frontMax == 0 || r.aside {
		return false, nil
	}
	pl, ok := r.placed[ptr]
	if !ok { // allocated while the front cache was aside: no record
		return false, nil
	}
	large := (size+511)&^511 > r.frontMax && !pl.Whole
	if large && !pl.Unchanged() {
		return false, nil
	}
	if i := r.oldestIfFull(pl.Type == 1); i >= 0 {
		old := r.front[i]
		r.front = append(r.front[:i], r.front[i+1:]...)
		delete(r.placed, old.ptr)
		if err := r.pool.Free(0, old.stream, old.ptr, old.size); err != nil {
			return false, err
		}
	}
	r.front = append(r.front, frontEntry{ptr, size, stream, pl, large})
	return true, nil
}

func (r *replayer) alloc(e Event, pre bool) error {
	var ptr uintptr
	if !r.aside {
		ptr = r.frontAlloc(e.Size, uintptr(e.Stream))
	}
	hit := ptr != 0
	if ptr == 0 {
		var err error
		if r.aside { // as with the front cache off: nothing recorded
			r.res.FrontAside++
			ptr, _, err = r.pool.Alloc(0, uintptr(e.Stream), e.Size)
		} else {
			var pl allocator.Placement
			ptr, pl, err = r.frontMiss(e.Size, uintptr(e.Stream))
			if err == nil && r.frontMax != 0 {
				r.placed[ptr] = pl
			}
		}
		switch {
		case allocator.IsOutOfMemory(err):
			r.res.OOMs++
			ptr = 0
		case err != nil:
			return rowError(e, pre, err)
		}
	}
	if r.frontMax != 0 {
		r.judge(hit)
	}
	r.ptrs[e.Addr] = ptr
	if pre {
		r.res.PreExisting++
	} else {
		r.res.Rows++
	}
	if ptr != 0 {
		r.live += e.Size
	}
	r.tick()
	return nil
}

// tick samples, after a row, the memory the backend holds and the bytes
// the program has live (Result.TimeAveraged), and the pool's allocated and
// reserved bytes (Result.Series).
func (r *replayer) tick() {
	r.heldArea += float64(r.v.Used(0))
	r.liveArea += float64(r.live)
	r.sample()
}

// free returns a's block: on the free_completed row's stream, or for a lost
// free on the stream it was allocated for.
func (r *replayer) free(a, by Event, lost bool) error {
	ptr := r.ptrs[a.Addr]
	delete(r.ptrs, a.Addr)
	stream := by.Stream
	if lost {
		r.res.LostFrees++
		stream = a.Stream
	} else {
		r.res.Rows++
	}
	if ptr == 0 {
		if !lost {
			r.tick()
		}
		return nil
	}
	r.live -= a.Size
	if !lost { // a lost free's row goes on to its alloc, which ticks
		defer r.tick()
	}
	// The front cache keys a block by the stream it was allocated for.
	if parked, err := r.frontFree(ptr, a.Size, uintptr(a.Stream)); parked || err != nil {
		if err != nil {
			return rowError(by, false, err)
		}
		return nil
	}
	delete(r.placed, ptr)
	if err := r.pool.Free(0, uintptr(stream), ptr, a.Size); err != nil {
		return rowError(by, false, err)
	}
	return nil
}

func (r *replayer) unmatched(Event) { r.res.UnmatchedFrees++ }

func rowError(e Event, pre bool, err error) error {
	what := fmt.Sprintf("%s of %d bytes at address %d, stream %d", e.Action, e.Size, e.Addr, e.Stream)
	if pre {
		what = fmt.Sprintf("allocating the pre-existing block that this row frees (%d bytes at address %d)", e.Size, e.Addr)
	}
	return fmt.Errorf("line %d (%s): %w", e.Line, what, err)
}
