package store

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// backend opens a fresh store; another opens one more handle on the same
// data (for Memory the same value, for TCP a second client).
type backend struct {
	name string
	open func(t *testing.T) (s Store, another func() Store)
}

func backends() []backend {
	return []backend{
		{"memory", func(t *testing.T) (Store, func() Store) {
			m := NewMemory()
			t.Cleanup(func() { m.Close() })
			return m, func() Store { return m }
		}},
		{"tcp", func(t *testing.T) (Store, func() Store) {
			srv := newServer(t, "")
			dial := func() Store { return dial(t, srv.Addr(), "") }
			return dial(), dial
		}},
		{"tcp-token-prefix", func(t *testing.T) (Store, func() Store) {
			srv := newServer(t, "s3cret")
			dial := func() Store {
				c := dial(t, srv.Addr(), "s3cret")
				return ownedView{Prefix(c, "p/"), c}
			}
			return dial(), dial
		}},
	}
}

// ownedView is a Prefix view whose Close closes the client under it.
type ownedView struct {
	Store
	c *Client
}

func (v ownedView) Close() error { return v.c.Close() }

func newServer(t *testing.T, token string) *Server {
	t.Helper()
	srv, err := NewServer("", token)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	return srv
}

func dial(t *testing.T, addr, token string) *Client {
	t.Helper()
	c, err := Dial(addr, token, 2*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// noLeaks fails t if goroutines outlive it. Call it first: cleanups run last
// registered first, so this check runs after every other cleanup.
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		// Not require.Eventually: it counts its own goroutines.
		for end := time.Now().Add(2 * time.Second); runtime.NumGoroutine() > before && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		require.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines outlived the test")
	})
}

// TestConformance runs the contract of doc.go against every implementation.
func TestConformance(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Run("SetGetOverwrite", func(t *testing.T) { testSetGet(t, b) })
			t.Run("GetWaitsForSet", func(t *testing.T) { testGetWaits(t, b) })
			t.Run("GetTimeout", func(t *testing.T) { testGetTimeout(t, b) })
			t.Run("AddConcurrent", func(t *testing.T) { testAdd(t, b) })
			t.Run("Delete", func(t *testing.T) { testDelete(t, b) })
			t.Run("Keys", func(t *testing.T) { testKeys(t, b) })
			t.Run("PrefixIsolation", func(t *testing.T) { testPrefix(t, b) })
			t.Run("CloseWakesWaiters", func(t *testing.T) { testCloseWakes(t, b) })
		})
	}
}

func testSetGet(t *testing.T, b backend) {
	noLeaks(t)
	s, another := b.open(t)
	other := another()
	for _, tc := range []struct {
		name  string
		value []byte
	}{
		{"empty", []byte{}},
		{"text", []byte("hello")},
		{"binary", []byte{0, 1, 0xff, 0, '\n'}},
		{"overwrite shorter", []byte("hi")},
		{"large", []byte(strings.Repeat("x", 1<<20))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, s.Set("k", tc.value))
			got, err := other.Get("k", 0)
			require.NoError(t, err)
			require.Equal(t, tc.value, got)
		})
	}

	// Values are copied in and out.
	v := []byte("abc")
	require.NoError(t, s.Set("copy", v))
	v[0] = 'X'
	got, err := s.Get("copy", 0)
	require.NoError(t, err)
	require.Equal(t, "abc", string(got))
	got[0] = 'Y'
	got, err = s.Get("copy", 0)
	require.NoError(t, err)
	require.Equal(t, "abc", string(got))
}

func testGetWaits(t *testing.T, b backend) {
	noLeaks(t)
	s, another := b.open(t)
	for _, tc := range []struct {
		name   string
		setter Store
	}{
		{"same handle", s}, // a waiting Get must not hold up a Set on its own client
		{"other handle", another()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "late/" + tc.name
			go func() {
				time.Sleep(50 * time.Millisecond)
				tc.setter.Set(key, []byte("v"))
			}()
			start := time.Now()
			got, err := s.Get(key, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, "v", string(got))
			require.GreaterOrEqual(t, time.Since(start), 40*time.Millisecond)
		})
	}

	// Many waiters on one key all wake.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Get("crowd", 5*time.Second)
		}()
	}
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, s.Set("crowd", []byte("go")))
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

func testGetTimeout(t *testing.T, b backend) {
	noLeaks(t)
	s, _ := b.open(t)
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		min     time.Duration
		want    string
	}{
		{"zero does not wait", 0, 0, "did not wait"},
		{"negative does not wait", -time.Second, 0, "did not wait"},
		{"waits then gives up", 100 * time.Millisecond, 100 * time.Millisecond, "100ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := s.Get("no/such/key", tc.timeout)
			took := time.Since(start)
			require.ErrorIs(t, err, ErrTimeout)
			require.Contains(t, err.Error(), `no/such/key"`)
			require.Contains(t, err.Error(), tc.want)
			require.GreaterOrEqual(t, took, tc.min)
			require.Less(t, took, tc.min+2*time.Second)
		})
	}
}

