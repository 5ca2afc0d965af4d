package settings

// When a setting is read.
const (
	atPool      = "when the pool is made (first allocation)"
	atSymmetric = "once, at the first symmetric call"
	atOpen      = "when the library is first opened"
)

// The settings, in the order of the README's table. Adding a setting is one
// entry here (its reader uses the variable); TestREADMETable holds the README
// to this list, and docs/SETTINGS.md holds the detail a cell has no room for.
var (
	Device = define(Setting{Name: "SYMM_DEVICE", Reader: Library, When: atPool + "; " + atSymmetric,
		Default: "`cuda`", Want: `want "cuda" or "host"`,
		Help: "backend: `cuda` or `host` (host memory; for machines without a GPU). Never chosen silently."})
	Backend = define(Setting{Name: "SYMM_BACKEND", Reader: Library, When: atSymmetric,
		Default: "`SYMM_DEVICE`'s", Want: "want cuda, nvshmem, nccl or host",
		Help: "symmetric-memory backend: `cuda` (VMM + descriptors), `nvshmem`, `nccl` or `host`; `symm_set_backend` / `symm.set_backend` do the same ([details](docs/SETTINGS.md#symm_backend))"})
	NCCLAdopt = define(Setting{Name: "SYMM_NCCL_ADOPT", Reader: Python, When: "at the first symmetric call on each device (NCCL backend)",
		Default: "`1`", Want: "want 1 or 0",
		Help: "`1`: adopt PyTorch's NCCL communicator (`ProcessGroupNCCL._comm_ptr`) so windows serve `torch.distributed` collectives; `0`: make libsymm's own"})
	PoolLimit = define(Setting{Name: "SYMM_POOL_LIMIT", Reader: Library, When: atPool,
		Help: "cap on each device's reserved bytes: a size (`8GiB`, `1.5GiB`, `4096`; a number without a unit is a whole number of bytes, so `1.5` is refused) or a share of device memory (`90%`); `0`, like unset, is no cap"})
	PoolMaxSplit = define(Setting{Name: "SYMM_POOL_MAX_SPLIT", Reader: Library, When: atPool,
		Default: "off", Want: "must be more than 1 MiB (small blocks are always split)",
		Help: "blocks of at least this size are \"oversize\": never split, reused only by requests at most 20 MiB smaller (PyTorch's `max_split_size_mb`)"})
	PoolExpandable = define(Setting{Name: "SYMM_POOL_EXPANDABLE", Reader: Library, When: atPool,
		Default: "`0`", Want: "want 0 or 1",
		Help: "`1`: expandable segments (PyTorch's `expandable_segments:True`): per device, stream and pool one reserved address range that grows and shrinks by chunks; `symm_pool_set_expandable` / `symm.set_expandable()` win ([details](docs/SETTINGS.md#symm_pool_expandable))"})
	PoolUnmapFreePages = define(Setting{Name: "SYMM_POOL_UNMAP_FREE_PAGES", Reader: Library, When: atPool,
		Default: "`1`", Want: "want 0 or 1",
		Help: "with expandable segments, `1`: a chunk wholly inside a free block gives its memory back to where the pool maps next, so reserved memory follows the live blocks; `0`: only a segment's free tail is unmapped, as PyTorch does ([details](docs/SETTINGS.md#symm_pool_unmap_free_pages))"})
	Publish = define(Setting{Name: "SYMM_PUBLISH", Reader: Library, When: atPool,
		Default: "`1`", Want: "want 0 or 1",
		Help: "`0`: do not publish this process's pool statistics for `symm top`; another value than 0 or 1 is refused when the pool is made"})
	PublishDir = define(Setting{Name: "SYMM_PUBLISH_DIR", Reader: Library, When: atPool + "; by `symm top`",
		Default: "`/dev/shm`",
		Help:    "where the statistics pages are written (and `symm top` reads them)"})
	PoolExpandableChunk = define(Setting{Name: "SYMM_POOL_EXPANDABLE_CHUNK", Reader: Library, When: atPool,
		Default: "`large_segment_size_mb` (20 MiB)", Want: "want a size from 1 byte to 1 TiB (rounded up to the driver's granularity)",
		Help: "size of the big chunks expandable segments map where a mapping covers a whole one (2 MiB chunks elsewhere), rounded up to the driver's granularity (2 MiB); `2MiB`: 2 MiB chunks only, fewer bytes, slower warm-up ([details](docs/SETTINGS.md#symm_pool_expandable_chunk))"})
	PoolFrontCache = define(Setting{Name: "SYMM_POOL_FRONT_CACHE", Reader: Library, When: atPool,
		Default: "`0`", Want: "want 0 or 1",
		Help: "off by default (`0`: every call goes to the Go pool); `1`: keep recently freed blocks per CPU in C, so a cached alloc/free of the same size and stream never enters Go: it pays for multi-threaded C callers of `symm_pool_alloc`/`symm_pool_free` ([details](docs/SETTINGS.md#symm_pool_front_cache))"})
	PoolFrontCacheMax = define(Setting{Name: "SYMM_POOL_FRONT_CACHE_MAX", Reader: Library, When: atPool,
		Default: "`1MiB`", Want: "want a size from 512 B to 64 MiB (e.g. 1MiB)",
		Help: "largest block cut from a shared segment that the front cache hands out again whatever happened since it was freed, 512 B to 64 MiB ([details](docs/SETTINGS.md#symm_pool_front_cache_max))"})
	TorchCUDAAllocConf = define(Setting{Name: "PYTORCH_CUDA_ALLOC_CONF", Reader: Library, When: atPool,
		Help: "PyTorch's allocator settings (`key:value,key:value`, e.g. `expandable_segments:True`), read by the pool as torch 2.11 reads them: see the key table below. A `SYMM_POOL_` variable that is set wins over the setting of the same field"})
	TorchAllocConf = define(Setting{Name: "PYTORCH_ALLOC_CONF", Reader: Library, When: atPool,
		Help: "the newer name of the same settings, read only when `PYTORCH_CUDA_ALLOC_CONF` is not set (torch 2.11's order: one of the two is read, never a merge; a warning says so when both are set and differ)"})
	TorchAllocator = define(Setting{Name: "SYMM_TORCH_ALLOCATOR", Reader: Python, When: "when a process finishes importing torch",
		Default: "unset", Want: "expected 1 (libsymm is PyTorch's allocator) or 0",
		Help: "`1` (also `true`, `yes`, `on`): libsymm becomes PyTorch's allocator in every Python process, with no edit to the script (an installed wheel's `symm_autoload.pth`; `symm run` sets it); `0` or unset: nothing ([details](docs/SETTINGS.md#symm_torch_allocator))"})
	TorchExt = define(Setting{Name: "SYMM_TORCH_EXT", Reader: Python, When: "at first use on a CUDA tensor",
		Default: "`auto`", Want: "want 0 (off), 1 (required) or unset (auto)",
		Help: "libsymm's PyTorch extension: `auto` (built at first use on a CUDA tensor; where it cannot be, one warning and the ctypes ways), `1` (required: a failed build is an error), `0` (not used)"})
	TorchExtCache = define(Setting{Name: "SYMM_TORCH_EXT_CACHE", Reader: Python, When: "when the extension is built or loaded",
		Default: "`$XDG_CACHE_HOME/libsymm/torch_ext`, else `~/.cache/libsymm/torch_ext`",
		Help:    "where the extension is built and kept, keyed by its sources, torch, Python, the CPU and the compiler; it must belong to the user and be writable by no one else ([details](docs/SETTINGS.md#symm_torch_ext_cache))"})
	TorchExtTimeout = define(Setting{Name: "SYMM_TORCH_EXT_TIMEOUT", Reader: Python, When: "when the extension is built",
		Default: "`600`", Want: "want seconds or a duration such as 300s or 10m, more than 0",
		Help: "longest build of the extension, in seconds or as a duration (`300s`, `10m`): past it the compiler is stopped, the fallback's warning says so (an error with `SYMM_TORCH_EXT=1`), and the next process tries again"})
	CUDALib = define(Setting{Name: "SYMM_CUDA_LIB", Reader: Library, When: atPool,
		Default: "`libcuda.so.1`",
		Help:    "path of the CUDA driver library"})
	PushMaxBytes = define(Setting{Name: "SYMM_PUSH_MAX_BYTES", Reader: Library, When: "when a push workspace is made",
		Default: "1048576", Want: "want a positive number of bytes",
		Help: "largest message of a push workspace (`symm.push_all_reduce`, `symm.all_reduce`), rounded up to 8; each group's workspace is 4 × world size × this on each GPU, fixed at its first call"})
	CollectiveBlocks = define(Setting{Name: "SYMM_COLLECTIVE_BLOCKS", Reader: Library, When: atSymmetric,
		Default: "96", Want: "want a number of blocks from %d to %d",
		Help: "the most blocks (of 512 threads) the one-shot, two-shot, reduce-scatter and all-gather kernels launch, 1–512; a group uses the smallest value of its ranks, and never more than 512 / world"})
	AllReduce = define(Setting{Name: "SYMM_ALL_REDUCE", Reader: Library, When: atSymmetric,
		Default: "`auto`", Want: "want auto, push, two_shot or one_shot",
		Help: "the algorithm of `symm.all_reduce` and `symm_all_reduce_algorithm`: `auto` (the push up to the measured crossover and the workspace's limit, the two-shot above), `push`, `two_shot` or `one_shot` (forced at every size)"})
	PushFirstCall = define(Setting{Name: "SYMM_PUSH_FIRST_CALL", Reader: Tests, When: atSymmetric,
		Default: "1", Want: "want a positive call number",
		Help: "number of a push all-reduce workspace's first call; near a multiple of 2^32 it makes the calls cross the wrap-around of their 32-bit flags"})
	TimeoutMS = define(Setting{Name: "SYMM_TIMEOUT_MS", Reader: Library, When: atSymmetric,
		Default: "60000", Want: "want a positive number of milliseconds",
		Help: "longest wait, in milliseconds, of a rendezvous, a backend bootstrap or a signal pad's reset for its peers (then SYMM_ERR_TIMEOUT naming who did not come); also the default timeout of `barrier`, `put_signal` and `wait_signal` ([details](docs/SETTINGS.md#symm_timeout_ms))"})
	RendezvousTimeout = define(Setting{Name: "SYMM_RENDEZVOUS_TIMEOUT", Reader: Library, When: atSymmetric,
		Default: "`60s`", Want: "want seconds or a duration such as 30s",
		Help: "the same as a duration (`30s`, or seconds); `SYMM_TIMEOUT_MS` wins when both are set"})
	AllowOverlappingDevices = define(Setting{Name: "SYMM_ALLOW_OVERLAPPING_DEVICES", Reader: Library, When: atSymmetric,
		Default: "off", Want: "want 1 (on) or 0 (off)",
		Help: "`1`: let two ranks of a group use one GPU; `0`: not"})
	TraceRendezvous = define(Setting{Name: "SYMM_TRACE_RENDEZVOUS", Reader: Library, When: atSymmetric,
		Default: "off", Want: "want 1 (on) or 0 (off)",
		Help: "`1`: print the time of each rendezvous phase to standard error; `0`: not"})
	StoreToken = define(Setting{Name: "SYMM_STORE_TOKEN", Reader: Library, When: "when a TCP store is made",
		Help: "shared secret of the TCP store (server and clients), when the caller passes none"})
	StoreAddr = define(Setting{Name: "SYMM_STORE_ADDR", Reader: Python, When: "when rank 0 makes a group's store",
		Default: "`127.0.0.1:0`",
		Help:    "where rank 0 binds the group's store"})
	HostDevices = define(Setting{Name: "SYMM_HOST_DEVICES", Reader: Library, When: atPool,
		Default: "1", Want: "want a device count from %d to %d",
		Help: "number of devices the host backend pretends to have (1–64)"})
	HostMemory = define(Setting{Name: "SYMM_HOST_MEMORY", Reader: Library, When: atPool,
		Default: "physical memory",
		Help:    "capacity of each host device (a size)"})
	HostFaults = define(Setting{Name: "SYMM_HOST_FAULTS", Reader: Tests, When: atPool + "; " + atSymmetric,
		Default: "off (seed 0)", Want: "want a failure rate from 0 to 1, optionally followed by :seed (0.05 or 0.05:42)",
		Help: "fault injection on the host backend: `<rate>` or `<rate>:<seed>`, rate from 0 to 1; segment allocations, event creations and symmetric create/export/import fail at random, deterministically from the seed (SYMM_ERR_DRIVER)"})
	FaultCrashAt = define(Setting{Name: "SYMM_FAULT_CRASH_AT", Reader: Tests, When: atSymmetric,
		Default: "off", Want: "want publish, gathered, sent or mapped",
		Help: "`publish`, `gathered`, `sent` or `mapped` kills the process (SIGKILL) at that phase of every rendezvous"})
	Lib = define(Setting{Name: "SYMM_LIB", Reader: Python, When: "when the package first loads the library (its first call into it)",
		Default: "package dir, then `build/`",
		Help:    "path of `libsymm.so`"})
	NVMLLib = define(Setting{Name: "SYMM_NVML_LIB", Reader: Library, When: "when the topology is read",
		Default: "`libnvidia-ml.so.1`",
		Help:    "path of NVML (topology: links, UUIDs, affinities)"})
	NCCLLib = define(Setting{Name: "SYMM_NCCL_LIB", Reader: Library, When: atOpen,
		Help: "NCCL library for the NCCL backend and `symm info`, tried before pip's wheels (in the site-packages the Python package tells the library) and the loader's path"})
	NVSHMEMLib = define(Setting{Name: "SYMM_NVSHMEM_LIB", Reader: Library, When: atOpen,
		Help: "NVSHMEM host library for the NVSHMEM backend and `symm info`, tried first, as `SYMM_NCCL_LIB`"})
	KernelCache = define(Setting{Name: "SYMM_KERNEL_CACHE", Reader: Library, When: atSymmetric + "; by `symm info`",
		Default: "`$XDG_CACHE_HOME/libsymm/kernels`, else `~/.cache/libsymm/kernels`",
		Help:    "directory of kernels compiled at run time (CUBINs keyed by source, target, NVRTC and driver), so that the next process does not compile again; `off`: none"})
	NVRTCLib = define(Setting{Name: "SYMM_NVRTC_LIB", Reader: Library, When: atOpen,
		Help: "NVRTC library (run-time kernel compilation: signal kernels, collectives, `symm info`), tried first, as `SYMM_NCCL_LIB`"})
	Signals = define(Setting{Name: "SYMM_SIGNALS", Reader: Library, When: atSymmetric,
		Default: "`auto`", Want: "want auto, kernel or memop",
		Help: "how `barrier`, `put_signal` and `wait_signal` run on GPUs: `auto` (kernels when NVRTC can build them, else stream memory operations), `kernel` (kernels, or SYMM_ERR_NO_DEVICE saying why not), `memop` (stream memory operations only)"})
	LaunchThroughGo = define(Setting{Name: "SYMM_LAUNCH_THROUGH_GO", Reader: Library, When: atSymmetric,
		Default: "`0`", Want: "want 1 (on) or 0 (off)",
		Help: "`1`: every signal and collective call goes through the library's Go core; `0`: after a handle's first call, the calls without a timeout launch from a plan kept in C ([details](docs/SETTINGS.md#symm_launch_through_go))"})
	PythonExe = define(Setting{Name: "SYMM_PYTHON", Reader: Tool, When: "by `symm info`",
		Default: "`python3`",
		Help:    "the Python asked for its site-packages, where pip puts NCCL, NVSHMEM and NVRTC"})
)

// All is every setting, in the README's order (the order of the entries
// above).
var All []*Setting

// define adds s to All.
func define(s Setting) *Setting {
	p := &s
	All = append(All, p)
	return p
}
