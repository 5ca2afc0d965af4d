package allocator_test

// The pool over the real host backend (memfd + mmap) with fault injection:
// backend allocations fail at random, at any of their steps, and the pool
// must neither lose nor keep anything. External test package: host imports
// allocator.

import (
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/internal/mem"
)

// memfdMaps counts this process's mappings of the host backend's memfds.
func memfdMaps(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Count(string(b), "memfd:symm-pool")
}

func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func poolStat(t testing.TB, p *allocator.Pool, dev int, name string) int64 {
	t.Helper()
	m, err := p.StatsMap(dev)
	require.NoError(t, err)
	v, ok := m[name]
	require.True(t, ok, "no statistic %q", name)
	return v
}

// liveBlock is a block the test holds, with the bytes it wrote at both ends
// of the request (checked at free: no two owners share memory).
type liveBlock struct {
	dev    int
	stream uintptr
	ptr    uintptr
	size   uint64
	mark   byte
}

func (b *liveBlock) write() {
	mem.Bytes(b.ptr+uintptr(b.size)-1, 1)[0] = ^b.mark
	mem.Bytes(b.ptr, 1)[0] = b.mark // a 1-byte block holds only this
}

func (b *liveBlock) intact() bool {
	return mem.Bytes(b.ptr, 1)[0] == b.mark && (b.size == 1 || mem.Bytes(b.ptr+uintptr(b.size)-1, 1)[0] == ^b.mark)
}

// randomSize: mostly small-pool requests, some large, a few that take a big
// share of a device (so that out-of-memory and its retry happen).
func randomSize(r *rand.Rand) uint64 {
	switch x := r.IntN(100); {
	case x < 70:
		return 1 + r.Uint64N(1<<20)
	case x < 97:
		return 1<<20 + r.Uint64N(12<<20)
	default:
		return 20<<20 + r.Uint64N(100<<20)
	}
}

// requireEmpty: with every block freed and the cache emptied, the pool
// reserves nothing and the backend holds no segment, mapping or descriptor.
func requireEmpty(t *testing.T, p *allocator.Pool, h *host.Backend, devices, fds, maps int) {
	t.Helper()
	err := p.EmptyCache()
	for try := 0; err != nil && errors.Is(err, host.ErrInjectedFault) && try < 100; try++ {
		err = p.EmptyCache() // event faults: a pending block's event is made on a later try
	}
	require.NoError(t, err)
	require.NoError(t, p.CheckInvariants())
	for dev := 0; dev < devices; dev++ {
		require.Zero(t, poolStat(t, p, dev, "reserved_bytes.all.current"), "device %d", dev)
		require.Zero(t, poolStat(t, p, dev, "segment.all.current"), "device %d", dev)
		require.Zero(t, poolStat(t, p, dev, "active.all.current"), "device %d", dev)
		free, total, err := h.MemInfo(dev)
		require.NoError(t, err)
		require.Equal(t, total, free, "device %d: the backend counts bytes in use", dev)
	}
	for dev := 0; dev < devices; dev++ {
		mapped, spare := h.Chunks(dev)
		require.Zero(t, mapped, "device %d: mapped chunk bytes", dev)
		require.Zero(t, spare, "device %d: spare chunk bytes", dev)
	}
	require.Zero(t, h.Segments(), "live backend segments")
	require.Zero(t, h.Ranges(), "reserved ranges of expandable segments")
	require.Equal(t, maps, memfdMaps(t), "memfd mappings")
	require.Equal(t, fds, openFDs(t), "open descriptors")
}

