package host

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
)

// ErrInjectedFault is wrapped by every failure that fault injection makes on
// purpose; nothing else returns it.
var ErrInjectedFault = errors.New("host: injected fault (SYMM_HOST_FAULTS)")

// Faults decides, for each operation asked about, whether it fails: with
// probability rate, from a generator seeded with seed, so the n-th decision
// of a run is the same in every run (which operation gets it depends on the
// callers' order, fixed in one goroutine). A nil *Faults never fails. It is
// safe for concurrent use. It is shared by the pool backend (Backend) and by
// the symmetric package's host provider.
type Faults struct {
	rate     float64
	mu       sync.Mutex
	rng      *rand.Rand
	injected atomic.Int64
}

// NewFaults returns a fault source failing with probability rate (0 ≤ rate ≤ 1).
func NewFaults(rate float64, seed uint64) (*Faults, error) {
	if !(rate >= 0 && rate <= 1) { // NaN too
		return nil, fmt.Errorf("%w: fault rate %v is outside [0, 1]", allocator.ErrInvalid, rate)
	}
	return &Faults{rate: rate, rng: rand.New(rand.NewPCG(seed, 0x5eed_f417))}, nil
}

// ParseFaults reads SYMM_HOST_FAULTS's value: "<rate>" or "<rate>:<seed>",
// rate a number in [0, 1], seed an unsigned integer (default 0). The error
// names the variable and wraps allocator.ErrInvalid.
func ParseFaults(v string) (rate float64, seed uint64, err error) {
	bad := func() (float64, uint64, error) {
		return 0, 0, fmt.Errorf("%w: %w", allocator.ErrInvalid, settings.HostFaults.Refuse(v))
	}
	r, s, hasSeed := strings.Cut(strings.TrimSpace(v), ":")
	rate, err = strconv.ParseFloat(r, 64)
	if err != nil || math.IsNaN(rate) || rate < 0 || rate > 1 {
		return bad()
	}
	if hasSeed {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			return bad()
		}
	}
	return rate, seed, nil
}

// Fail returns an error wrapping ErrInjectedFault, naming op, with
// probability rate; else nil.
func (f *Faults) Fail(op string) error {
	if f.Pick(1) < 0 {
		return nil
	}
	return f.Err(op)
}

// Pick decides one operation of n steps: -1 (with probability 1 - rate) when
// it succeeds, else the step, uniform in [0, n), at which it fails, so that
// the cleanup of every partly done step is exercised.
func (f *Faults) Pick(n int) int {
	if f == nil || f.rate == 0 {
		return -1
	}
	f.mu.Lock()
	hit := f.rng.Float64() < f.rate
	step := f.rng.IntN(n)
	f.mu.Unlock()
	if !hit {
		return -1
	}
	return step
}

// Err is the injected failure of op (for a step chosen by Pick), counted.
func (f *Faults) Err(op string) error {
	f.injected.Add(1)
	return fmt.Errorf("%w: %s", ErrInjectedFault, op)
}

// Injected is the number of failures injected so far.
func (f *Faults) Injected() int64 {
	if f == nil {
		return 0
	}
	return f.injected.Load()
}
