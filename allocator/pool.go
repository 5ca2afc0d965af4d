package allocator

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libsymm/libsymm/internal/errs"
)

// Config holds the pool's tunables. The zero value is PyTorch's default
// behaviour: no oversize pool, no limit.
type Config struct {
	// MaxSplit: blocks of at least this many bytes are oversize: never
	// split, reused only by requests at most 20 MiB smaller. 0 disables.
	MaxSplit uint64
	// Expandable makes the default pool's segments expandable: per (device,
	// stream, small/large), one reserved address range into which physical
	// chunks are mapped as the pool grows (the backend must implement
	// Expander). Private pools and MemPool segments stay fixed. MaxSplit is
	// ignored: every block of an expandable segment may be split.
	Expandable bool
	// ExpandableChunk is the size of the big chunks of expandable segments,
	// each one physical allocation, mapped wherever a mapping covers a
	// whole one (expandable.go); the rest is mapped in chunks of the
	// backend's granularity. 0 or the granularity: granules only; other
	// values are rounded up to a multiple of it. The library's default
	// (ConfigFromEnv) is DefaultExpandableChunk, 20 MiB.
	ExpandableChunk uint64
	// UnmapFreePages unmaps, in expandable segments, the chunks that lie
	// wholly inside free blocks: before the pool maps memory, as many as it
	// is about to map, and all of them at release (pages.go). A block
	// handed out over them gets them mapped again first. The library's
	// default (ConfigFromEnv) is on.
	UnmapFreePages bool
	// FreePagesWait bounds how long an allocation about to map new memory
	// past the device's peak waits, without its shard's lock, for its
	// stream to pass free pages of its own that would cover at least half
	// of it (awaitFreePages, progress.go); 0 never waits. The library's
	// default (ConfigFromEnv) is DefaultFreePagesWait.
	FreePagesWait time.Duration
	// Limit caps every device's reserved bytes. 0: no cap.
	Limit uint64
	// LimitFraction caps every device's reserved bytes at this share of its
	// total memory (0 < f ≤ 1). 0: no cap. Limit wins when both are set.
	LimitFraction float64
	// LimitZero caps every device's reserved bytes at 0 (PyTorch's
	// per_process_memory_fraction:0): every request that needs new memory
	// fails. Limit and LimitFraction win over it.
	LimitZero bool
	// LargeSegment is the size of the segments that requests from 1 to 10
	// MiB are packed into (PyTorch's large_segment_size_mb): a whole number
	// of MiB above 10 MiB. 0: 20 MiB, PyTorch's default.
	LargeSegment uint64
	// MaxNonSplitRounding: an oversize block (MaxSplit) serves a request
	// only if it is less than this many bytes larger (PyTorch's
	// max_non_split_rounding_mb). 0: 20 MiB, PyTorch's default.
	MaxNonSplitRounding uint64
	// RoundupPower2Divisions is PyTorch's roundup_power2_divisions: before
	// the size rules of sizeclass.go, a request of n bytes whose interval
	// (see RoundupIntervals) has d > 1 divisions and with n > 512·d is
	// rounded up to the next of d equal steps between the powers of two
	// around n (roundDivisions). All zero (or ones): plain 512-byte
	// rounding. Entries must be 0 or powers of two. MemPool segments
	// (AllocSegment) are never rounded: PyTorch above rounded them already.
	RoundupPower2Divisions [RoundupIntervals]uint64
	// GCThreshold is PyTorch's garbage_collection_threshold, in [0, 1); 0:
	// off. When a device has a cap (Limit, LimitFraction, SetLimit,
	// SetMemoryFraction) and its reserved bytes are above GCThreshold × cap,
	// an allocation that must ask the backend for a new segment first
	// returns idle cached segments of the default pool's large and oversize
	// pools to the backend, the longest unused first, until the reserved
	// bytes are back under that line (gc.go). Expandable segments are not
	// collected, as in PyTorch.
	GCThreshold float64
	// CaptureReuse is PyTorch's graph_capture_record_stream_reuse: a block
	// freed during a CUDA graph capture after record_stream may serve the
	// capture again once the capture graph orders every use of it before
	// the allocation (capture_reuse.go). It needs a backend that is a
	// CaptureGrapher; without one, or off, such a block waits until no
	// capture is under way.
	CaptureReuse bool
	// AllocConf is the text of PyTorch's allocator settings this Config was
	// read from (ConfigFromEnv), reported by Snapshot as PyTorch does.
	AllocConf string
	// Front is the cache in front of the pool, if any (front.go): the pool
	// has it return its blocks before it reads or releases what they would
	// change, and before it grows.
	Front Front
}

