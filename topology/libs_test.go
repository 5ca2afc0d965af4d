package topology

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// AddLibraryDirs: what a program tells once is searched for every library,
// after its SYMM_*_LIB variable and before the loader path; repeats and
// empty entries are left out; a relative entry adds nothing.
func TestAddLibraryDirs(t *testing.T) {
	t.Cleanup(forgetLibraryDirs)
	t.Setenv("SYMM_NCCL_LIB", "")
	t.Setenv("SYMM_NVRTC_LIB", "/opt/nvrtc/libnvrtc.so.13")

	for _, tc := range []struct {
		name    string
		dirs    []string
		want    []string
		wantErr string
	}{
		{"nothing told", nil, nil, ""},
		{"two site-packages", []string{"/venv/site", "", "/usr/lib/site/"}, []string{"/venv/site", "/usr/lib/site"}, ""},
		{"again, in another order", []string{"/usr/lib/site", "/venv/site"}, []string{"/venv/site", "/usr/lib/site"}, ""},
		{"a relative entry: nothing added", []string{"/more", "site"}, []string{"/venv/site", "/usr/lib/site"},
			`library directory "site" is not an absolute path`},
		{"one more", []string{"/more"}, []string{"/venv/site", "/usr/lib/site", "/more"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := AddLibraryDirs(tc.dirs)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.want, LibraryDirs())
		})
	}

	require.Equal(t, []string{
		"/venv/site/nvidia/nccl/lib/libnccl.so.2", "/venv/site/libnccl.so.2",
		"/usr/lib/site/nvidia/nccl/lib/libnccl.so.2", "/usr/lib/site/libnccl.so.2",
		"/more/nvidia/nccl/lib/libnccl.so.2", "/more/libnccl.so.2",
		"libnccl.so.2",
		"/call/nvidia/nccl/lib/libnccl.so.2", "/call/libnccl.so.2",
	}, Candidates("nccl", []string{"/call"}), "told, loader path, then the caller's")
	require.Equal(t, "/opt/nvrtc/libnvrtc.so.13", Candidates("nvrtc", nil)[0], "the variable still wins")
	require.Equal(t, "/venv/site/nvidia/cu13/lib/libnvrtc.so.13", Candidates("nvrtc", nil)[1], "the wheel's sub-path is Go's")

	got := LibraryDirs()
	got[0] = "changed"
	require.Equal(t, "/venv/site", LibraryDirs()[0], "a copy")
}

// OpenFirst finds a library in a told site-packages directory, as pip lays
// it out, with nothing else: no variable, no caller's directories.
func TestOpenFirstFindsAToldWheel(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build a stand-in NCCL")
	}
	t.Cleanup(forgetLibraryDirs)
	t.Setenv("SYMM_NCCL_LIB", "")
	site := t.TempDir()
	lib := filepath.Join(site, "nvidia", "nccl", "lib", "libnccl.so.2")
	require.NoError(t, os.MkdirAll(filepath.Dir(lib), 0o755))
	src := filepath.Join(site, "nccl.c")
	require.NoError(t, os.WriteFile(src, []byte("int ncclGetVersion(int *v) { *v = 22809; return 0; }\n"), 0o644))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput()
	require.NoError(t, err, string(out))

	require.NoError(t, AddLibraryDirs([]string{site}))
	l, path, err := OpenFirst("nccl", nil)
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, lib, path)
	v, err := ncclVersion(l)
	require.NoError(t, err)
	require.Equal(t, "2.28.9", v)
}

// A library found nowhere is reported with every directory looked in, by
// name: the caller's and those told (AddLibraryDirs).
func TestOpenFirstNamesWhereItLooked(t *testing.T) {
	t.Cleanup(forgetLibraryDirs)
	t.Setenv("SYMM_NVSHMEM_LIB", "")
	mine, told := t.TempDir(), t.TempDir()
	require.NoError(t, AddLibraryDirs([]string{told}))
	_, _, err := OpenFirst("nvshmem", []string{mine})
	require.Error(t, err)
	require.Contains(t, err.Error(), "not found (looked on the loader path and in "+mine+", "+told+")")
}
