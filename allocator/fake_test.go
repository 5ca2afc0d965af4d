package allocator

import (
	"fmt"
	"sync"
)

// fakeBackend serves segments from Go memory and models streams: each stream
// has work submitted and work completed; an event captures the submitted
// count at Record and is done once completed reaches it. Tests make a stream
// busy with launch and let it finish with finish.
type fakeBackend struct {
	mu        sync.Mutex
	devices   int
	capacity  uint64 // per device; 0 = unlimited
	used      []uint64
	segs      map[uintptr][]byte
	submitted map[uintptr]int
	completed map[uintptr]int
	events    map[Event]fakeEvent
	nextEv    Event
	allocs    int
	frees     int
	failAlloc error // returned by the next Alloc or MapChunks if set
	// failUnmap, when set, fails the failUnmapCall-th UnmapChunks or
	// KeepChunks from now (1: the next) after failUnmapAfter of its chunks
	// were unmapped (a prefix, as the CUDA backend's chunk-by-chunk unmap
	// fails); failUnmapCall counts down.
	failUnmap      error
	failUnmapCall  int
	failUnmapAfter int

	// Expandable segments: reserved ranges backed by Go memory (only the
	// chunks marked mapped may be touched) and the mapped chunks.
	ranges map[uintptr][]byte
	mapped map[uintptr]bool
	// starts: each physical chunk mapped (its start and size), which
	// unmaps only whole; spareOf: the spare bytes of each device and chunk
	// size.
	starts  ChunkStarts
	spareOf map[[2]uint64]uint64
	// Chunk memory per device (ChunkKeeper): chunks mapped and spare, and
	// chunks ever created minus released, which must equal their sum.
	chunkMapped, chunkSpare, chunkHandles []uint64

	// uses[chunk] is the last work queued on a chunk of an expandable range
	// (use): unmapping it before that work completed fails, as it would
	// corrupt memory on a GPU. onSync, when set, runs before each Sync.
	uses   map[uintptr]fakeUse
	onSync func()
	// onEvent, when set, runs (without f.mu) at the start of every event
	// call: "new", "record", "query", "sync".
	onEvent func(op string)
}

func (f *fakeBackend) eventHook(op string) {
	if f.onEvent != nil {
		f.onEvent(op)
	}
}

type fakeUse struct {
	stream uintptr
	seq    int
}

const fakeGranularity = 2 << 20

type fakeEvent struct {
	stream   uintptr
	target   int
	recorded bool
}

func newFake(devices int) *fakeBackend {
	return &fakeBackend{
		devices: devices, used: make([]uint64, devices), segs: map[uintptr][]byte{},
		submitted: map[uintptr]int{}, completed: map[uintptr]int{}, events: map[Event]fakeEvent{}, nextEv: 1,
		ranges: map[uintptr][]byte{}, mapped: map[uintptr]bool{}, uses: map[uintptr]fakeUse{},
		starts: ChunkStarts{}, spareOf: map[[2]uint64]uint64{},
		chunkMapped: make([]uint64, devices), chunkSpare: make([]uint64, devices), chunkHandles: make([]uint64, devices),
	}
}

type fakeOOM struct{}

func (fakeOOM) Error() string     { return "FAKE_ERROR_OUT_OF_MEMORY" }
func (fakeOOM) OutOfMemory() bool { return true }

func (f *fakeBackend) Name() string              { return "fake" }
func (f *fakeBackend) DeviceCount() (int, error) { return f.devices, nil }
func (f *fakeBackend) MemInfo(dev int) (uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.capacity == 0 {
		return 1 << 40, 1 << 40, nil
	}
	return f.capacity - f.used[dev], f.capacity, nil
}

func (f *fakeBackend) Alloc(dev int, size uint64) (uintptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failAlloc; err != nil {
		f.failAlloc = nil
		return 0, err
	}
	if f.capacity != 0 && f.used[dev]+size > f.capacity {
		return 0, fakeOOM{}
	}
	base, buf := alignedBuf(size, 4096)
	f.segs[base] = buf
	f.used[dev] += size
	f.allocs++
	return base, nil
}

