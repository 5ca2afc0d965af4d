package symmetric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/store"
)

// Free races put/wait/barrier and reads of the handle's arrays from several
// goroutines: a call either runs on live mappings or returns
// ErrUnknownPointer, never touches unmapped memory (on the host backend that
// would be a fatal fault, not a recoverable panic; on a GPU an illegal
// address that poisons the context). SYMM_SOAK_SCALE multiplies the cycles
// (default: ~10^5 calls). The cuda subtest runs where SYMM_TEST_DEVICE=cuda
// (tests/device/run.sh sets it), on device 0, signals on the legacy default
// stream.
func TestFreeRacesSignals(t *testing.T) {
	t.Run("host", func(t *testing.T) { freeRacesSignals(t, NewHostProvider(), 0, "") })
	// On GPUs: signals as stream memory operations, then as kernels (whose
	// status word the watchdog reads after the call has returned).
	for _, signals := range []string{SignalsMemop, SignalsKernel} {
		t.Run("cuda-"+signals, func(t *testing.T) {
			if os.Getenv("SYMM_TEST_DEVICE") != "cuda" {
				t.Skip("needs a GPU: SYMM_TEST_DEVICE=cuda")
			}
			prov, err := NewCUDAProvider()
			require.NoError(t, err, "SYMM_TEST_DEVICE=cuda, yet no CUDA provider")
			freeRacesSignals(t, prov, 0, signals) // 0: the legacy default stream (CU_STREAM_LEGACY)
		})
	}
}

