package allocator

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// ExpandableChunk is the size of the chunks an expandable segment grows
	// and shrinks by: 0 is the backend's granularity; other values are
	// rounded up to a multiple of it.
	ExpandableChunk uint64
	// Limit caps every device's reserved bytes. 0: no cap.
	Limit uint64
	// LimitFraction caps every device's reserved bytes at this share of its
	// total memory (0 < f ≤ 1). 0: no cap. Limit wins when both are set.
	LimitFraction float64
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
	// AllocConf is the text of PyTorch's allocator settings this Config was
	// read from (ConfigFromEnv), reported by Snapshot as PyTorch does.
	AllocConf string
	// Reclaim, if set, is called with no lock held before the out-of-memory
	// retry releases the device's cached segments: a cache in front of the
	// pool (the C front cache of export/) returns its blocks through Free.
	Reclaim func(dev int)
	// Parked, if set with Reclaim, reports whether that cache holds blocks
	// of dev. Before the pool takes a new segment it reclaims them (and
	// looks again), so that blocks parked in front never make the pool grow.
	// (The C front cache also hands its blocks back before every pool
	// allocation; this covers frees parked by other threads meanwhile.)
	Parked func(dev int) bool
}

// Pool is a caching allocator over a Backend, one set of pools per
// (device, stream). It is safe for concurrent use.
type Pool struct {
	backend Backend
	cfg     Config
	devs    []*device
	// exp is the backend's Expander when cfg.Expandable; nil otherwise.
	exp Expander
	// roundup: some interval of cfg.RoundupPower2Divisions rounds (d > 1);
	// the cached path tests only this flag when none does.
	roundup bool
	// gcOn: cfg.GCThreshold is set and the default pool's segments are
	// fixed (expandable ones are never collected).
	gcOn bool
	// slack is the oversize reuse tolerance (cfg.MaxNonSplitRounding or 20 MiB).
	slack uint64
}