// faultyRun drives a pool over a host backend whose operations in ops fail
// with probability rate: n random operations (alloc, free on its stream or
// another, record_stream of the start or an interior address, empty_cache)
// over 2 devices and 4 streams, from one goroutine, all decided by seed.
// Every failure must be an injected fault or an out-of-memory after the
// pool's retry; the invariants hold every 64 operations and after every
// failure; at the end nothing is left.
func faultyRun(t *testing.T, rate float64, seed uint64, ops host.FaultOps, n int, cfg allocator.Config) (injected, ooms int) {
	const devices = 2
	streams := []uintptr{0, 0x1000, 0x2000, 0x3000}
	fds, maps := openFDs(t), memfdMaps(t)
	h, err := host.New(devices, 1<<30)
	require.NoError(t, err)
	require.NoError(t, h.WithFaults(rate, seed, ops))
	p, err := allocator.New(h, cfg)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(seed, 99))
	var live []*liveBlock
	free := func(i int, anyStream bool) {
		b := live[i]
		require.True(t, b.intact(), "block %#x (%d bytes) was overwritten while held", b.ptr, b.size)
		st := b.stream
		if anyStream {
			st = streams[r.IntN(len(streams))] // the pool finds it on its own stream
		}
		require.NoError(t, p.Free(b.dev, st, b.ptr, b.size))
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	}
	for i := 0; i < n; i++ {
		failed := false
		switch x := r.IntN(1000); {
		case x < 480 && len(live) < 200: // alloc
			b := &liveBlock{dev: r.IntN(devices), stream: streams[r.IntN(len(streams))], size: randomSize(r), mark: byte(r.Uint32())}
			retries := poolStat(t, p, b.dev, "num_alloc_retries")
			ptr, _, err := p.Alloc(b.dev, b.stream, b.size)
			if err != nil {
				failed = true
				switch {
				case allocator.IsOutOfMemory(err):
					ooms++
					require.ErrorIs(t, err, allocator.ErrOutOfMemory, "the pool's error, after its retry")
					require.Greater(t, poolStat(t, p, b.dev, "num_alloc_retries"), retries, "out of memory only after the retry")
					require.Contains(t, err.Error(), "out of memory")
				default:
					injected++
					require.ErrorIs(t, err, host.ErrInjectedFault)
					require.Contains(t, err.Error(), "host: injected fault (SYMM_HOST_FAULTS)")
				}
				break
			}
			b.ptr = ptr
			b.write()
			live = append(live, b)
		case x < 900 && len(live) > 0: // free
			free(r.IntN(len(live)), r.IntN(5) == 0)
		case x < 970 && len(live) > 0: // record_stream on another stream
			b := live[r.IntN(len(live))]
			at := b.ptr
			if r.IntN(4) == 0 {
				at += uintptr(r.Uint64N(b.size))
			}
			require.NoError(t, p.RecordStream(at, streams[r.IntN(len(streams))]))
		case x >= 970: // empty_cache: later allocations go to the backend again
			if err := p.EmptyCache(); err != nil && ops&(host.FaultEvents|host.FaultUnmap) != 0 {
				// A pending block's event, made late; or an unmap that
				// failed partway, booked as it went (the invariants below).
				require.ErrorIs(t, err, host.ErrInjectedFault)
				failed = true
			} else {
				require.NoError(t, err)
			}
		}
		if failed || i%64 == 0 {
			require.NoError(t, p.CheckInvariants(), "after operation %d", i)
		}
	}
	for len(live) > 0 {
		free(len(live)-1, false)
	}
	t.Logf("rate %g: %d operations, %d backend allocations, %d injected faults, %d out-of-memory errors, %d spare chunks reused",
		rate, n, poolStat(t, p, 0, "num_device_alloc")+poolStat(t, p, 1, "num_device_alloc"), injected, ooms,
		poolStat(t, p, 0, "num_spare_chunks_reused")+poolStat(t, p, 1, "num_spare_chunks_reused"))
	if cfg.UnmapFreePages {
		require.Positive(t, poolStat(t, p, 0, "num_spare_chunks_reused")+poolStat(t, p, 1, "num_spare_chunks_reused"),
			"free pages moved to new mappings as spare chunks")
	}
	if ops == host.FaultAlloc {
		require.EqualValues(t, injected, h.Faults().Injected(), "every injected fault reached the caller")
	}
	if ops&host.FaultUnmap != 0 {
		fails := poolStat(t, p, 0, "num_release_failures") + poolStat(t, p, 1, "num_release_failures")
		t.Logf("%d failed unmaps and releases carried on past", fails)
		require.Positive(t, fails, "unmaps failed")
	}
	requireEmpty(t, p, h, devices, fds, maps)
	return injected, ooms
}

