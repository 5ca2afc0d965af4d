package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"run"}, exitUsage, "symm run: no command given"},
		{[]string{"run", "--"}, exitUsage, "symm run: no command given"},
		{[]string{"run", "--bogus"}, exitUsage, `unknown flag "--bogus"`},
		{[]string{"run", "--help"}, exitOK, "usage: symm run [--] COMMAND"},
		// The test binary has no _boot beside it: refused, naming where it looked.
		{[]string{"run", "--", "true"}, exitFailure, "_boot/sitecustomize.py is not beside"},
	} {
		code, out, errOut := runCLI(tc.args...)
		require.Equal(t, tc.code, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, out+errOut, tc.out, "%v", tc.args)
	}
}

func TestRunFindsBootInWheelAndCheckout(t *testing.T) {
	for _, layout := range []struct{ exe, boot string }{
		{"site/symm/bin/symm", "site/symm/_boot"},     // a wheel
		{"repo/build/symm", "repo/python/symm/_boot"}, // a checkout
	} {
		root := t.TempDir()
		boot := filepath.Join(root, layout.boot)
		require.NoError(t, os.MkdirAll(boot, 0o755))
		_, err := findBoot(filepath.Join(root, layout.exe))
		require.ErrorContains(t, err, "is not beside", "a directory without sitecustomize.py is no boot")
		require.NoError(t, os.WriteFile(filepath.Join(boot, "sitecustomize.py"), nil, 0o644))
		got, err := findBoot(filepath.Join(root, layout.exe))
		require.NoError(t, err)
		require.Equal(t, boot, got)
	}
}

func TestRunEnv(t *testing.T) {
	env := runEnv([]string{"HOME=/h", "PYTHONPATH=/a:/b", "SYMM_TORCH_ALLOCATOR=0"}, "/boot")
	require.Equal(t, []string{"HOME=/h", "SYMM_TORCH_ALLOCATOR=1", "PYTHONPATH=/boot:/a:/b"}, env)
	// An empty PYTHONPATH would put the working directory on sys.path: not kept.
	env = runEnv([]string{"PYTHONPATH="}, "/boot")
	require.Equal(t, []string{"SYMM_TORCH_ALLOCATOR=1", "PYTHONPATH=/boot"}, env)
}
