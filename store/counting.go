package store

import (
	"sync/atomic"
	"time"
)

// Traffic is what one user sent through a Store and got back.
type Traffic struct {
	// Requests of each kind; an all-gather is one Set and world Gets.
	Sets, Gets, Adds, Deletes int64
	// RoundTrips counts the waits for the store: one per call, and one per
	// all-gather on a store that batches it (a Client), where a store that
	// does not (Memory) takes one per request.
	RoundTrips int64
	// BytesSent counts the keys and values sent (an Add's delta as 8
	// bytes), BytesReceived the values returned (an Add's sum as 8 bytes):
	// the payload, not the wire format's framing.
	BytesSent, BytesReceived int64
}

// Ops is the number of requests of every kind.
func (t Traffic) Ops() int64 { return t.Sets + t.Gets + t.Adds + t.Deletes }

// Sub is the traffic from u to t, u taken earlier.
func (t Traffic) Sub(u Traffic) Traffic {
	return Traffic{t.Sets - u.Sets, t.Gets - u.Gets, t.Adds - u.Adds, t.Deletes - u.Deletes,
		t.RoundTrips - u.RoundTrips, t.BytesSent - u.BytesSent, t.BytesReceived - u.BytesReceived}
}

// Counting is a Store that passes every call to the store it wraps and
// counts what goes through (Traffic), whether the call succeeds or not.
// AllGather through it batches exactly when it would through the wrapped
// store, so counting does not change what is sent. Closing it closes the
// wrapped store.
type Counting struct {
	s                         Store
	sets, gets, adds, deletes atomic.Int64
	trips, sent, received     atomic.Int64
}

var _ Store = (*Counting)(nil)

// Count returns a Counting over s, its counts at zero.
func Count(s Store) *Counting { return &Counting{s: s} }

// Traffic is what has gone through c so far.
func (c *Counting) Traffic() Traffic {
	return Traffic{c.sets.Load(), c.gets.Load(), c.adds.Load(), c.deletes.Load(),
		c.trips.Load(), c.sent.Load(), c.received.Load()}
}

func (c *Counting) Set(key string, value []byte) error {
	c.sets.Add(1)
	c.trips.Add(1)
	c.sent.Add(int64(len(key) + len(value)))
	return c.s.Set(key, value)
}

func (c *Counting) Get(key string, timeout time.Duration) ([]byte, error) {
	c.gets.Add(1)
	c.trips.Add(1)
	c.sent.Add(int64(len(key)))
	v, err := c.s.Get(key, timeout)
	c.received.Add(int64(len(v)))
	return v, err
}

func (c *Counting) Add(key string, delta int64) (int64, error) {
	c.adds.Add(1)
	c.trips.Add(1)
	c.sent.Add(int64(len(key) + 8))
	n, err := c.s.Add(key, delta)
	if err == nil {
		c.received.Add(8)
	}
	return n, err
}

func (c *Counting) Delete(key string) error {
	c.deletes.Add(1)
	c.trips.Add(1)
	c.sent.Add(int64(len(key)))
	return c.s.Delete(key)
}

func (c *Counting) Close() error { return c.s.Close() }

// setGet makes c a batcher: the all-gather goes to the wrapped store as
// AllGather would send it there, and is counted as it was sent.
func (c *Counting) setGet(key string, value []byte, keys []string, timeout time.Duration) ([][]byte, []error, error) {
	vals, errs, err := setGet(c.s, key, value, keys, timeout)
	gets := len(keys)
	batched := batches(c.s)
	if !batched { // one request at a time: the Gets stopped at the first failure, or never started
		gets = len(errs)
		for j, e := range errs {
			if e != nil {
				gets = j + 1
				break
			}
		}
	}
	sent := len(key) + len(value)
	for _, k := range keys[:gets] {
		sent += len(k)
	}
	received := 0
	for _, v := range vals {
		received += len(v)
	}
	c.sets.Add(1)
	c.gets.Add(int64(gets))
	c.sent.Add(int64(sent))
	c.received.Add(int64(received))
	if batched {
		c.trips.Add(1)
	} else {
		c.trips.Add(int64(1 + gets))
	}
	return vals, errs, err
}