// freeRacesSignals is TestFreeRacesSignals over prov, one rank of a world of
// one on device 0, its signals queued on stream (ignored by the host
// provider, whose signals are atomics).
func freeRacesSignals(t *testing.T, prov Provider, stream uintptr, signals string) {
	const dev = 0
	cycles := 400
	if s, err := strconv.Atoi(os.Getenv("SYMM_SOAK_SCALE")); err == nil && s > 0 {
		cycles *= s
	}
	if testing.Short() {
		cycles = 50
	}
	m := NewManager(prov, Config{Timeout: 5 * time.Second, Signals: signals})
	st := store.NewMemory()
	defer st.Close()
	cp, onGPU := prov.(*cudaProvider)

	// One signal pair before the race: the provider can signal at all (on a
	// GPU: the driver has stream memory operations), and the baselines below
	// are taken after the driver's first-use descriptors and memory.
	b, err := m.Alloc(dev, 4096)
	require.NoError(t, err)
	h, err := m.Rendezvous(b.Ptr(), Group{Name: "race-probe", Rank: 0, World: 1, Store: st})
	require.NoError(t, err)
	require.NoError(t, h.PutSignal(0, 0, stream, 0))
	require.NoError(t, h.WaitSignal(0, 0, stream, 0))
	if onGPU {
		require.NoError(t, cuda.StreamSynchronize(dev, stream))
	}
	require.NoError(t, m.Free(b.Ptr()))
	waitWatchdogIdle(t, m)
	m.Close() // the probe group's link, not counted in the baseline
	fds, maps := openFDs(t), blockMaps(t)
	var devFree uint64
	if onGPU {
		devFree, _, err = cp.arrays.MemInfo(dev)
		require.NoError(t, err)
	}

	// touch reads what symm_handle_info hands to C: the host array of buffer
	// pointers and, through it, the buffer. On a GPU the buffer is device
	// memory the host cannot load from: it and the device copy of the array
	// are read with cuMemcpyDtoH, which fails (rather than faults) on an
	// unmapped address, and such a failure is reported as not
	// ErrUnknownPointer.
	touch := func(h *Handle) error {
		arr := h.BufferPtrsHost() // memory outside Go's heap, as C sees it
		buf := uintptr(*(*uint64)(*(*unsafe.Pointer)(unsafe.Pointer(&arr))))
		if !onGPU {
			_ = *(*uint32)(*(*unsafe.Pointer)(unsafe.Pointer(&buf))) // the buffer itself
			return nil
		}
		word := make([]byte, 8)
		if err := cuda.MemcpyDtoH(dev, word, h.BufferPtrsDev()); err != nil {
			return err
		}
		if got := uintptr(binary.LittleEndian.Uint64(word)); got != buf {
			t.Errorf("device array holds %#x, host array %#x", got, buf)
		}
		return cuda.MemcpyDtoH(dev, word[:4], buf)
	}

	testHookAcquired = func() { time.Sleep(time.Microsecond) } // let a racing free try to get in
	defer func() { testHookAcquired = nil }()
	const workers = 6
	calls, refused := 0, 0
	var won [4]int // calls that got in before the free, per kind of call (i % 4)
	firstRefusal := ""
	var mu sync.Mutex
	for c := 0; c < cycles; c++ {
		b, err := m.Alloc(dev, 4096)
		require.NoError(t, err)
		h, err := m.Rendezvous(b.Ptr(), Group{Name: "race", Rank: 0, World: 1, Store: st})
		require.NoError(t, err)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				<-start
				n, r := 0, 0
				for i := 0; i < 40; i++ {
					var err error
					switch i % 4 {
					case 0: // our own channel: the put and the wait pair up
						if err = h.PutSignal(0, w+1, stream, 0); err == nil {
							err = h.WaitSignal(0, w+1, stream, 0)
						}
					case 1: // a world of one: no peer to signal, only the checks
						err = h.Barrier(0, stream, 0)
					default:
						var release func()
						if release, err = h.Acquire(); err == nil {
							err = touch(h)
							release()
						}
					}
					n++
					if err == nil {
						mu.Lock()
						won[i%4]++
						mu.Unlock()
					}
					if err != nil {
						if !errors.Is(err, ErrUnknownPointer) {
							t.Errorf("call %d: %v", i, err)
						}
						r++
						mu.Lock()
						if firstRefusal == "" {
							firstRefusal = fmt.Sprintf("call %d (op %d): %v", i, i%4, err)
						}
						mu.Unlock()
					}
				}
				mu.Lock()
				calls += n
				refused += r
				mu.Unlock()
			}(w)
		}
		close(start)
		if c%2 == 0 {
			time.Sleep(time.Duration(c%7) * time.Microsecond)
		}
		require.NoError(t, m.Free(b.Ptr()))
		wg.Wait()
		require.ErrorIs(t, h.Barrier(0, stream, 0), ErrUnknownPointer, "a call after free is refused")
	}
	if onGPU {
		// Every queued put/wait has run (an illegal address would surface
		// here as the context's sticky error).
		require.NoError(t, cuda.StreamSynchronize(dev, stream))
	}
	waitWatchdogIdle(t, m)
	t.Logf("%s: %d calls raced %d frees; %d refused after their block was freed (the first: %s); won per kind (put+wait, barrier, touch, touch): %v",
		prov.Name(), calls, cycles, refused, firstRefusal, won)
	require.Greater(t, refused, 0, "some calls must have lost the race")
	require.Less(t, refused, calls, "some calls must have won it")

	// Nothing leaked: blocks, descriptors (memfds, exported block
	// descriptors, links), host mappings, device memory.
	require.Zero(t, m.Live())
	m.Close()
	requireFDs(t, fds)
	require.Equal(t, maps, blockMaps(t), "memfd mappings")
	if onGPU {
		free, _, err := cp.arrays.MemInfo(dev)
		require.NoError(t, err)
		// A leaked block is at least the 2 MiB granularity: 400 would show.
		const slack = 64 << 20
		require.GreaterOrEqual(t, free+slack, devFree, "device memory free before the race %d, after %d", devFree, free)
	}
}

// waitWatchdogIdle waits until the watchdog has retired every marker of m's
// signals (each passed, or failed its handle): none stays pending.
func waitWatchdogIdle(t *testing.T, m *Manager) {
	t.Helper()
	idle := func() bool {
		m.dog.mu.Lock()
		defer m.dog.mu.Unlock()
		return !m.dog.running && len(m.dog.pending) == 0
	}
	for end := time.Now().Add(10 * time.Second); !idle() && time.Now().Before(end); {
		time.Sleep(pollEvery)
	}
	require.True(t, idle(), "the watchdog still holds signal markers")
}