// 10^5 operations at a 10% fault rate on every backend allocation step.
func TestPoolOverFaultyHostBackend(t *testing.T) {
	n := int(1e5 * soakScale(t))
	injected, ooms := faultyRun(t, 0.1, 1, host.FaultAlloc, n, allocator.Config{})
	require.Greater(t, injected, 0, "faults were injected")
	if n >= 1e5 {
		require.Greater(t, injected, 200)
		require.Greater(t, ooms, 0, "the out-of-memory retry ran")
	}
}

// The ends of the rate range, with other seeds, shorter; at 0.2 with an
// oversize pool (blocks of 32 MiB and more are never split).
func TestPoolOverFaultyHostBackendRates(t *testing.T) {
	for _, c := range []struct {
		rate float64
		cfg  allocator.Config
	}{{0.05, allocator.Config{}}, {0.2, allocator.Config{MaxSplit: 32 << 20}}} {
		injected, _ := faultyRun(t, c.rate, uint64(c.rate*100), host.FaultAlloc, int(2e4*soakScale(t)), c.cfg)
		require.Greater(t, injected, 0)
	}
}

// Expandable segments over the real host backend (address space reserved,
// chunks mapped with MAP_FIXED) with chunk maps failing at random, before or
// after the mapping is made: every failure is clear, blocks keep their bytes
// through their segment's growth, and nothing is left at the end.
func TestExpandablePoolOverFaultyHostBackend(t *testing.T) {
	injected, ooms := faultyRun(t, 0.1, 7, host.FaultAlloc, int(3e4*soakScale(t)), allocator.Config{Expandable: true})
	require.Greater(t, injected, 0)
	require.Greater(t, ooms, 0, "the out-of-memory retry ran")
}

// The same with free pages unmapped whenever the pool maps memory and kept
// as spare chunks for that mapping (Config.UnmapFreePages over the host
// backend's ChunkKeeper): a mapping of spare chunks fails at random too,
// CheckInvariants compares the backend's mapped and spare chunks with the
// pool's after every failure, and at the end nothing is mapped or spare.
func TestFreePagesPoolOverFaultyHostBackend(t *testing.T) {
	injected, _ := faultyRun(t, 0.1, 11, host.FaultAlloc, int(3e4*soakScale(t)),
		allocator.Config{Expandable: true, UnmapFreePages: true})
	require.Greater(t, injected, 0)
}

// Unmaps fail too, partway through their chunks (the CUDA backend unmaps
// chunk by chunk): at release, at the out-of-memory retry, and when free
// pages are moved to a new mapping. After each failure CheckInvariants
// proves, chunk by chunk, that the pool's books are what the backend has
// mapped (the host backend refuses a second map over a live chunk and an
// unmap of one not mapped), blocks keep their bytes, and at the end
// nothing is left.
func TestPoolOverHostBackendWithUnmapFaults(t *testing.T) {
	for _, c := range []struct {
		name string
		seed uint64
		cfg  allocator.Config
	}{
		{"expandable", 13, allocator.Config{Expandable: true}},
		{"free pages", 17, allocator.Config{Expandable: true, UnmapFreePages: true}},
		{"free pages, big chunks", 19, allocator.Config{Expandable: true, ExpandableChunk: 6 << 20, UnmapFreePages: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			injected, _ := faultyRun(t, 0.1, c.seed, host.FaultAlloc|host.FaultUnmap, int(2e4*soakScale(t)), c.cfg)
			require.Greater(t, injected, 0)
		})
	}
}

// soakScale is SYMM_SOAK_SCALE, the multiplier of the long tests' operation
// counts (default 1).
func soakScale(t testing.TB) float64 {
	v := os.Getenv("SYMM_SOAK_SCALE")
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) {
		t.Fatalf("SYMM_SOAK_SCALE=%q: want a positive number", v)
	}
	return f
}

// Event creation fails too. When a block used on other streams
// (record_stream) is freed, the pool records an event on each of them; if
// that fails, the pool parks the block and records the event later
// (processPending), so the segment is still released in the end.
func TestPoolOverFaultyHostBackendEvents(t *testing.T) {
	injected, _ := faultyRun(t, 0.1, 5, host.FaultAlloc|host.FaultEvents, int(2e4*soakScale(t)), allocator.Config{})
	require.Greater(t, injected, 0)
}
