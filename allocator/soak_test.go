package allocator_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/host"
)

// TestSoakConcurrentPool: 10^6 random pool operations (× SYMM_SOAK_SCALE)
// from 16 goroutines on the host backend over 2 devices. Each goroutine
// allocates mostly on its own stream, sometimes on one of 3 shared streams;
// it frees on the block's stream or another, calls record_stream with other
// goroutines' streams, passes blocks to other goroutines to free, and now and
// then empties the cache while the others run. Each block carries marks at
// both ends, checked when it is freed: no two holders ever share memory.
// The work runs in rounds; between rounds, with every goroutine stopped, the
// pool's invariants are checked and its allocation count must equal the
// blocks the goroutines hold. At the end, everything freed and the cache
// emptied, nothing is reserved and the backend holds no segment.
func TestSoakConcurrentPool(t *testing.T) { soakConcurrentPool(t, allocator.Config{}) }

// TestSoakConcurrentPoolFreePages is the same soak with expandable segments
// whose free pages are unmapped whenever the pool maps memory and at every
// empty_cache (Config.UnmapFreePages), while the other goroutines allocate
// and free on their streams: under -race in CI.
func TestSoakConcurrentPoolFreePages(t *testing.T) {
	soakConcurrentPool(t, allocator.Config{Expandable: true, UnmapFreePages: true})
}

func soakConcurrentPool(t *testing.T, cfg allocator.Config) {
	const (
		workers = 16
		devices = 2
		rounds  = 20
		maxLive = 48 // per goroutine
	)
	total := int(1e6 * soakScale(t))
	perRound := max(1, total/(workers*rounds))
	fds, maps := openFDs(t), memfdMaps(t)
	h, err := host.New(devices, 1<<40) // address space only: memfd pages are touched at the marks
	require.NoError(t, err)
	p, err := allocator.New(h, cfg)
	require.NoError(t, err)

	shared := []uintptr{0, 0xa000, 0xb000}
	own := func(w int) uintptr { return uintptr(0x10_0000 * (w + 1)) }
	anyStream := func(r *rand.Rand) uintptr {
		if r.IntN(2) == 0 {
			return shared[r.IntN(len(shared))]
		}
		return own(r.IntN(workers))
	}
	var handMu sync.Mutex
	var handed []*liveBlock // blocks given away, freed by whoever takes them

	lives := make([][]*liveBlock, workers)
	rngs := make([]*rand.Rand, workers)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(uint64(w), 2024))
	}
	work := func(w int) error {
		r, live := rngs[w], lives[w]
		defer func() { lives[w] = live }()
		free := func(b *liveBlock, st uintptr) error {
			if !b.intact() {
				return fmt.Errorf("block %#x (%d bytes) was overwritten while held", b.ptr, b.size)
			}
			if err := p.Free(b.dev, st, b.ptr, b.size); err != nil {
				return fmt.Errorf("free of %#x: %w", b.ptr, err)
			}
			return nil
		}
		take := func(i int) *liveBlock {
			b := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			return b
		}
		for i := 0; i < perRound; i++ {
			switch x := r.IntN(1000); {
			case x < 450 && len(live) < maxLive:
				st := own(w)
				if r.IntN(4) == 0 {
					st = shared[r.IntN(len(shared))]
				}
				b := &liveBlock{dev: r.IntN(devices), stream: st, size: soakSize(r), mark: byte(r.Uint32())}
				ptr, _, err := p.Alloc(b.dev, b.stream, b.size)
				if err != nil {
					return fmt.Errorf("alloc of %d bytes on device %d: %w", b.size, b.dev, err)
				}
				b.ptr = ptr
				b.write()
				live = append(live, b)
			case x < 850 && len(live) > 0:
				b := take(r.IntN(len(live)))
				st := b.stream
				if r.IntN(8) == 0 {
					st = anyStream(r) // the pool finds the block on its own stream
				}
				if err := free(b, st); err != nil {
					return err
				}
			case x < 950 && len(live) > 0:
				b := live[r.IntN(len(live))]
				at := b.ptr
				if r.IntN(4) == 0 {
					at += uintptr(r.Uint64N(b.size))
				}
				if err := p.RecordStream(at, anyStream(r)); err != nil {
					return fmt.Errorf("record_stream of %#x: %w", at, err)
				}
			case x < 975 && len(live) > 0:
				b := take(r.IntN(len(live)))
				handMu.Lock()
				handed = append(handed, b)
				handMu.Unlock()
			case x < 999:
				handMu.Lock()
				var b *liveBlock
				if n := len(handed); n > 0 {
					b = handed[n-1]
					handed = handed[:n-1]
				}
				handMu.Unlock()
				if b != nil {
					if err := free(b, b.stream); err != nil {
						return err
					}
				}
			default:
				if err := p.EmptyCache(); err != nil {
					return fmt.Errorf("empty_cache: %w", err)
				}
			}
		}
		return nil
	}

	start := time.Now()
	for round := 0; round < rounds; round++ {
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[w] = work(w)
			}()
		}
		wg.Wait()
		for w, err := range errs {
			require.NoError(t, err, "round %d, goroutine %d", round, w)
		}
		require.NoError(t, p.CheckInvariants(), "after round %d", round)
		held := make([]int64, devices)
		for _, live := range append(lives, handed) {
			for _, b := range live {
				held[b.dev]++
			}
		}
		for dev := 0; dev < devices; dev++ {
			require.Equal(t, held[dev], poolStat(t, p, dev, "allocation.all.current"), "round %d, device %d", round, dev)
		}
	}
	elapsed := time.Since(start)
	for _, live := range append(lives, handed) {
		for _, b := range live {
			require.True(t, b.intact(), "block %#x was overwritten while held", b.ptr)
			require.NoError(t, p.Free(b.dev, b.stream, b.ptr, b.size))
		}
	}
	var segs, retries int64
	for dev := 0; dev < devices; dev++ {
		segs += poolStat(t, p, dev, "num_device_alloc")
		retries += poolStat(t, p, dev, "num_alloc_retries")
	}
	require.Zero(t, retries, "the backend never ran out of memory")
	requireEmpty(t, p, h, devices, fds, maps)
	t.Logf("%d operations from %d goroutines in %v (%.0f ns/op), %d backend segments",
		rounds*workers*perRound, workers, elapsed.Round(time.Millisecond), float64(elapsed.Nanoseconds())/float64(rounds*workers*perRound), segs)
}

// soakSize: mostly small-pool requests, some large, rarely one of 20-70 MiB.
func soakSize(r *rand.Rand) uint64 {
	switch x := r.IntN(1000); {
	case x < 750:
		return 1 + r.Uint64N(1<<20)
	case x < 995:
		return 1<<20 + r.Uint64N(12<<20)
	default:
		return 20<<20 + r.Uint64N(50<<20)
	}
}