// Pool is a caching allocator over a Backend, one set of pools per
// (device, stream). It is safe for concurrent use.
type Pool struct {
	backend Backend
	cfg     Config
	devs    []*device
	// exp is the backend's Expander, if it is one (expandable segments can
	// be turned on at run time: tunables.go); nil otherwise.
	exp Expander
	// keeper is exp's ChunkKeeper when cfg.UnmapFreePages and it has one:
	// free pages unmapped to make room for a mapping are kept and mapped
	// again (pages.go). nil otherwise.
	keeper ChunkKeeper
	// grapher is the backend's CaptureGrapher, if it is one; nil otherwise
	// (capture_reuse.go).
	grapher CaptureGrapher
	// tun holds the settings a program may change while it runs
	// (tunables.go), read on every request.
	tun tunables
	// routes counts the open routings of every device (routes.go,
	// OpenRoutes), outside the Go heap.
	routes *atomic.Uint64
	// byAddr finds every segment of every device by address, without a
	// lock (segmap.go).
	byAddr segMap
	// annots holds the annotations of history entries (annotations.go).
	annots annotations
}

// device is the per-GPU state. Its mutexes guard shard creation and the
// event cache; the cached path takes neither.
type device struct {
	pool *Pool
	idx  int

	// Lock order: mu, then any shard's mu, then evMu; reserveMu is a leaf.
	mu     sync.Mutex                    // shard creation
	tables [2]atomic.Pointer[shardTable] // default-pool shards by stream, per segKind
	list   atomic.Pointer[[]*shard]      // every shard, for whole-device walks
	evMu   sync.Mutex
	events []Event // idle events, reused; under evMu

	budget deviceBudget // the memory cap and what counts against it

	hot          hotStats
	segments     [numStatTypes]atomicStat
	reserved     [numStatTypes]atomicStat
	oversizeSegs atomicStat
	counts       deviceCounts
	// frontBase is Config.Front's Served at the last ResetAccumulated, under
	// frontMu.
	frontMu   sync.Mutex
	frontBase FrontCounts

	// Private pools (private.go). Lock order: privMu before mu.
	privMu sync.Mutex
	privs  map[PoolID]*privatePool // under privMu
	direct *privatePool            // segment-serving pool (MemPool mode), under privMu
	routes []openRouting           // open routings to private pools, newest last, under privMu (routes.go)
	onOOM  atomic.Int32            // use_on_oom private pools (mempools.go); changed under privMu
	// capture answers whether a graph capture may be under way (gate.go).
	capture gate

	hist history

	// gcClock counts the default pool's large and oversize requests while
	// the garbage collector is on (Pool.gcOn): a segment's age is the
	// requests since it became idle (segment.idleAt), PyTorch's gc_count.
	gcClock atomic.Uint64
	// gcMu serializes collectors (gc.go); taken with no shard lock held.
	gcMu sync.Mutex

	expand expandGeometry // set once in New
}

// deviceBudget is a device's memory cap (a limit or a fraction of the
// device) and what is checked against it.
type deviceBudget struct {
	limit atomic.Uint64 // 0: none
	total atomic.Uint64 // device memory, read once when a fraction is set
	// fraction is fractionSet with the float64 bits of the share of total
	// that limit was set from (SetMemoryFraction); 0 when the cap is none or
	// a byte count
	// (SetLimit). The one record of the memory fraction in the process: the
	// PyTorch extension reads it (symm_pool_memory_fraction).
	fraction  atomic.Uint64
	reserveMu sync.Mutex // serializes limit checks with reservations
	// committed is reserved bytes plus those of segments being asked of the
	// backend (under reserveMu): what the limit is checked against. The
	// reserved statistics count a segment only once the backend gave it, so
	// a refused one leaves no trace in their peak or totals.
	committed uint64
}