func (f *fakeBackend) Free(dev int, ptr uintptr, size uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.segs[ptr]
	if !ok || uint64(len(b)) != size {
		return fmt.Errorf("fake: free of unknown segment %#x/%d", ptr, size)
	}
	delete(f.segs, ptr)
	f.used[dev] -= size
	f.frees++
	return nil
}

func (f *fakeBackend) NewEvent(dev int) (Event, error) {
	f.eventHook("new")
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.nextEv
	f.nextEv++
	f.events[e] = fakeEvent{}
	return e, nil
}

func (f *fakeBackend) Record(dev int, ev Event, stream uintptr) error {
	f.eventHook("record")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events[ev] = fakeEvent{stream: stream, target: f.submitted[stream], recorded: true}
	return nil
}

func (f *fakeBackend) Query(dev int, ev Event) (bool, error) {
	f.eventHook("query")
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.events[ev]
	return !e.recorded || f.completed[e.stream] >= e.target, nil
}

func (f *fakeBackend) Sync(dev int, ev Event) error {
	f.eventHook("sync")
	if f.onSync != nil {
		f.onSync()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.events[ev]
	if e.recorded && f.completed[e.stream] < e.target {
		f.completed[e.stream] = e.target
	}
	return nil
}

func (f *fakeBackend) DestroyEvent(dev int, ev Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.events, ev)
	return nil
}

// launch queues work on stream; finish completes everything queued.
func (f *fakeBackend) launch(stream uintptr) { f.mu.Lock(); f.submitted[stream]++; f.mu.Unlock() }
func (f *fakeBackend) finish(stream uintptr) {
	f.mu.Lock()
	f.completed[stream] = f.submitted[stream]
	f.mu.Unlock()
}

// use queues work on stream that touches [ptr, ptr+n) of an expandable range.
func (f *fakeBackend) use(stream, ptr uintptr, n uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submitted[stream]++
	for c := ptr &^ (fakeGranularity - 1); c < ptr+uintptr(n); c += fakeGranularity {
		f.uses[c] = fakeUse{stream: stream, seq: f.submitted[stream]}
	}
}

// mem returns the bytes at [ptr, ptr+n) of a live fake segment.
func (f *fakeBackend) mem(ptr uintptr, n uint64) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	for base, b := range f.segs {
		if ptr >= base && ptr+uintptr(n) <= base+uintptr(len(b)) {
			off := ptr - base
			return b[off : off+uintptr(n)]
		}
	}
	for base, b := range f.ranges {
		if ptr >= base && ptr+uintptr(n) <= base+uintptr(len(b)) {
			for c := ptr &^ (fakeGranularity - 1); c < ptr+uintptr(n); c += fakeGranularity {
				if !f.mapped[c] {
					panic(fmt.Sprintf("fake: %#x+%d touches chunk %#x, which is not mapped", ptr, n, c))
				}
			}
			off := ptr - base
			return b[off : off+uintptr(n)]
		}
	}
	panic(fmt.Sprintf("fake: %#x+%d is not inside a live segment", ptr, n))
}

// alignedBuf returns Go memory of size bytes starting on a multiple of align.
func alignedBuf(size, align uint64) (uintptr, []byte) {
	buf := make([]byte, size+align)
	off := (align - uint64(addrOf(buf))%align) % align
	return addrOf(buf[off:]), buf[off : off+size]
}

func (f *fakeBackend) Granularity(int) (uint64, error) { return fakeGranularity, nil }

func (f *fakeBackend) ReserveRange(dev int, size uint64) (uintptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if size%fakeGranularity != 0 {
		return 0, fmt.Errorf("fake: reserve of %d bytes", size)
	}
	base, buf := alignedBuf(size, fakeGranularity)
	f.ranges[base] = buf
	return base, nil
}

