package allocator

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// Tunables: the pool's settings that PyTorch lets a program change while it
// runs (torch.cuda.memory._set_allocator_settings after CUDA is up). PyTorch
// reads them from CUDAAllocatorConfig on every request, so a change applies
// to the requests and segments that come after it and leaves every block
// and segment already made as it is. libsymm does the same: each is read
// with one atomic load where the request needs it, so the cached path takes
// no lock and every later request sees the new value.
//
// What a change does to what exists (PyTorch's behaviour, kept):
//   - max_split_size_mb: a request is classed oversize or not by the value
//     it meets; a block keeps the pool (bins) it was made in.
//   - roundup_power2_divisions, max_non_split_rounding_mb,
//     large_segment_size_mb: the next request's rounding, oversize
//     tolerance and new segment size.
//   - garbage_collection_threshold: the next request that must take memory.
//   - expandable_segments: the default pool keeps a shard per stream for
//     each kind of segment; requests go to the kind the setting names now,
//     frees go to the shard that holds the block, and the out-of-memory
//     retry and empty_cache release both kinds. Expandable segments made
//     while it was on stay expandable, fixed ones fixed (PyTorch: "someone
//     might temporarily disable it"; its free lists skip the other kind).
//   - graph_capture_record_stream_reuse: blocks freed from then on during a
//     capture get free markers; allocations scan for reusable ones only while
//     it is on (capture_reuse.go). Blocks freed with it off wait until no
//     capture is under way, even if it is turned on later, as in PyTorch.
type tunables struct {
	maxSplit atomic.Uint64 // 0: nothing is oversize
	slack    atomic.Uint64 // oversize reuse tolerance (max_non_split_rounding_mb or 20 MiB)
	largeSeg atomic.Uint64 // segment size of requests from 1 to 10 MiB (large_segment_size_mb or 20 MiB)
	// roundup is roundup_power2_divisions when some interval rounds (d > 1);
	// nil when none does, so the cached path tests one pointer.
	roundup atomic.Pointer[[RoundupIntervals]uint64]
	// divisions is roundup_power2_divisions as given (ones included), for
	// reports.
	divisions atomic.Pointer[[RoundupIntervals]uint64]
	gcBits    atomic.Uint64 // garbage_collection_threshold, float64 bits; 0: off
	// expandable: new default-pool segments are expandable. Set only once
	// the backend's Expander is ready on every device (expandMu).
	expandable atomic.Bool
	// captureReuse is graph_capture_record_stream_reuse (Config.CaptureReuse).
	captureReuse atomic.Bool
	allocConf    atomic.Pointer[string] // the settings text last applied, reported by snapshots

	// mu serializes changes (ApplyTorchSettings, setExpandable): each
	// device's expandable geometry is read from the backend once
	// (expandReady). Never taken by a request.
	mu          sync.Mutex
	expandReady bool
}

// checkTunables reports the first tunable of cfg that New refuses.
func checkTunables(cfg Config) error {
	if !(cfg.GCThreshold >= 0 && cfg.GCThreshold < 1) {
		return fmt.Errorf("%w: garbage collection threshold %g is outside [0, 1)", ErrInvalid, cfg.GCThreshold)
	}
	if ls := cfg.LargeSegment; ls != 0 && (ls <= minLargeSeg || ls%(1<<20) != 0 || ls > maxRequest) {
		return fmt.Errorf("%w: large segment size %d is not a whole number of MiB above 10 MiB", ErrInvalid, ls)
	}
	for i, d := range cfg.RoundupPower2Divisions {
		if d != 0 && !isPow2(d) {
			return fmt.Errorf("%w: roundup_power2_divisions: interval %d has %d divisions, not 0 or a power of 2", ErrInvalid, i, d)
		}
	}
	return nil
}

