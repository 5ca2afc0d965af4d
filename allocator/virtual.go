package allocator

import (
	"fmt"
	"maps"
	"sync"
)

// Virtual is a Backend (and Expander) that hands out address ranges with no
// memory behind them: a trace that peaked at 15 GiB on an H200 replays
// through a real Pool on any machine (symm replay, the trace benchmarks).
// Pointers it returns must never be dereferenced. Events complete at once.
// It counts the bytes it has handed out (segments plus mapped chunks) against
// a capacity, so a replay can also run into out-of-memory as a device would.
type Virtual struct {
	mu       sync.Mutex
	devices  int
	capacity uint64
	gran     uint64
	next     uintptr
	used     []uint64
	peak     []uint64
	segs     map[uintptr]uint64 // Alloc'd segments: base -> size
	ranges   map[uintptr]uint64 // reserved ranges: base -> size
	mapped   map[uintptr]bool   // mapped chunks of the granularity, by address
	starts   ChunkStarts        // physical chunks mapped: start -> size
	created  map[uint64]int     // physical chunks created, by size
	nextEv   Event
	// A stream that lags its host (SetStreamLag): lag rows of the
	// caller's clock (Tick) pass before an event recorded completes;
	// recorded is each event's row, asked the row it was last asked at
	// plus one (0: not asked since it was recorded).
	lag, clock      int
	recorded, asked map[Event]int
}

var (
	_ Backend      = (*Virtual)(nil)
	_ Expander     = (*Virtual)(nil)
	_ ChunkAuditor = (*Virtual)(nil)
)

// NewVirtual returns a virtual backend of devices devices of capacity bytes
// each (0: 1 PiB), with a 2 MiB chunk granularity, as current GPUs have.
func NewVirtual(devices int, capacity uint64) *Virtual {
	if devices <= 0 {
		devices = 1
	}
	if capacity == 0 {
		capacity = 1 << 50
	}
	return &Virtual{
		devices: devices, capacity: capacity, gran: 2 << 20, next: 1 << 44,
		used: make([]uint64, devices), peak: make([]uint64, devices),
		segs: map[uintptr]uint64{}, ranges: map[uintptr]uint64{}, mapped: map[uintptr]bool{},
		starts: ChunkStarts{}, created: map[uint64]int{},
	}
}

// Used is the bytes device dev has handed out now (segments and mapped
// chunks); Peak is the most it ever had at once.
func (v *Virtual) Used(dev int) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.used[dev]
}

// Peak: see Used.
func (v *Virtual) Peak(dev int) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.peak[dev]
}

// Outstanding reports the segments, reserved ranges and mapped chunks still
// held, for leak checks.
func (v *Virtual) Outstanding() (segments, ranges, chunks int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.segs), len(v.ranges), len(v.mapped)
}

func (v *Virtual) Name() string              { return "virtual" }
func (v *Virtual) DeviceCount() (int, error) { return v.devices, nil }

func (v *Virtual) check(dev int) error {
	if dev < 0 || dev >= v.devices {
		return fmt.Errorf("virtual: device %d out of range [0, %d)", dev, v.devices)
	}
	return nil
}

