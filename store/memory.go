package store

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
)

// Memory is a Store held in this process's memory.
//
// Waiting is per key: a Get that finds its key missing waits on the key's
// waiter, whose channel the next Set or Add of that key closes (removing the
// waiter). Close closes done, which wakes every waiter at once. A waiter
// counts its Gets, and the last one to give up removes it, so keys that are
// waited for and never set leave nothing behind.
type Memory struct {
	mu      sync.Mutex
	data    map[string][]byte
	waiters map[string]*waiter
	closed  bool
	done    chan struct{} // closed by Close
}

type waiter struct {
	ch chan struct{} // closed when the key is set
	n  int           // Gets waiting on ch
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-process store.
func NewMemory() *Memory {
	return &Memory{
		data:    map[string][]byte{},
		waiters: map[string]*waiter{},
		done:    make(chan struct{}),
	}
}

// errCanceled ends a get whose cancel channel closed (the server's
// connection for it went away); it never reaches a caller of Store.
var errCanceled = errors.New("store: get canceled")

// Set stores a copy of value under key and wakes the key's waiters.
func (m *Memory) Set(key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("store: set: %w", err)
	}
	if err := checkValue(key, value); err != nil {
		return fmt.Errorf("store: set: %w", err)
	}
	v := append(make([]byte, 0, len(value)), value...)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("%w: set %q", ErrClosed, key)
	}
	m.setLocked(key, v)
	return nil
}

func (m *Memory) setLocked(key string, v []byte) {
	m.data[key] = v
	if w, ok := m.waiters[key]; ok {
		close(w.ch)
		delete(m.waiters, key)
	}
}

// Get returns a copy of key's value, waiting at most timeout for it.
func (m *Memory) Get(key string, timeout time.Duration) ([]byte, error) {
	return m.get(key, timeout, nil)
}

// get is Get that also gives up, with errCanceled, when cancel closes.
//
// Every wake-up re-reads the state under the lock, in a fixed order: closed,
// then the value, then cancel, then the deadline. So a Get woken by Close
// reports ErrClosed even if its cancel channel closed too, and a value set
// just as the timer fired is still returned.
func (m *Memory) get(key string, timeout time.Duration, cancel <-chan struct{}) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("store: get: %w", err)
	}
	var timer *time.Timer
	var w *waiter // registered while we wait
	expired, canceled := timeout <= 0, false
	for {
		m.mu.Lock()
		if w != nil {
			if w.n--; w.n == 0 && m.waiters[key] == w {
				delete(m.waiters, key)
			}
			w = nil
		}
		if m.closed {
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: get %q", ErrClosed, key)
		}
		if v, ok := m.data[key]; ok {
			v = append(make([]byte, 0, len(v)), v...)
			m.mu.Unlock()
			return v, nil
		}
		if canceled {
			m.mu.Unlock()
			return nil, errCanceled
		}
		if expired {
			m.mu.Unlock()
			if timeout <= 0 {
				return nil, fmt.Errorf("%w: key %q is not set (did not wait)", ErrTimeout, key)
			}
			return nil, fmt.Errorf("%w: key %q not set after waiting %v", ErrTimeout, key, timeout)
		}
		w = m.waiters[key]
		if w == nil {
			w = &waiter{ch: make(chan struct{})}
			m.waiters[key] = w
		}
		w.n++
		m.mu.Unlock()

		if timer == nil {
			timer = time.NewTimer(timeout)
			defer timer.Stop()
		}
		select {
		case <-w.ch:
		case <-m.done:
		case <-cancel:
			canceled = true
		case <-timer.C:
			expired = true
		}
	}
}

// Add adds delta to the decimal integer at key (missing = 0) and returns the sum.
func (m *Memory) Add(key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, fmt.Errorf("store: add: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, fmt.Errorf("%w: add %d to %q", ErrClosed, delta, key)
	}
	var cur int64
	if v, ok := m.data[key]; ok {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("store: add %d to %q: its value %.40q is not a decimal int64", delta, key, v)
		}
		cur = n
	}
	if delta > 0 && cur > math.MaxInt64-delta || delta < 0 && cur < math.MinInt64-delta {
		return 0, fmt.Errorf("store: add %d to %q: %d + %d overflows int64", delta, key, cur, delta)
	}
	cur += delta
	m.setLocked(key, strconv.AppendInt(nil, cur, 10))
	return cur, nil
}

// Delete removes key; a missing key is not an error.
func (m *Memory) Delete(key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("store: delete: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("%w: delete %q", ErrClosed, key)
	}
	delete(m.data, key)
	return nil
}

// Close drops the data and wakes every waiting Get with ErrClosed. It is
// idempotent.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		m.data = nil
		close(m.done)
	}
	return nil
}
