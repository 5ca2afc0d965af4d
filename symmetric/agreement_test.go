package symmetric

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/store"
)

// registrar is the host provider with a collective registration step, as
// the NCCL provider has (windows); it counts registrations and releases.
type registrar struct {
	Provider
	hostLabels
	mu         sync.Mutex
	registered int
}

func (r *registrar) Register(m *Mem, rank, world int) (func() error, error) {
	r.mu.Lock()
	r.registered++
	r.mu.Unlock()
	return func() error {
		r.mu.Lock()
		r.registered--
		r.mu.Unlock()
		return nil
	}, nil
}

// rendezvousWithFault runs a 3-rank rendezvous in which rank 1 fails at
// phase; it returns each rank's error and how long each took.
func rendezvousWithFault(t *testing.T, phase string, prov func(rank int) Provider) ([]error, []time.Duration) {
	t.Helper()
	const world = 3
	st := store.NewMemory()
	defer st.Close()
	errs := make([]error, world)
	took := make([]time.Duration, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		cfg := Config{Timeout: 10 * time.Second}
		if r == 1 {
			cfg.FailAt = phase
		}
		m := NewManager(prov(r), cfg)
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			b, err := m.Alloc(0, 4096)
			if err != nil {
				errs[r] = err
				return
			}
			start := time.Now()
			_, errs[r] = m.Rendezvous(b.Ptr(), Group{Name: "agree-" + phase, Rank: r, World: world, Store: st})
			took[r] = time.Since(start)
			require.NoError(t, m.Free(b.Ptr()))
			require.Zero(t, m.Live())
		}(r)
	}
	wg.Wait()
	return errs, took
}

// A rank that fails at any step after the metadata agreement makes every
// rank fail, with its cause named, at once (not at the 10 s deadline), and
// nothing stays mapped or registered.
func TestEveryRankFailsWithTheSameCause(t *testing.T) {
	for _, phase := range []string{"send", "arrays", "register"} {
		t.Run(phase, func(t *testing.T) {
			regs := make([]*registrar, 3)
			errs, took := rendezvousWithFault(t, phase, func(r int) Provider {
				if phase == "register" {
					regs[r] = &registrar{Provider: NewHostProvider()}
					return regs[r]
				}
				return NewHostProvider()
			})
			cause := fmt.Sprintf("injected failure at %s", phase)
			for r, err := range errs {
				require.Error(t, err, "rank %d succeeded while rank 1 failed", r)
				require.ErrorContains(t, err, cause, "rank %d", r)
				if r != 1 {
					require.ErrorContains(t, err, "rank 1 (pid", "rank %d names the failing rank", r)
				}
				require.Less(t, took[r], time.Second, "rank %d learned it at once, not at the deadline", r)
			}
			for r, reg := range regs {
				if reg != nil {
					require.Zero(t, reg.registered, "rank %d kept a registration", r)
				}
			}
		})
	}
}