// setTunables stores cfg's tunables but expandable (setExpandable), after
// checkTunables accepted them.
func (p *Pool) setTunables(cfg Config) {
	t := &p.tun
	t.maxSplit.Store(cfg.MaxSplit)
	t.slack.Store(cmpOr(cfg.MaxNonSplitRounding, largeBuffer))
	t.largeSeg.Store(cmpOr(cfg.LargeSegment, largeSeg))
	given := cfg.RoundupPower2Divisions
	t.divisions.Store(&given)
	var div *[RoundupIntervals]uint64
	for _, d := range given {
		if d > 1 {
			div = &given
			break
		}
	}
	t.roundup.Store(div)
	t.gcBits.Store(math.Float64bits(cfg.GCThreshold))
	t.captureReuse.Store(cfg.CaptureReuse)
	text := cfg.AllocConf
	t.allocConf.Store(&text)
}

func cmpOr(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}

// setExpandable makes new default-pool segments expandable (on) or fixed.
// Turning it on the first time reads each device's chunk geometry from the
// backend, which must be an Expander. Called with p.tun.mu held, or from
// New.
func (p *Pool) setExpandable(on bool) error {
	t := &p.tun
	if !on {
		t.expandable.Store(false)
		return nil
	}
	if !t.expandReady {
		if p.exp == nil {
			return fmt.Errorf("%w: expandable segments: the %s backend cannot reserve address space and map chunks", ErrInvalid, p.backend.Name())
		}
		for _, d := range p.devs {
			if err := d.initExpandable(); err != nil {
				return err
			}
		}
		t.expandReady = true
	}
	t.expandable.Store(true)
	return nil
}

// gcThreshold is garbage_collection_threshold now (0: off).
func (p *Pool) gcThreshold() float64 { return math.Float64frombits(p.tun.gcBits.Load()) }

// gcOn reports whether the garbage collector is on.
func (p *Pool) gcOn() bool { return p.tun.gcBits.Load() != 0 }

// maxSplit is max_split_size now (0: off).
func (p *Pool) maxSplit() uint64 { return p.tun.maxSplit.Load() }

// slack is the oversize reuse tolerance now.
func (p *Pool) slack() uint64 { return p.tun.slack.Load() }

// largeSegSize is the segment size of requests from 1 to 10 MiB now.
func (p *Pool) largeSegSize() uint64 { return p.tun.largeSeg.Load() }

// roundupDivisions is roundup_power2_divisions now, every interval.
func (p *Pool) roundupDivisions() [RoundupIntervals]uint64 { return *p.tun.divisions.Load() }

// SetExpandable makes the default pool's new segments expandable (on) or
// fixed, from the next request on (see the rules above); the segments made
// before keep their kind. An error wrapping ErrInvalid when the backend
// cannot map chunks (nothing changes then).
func (p *Pool) SetExpandable(on bool) error {
	p.tun.mu.Lock()
	defer p.tun.mu.Unlock()
	if err := p.switchExpandable(on); err != nil {
		return err
	}
	p.settingsChanged()
	return nil
}

// switchExpandable is SetExpandable with p.tun.mu held.
func (p *Pool) switchExpandable(on bool) error {
	if on == p.Expandable() {
		return nil
	}
	if err := p.setExpandable(on); err != nil {
		return err
	}
	// Blocks a front cache holds were cut from the other kind's segments:
	// they go back, so that what comes next is served from the kind asked
	// for.
	p.observe(-1)
	return nil
}

// settingsChanged advances the epoch of every default-pool shard
// (epoch.go): the best fit of a request may differ after a change of the
// settings (another rounding, pool or kind of segment), so no placement
// taken before the change may be claimed to stay. A request that read the
// settings before the change and takes its shard's lock after this can
// still claim its placement; that block is a valid block of the size asked
// for, placed by the settings of a moment before.
func (p *Pool) settingsChanged() {
	for _, d := range p.devs {
		for _, s := range d.shardList() {
			if s.pool == nil {
				s.mu.Lock()
				s.changed()
				s.mu.Unlock()
			}
		}
	}
}

// CaptureReuse reports graph_capture_record_stream_reuse as set now.
func (p *Pool) CaptureReuse() bool { return p.tun.captureReuse.Load() }