// deviceCounts are a device's event counters (PyTorch's num_alloc_retries,
// num_ooms, num_sync_all_streams, num_device_alloc/free), and what
// expandable segments' chunk mappings cost (libsymm's own statistics):
// calls mapping and unmapping chunks inside segments, the nanoseconds spent
// in them, chunks mapped from spare ones, and unmaps and releases of cached
// memory that failed and that the pool carried on past, its books following
// what the backend has mapped.
type deviceCounts struct {
	numAllocRetries, numOOMs, numSyncAll                                                       atomic.Int64
	numDeviceAlloc, numDeviceFree                                                              atomic.Int64
	numChunkMaps, numChunkUnmaps, chunkMapNs, chunkUnmapNs, numSpareReused, numReleaseFailures atomic.Int64
}

// expandGeometry is how a device's expandable segments (expandable.go)
// are cut: chunk, the driver's granularity, is the unit of their books (a
// segment's size, its unmapped holes) and the size of their small physical
// chunks; big (a multiple of chunk, equal to it when the pool maps none
// larger) is the size of their large ones, each at a multiple of big from
// its segment's base; vaSize, a multiple of big, is the address space each
// segment reserves.
type expandGeometry struct {
	chunk, big, vaSize uint64
}

// chunkSizes indexes what is kept of each size of physical chunk
// (shard.kept): 0 the granularity, 1 the big chunk.
type chunkSizes [2]uint64

// sizeIndex is the index in a chunkSizes of chunks of c bytes.
func (g expandGeometry) sizeIndex(c uint64) int {
	if c == g.chunk {
		return 0
	}
	return 1
}

// size is the chunk size of index i of a chunkSizes.
func (g expandGeometry) size(i int) uint64 {
	if i == 0 {
		return g.chunk
	}
	return g.big
}

// total is the bytes of every size together.
func (k chunkSizes) total() uint64 { return k[0] + k[1] }

// shard is the pool state of one (device, stream): three pools of bins, the
// live blocks and the segments it owns. Its mutex is the only lock on the
// cached path, so streams never contend with each other.
type shard struct {
	mu     sync.Mutex
	dev    *device
	stream uintptr

	bins    [numPools]bins
	live    liveTable
	segs    *segment // every segment it owns
	idle    *segment // segments that are one free block
	spare   *block   // recycled block structs
	pending []pendingFree
	stats   shardStats
	// marked are the pending blocks freed during a CUDA graph capture with
	// a free marker on each of their streams (capture_reuse.go); each is
	// also on pending. Empty whenever processPending has run since: it
	// runs only while no capture can be under way, when markers mean
	// nothing any more.
	marked []markedFree
	// reuse caches, for the capture s.stream is in, the graph nodes known
	// to precede the stream's work (capture_reuse.go); nil when none.
	reuse *graphReuse

	pool *privatePool // nil: the default pool
	// src is where the shard's segments come from and go back (source.go),
	// chosen when the shard is made.
	src segmentSource

	// Expandable segments (expandableSource): grow[k] is the segment of
	// pool k that grows next; births counts the blocks handed out so far
	// (block.born).
	grow   [numPools]*segment
	births uint64

	// frees counts the frees into this shard's free blocks (block.freedAt);
	// safe is the count the stream had passed at the last completed quiet
	// event, which is outstanding (recorded, not yet seen complete) when
	// quietSet (progress.go: only free pages read them).
	frees, safe, quietTag uint64
	quiet                 Event
	quietSet              bool
	// waitedTag is s.frees when awaitFreePages last waited: it waits
	// again only after more frees.
	waitedTag uint64
	// kept is the bytes of chunks of each size (expandGeometry.sizeIndex)
	// this shard unmapped into the backend's spare (Pool.keeper) for the
	// mapping it is making; 0 between operations (dropSpare).
	kept chunkSizes
	// holding: makeRoom holds the capture gate, until
	// dropSpareAfterMapping (chunks.go).
	holding bool

	// epoch counts changes to what the best fit sees (epoch.go); nil in
	// private pools, which no front cache serves. changes is its value,
	// written under mu.
	epoch   *atomic.Uint64
	changes uint64
}

