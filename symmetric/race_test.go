package symmetric

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// Free races put/wait/barrier and reads of the handle's arrays from several
// goroutines: a call either runs on live mappings or returns
// ErrUnknownPointer, never touches unmapped memory (on the host backend that
// would be a fatal fault, not a recoverable panic). SYMM_SOAK_SCALE
// multiplies the cycles (default: ~10^5 calls).
func TestFreeRacesSignals(t *testing.T) {
	cycles := 400
	if s, err := strconv.Atoi(os.Getenv("SYMM_SOAK_SCALE")); err == nil && s > 0 {
		cycles *= s
	}
	if testing.Short() {
		cycles = 50
	}
	testHookAcquired = func() { time.Sleep(time.Microsecond) } // let a racing free try to get in
	defer func() { testHookAcquired = nil }()
	m := NewManager(NewHostProvider(), Config{Timeout: 5 * time.Second})
	st := store.NewMemory()
	defer st.Close()
	const workers = 6
	calls, refused := 0, 0
	var mu sync.Mutex
	for c := 0; c < cycles; c++ {
		b, err := m.Alloc(0, 4096)
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
						if err = h.PutSignal(0, w+1, 0, 0); err == nil {
							err = h.WaitSignal(0, w+1, 0, 0)
						}
					case 1:
						err = h.Barrier(0, 0, 0)
					default: // what symm_handle_info hands to C: the host arrays
						var release func()
						if release, err = h.Acquire(); err == nil {
							arr := h.BufferPtrsHost() // memory outside Go's heap, as C sees it
							buf := uintptr(*(*uint64)(*(*unsafe.Pointer)(unsafe.Pointer(&arr))))
							_ = *(*uint32)(*(*unsafe.Pointer)(unsafe.Pointer(&buf))) // the buffer itself
							release()
						}
					}
					n++
					if err != nil {
						if !errors.Is(err, ErrUnknownPointer) {
							t.Errorf("call %d: %v", i, err)
						}
						r++
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
		require.ErrorIs(t, h.Barrier(0, 0, 0), ErrUnknownPointer, "a call after free is refused")
	}
	t.Logf("%d calls raced %d frees; %d refused after their block was freed", calls, cycles, refused)
	require.Greater(t, refused, 0, "some calls must have lost the race")
	require.Less(t, refused, calls, "some calls must have won it")
}