// device is the per-GPU state. Its mutexes guard shard creation and the
// event cache; the cached path takes neither.
type device struct {
	pool *Pool
	idx  int

	// Lock order: mu, then any shard's mu, then evMu; reserveMu is a leaf.
	mu     sync.Mutex // shard creation
	table  atomic.Pointer[shardTable]
	list   atomic.Pointer[[]*shard] // every shard, for whole-device walks
	evMu   sync.Mutex
	events []Event // idle events, reused; under evMu

	limit     atomic.Uint64 // 0: none
	total     atomic.Uint64 // device memory, read once when a fraction is set
	reserveMu sync.Mutex    // serializes limit checks with reservations
	// committed is reserved bytes plus those of segments being asked of the
	// backend (under reserveMu): what the limit is checked against. The
	// reserved statistics count a segment only once the backend gave it, so
	// a refused one leaves no trace in their peak or totals.
	committed uint64

	hot          hotStats
	segments     [numStatTypes]atomicStat
	reserved     [numStatTypes]atomicStat
	oversizeSegs atomicStat

	numAllocRetries, numOOMs, numSyncAll atomic.Int64
	numDeviceAlloc, numDeviceFree        atomic.Int64

	// Private pools (private.go). Lock order: privMu before mu.
	privMu sync.Mutex
	privs  map[PoolID]*privatePool // under privMu
	direct *privatePool            // segment-serving pool (MemPool mode), under privMu
	// routes counts allocations being routed to private pools (begun, not
	// ended). While it is non-zero any stream of the device may be under
	// CUDA graph capture, where recording or querying an event on a
	// capturing stream would invalidate the capture: the pool then records
	// and queries none, as PyTorch's allocator does while a capture is
	// under way.
	routes atomic.Int32

	hist history

	// gcClock counts the default pool's large and oversize requests while
	// the garbage collector is on (Pool.gcOn): a segment's age is the
	// requests since it became idle (segment.idleAt), PyTorch's gc_count.
	gcClock atomic.Uint64

	// Expandable segments (expandable.go), set once in New: the chunk they
	// grow and shrink by, and the address space each one reserves.
	chunk, vaSize uint64
}

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

	pool   *privatePool // nil: the default pool
	direct bool         // pool.direct: a segment per block, returned when freed

	// expandable: this shard's segments are expandable (default pool of an
	// expandable Pool); grow[k] is the segment of pool k that grows next.
	expandable bool
	grow       [numPools]*segment
	births     uint64 // blocks handed out from expandable segments so far (block.born)
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
		return nil, fmt.Errorf("limit fraction %g is outside (0, 1]", cfg.LimitFraction)
	}
	if !(cfg.GCThreshold >= 0 && cfg.GCThreshold < 1) {
		return nil, fmt.Errorf("%w: garbage collection threshold %g is outside [0, 1)", ErrInvalid, cfg.GCThreshold)
	}
	roundup := false
	for i, d := range cfg.RoundupPower2Divisions {
		if d != 0 && !isPow2(d) {
			return nil, fmt.Errorf("%w: roundup_power2_divisions: interval %d has %d divisions, not 0 or a power of 2", ErrInvalid, i, d)
		}
		roundup = roundup || d > 1
	}
	n, err := b.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("%s backend has no devices", b.Name())
	}
	p := &Pool{backend: b, cfg: cfg, devs: make([]*device, n), roundup: roundup,
		gcOn: cfg.GCThreshold > 0 && !cfg.Expandable, slack: cfg.MaxNonSplitRounding}
	if p.slack == 0 {
		p.slack = largeBuffer
	}
	if cfg.Expandable {
		e, ok := b.(Expander)
		if !ok {
			return nil, fmt.Errorf("%w: expandable segments: the %s backend cannot reserve address space and map chunks", ErrInvalid, b.Name())
		}
		p.exp = e
	}
	for i := range p.devs {
		d := &device{pool: p, idx: i}
		if p.exp != nil {
			if err := d.initExpandable(); err != nil {
				return nil, err
			}
		}
		d.list.Store(&[]*shard{})
		p.devs[i] = d
		switch {
		case cfg.Limit > 0:
			d.limit.Store(cfg.Limit)
		case cfg.LimitFraction > 0:
			if err := p.SetMemoryFraction(i, cfg.LimitFraction); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Expandable reports whether the default pool's segments are expandable.
func (p *Pool) Expandable() bool { return p.exp != nil }

// Backend returns the pool's backend.
func (p *Pool) Backend() Backend { return p.backend }

// DeviceCount is the number of devices the pool serves.
func (p *Pool) DeviceCount() int { return len(p.devs) }

// ErrInvalid marks bad arguments.
var ErrInvalid = errors.New("invalid argument")

// ErrUnknownPointer marks a free or record_stream of a pointer the pool did
// not hand out or already took back.
var ErrUnknownPointer = errors.New("unknown pointer")

func (p *Pool) device(dev int) (*device, error) {
	if dev < 0 || dev >= len(p.devs) {
		return nil, fmt.Errorf("%w: device %d out of range [0, %d)", ErrInvalid, dev, len(p.devs))
	}
	return p.devs[dev], nil
}

// Alloc returns a block of at least size bytes on device dev for stream.
// Size 0 returns 0 and no error.
func (p *Pool) Alloc(dev int, stream uintptr, size uint64) (uintptr, error) {
	ptr, _, err := p.AllocBlock(dev, stream, size)
	return ptr, err
}

// AllocBlock is Alloc that also reports the size of the block handed out
// (size rounded up, or more when the rest was too small to split off).
func (p *Pool) AllocBlock(dev int, stream uintptr, size uint64) (uintptr, uint64, error) {
	if size == 0 {
		return 0, 0, nil
	}
	if dev < 0 || dev >= len(p.devs) || size > maxRequest {
		return 0, 0, p.badRequest(dev, size)
	}
	return p.devs[dev].shardFor(stream).alloc(size)
}

// badRequest says why a request of size bytes on device dev cannot be
// served at all (a bad device, a size beyond any device), or returns nil.
func (p *Pool) badRequest(dev int, size uint64) error {
	if _, err := p.device(dev); err != nil {
		return err
	}
	if size > maxRequest {
		return fmt.Errorf("%w: requested %d bytes on device %d: larger than any device (%d bytes at most)",
			ErrOutOfMemory, size, dev, maxRequest)
	}
	return nil
}

// Free returns ptr, allocated on device dev with size bytes for stream. size
// 0 skips the size check. The stream is where the pool looks first; a block
// of another stream of the same device is found too. A pointer the pool does
// not hold, a size or device that does not match: an error, and nothing changes.
func (p *Pool) Free(dev int, stream uintptr, ptr uintptr, size uint64) error {
	if ptr == 0 {
		return nil
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

// freeSlow finds ptr in any shard when the stream given was not its own.
func (p *Pool) freeSlow(d *device, ptr uintptr, size uint64) error {
	s, b := p.findLive(ptr)
	if b == nil {
		return fmt.Errorf("%w: %#x was not allocated by this pool or was already freed; nothing freed",
			ErrUnknownPointer, ptr)
	}
	defer s.mu.Unlock()
	if s.dev != d {
		return fmt.Errorf("%w: %#x belongs to device %d, not device %d; not freed",
			ErrInvalid, ptr, s.dev.idx, d.idx)
	}
	if size != 0 && size != b.req {
		return sizeMismatch(ptr, size, b.req)
	}
	seg := b.seg
	s.free(b)
	if s.direct && seg.idle {
		// MemPool mode: PyTorch released this segment; it goes back now.
		return s.releaseSegment(seg)
	}
	return nil
}

// findLive returns the shard, locked, and the allocated block at ptr; or nil, nil.
func (p *Pool) findLive(ptr uintptr) (*shard, *block) {
	for _, d := range p.devs {
		for _, s := range d.shardList() {
			s.mu.Lock()
			if b := s.live.get(ptr); b != nil {
				return s, b
			}
			s.mu.Unlock()
		}
	}
	return nil, nil
}

// findContaining returns the shard, locked, and the allocated block that
// holds address ptr (its start or any byte inside); or nil, nil. It walks
// segments: a slow path for record_stream of interior pointers.
func (p *Pool) findContaining(ptr uintptr) (*shard, *block) {
	if s, b := p.findLive(ptr); b != nil {
		return s, b
	}
	for _, d := range p.devs {
		for _, s := range d.shardList() {
			s.mu.Lock()
			for seg := s.segs; seg != nil; seg = seg.snext {
				if ptr < seg.ptr || ptr >= seg.ptr+uintptr(seg.size) {
					continue
				}
				for b := seg.head; b != nil; b = b.next {
					if ptr >= b.ptr && ptr < b.ptr+uintptr(b.size) && b.state == blockAllocated {
						return s, b
					}
				}
			}
			s.mu.Unlock()
		}
	}
	return nil, nil
}

// RecordStream marks the block holding ptr as used on stream: when freed, it
// is reused only after the work queued on stream by then has completed.
func (p *Pool) RecordStream(ptr uintptr, stream uintptr) error {
	_, err := p.RecordStreamBlock(ptr, stream)
	return err
}

// RecordStreamBlock is RecordStream that also returns the block's start.
func (p *Pool) RecordStreamBlock(ptr uintptr, stream uintptr) (uintptr, error) {
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
	var errs []error
	for _, d := range p.devs {
		errs = append(errs, d.releaseCached())
	}
	return errors.Join(errs...)
}

// SetMemoryFraction caps device dev's reserved bytes at fraction of its total memory.
func (p *Pool) SetMemoryFraction(dev int, fraction float64) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	if !(fraction > 0 && fraction <= 1) {
		return fmt.Errorf("%w: memory fraction %g for device %d is outside (0, 1]", ErrInvalid, fraction, dev)
	}
	total := d.total.Load()
	if total == 0 {
		_, t, err := p.backend.MemInfo(dev)
		if err != nil {
			return fmt.Errorf("memory fraction for device %d: %w", dev, err)
		}
		total = t
		d.total.Store(t)
	}
	d.limit.Store(uint64(fraction * float64(total)))
	return nil
}

// SetLimit caps device dev's reserved bytes; 0 removes the cap.
func (p *Pool) SetLimit(dev int, bytes uint64) error {
	d, err := p.device(dev)
	if err != nil {
		return err
	}
	d.limit.Store(bytes)
	return nil
}

// Limit returns device dev's cap, 0 if none.
func (p *Pool) Limit(dev int) uint64 {
	if d, err := p.device(dev); err == nil {
		return d.limit.Load()
	}
	return 0
}

// ---- shards ---------------------------------------------------------------

// shardTable is an open-addressed table from stream to shard, read without
// locks. Slots only ever go from nil to a shard; a full table is replaced by
// a larger copy under device.mu.
type shardTable struct {
	slots []atomic.Pointer[shard]
	n     int // under device.mu
}

func streamHash(stream uintptr, mask int) int {
	return int((uint64(stream) * 0x9E3779B97F4A7C15) >> 32 & uint64(mask))
}

func (t *shardTable) lookup(stream uintptr) *shard {
	mask := len(t.slots) - 1
	for i := streamHash(stream, mask); ; i = (i + 1) & mask {
		s := t.slots[i].Load()
		if s == nil || s.stream == stream {
			return s
		}
	}
}

func (t *shardTable) insert(s *shard) {
	mask := len(t.slots) - 1
	i := streamHash(s.stream, mask)
	for t.slots[i].Load() != nil {
		i = (i + 1) & mask
	}
	t.slots[i].Store(s)
	t.n++
}

// lookup returns the shard of stream, or nil if the stream never allocated here.
func (d *device) lookup(stream uintptr) *shard {
	if t := d.table.Load(); t != nil {
		return t.lookup(stream)
	}
	return nil
}

func (d *device) shardFor(stream uintptr) *shard {
	if s := d.lookup(stream); s != nil {
		return s
	}
	return d.newShard(stream)
}

func (d *device) newShard(stream uintptr) *shard {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.lookup(stream); s != nil {
		return s
	}
	s := &shard{dev: d, stream: stream, expandable: d.pool.exp != nil}
	for k := range s.bins {
		s.bins[k].highTies = s.expandable
	}
	// On the list first: at the second shard the device switches to
	// device-wide counters, before anyone can find s in the table.
	d.appendShard(s)
	t := d.table.Load()
	if t == nil || 2*(t.n+1) > len(t.slots) {
		size := 16
		if t != nil {
			size = 2 * len(t.slots)
		}
		nt := &shardTable{slots: make([]atomic.Pointer[shard], size)}
		for _, o := range *d.list.Load() {
			if o.pool == nil {
				nt.insert(o) // s among them
			}
		}
		d.table.Store(nt)
	} else {
		t.insert(s)
	}
	return s
}

func (d *device) shardList() []*shard { return *d.list.Load() }

// ---- the cached path --------------------------------------------------------

func (s *shard) alloc(n uint64) (uintptr, uint64, error) {
	p := s.dev.pool
	r := roundSize(n)
	if p.roundup && !s.direct {
		r = roundDivisions(n, &p.cfg.RoundupPower2Divisions)
	}
	var k poolKind
	if s.expandable {
		k = expandableKind(r)
	} else {
		k = kindFor(r, p.cfg.MaxSplit)
	}
	if p.gcOn && k != smallPool && s.pool == nil {
		s.dev.gcClock.Add(1) // the collector's clock: large-pool requests (gc.go)
	}
	s.mu.Lock()
	if len(s.pending) > 0 && s.dev.routes.Load() == 0 {
		s.processPending(false)
	}
	var b *block
	if !s.direct {
		b = s.findFree(r, k)
	}
	if b == nil {
		var err error
		if b, err = s.allocSlow(n, r, k); err != nil {
			s.mu.Unlock()
			return 0, 0, err
		}
	}
	s.take(b, r, n)
	ptr, size := b.ptr, b.size
	s.dev.hist.record(ActAlloc, ptr, size, s.stream)
	s.mu.Unlock()
	return ptr, size, nil
}

func (s *shard) findFree(r uint64, k poolKind) *block {
	b := s.bins[k].find(r)
	if b != nil && k == oversizePool && b.size >= r+s.dev.pool.slack {
		return nil
	}
	return b
}

// take hands out free block b for a request of n bytes rounded to r.
func (s *shard) take(b *block, r, n uint64) {
	s.removeFree(b)
	seg := b.seg
	if seg.idle {
		s.removeIdle(seg)
	}
	if seg.vsize != 0 && b.size > r && b.next != nil && nearNewer(b) {
		s.splitHigh(b, r)
	} else if shouldSplit(b.size, r, seg.kind) || (seg.vsize != 0 && b.size > r) {
		s.splitTail(b, r)
	}
	b.state = blockAllocated
	b.req = n
	if seg.vsize != 0 { // only nearNewer reads born, and only in expandable segments
		s.births++
		b.born = s.births
	}
	s.live.put(b)
	sz := int64(b.size)
	s.stats.alloc(seg.kind, sz, int64(n))
	if s.dev.hot.multi.Load() {
		s.dev.hot.alloc(sz, int64(n))
	}
}

// free takes back allocated block b.
func (s *shard) free(b *block) {
	s.live.del(b)
	k := b.seg.kind
	sz := int64(b.size)
	pending := b.extraN > 0
	s.dev.hist.record(ActFreeRequested, b.ptr, b.size, s.stream)
	s.stats.free(k, sz, int64(b.req))
	if s.dev.hot.multi.Load() {
		s.dev.hot.free(sz, int64(b.req), pending)
	}
	if pending {
		s.deferFree(b)
		return
	}
	s.stats.done(k, sz)
	s.dev.hist.record(ActFreeCompleted, b.ptr, b.size, s.stream)
	s.release(b)
}

// release puts block b (allocated or pending, already out of every table)
// back in the bins, merged with free neighbours.
func (s *shard) release(b *block) {
	b.state = blockFree
	b.req = 0
	b.extraN = 0
	b.extraMore = nil
	if p := b.prev; p != nil && p.state == blockFree {
		s.removeFree(p)
		p.size += b.size
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		} else {
			p.seg.tail = p
		}
		s.recycle(b)
		b = p
	}
	if nx := b.next; nx != nil && nx.state == blockFree {
		s.removeFree(nx)
		b.size += nx.size
		b.next = nx.next
		if nx.next != nil {
			nx.next.prev = b
		} else {
			b.seg.tail = b
		}
		s.recycle(nx)
	}
	s.insertFree(b)
	if b.isWholeSegment() {
		s.addIdle(b.seg)
	}
}

// splitTail cuts b down to its first n bytes (0 < n < b.size); the rest of
// it becomes a free block right after it, in its bin.
func (s *shard) splitTail(b *block, n uint64) {
	rest := s.newBlock()
	*rest = block{ptr: b.ptr + uintptr(n), size: b.size - n, seg: b.seg, prev: b, next: b.next}
	if b.next != nil {
		b.next.prev = rest
	} else {
		b.seg.tail = rest
	}
	b.next = rest
	b.size = n
	s.insertFree(rest)
}

func (s *shard) insertFree(b *block) {
	s.bins[b.seg.kind].insert(b)
	if !b.isWholeSegment() {
		b.splitFree = true
		s.stats.inactiveSplit(b.seg.kind, 1, int64(b.size))
	}
}

func (s *shard) removeFree(b *block) {
	s.bins[b.seg.kind].remove(b)
	if b.splitFree {
		b.splitFree = false
		s.stats.inactiveSplit(b.seg.kind, -1, -int64(b.size))
	}
}

func (s *shard) newBlock() *block {
	if b := s.spare; b != nil {
		s.spare = b.fnext
		b.fnext = nil
		return b
	}
	return new(block)
}

func (s *shard) recycle(b *block) {
	*b = block{fnext: s.spare}
	s.spare = b
}

func (s *shard) addSeg(seg *segment) {
	seg.shard = s
	seg.sprev = nil
	seg.snext = s.segs
	if s.segs != nil {
		s.segs.sprev = seg
	}
	s.segs = seg
}

func (s *shard) removeSeg(seg *segment) {
	if seg.sprev != nil {
		seg.sprev.snext = seg.snext
	} else {
		s.segs = seg.snext
	}
	if seg.snext != nil {
		seg.snext.sprev = seg.sprev
	}
	seg.sprev, seg.snext = nil, nil
}

func (s *shard) addIdle(seg *segment) {
	seg.idle = true
	if s.dev.pool.gcOn {
		seg.idleAt = s.dev.gcClock.Load()
	}
	seg.iprev = nil
	seg.inext = s.idle
	if s.idle != nil {
		s.idle.iprev = seg
	}
	s.idle = seg
}

// removeIdle takes seg off the idle list; its owner is using it again, so a
// steal event recorded earlier no longer covers it.
func (s *shard) removeIdle(seg *segment) {
	if seg.iprev != nil {
		seg.iprev.inext = seg.inext
	} else {
		s.idle = seg.inext
	}
	if seg.inext != nil {
		seg.inext.iprev = seg.iprev
	}
	seg.iprev, seg.inext, seg.idle = nil, nil, false
	if seg.hasEvent {
		s.dev.putEvent(seg.stealEvent)
		seg.hasEvent = false
	}
}

// ---- slow paths -------------------------------------------------------------

// allocSlow finds memory when no cached block of this stream fits: an idle
// segment of another stream whose work has completed, else a new segment,
// else (out of memory or over the limit) release every cached segment of
// the device and try once more. Called and returns with s.mu held.
func (s *shard) allocSlow(n, r uint64, k poolKind) (*block, error) {
	if b := s.steal(r, k); b != nil {
		return b, nil
	}
	if b := s.reclaimParked(r, k); b != nil {
		return b, nil
	}
	if b, err := s.collectGarbage(r, k); b != nil || err != nil {
		return b, err
	}
	b, err := s.newMemory(r, k)
	if err == nil || !IsOutOfMemory(err) {
		return b, err
	}
	d := s.dev
	d.numAllocRetries.Add(1)
	s.mu.Unlock()
	if rc := d.pool.cfg.Reclaim; rc != nil {
		rc(d.idx)
	}
	relErr := d.releaseCached()
	s.mu.Lock()
	if !s.direct {
		if b := s.findFree(r, k); b != nil {
			return b, nil
		}
	}
	if b := s.steal(r, k); b != nil {
		return b, nil
	}
	if b, err = s.newMemory(r, k); err == nil {
		return b, nil
	}
	if !IsOutOfMemory(err) {
		return nil, err
	}
	d.numOOMs.Add(1)
	return nil, d.oomError(s, n, r, k, err, relErr)
}

// reclaimParked takes back the blocks a cache in front of the pool holds
// for this device, when it holds any, and looks for a fit again: the pool
// grows only when even they would not do. Default-pool shards only (private
// pools never see those blocks). Called and returns with s.mu held.
func (s *shard) reclaimParked(r uint64, k poolKind) *block {
	cfg := &s.dev.pool.cfg
	if s.pool != nil || cfg.Reclaim == nil || cfg.Parked == nil || !cfg.Parked(s.dev.idx) {
		return nil
	}
	s.mu.Unlock()
	cfg.Reclaim(s.dev.idx)
	s.mu.Lock()
	if b := s.findFree(r, k); b != nil {
		return b
	}
	return s.steal(r, k)
}

// oomError describes a refused request; called with held's lock held.
func (d *device) oomError(held *shard, n, r uint64, k poolKind, cause, relErr error) error {
	free, total, merr := d.pool.backend.MemInfo(d.idx)
	dev := "unknown"
	if merr == nil {
		dev = fmt.Sprintf("%d of %d bytes free", free, total)
	}
	d.hist.record(ActOOM, uintptr(free), n, held.stream)
	lim := "none"
	if l := d.limit.Load(); l > 0 {
		lim = fmt.Sprintf("%d bytes", l)
	}
	msg := fmt.Sprintf("%s: out of memory: requested %d bytes (a %d-byte segment of the %s) on device %d: "+
		"pool reserved %d bytes, allocated %d bytes; limit %s; device %s; cause: %v",
		d.pool.backend.Name(), n, segmentSize(r, k), k, d.idx,
		d.reserved[stAll].cur.Load(), d.allocatedBytes(held), lim, dev, cause)
	if relErr != nil {
		msg += fmt.Sprintf(" (releasing the cache also failed: %v)", relErr)
	}
	return &oomErr{msg: msg}
}

type oomErr struct{ msg string }

func (e *oomErr) Error() string        { return e.msg }
func (e *oomErr) Is(target error) bool { return target == ErrOutOfMemory }

// errLimit is the cause when the cap, not the device, refuses a segment.
type limitErr struct{ want, reserved, limit uint64 }

func (e *limitErr) Error() string {
	return fmt.Sprintf("pool limit: %d reserved + %d requested > limit %d bytes", e.reserved, e.want, e.limit)
}
func (e *limitErr) OutOfMemory() bool { return true }

// newSegment asks the backend for a segment that fits r and returns its
// (free, whole) block. Called with s.mu held.
func (s *shard) newSegment(r uint64, k poolKind) (*block, error) {
	d := s.dev
	size := segmentSize(r, k)
	if s.direct {
		size = r // PyTorch's caching allocator above already chose the segment's size
	}
	if err := d.reserve(size); err != nil {
		return nil, err
	}
	ptr, err := d.pool.backend.Alloc(d.idx, size)
	if err != nil {
		d.unreserve(size, false)
		return nil, err
	}
	d.countSegment(k, int64(size), 1)
	seg := &segment{ptr: ptr, size: size, kind: k}
	d.hist.record(ActSegmentAlloc, ptr, size, s.stream)
	s.addSeg(seg)
	b := s.newBlock()
	*b = block{ptr: ptr, size: size, seg: seg}
	seg.head, seg.tail = b, b
	s.insertFree(b)
	s.addIdle(seg)
	return b, nil
}

// allocatedBytes is allocated_bytes.all.current. held is a shard whose lock
// the caller already holds (or nil).
//
// Lock order: it may take other shards' locks while holding held's, which
// is safe only because it does so while the device is not multi, and a
// device that is not multi has one shard: appendShard switches the device
// to multi (goMulti) before it publishes a second shard, so two callers can
// never each hold one shard's lock and wait for the other's. Once multi,
// the device-wide counters answer and no lock is taken.
func (d *device) allocatedBytes(held *shard) int64 {
	if d.hot.multi.Load() {
		return d.hot.allocBytes.Load()
	}
	var n int64
	for _, s := range d.shardList() {
		if s != held {
			s.mu.Lock()
		}
		n += s.stats.c[stAll].bAlloc - s.stats.c[stAll].bFree
		if s != held {
			s.mu.Unlock()
		}
	}
	return n
}

// reserve counts size against the device's reserved bytes, refusing it if
// the limit would be passed.
func (d *device) reserve(size uint64) error {
	d.reserveMu.Lock()
	defer d.reserveMu.Unlock()
	if l := d.limit.Load(); l > 0 && d.committed+size > l {
		return &limitErr{want: size, reserved: d.committed, limit: l}
	}
	d.committed += size
	return nil
}

// unreserve gives back a reservation: of a segment the backend refused
// (counted=false) or of one released (counted=true, in the statistics too).
func (d *device) unreserve(size uint64, counted bool) {
	d.reserveMu.Lock()
	d.committed -= size
	d.reserveMu.Unlock()
	if counted {
		d.reserved[stAll].add(-int64(size))
	}
}

// releaseSegment returns idle segment seg of s to the backend.
func (s *shard) releaseSegment(seg *segment) error {
	d := s.dev
	var rangeErr error
	if seg.vsize != 0 {
		if err := d.pool.exp.UnmapChunks(d.idx, seg.ptr, seg.size); err != nil {
			return fmt.Errorf("unmapping a %d-byte expandable segment at %#x on device %d: %w", seg.size, seg.ptr, d.idx, err)
		}
		// The memory is gone with the unmap; a range that cannot be given
		// back leaks address space only, so the segment goes all the same.
		rangeErr = d.pool.exp.FreeRange(d.idx, seg.ptr, seg.vsize)
		d.hist.record(ActSegmentUnmap, seg.ptr, seg.size, s.stream)
		for k := range s.grow {
			if s.grow[k] == seg {
				s.grow[k] = nil
			}
		}
	} else {
		if err := d.pool.backend.Free(d.idx, seg.ptr, seg.size); err != nil {
			return fmt.Errorf("releasing a %d-byte segment at %#x on device %d: %w", seg.size, seg.ptr, d.idx, err)
		}
		d.hist.record(ActSegmentFree, seg.ptr, seg.size, s.stream)
	}
	s.removeIdle(seg)
	s.removeFree(seg.head)
	s.removeSeg(seg)
	s.recycle(seg.head)
	seg.head, seg.tail = nil, nil
	t := statType(seg.kind)
	d.unreserve(seg.size, true)
	d.reserved[t].add(-int64(seg.size))
	d.segments[stAll].add(-1)
	d.segments[t].add(-1)
	if seg.kind == oversizePool {
		d.oversizeSegs.add(-1)
	}
	d.numDeviceFree.Add(1)
	if rangeErr != nil {
		return fmt.Errorf("giving back the address range of an expandable segment at %#x on device %d: %w", seg.ptr, d.idx, rangeErr)
	}
	return nil
}

// releaseCached waits for every pending block of the device and returns
// every idle segment to the backend; while any private pool of the device is
// routing (a capture may be under way) it does nothing.
func (d *device) releaseCached() error {
	var errs []error
	// privMu keeps every private pool's released state put meanwhile.
	d.privMu.Lock()
	defer d.privMu.Unlock()
	if d.routes.Load() > 0 {
		// A capture may be under way on any stream of the device: the
		// driver forbids freeing (cuMemFree) and the synchronize before an
		// unmap during a global-mode capture, and waiting for pending blocks
		// would record and query events. PyTorch releases nothing while a
		// capture is under way either; the first release after the routes
		// end does it.
		return nil
	}
	for _, s := range d.shardList() {
		if s.pool != nil && !s.direct && !s.pool.released() {
			continue // a live graph's memory stays with its pool
		}
		s.mu.Lock()
		if len(s.pending) > 0 {
			if err := s.processPending(true); err != nil {
				errs = append(errs, err)
			}
		}
		for seg := s.idle; seg != nil; {
			next := seg.inext
			if err := s.releaseSegment(seg); err != nil {
				errs = append(errs, err)
			}
			seg = next
		}
		if s.expandable {
			if err := s.trimAll(); err != nil {
				errs = append(errs, err)
			}
		}
		s.mu.Unlock()
	}
	d.forgetReleased()
	d.numSyncAll.Add(1)
	return errors.Join(errs...)
}

// steal moves an idle segment of another stream of the same device to s, if
// one fits r and the work its stream had queued when it became a candidate
// has completed. It never waits: a shard busy with its own lock is skipped,
// and a segment whose event has not completed is left for a later call.
// Called with s.mu held.
func (s *shard) steal(r uint64, k poolKind) *block {
	d := s.dev
	if s.pool != nil || d.routes.Load() > 0 {
		// Private pools take nothing from others; and while a capture may be
		// under way, no event may be recorded or queried.
		return nil
	}
	for _, o := range d.shardList() {
		if o == s || o.pool != nil || !o.mu.TryLock() {
			continue
		}
		seen := 0
		for seg := o.idle; seg != nil && seen < 64; seg = seg.inext {
			seen++
			// An expandable segment stays with its stream (as in PyTorch):
			// it grows in place, and goes back whole at release.
			if seg.vsize != 0 || seg.kind != k || seg.size < r || (k == oversizePool && seg.size >= r+d.pool.slack) {
				continue
			}
			if !o.segmentQuiet(seg) {
				continue
			}
			o.removeIdle(seg)
			o.removeFree(seg.head)
			o.removeSeg(seg)
			s.addSeg(seg)
			s.insertFree(seg.head)
			s.addIdle(seg)
			o.mu.Unlock()
			return seg.head
		}
		o.mu.Unlock()
	}
	return nil
}

// segmentQuiet reports whether the owner stream's work on idle segment seg
// has completed, recording the event that tells on first ask. Called with
// o.mu held.
func (o *shard) segmentQuiet(seg *segment) bool {
	d := o.dev
	if !seg.hasEvent {
		ev, err := d.getEvent()
		if err != nil {
			return false
		}
		if err := d.pool.backend.Record(d.idx, ev, o.stream); err != nil {
			d.putEvent(ev)
			return false
		}
		seg.stealEvent, seg.hasEvent = ev, true
	}
	done, err := d.pool.backend.Query(d.idx, seg.stealEvent)
	return err == nil && done
}

// deferFree parks b until events recorded now on its record_stream streams
// have completed. If an event cannot be recorded now, processPending records
// it later (an event recorded later on the stream covers the work queued
// before the free too); until then the block is never reused.
func (s *shard) deferFree(b *block) {
	d := s.dev
	b.state = blockPending
	capturing := d.routes.Load() > 0
	b.streams(func(st uintptr) {
		if capturing {
			// The stream may be capturing: record the event once no
			// capture is under way (processPending), as PyTorch defers it.
			b.waiting++
			s.pending = append(s.pending, pendingFree{b: b, stream: st})
			return
		}
		ev, err := d.getEvent()
		if err == nil {
			if err = d.pool.backend.Record(d.idx, ev, st); err != nil {
				d.putEvent(ev)
			}
		}
		if err != nil {
			ev = 0
		}
		b.waiting++
		s.pending = append(s.pending, pendingFree{b: b, ev: ev, stream: st})
	})
}

// processPending releases the pending blocks whose events have all
// completed; with wait it first waits for every event. Called with s.mu held.
func (s *shard) processPending(wait bool) error {
	d := s.dev
	var errs []error
	keep := s.pending[:0]
	for _, pf := range s.pending {
		done := false
		if pf.ev == 0 { // recording failed at free time: try again
			if ev, err := d.getEvent(); err != nil {
				errs = append(errs, err)
			} else if err := d.pool.backend.Record(d.idx, ev, pf.stream); err != nil {
				d.putEvent(ev)
				errs = append(errs, err)
			} else {
				pf.ev = ev
			}
		}
		if pf.ev != 0 {
			var err error
			if wait {
				err = d.pool.backend.Sync(d.idx, pf.ev)
				done = err == nil
			} else {
				done, err = d.pool.backend.Query(d.idx, pf.ev)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
		if !done {
			keep = append(keep, pf)
			continue
		}
		d.putEvent(pf.ev)
		b := pf.b
		if b.waiting--; b.waiting == 0 {
			s.stats.done(b.seg.kind, int64(b.size))
			if d.hot.multi.Load() {
				d.hot.done(int64(b.size))
			}
			d.hist.record(ActFreeCompleted, b.ptr, b.size, s.stream)
			s.release(b)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
	return errors.Join(errs...)
}

// getEvent returns an idle event of the device, creating one if needed.
func (d *device) getEvent() (Event, error) {
	d.evMu.Lock()
	if n := len(d.events); n > 0 {
		ev := d.events[n-1]
		d.events = d.events[:n-1]
		d.evMu.Unlock()
		return ev, nil
	}
	d.evMu.Unlock()
	return d.pool.backend.NewEvent(d.idx)
}

func (d *device) putEvent(ev Event) {
	d.evMu.Lock()
	d.events = append(d.events, ev)
	d.evMu.Unlock()
}