func testAdd(t *testing.T, b backend) {
	noLeaks(t)
	s, another := b.open(t)
	const workers, each = 16, 50
	handles := []Store{s, another()}
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := handles[w%len(handles)]
			for i := 0; i < each && errs[w] == nil; i++ {
				_, errs[w] = h.Add("counter", 1)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	got, err := s.Get("counter", 0)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(workers*each), string(got), "stored as decimal ASCII")

	n, err := s.Add("counter", -workers*each-5)
	require.NoError(t, err)
	require.EqualValues(t, -5, n)

	// A value that is not an integer is refused and kept.
	require.NoError(t, s.Set("text", []byte("twelve")))
	_, err = s.Add("text", 1)
	require.ErrorContains(t, err, "not a decimal")
	got, err = s.Get("text", 0)
	require.NoError(t, err)
	require.Equal(t, "twelve", string(got))

	// Overflow is refused.
	require.NoError(t, s.Set("big", []byte("9223372036854775807")))
	_, err = s.Add("big", 1)
	require.ErrorContains(t, err, "overflows")

	// Add wakes a waiting Get like Set.
	go func() {
		time.Sleep(20 * time.Millisecond)
		s.Add("woken", 7)
	}()
	got, err = s.Get("woken", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "7", string(got))
}

func testDelete(t *testing.T, b backend) {
	noLeaks(t)
	s, _ := b.open(t)
	require.NoError(t, s.Set("k", []byte("v")))
	require.NoError(t, s.Delete("k"))
	_, err := s.Get("k", 0)
	require.ErrorIs(t, err, ErrTimeout)
	require.NoError(t, s.Delete("k"), "deleting a missing key is not an error")
	n, err := s.Add("k", 3)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "a deleted key counts as 0")
}

func testKeys(t *testing.T, b backend) {
	noLeaks(t)
	s, _ := b.open(t)
	// Prefix "p/" (one backend) takes 2 bytes of the limit.
	long := strings.Repeat("k", maxKeyLen-2)
	for _, tc := range []struct {
		name, key string
		err       string
	}{
		{"empty", "", ""},
		{"utf8", "rang/秩/ü", ""},
		{"at the limit", long, ""},
		{"over the limit", long + "xyz", "exceeds"},
		{"invalid utf8", "bad\xff", "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Set(tc.key, []byte("v"))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				_, err = s.Get(tc.key, 0)
				require.ErrorContains(t, err, tc.err)
				_, err = s.Add(tc.key, 1)
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, s.Delete(tc.key), tc.err)
				return
			}
			require.NoError(t, err)
			got, err := s.Get(tc.key, 0)
			require.NoError(t, err)
			require.Equal(t, "v", string(got))
		})
	}
}

func testPrefix(t *testing.T, b backend) {
	noLeaks(t)
	s, _ := b.open(t)
	g1, g2 := Prefix(s, "g1/"), Prefix(s, "g2/")
	require.NoError(t, g1.Set("rank0", []byte("one")))
	_, err := g2.Get("rank0", 0)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorContains(t, err, "g2/rank0", "errors name the full key")

	got, err := s.Get("g1/rank0", 0)
	require.NoError(t, err)
	require.Equal(t, "one", string(got))

	nested := Prefix(g1, "sub/")
	require.NoError(t, nested.Set("x", []byte("2")))
	got, err = s.Get("g1/sub/x", 0)
	require.NoError(t, err)
	require.Equal(t, "2", string(got))

	n, err := g2.Add("n", 5)
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	require.NoError(t, g2.Delete("n"))
	_, err = s.Get("g2/n", 0)
	require.ErrorIs(t, err, ErrTimeout)

	// A view does not own the store.
	require.NoError(t, g1.Close())
	require.NoError(t, s.Set("still", []byte("open")))
}

func testCloseWakes(t *testing.T, b backend) {
	noLeaks(t)
	s, _ := b.open(t)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Get("never", 30*time.Second)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, s.Close())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(2 * time.Second):
		t.Fatal("a waiting Get was not woken by Close")
	}
	require.Less(t, time.Since(start), 2*time.Second)
	require.ErrorIs(t, s.Set("k", nil), ErrClosed)
	_, err := s.Get("k", time.Second)
	require.ErrorIs(t, err, ErrClosed)
	_, err = s.Add("k", 1)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, s.Delete("k"), ErrClosed)
	require.NoError(t, s.Close(), "Close is idempotent")
}

// TestMemoryWaitersDoNotAccumulate: Gets that time out on keys never set
// leave nothing behind.
func TestMemoryWaitersDoNotAccumulate(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Get(fmt.Sprint("k", i%3), 10*time.Millisecond)
		}()
	}
	wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	require.Empty(t, m.waiters)
}
