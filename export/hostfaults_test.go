package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/symmetric"
)

// SYMM_HOST_FAULTS turns on fault injection in the host pool backend and the
// host symmetric provider; a malformed value is an error naming it.
func TestHostFaultsFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	// The symmetric provider, as getManager makes it.
	newProvider := func(getenv func(string) string) (symmetric.Provider, error) {
		cfg, err := symmetric.ConfigFromEnv(getenv)
		if err != nil {
			return nil, err
		}
		return symmetric.NewProvider(cfg)
	}
	b, kind, err := newBackend(env("SYMM_DEVICE", "host", "SYMM_HOST_FAULTS", "1:7"))
	require.NoError(t, err)
	require.EqualValues(t, 2, kind)
	_, err = b.Alloc(0, 4096)
	require.ErrorIs(t, err, host.ErrInjectedFault)
	require.Contains(t, err.Error(), "host: injected fault (SYMM_HOST_FAULTS)")
	require.Equal(t, 6, int(errCode(err)), "SYMM_ERR_DRIVER: the backend failed, not libsymm")
	_, err = b.NewEvent(0)
	require.ErrorIs(t, err, host.ErrInjectedFault, "event creation fails too (see hostFaultOps)")

	b, _, err = newBackend(env("SYMM_DEVICE", "host", "SYMM_HOST_FAULTS", "0"))
	require.NoError(t, err)
	ptr, err := b.Alloc(0, 4096)
	require.NoError(t, err, "rate 0: never fails")
	require.NoError(t, b.Free(0, ptr, 4096))

	for _, e := range []func(string) string{env("SYMM_DEVICE", "host"), env("SYMM_BACKEND", "host")} {
		p, err := newProvider(e)
		require.NoError(t, err)
		m, err := p.Create(0, 4096)
		require.NoError(t, err, "no SYMM_HOST_FAULTS: no faults")
		require.NoError(t, p.Release(m))
	}
	p, err := newProvider(env("SYMM_DEVICE", "host", "SYMM_HOST_FAULTS", "1"))
	require.NoError(t, err)
	_, err = p.Create(0, 4096)
	require.ErrorIs(t, err, host.ErrInjectedFault)
	require.Equal(t, 6, int(errCode(err)))

	for _, bad := range []string{"x", "2", "-1", "0.5:", "0.5:x", "0.1:2:3"} {
		_, _, err := newBackend(env("SYMM_DEVICE", "host", "SYMM_HOST_FAULTS", bad))
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "SYMM_HOST_FAULTS", "names the variable")
		require.Equal(t, 1, int(errCode(err)), "SYMM_ERR_INVALID")
		_, err = newProvider(env("SYMM_DEVICE", "host", "SYMM_HOST_FAULTS", bad))
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "SYMM_HOST_FAULTS", "names the variable")
		require.Equal(t, 1, int(errCode(err)), "SYMM_ERR_INVALID")
	}
}
