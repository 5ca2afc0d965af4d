package store

import (
	"fmt"
	"strconv"
	"time"
)

// GatherError is an AllGather whose entry for Rank did not come (or could
// not be read); Err says why.
type GatherError struct {
	Rank int
	Err  error
}

func (e *GatherError) Error() string { return fmt.Sprintf("entry of rank %d: %v", e.Rank, e.Err) }
func (e *GatherError) Unwrap() error { return e.Err }

// batcher is a Store that sends a Set and the Gets that follow it as one
// batch, so that an all-gather costs one round trip instead of world + 1.
type batcher interface {
	// setGet stores value under key, then gets every key of keys, each
	// waiting until the common deadline now+timeout. errs[i] is keys[i]'s
	// error; err is the Set's, or the batch's as a whole.
	setGet(key string, value []byte, keys []string, timeout time.Duration) (vals [][]byte, errs []error, err error)
}

// AllGather publishes value as rank's entry under prefix (key prefix+rank)
// and returns the entries of ranks 0..world-1, waiting at most timeout in
// all. An entry missing at the deadline is a *GatherError naming the lowest
// such rank (wrapping ErrTimeout). On a Client it is one round trip.
func AllGather(s Store, prefix string, rank, world int, value []byte, timeout time.Duration) ([][]byte, error) {
	if world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("store: all-gather under %q: rank %d outside [0, %d)", prefix, rank, world)
	}
	keys := make([]string, world)
	for j := range keys {
		keys[j] = prefix + strconv.Itoa(j)
	}
	vals, errs, err := setGet(s, keys[rank], value, keys, timeout)
	if err != nil {
		return nil, err
	}
	for j, e := range errs {
		if e != nil {
			return nil, &GatherError{Rank: j, Err: e}
		}
	}
	return vals, nil
}

// setGet sends one all-gather's requests through s: a Set of key, then a
// Get of each of keys under one deadline. A store that batches (through
// Prefix's views too) sends them as one batch; any other gets them one at a
// time, and the Gets stop at the first that fails (errs holds its error;
// the later keys are not asked).
func setGet(s Store, key string, value []byte, keys []string, timeout time.Duration) (vals [][]byte, errs []error, err error) {
	if p, ok := s.(*prefixed); ok { // batch through the view
		full := make([]string, len(keys))
		for j, k := range keys {
			full[j] = p.prefix + k
		}
		s, key, keys = p.s, p.prefix+key, full
	}
	if b, ok := s.(batcher); ok {
		return b.setGet(key, value, keys, timeout)
	}
	if err := s.Set(key, value); err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(timeout)
	vals, errs = make([][]byte, len(keys)), make([]error, len(keys))
	for j, k := range keys {
		if vals[j], errs[j] = s.Get(k, max(time.Until(deadline), time.Nanosecond)); errs[j] != nil {
			break
		}
	}
	return vals, errs, nil
}

// batches reports whether setGet sends s's requests as one batch.
func batches(s Store) bool {
	if p, ok := s.(*prefixed); ok {
		s = p.s
	}
	_, ok := s.(batcher)
	return ok
}