func (f *fakeBackend) FreeRange(dev int, ptr uintptr, size uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.ranges[ptr]
	if !ok || uint64(len(b)) != size {
		return fmt.Errorf("fake: free of unknown range %#x/%d", ptr, size)
	}
	for c := ptr; c < ptr+uintptr(size); c += fakeGranularity {
		if f.mapped[c] {
			return fmt.Errorf("fake: free of range %#x with chunk %#x mapped", ptr, c)
		}
	}
	delete(f.ranges, ptr)
	return nil
}

// chunks checks that [ptr, ptr+size) is whole chunks of one range, each
// mapped (want) or not; called with f.mu held.
func (f *fakeBackend) chunks(ptr uintptr, size uint64, want bool) error {
	if size == 0 || size%fakeGranularity != 0 || ptr%fakeGranularity != 0 {
		return fmt.Errorf("fake: range %#x/%d is not whole chunks", ptr, size)
	}
	for base, b := range f.ranges {
		if ptr >= base && ptr+uintptr(size) <= base+uintptr(len(b)) {
			for c := ptr; c < ptr+uintptr(size); c += fakeGranularity {
				if f.mapped[c] != want {
					return fmt.Errorf("fake: chunk %#x mapped %v, want %v", c, f.mapped[c], want)
				}
			}
			return nil
		}
	}
	return fmt.Errorf("fake: range %#x/%d is not reserved", ptr, size)
}

// wholeChunks checks that size is whole chunks of chunk bytes, chunk a
// multiple of the granularity, as the pool must always ask.
func wholeChunks(size, chunk uint64) error {
	if chunk == 0 || chunk%fakeGranularity != 0 || size%chunk != 0 {
		return fmt.Errorf("fake: %d bytes are not whole %d-byte chunks of the %d-byte granularity", size, chunk, fakeGranularity)
	}
	return nil
}

func (f *fakeBackend) MapChunks(dev int, ptr uintptr, size, chunk uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failAlloc; err != nil {
		f.failAlloc = nil
		return err
	}
	if err := wholeChunks(size, chunk); err != nil {
		return err
	}
	if err := f.chunks(ptr, size, false); err != nil {
		return err
	}
	if f.capacity != 0 && f.used[dev]+size > f.capacity {
		return fakeOOM{}
	}
	for c := ptr; c < ptr+uintptr(size); c += fakeGranularity {
		f.mapped[c] = true
	}
	f.starts.Add(ptr, size, chunk)
	f.used[dev] += size
	f.chunkMapped[dev] += size
	f.chunkHandles[dev] += size
	f.allocs++
	return nil
}

func (f *fakeBackend) UnmapChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	return f.unmap(dev, ptr, size, chunk, false)
}

// ChunkKeeper: spare chunks keep their place in the capacity (used).

func (f *fakeBackend) KeepChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	return f.unmap(dev, ptr, size, chunk, true)
}

// unmap drops the chunks of [ptr, ptr+size), refusing while work queued on
// one has not completed (unmapping it would corrupt memory on a GPU); their
// bytes are released, or with keep become spare chunks. An injected fault
// (failUnmap) unmaps a prefix of whole chunks and fails.
func (f *fakeBackend) unmap(dev int, ptr uintptr, size, chunk uint64, keep bool) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := wholeChunks(size, chunk); err != nil {
		return 0, err
	}
	if err := f.chunks(ptr, size, true); err != nil {
		return 0, err
	}
	if err := f.starts.Check(ptr, size, chunk); err != nil {
		return 0, fmt.Errorf("fake: unmap: %w", err)
	}
	for c := ptr; c < ptr+uintptr(size); c += fakeGranularity {
		if u, ok := f.uses[c]; ok && f.completed[u.stream] < u.seq {
			return 0, fmt.Errorf("fake: unmap of chunk %#x while work %d of stream %#x on it has not completed", c, u.seq, u.stream)
		}
	}
	n, failErr := size, error(nil)
	if f.failUnmap != nil && f.failUnmapCall > 0 {
		if f.failUnmapCall--; f.failUnmapCall == 0 {
			n = min(size, uint64(f.failUnmapAfter)*chunk)
			failErr = f.failUnmap
		}
	}
	for c := ptr; c < ptr+uintptr(n); c += fakeGranularity {
		delete(f.mapped, c)
		delete(f.uses, c)
	}
	f.starts.Remove(ptr, n, chunk)
	f.chunkMapped[dev] -= n
	if keep {
		f.chunkSpare[dev] += n
		f.spareOf[[2]uint64{uint64(dev), chunk}] += n
		return n, failErr
	}
	f.used[dev] -= n
	f.chunkHandles[dev] -= n
	f.frees++
	return n, failErr
}