// pendingFree is a freed block waiting for an event on a record_stream stream.
type pendingFree struct {
	b      *block
	ev     Event   // 0: not recorded yet (creating or recording it failed)
	stream uintptr // the record_stream stream ev is recorded on
}

// New creates a pool over b, sized for b's devices.
func New(b Backend, cfg Config) (*Pool, error) {
	if cfg.LimitFraction < 0 || cfg.LimitFraction > 1 {
		return nil, fmt.Errorf("%w: limit fraction %g is outside [0, 1]", ErrInvalid, cfg.LimitFraction)
	}
	if err := checkTunables(cfg); err != nil {
		return nil, err
	}
	n, err := b.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("%s backend has no devices", b.Name())
	}
	p := &Pool{backend: b, cfg: cfg, devs: make([]*device, n)}
	p.setTunables(cfg)
	if p.routes = newEpochCell(); p.routes == nil {
		return nil, errors.New("cannot map a page for the count of open routings")
	}
	if g, ok := b.(CaptureGrapher); ok {
		p.grapher = g
	}
	if e, ok := b.(Expander); ok {
		p.exp = e
		if k, ok := e.(ChunkKeeper); ok && cfg.UnmapFreePages {
			p.keeper = k
		}
	}
	for i := range p.devs {
		d := &device{pool: p, idx: i}
		d.hist.ann = &p.annots
		d.capture.total = p.routes
		d.list.Store(&[]*shard{})
		p.devs[i] = d
		switch {
		case cfg.Limit > 0:
			d.budget.limit.Store(cfg.Limit)
		case cfg.LimitFraction > 0 || cfg.LimitZero:
			if err := p.SetMemoryFraction(i, cfg.LimitFraction); err != nil {
				return nil, err
			}
		}
	}
	if err := p.setExpandable(cfg.Expandable); err != nil {
		return nil, err
	}
	return p, nil
}

// Expandable reports whether the default pool's new segments are
// expandable (the setting now: segments made before a change keep their
// kind).
func (p *Pool) Expandable() bool { return p.tun.expandable.Load() }

// Backend returns the pool's backend.
func (p *Pool) Backend() Backend { return p.backend }

// DeviceCount is the number of devices the pool serves.
func (p *Pool) DeviceCount() int { return len(p.devs) }

// ErrInvalid marks bad arguments (internal/errs owns it: symmetric's is the
// same value).
var ErrInvalid = errs.ErrInvalid

// ErrUnknownPointer marks a free or record_stream of a pointer the pool did
// not hand out or already took back (internal/errs owns it, as ErrInvalid).
var ErrUnknownPointer = errs.ErrUnknownPointer

func (p *Pool) device(dev int) (*device, error) {
	if dev < 0 || dev >= len(p.devs) {
		return nil, fmt.Errorf("%w: device %d out of range [0, %d)", ErrInvalid, dev, len(p.devs))
	}
	return p.devs[dev], nil
}

// Alloc returns a block of at least size bytes on device dev for stream,
// and where the pool placed it (Placement: the block's size, size rounded
// up or more when the rest was too small to split off, and what a cache in
// front of the pool needs to know to hand the block, once freed, to the
// next request of its size without changing what the pool would have
// placed). Size 0 returns 0 and no error.
func (p *Pool) Alloc(dev int, stream uintptr, size uint64) (uintptr, Placement, error) {
	if size == 0 {
		return 0, Placement{}, nil
	}
	if dev < 0 || dev >= len(p.devs) || size > maxRequest {
		return 0, Placement{}, p.badRequest(dev, size)
	}
	return p.devs[dev].shardFor(stream).alloc(size, nil)
}

