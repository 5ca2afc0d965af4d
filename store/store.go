package store

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Store is what rendezvous needs. Implementations are safe for concurrent use.
type Store interface {
	// Set stores value under key, replacing any earlier value, and wakes waiters.
	Set(key string, value []byte) error
	// Get returns key's value, waiting until it is set or timeout passes (timeout <= 0: do not wait).
	// On timeout the error wraps ErrTimeout and names the key and the time waited.
	Get(key string, timeout time.Duration) ([]byte, error)
	// Add adds delta to the integer stored at key (missing = 0; stored as decimal ASCII, like c10d's TCPStore) and returns the new value.
	Add(key string, delta int64) (int64, error)
	// Delete removes key (no error if absent).
	Delete(key string) error
	Close() error
}

// ErrTimeout is wrapped by the error of a Get whose key did not come in time,
// and of a Client call whose server did not answer in time.
var ErrTimeout = errors.New("store: timeout")

// ErrClosed is wrapped by the error of every call on a closed store, of a
// Get that was waiting when its store closed, and of a Client call whose
// connection to the server is gone.
var ErrClosed = errors.New("store: closed")

// Limits of the contract (see doc.go); the wire format is sized from them.
const (
	maxKeyLen   = 4 << 10
	maxValueLen = 64 << 20
)

// checkKey enforces the key rules every Store shares, so that a program
// tested against Memory does not fail later against a Server.
func checkKey(key string) error {
	if len(key) > maxKeyLen {
		return fmt.Errorf("key of %d bytes (starting %q) exceeds the %d-byte limit", len(key), key[:32], maxKeyLen)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("key %q is not valid UTF-8", key)
	}
	return nil
}

func checkValue(key string, value []byte) error {
	if len(value) > maxValueLen {
		return fmt.Errorf("value of %d bytes for key %q exceeds the %d-byte limit", len(value), key, maxValueLen)
	}
	return nil
}

// Prefix returns a Store that prepends prefix to every key of s (groups use it to keep keys apart).
// Errors name the full key. Closing the returned Store does nothing to s: s
// belongs to whoever made it, and other groups may still be using it.
func Prefix(s Store, prefix string) Store {
	if p, ok := s.(*prefixed); ok {
		return &prefixed{s: p.s, prefix: p.prefix + prefix}
	}
	return &prefixed{s: s, prefix: prefix}
}

type prefixed struct {
	s      Store
	prefix string
}

func (p *prefixed) Set(key string, value []byte) error { return p.s.Set(p.prefix+key, value) }
func (p *prefixed) Get(key string, timeout time.Duration) ([]byte, error) {
	return p.s.Get(p.prefix+key, timeout)
}
func (p *prefixed) Add(key string, delta int64) (int64, error) { return p.s.Add(p.prefix+key, delta) }
func (p *prefixed) Delete(key string) error                    { return p.s.Delete(p.prefix + key) }
func (p *prefixed) Close() error                               { return nil }
