package topology_test

import (
	"fmt"

	"github.com/libsymm/libsymm/topology"
)

// Where the NVSHMEM backend looks for its host library, in order: the
// variable SYMM_NVSHMEM_LIB (when set), the directories the program told
// once (AddLibraryDirs, symm_add_library_dirs; none here), the loader's
// search by soname, then each directory given as a site-packages (pip's
// nvidia-nvshmem wheel) and as a plain directory. topology.Discover reads the whole machine the same
// way (`symm info`).
func ExampleCandidates() {
	for _, p := range topology.Candidates("nvshmem", []string{"/venv/lib/python3.12/site-packages"}) {
		fmt.Println(p)
	}
	// Output:
	// libnvshmem_host.so.3
	// /venv/lib/python3.12/site-packages/nvidia/nvshmem/lib/libnvshmem_host.so.3
	// /venv/lib/python3.12/site-packages/libnvshmem_host.so.3
}