// MappedChunks reports which chunks of [base, base+size) are mapped, and
// the bytes mapped in the whole range at base.
func (f *fakeBackend) MappedChunks(dev int, base uintptr, size uint64) ([]bool, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.ranges[base]
	if !ok || size > uint64(len(b)) {
		return nil, 0, fmt.Errorf("fake: %#x+%d is not the start of a reserved range", base, size)
	}
	out := make([]bool, size/fakeGranularity)
	var total uint64
	for c := range f.mapped {
		if c >= base && c < base+uintptr(len(b)) {
			total += fakeGranularity
			if i := uint64(c-base) / fakeGranularity; i < uint64(len(out)) {
				out[i] = true
			}
		}
	}
	return out, total, nil
}

func (f *fakeBackend) MapKept(dev int, ptr uintptr, size, chunk uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failAlloc; err != nil {
		f.failAlloc = nil
		return err
	}
	if err := wholeChunks(size, chunk); err != nil {
		return err
	}
	if err := f.chunks(ptr, size, false); err != nil {
		return err
	}
	key := [2]uint64{uint64(dev), chunk}
	if f.spareOf[key] < size {
		return fmt.Errorf("fake: map of %d spare bytes of %d-byte chunks on device %d, which keeps %d", size, chunk, dev, f.spareOf[key])
	}
	for c := ptr; c < ptr+uintptr(size); c += fakeGranularity {
		f.mapped[c] = true
	}
	f.starts.Add(ptr, size, chunk)
	f.spareOf[key] -= size
	f.chunkSpare[dev] -= size
	f.chunkMapped[dev] += size
	return nil
}

func (f *fakeBackend) ReleaseKept(dev int, size, chunk uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := [2]uint64{uint64(dev), chunk}
	if f.spareOf[key] < size {
		return fmt.Errorf("fake: release of %d spare bytes of %d-byte chunks on device %d, which keeps %d", size, chunk, dev, f.spareOf[key])
	}
	f.spareOf[key] -= size
	f.chunkSpare[dev] -= size
	f.chunkHandles[dev] -= size
	f.used[dev] -= size
	return nil
}

func (f *fakeBackend) Chunks(dev int) (mapped, spare uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.chunkMapped[dev], f.chunkSpare[dev]
}

// checkChunks reports whether every chunk created and not released is
// mapped or spare, and as many are mapped as the mapped set holds.
func (f *fakeBackend) checkChunks() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var all uint64
	for d := range f.chunkHandles {
		if f.chunkHandles[d] != f.chunkMapped[d]+f.chunkSpare[d] {
			return fmt.Errorf("fake: device %d holds %d bytes of chunks, but %d are mapped and %d spare", d, f.chunkHandles[d], f.chunkMapped[d], f.chunkSpare[d])
		}
		all += f.chunkMapped[d]
	}
	if n := uint64(len(f.mapped)) * fakeGranularity; n != all {
		return fmt.Errorf("fake: %d bytes of chunks mapped, %d counted", n, all)
	}
	return nil
}