func (v *Virtual) MemInfo(dev int) (free, total uint64, err error) {
	if err := v.check(dev); err != nil {
		return 0, 0, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.capacity - v.used[dev], v.capacity, nil
}

// take counts size bytes against dev; called with v.mu held.
func (v *Virtual) take(dev int, size uint64) error {
	if size > v.capacity-v.used[dev] {
		return &virtualOOM{dev: dev, want: size, used: v.used[dev], capacity: v.capacity}
	}
	v.used[dev] += size
	v.peak[dev] = max(v.peak[dev], v.used[dev])
	return nil
}

// addressSpace hands out a new address range, granularity-aligned, with a
// gap after it so that neighbouring ranges never touch.
func (v *Virtual) addressSpace(size uint64) uintptr {
	p := v.next
	v.next += uintptr((size+v.gran-1)&^(v.gran-1)) + uintptr(v.gran)
	return p
}

func (v *Virtual) Alloc(dev int, size uint64) (uintptr, error) {
	if err := v.check(dev); err != nil {
		return 0, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.take(dev, size); err != nil {
		return 0, err
	}
	p := v.addressSpace(size)
	v.segs[p] = size
	return p, nil
}

func (v *Virtual) Free(dev int, ptr uintptr, size uint64) error {
	if err := v.check(dev); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if got, ok := v.segs[ptr]; !ok || got != size {
		return fmt.Errorf("virtual: free of %#x (%d bytes): not a segment of this backend", ptr, size)
	}
	delete(v.segs, ptr)
	v.used[dev] -= size
	return nil
}

func (v *Virtual) Granularity(dev int) (uint64, error) { return v.gran, v.check(dev) }

func (v *Virtual) ReserveRange(dev int, size uint64) (uintptr, error) {
	if err := v.check(dev); err != nil {
		return 0, err
	}
	if size == 0 || size%v.gran != 0 {
		return 0, fmt.Errorf("virtual: reserve of %d bytes: not a positive multiple of %d", size, v.gran)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	p := v.addressSpace(size)
	v.ranges[p] = size
	return p, nil
}

func (v *Virtual) FreeRange(dev int, ptr uintptr, size uint64) error {
	if err := v.check(dev); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if got, ok := v.ranges[ptr]; !ok || got != size {
		return fmt.Errorf("virtual: free of range %#x (%d bytes): not reserved", ptr, size)
	}
	for c := range v.mapped { // the mapped chunks are far fewer than a range's
		if c >= ptr && c < ptr+uintptr(size) {
			return fmt.Errorf("virtual: free of range %#x: chunk %#x is still mapped", ptr, c)
		}
	}
	delete(v.ranges, ptr)
	return nil
}

// inRange checks that [ptr, ptr+size) is whole chunks (chunk a multiple of
// the granularity) inside one reserved range; called with v.mu held.
func (v *Virtual) inRange(ptr uintptr, size, chunk uint64) error {
	if chunk == 0 || chunk%v.gran != 0 || size == 0 || size%chunk != 0 || uint64(ptr)%v.gran != 0 {
		return fmt.Errorf("virtual: range %#x+%d is not whole %d-byte chunks", ptr, size, chunk)
	}
	for base, n := range v.ranges {
		if ptr >= base && ptr+uintptr(size) <= base+uintptr(n) {
			return nil
		}
	}
	return fmt.Errorf("virtual: range %#x+%d is not inside a reserved range", ptr, size)
}

func (v *Virtual) MapChunks(dev int, ptr uintptr, size, chunk uint64) error {
	if err := v.check(dev); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.inRange(ptr, size, chunk); err != nil {
		return err
	}
	for c := ptr; c < ptr+uintptr(size); c += uintptr(v.gran) {
		if v.mapped[c] {
			return fmt.Errorf("virtual: map of %#x+%d: chunk %#x is already mapped", ptr, size, c)
		}
	}
	if err := v.take(dev, size); err != nil {
		return err
	}
	for c := ptr; c < ptr+uintptr(size); c += uintptr(v.gran) {
		v.mapped[c] = true
	}
	v.starts.Add(ptr, size, chunk)
	v.created[chunk] += int(size / chunk)
	return nil
}

// Created reports how many physical chunks of each size MapChunks has
// created: what the driver's per-allocation cost is paid for on a GPU.
func (v *Virtual) Created() map[uint64]int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.created)
}

func (v *Virtual) UnmapChunks(dev int, ptr uintptr, size, chunk uint64) (uint64, error) {
	if err := v.check(dev); err != nil {
		return 0, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.inRange(ptr, size, chunk); err != nil {
		return 0, err
	}
	for c := ptr; c < ptr+uintptr(size); c += uintptr(v.gran) {
		if !v.mapped[c] {
			return 0, fmt.Errorf("virtual: unmap of %#x+%d: chunk %#x is not mapped", ptr, size, c)
		}
	}
	if err := v.starts.Check(ptr, size, chunk); err != nil {
		return 0, fmt.Errorf("virtual: unmap of %#x+%d: %w", ptr, size, err)
	}
	v.starts.Remove(ptr, size, chunk)
	for c := ptr; c < ptr+uintptr(size); c += uintptr(v.gran) {
		delete(v.mapped, c)
	}
	v.used[dev] -= size
	return size, nil
}

// MappedChunks reports which chunks of the first size bytes of the range
// reserved at base are mapped, and the bytes mapped in all of it
// (ChunkAuditor).
func (v *Virtual) MappedChunks(dev int, base uintptr, size uint64) ([]bool, uint64, error) {
	if err := v.check(dev); err != nil {
		return nil, 0, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	n, ok := v.ranges[base]
	if !ok || size > n {
		return nil, 0, fmt.Errorf("virtual: %#x+%d is not the start of a reserved range", base, size)
	}
	out := make([]bool, size/v.gran)
	var total uint64
	for c := range v.mapped {
		if c >= base && c < base+uintptr(n) {
			total += v.gran
			if i := uint64(c-base) / v.gran; i < uint64(len(out)) {
				out[i] = true
			}
		}
	}
	return out, total, nil
}

func (v *Virtual) NewEvent(dev int) (Event, error) {
	if err := v.check(dev); err != nil {
		return 0, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.nextEv++
	return v.nextEv, nil
}

// SetStreamLag makes every stream lag its host by rows ticks of the
// caller's clock (Tick): an event recorded at tick t reports completion
// from tick t+rows on, or when asked a second time within one tick (a
// host that polls is waiting, and its GPU catches up), and Sync completes
// it at once. 0 (the default): every event is complete when recorded, as
// if the GPU kept up with its host.
func (v *Virtual) SetStreamLag(rows int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lag, v.recorded, v.asked = rows, map[Event]int{}, map[Event]int{}
}

// Tick sets the clock of SetStreamLag: the row being replayed.
func (v *Virtual) Tick(row int) {
	v.mu.Lock()
	v.clock = row
	v.mu.Unlock()
}

func (v *Virtual) Record(dev int, ev Event, _ uintptr) error {
	if err := v.check(dev); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.lag > 0 {
		v.recorded[ev] = v.clock
		delete(v.asked, ev)
	}
	return nil
}

func (v *Virtual) Query(dev int, ev Event) (bool, error) {
	if err := v.check(dev); err != nil {
		return false, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.lag == 0 || v.clock >= v.recorded[ev]+v.lag || v.asked[ev] == v.clock+1 {
		return true, nil
	}
	v.asked[ev] = v.clock + 1
	return false, nil
}

func (v *Virtual) Sync(dev int, ev Event) error {
	if err := v.check(dev); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.lag > 0 {
		v.recorded[ev] = v.clock - v.lag
	}
	return nil
}

func (v *Virtual) DestroyEvent(dev int, _ Event) error { return v.check(dev) }

type virtualOOM struct {
	dev                  int
	want, used, capacity uint64
}

func (e *virtualOOM) Error() string {
	return fmt.Sprintf("virtual: out of memory: %d bytes on device %d (%d of %d bytes in use)", e.want, e.dev, e.used, e.capacity)
}
func (e *virtualOOM) OutOfMemory() bool { return true }