// badRequest says why a request of size bytes on device dev cannot be
// served at all (a bad device, a size beyond any device), or returns nil.
func (p *Pool) badRequest(dev int, size uint64) error {
	if _, err := p.device(dev); err != nil {
		return err
	}
	if size > maxRequest {
		// The device's own size says more than the pool's bound on any
		// request: the program asked for more than this device holds.
		if _, total, err := p.backend.MemInfo(dev); err == nil && total > 0 {
			return fmt.Errorf("%w: requested %d bytes on device %d, which has %d bytes", ErrOutOfMemory, size, dev, total)
		}
		return fmt.Errorf("%w: requested %d bytes on device %d: larger than any device (%d bytes at most)",
			ErrOutOfMemory, size, dev, maxRequest)
	}
	return nil
}

// AnyDevice, as Free's device, has the pool find the block on whichever
// device holds it: for callers that keep only the pointer (PyTorch's
// raw_delete), at the cost of a binary search of the pool's segments by
// address (segmap.go); only the owner's shard is locked.
const AnyDevice = -1

// Free returns ptr, allocated on device dev (or AnyDevice) with size bytes
// for stream. size 0 skips the size check. The stream is where the pool
// looks first; a block of another stream of the same device is found too. A
// pointer the pool does not hold, a size or device that does not match: an
// error, and nothing changes.
func (p *Pool) Free(dev int, stream uintptr, ptr uintptr, size uint64) error {
	if ptr == 0 {
		return nil
	}
	if dev == AnyDevice {
		return p.freeSlow(nil, ptr, size)
	}
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	if s := d.lookup(stream); s != nil {
		s.mu.Lock()
		if b := s.live.get(ptr); b != nil {
			if size != 0 && size != b.req {
				s.mu.Unlock()
				return sizeMismatch(ptr, size, b.req)
			}
			s.free(b)
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
	}
	return p.freeSlow(d, ptr, size)
}

func sizeMismatch(ptr uintptr, size, req uint64) error {
	return fmt.Errorf("%w: free of %#x with size %d, but it was allocated with size %d; not freed",
		ErrInvalid, ptr, size, req)
}

// freeSlow finds ptr in any shard when the stream given was not its own
// (d: the device given; nil for AnyDevice).
func (p *Pool) freeSlow(d *device, ptr uintptr, size uint64) error {
	s, b := p.findLive(ptr)
	if b == nil {
		return fmt.Errorf("%w: %#x was not allocated by this pool or was already freed; nothing freed",
			ErrUnknownPointer, ptr)
	}
	defer s.mu.Unlock()
	if d != nil && s.dev != d {
		return fmt.Errorf("%w: %#x belongs to device %d, not device %d; not freed",
			ErrInvalid, ptr, s.dev.idx, d.idx)
	}
	if size != 0 && size != b.req {
		return sizeMismatch(ptr, size, b.req)
	}
	seg := b.seg
	s.free(b)
	if !s.src.caches() && seg.idle {
		// MemPool mode (directSource): PyTorch released this segment; it
		// goes back now.
		return s.releaseSegment(seg)
	}
	return nil
}

// findLive returns the shard, locked, and the allocated block at ptr; or
// nil, nil. It locks only the shard that owns ptr's segment, found by
// address (segmap.go), never the others: a free by pointer alone waits for
// no other stream or device.
func (p *Pool) findLive(ptr uintptr) (*shard, *block) {
	s, _ := p.lockedSegment(ptr)
	if s == nil {
		return nil, nil
	}
	if b := s.live.get(ptr); b != nil {
		return s, b
	}
	s.mu.Unlock()
	return nil, nil
}

// findContaining returns the shard, locked, and the allocated block that
// holds address ptr (its start or any byte inside); or nil, nil. It walks
// the blocks of ptr's segment: a slow path for record_stream and CUDA IPC
// of interior pointers.
func (p *Pool) findContaining(ptr uintptr) (*shard, *block) {
	s, seg := p.lockedSegment(ptr)
	if s == nil {
		return nil, nil
	}
	if b := s.live.get(ptr); b != nil {
		return s, b
	}
	for b := seg.head; b != nil; b = b.next {
		if ptr >= b.ptr && ptr < b.ptr+uintptr(b.size) && b.state == blockAllocated {
			return s, b
		}
	}
	s.mu.Unlock()
	return nil, nil
}

// RecordStream marks the block holding ptr as used on stream: when freed, it
// is reused only after the work queued on stream by then has completed.
func (p *Pool) RecordStream(ptr uintptr, stream uintptr) error {
	_, err := p.RecordStreamBlock(ptr, stream)
	return err
}

// RecordStreamBlock is RecordStream that also returns the block's start.
//
// A block parked in a cache in front of the pool was freed by its caller:
// it goes back first (only when some block is parked: record_stream is rare
// next to alloc and free, and a drain costs the cached blocks), so that the
// answer is ErrUnknownPointer, as without that cache, rather than a stream
// recorded on a freed block.
func (p *Pool) RecordStreamBlock(ptr uintptr, stream uintptr) (uintptr, error) {
	p.reclaim(-1)
	s, b := p.findContaining(ptr)
	if b == nil {
		return 0, fmt.Errorf("%w: record_stream of %#x: not a block allocated by this pool", ErrUnknownPointer, ptr)
	}
	if stream != s.stream {
		b.addStream(stream)
	}
	base := b.ptr
	s.mu.Unlock()
	return base, nil
}

// EmptyCache returns every unused segment of every device to the backend.
// Blocks waiting on record_stream events are waited for first.
func (p *Pool) EmptyCache() error {
	p.observe(-1)
	var errs []error
	for _, d := range p.devs {
		errs = append(errs, d.releaseCached())
	}
	return errors.Join(errs...)
}

// SetMemoryFraction caps device dev's reserved bytes at fraction of its
// total memory, in [0, 1] as in PyTorch: 0 is a cap of 0 bytes (every
// request that needs new memory fails; cached blocks still serve).
func (p *Pool) SetMemoryFraction(dev int, fraction float64) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	if !(fraction >= 0 && fraction <= 1) {
		return fmt.Errorf("%w: memory fraction %g for device %d is outside [0, 1]", ErrInvalid, fraction, dev)
	}
	total := d.budget.total.Load()
	if total == 0 {
		_, t, err := p.backend.MemInfo(dev)
		if err != nil {
			return fmt.Errorf("memory fraction for device %d: %w", dev, err)
		}
		total = t
		d.budget.total.Store(t)
	}
	// A limit of 0 is no cap: a cap of 0 bytes is kept as 1 byte, which no
	// segment fits in.
	d.budget.limit.Store(max(uint64(fraction*float64(total)), 1))
	d.budget.fraction.Store(fractionSet | math.Float64bits(fraction))
	return nil
}

// fractionSet marks deviceBudget.fraction as set (a fraction is never
// negative, so its sign bit is free): a fraction of 0 is a cap.
const fractionSet = 1 << 63

// MemoryFraction is the share of device dev's memory its cap was set to
// (SetMemoryFraction, Config.LimitFraction), 1 when it has no cap or a cap
// in bytes (SetLimit, Config.Limit), as PyTorch's getMemoryFraction answers.
func (p *Pool) MemoryFraction(dev int) (float64, error) {
	d, err := p.device(dev)
	if err != nil {
		return 0, err
	}
	if f := d.budget.fraction.Load(); f != 0 {
		return math.Float64frombits(f &^ fractionSet), nil
	}
	return 1, nil
}

// SetLimit caps device dev's reserved bytes; 0 removes the cap.
func (p *Pool) SetLimit(dev int, bytes uint64) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	d.budget.limit.Store(bytes)
	d.budget.fraction.Store(0)
	return nil
}

// Limit returns device dev's cap, 0 if none.
func (p *Pool) Limit(dev int) uint64 {
	if d, err := p.device(dev); err == nil {
		return d.budget.limit.Load()
	}
	return 0
}
