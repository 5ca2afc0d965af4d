"""symm: Python bindings for libsymm, a caching GPU allocator written in Go.

Torch-free part (ctypes only)::

    import symm
    p = symm.alloc(1 << 20)          # device 0, default stream
    symm.free(p, 1 << 20)
    symm.memory_stats()["reserved_bytes.all.current"]

PyTorch part (imports torch lazily)::

    symm.use_as_default()            # before the first CUDA tensor
    # or, for some allocations only:
    pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(n, device="cuda")

The library is found through $SYMM_LIB, else python/symm/libsymm.so, else the
repository's build/libsymm.so, and loaded at the first call. libsymm reads its
SYMM_* environment variables (e.g. SYMM_DEVICE=host for the host-memory
backend) at the first call that needs them: set them before that call.

Failures raise SymmError (a RuntimeError) carrying the library's code and
message; running out of memory raises OutOfMemoryError (also a MemoryError).
"""

def _package_version() -> str:
    """The package's version: its VERSION file (a link to the repository's
    internal/version/VERSION in a checkout, a copy in a wheel)."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    # A wheel's copy first; then a checkout's python/VERSION link (never a
    # stray VERSION of another package in site-packages: only beside a pyproject).
    candidates = [here / "VERSION"]
    if (here.parent / "pyproject.toml").is_file():
        candidates.append(here.parent / "VERSION")
    for path in candidates:
        try:
            return path.read_text().strip()
        except OSError:
            pass
    try:
        from importlib.metadata import version as _v

        return _v("symm")
    except Exception:  # noqa: BLE001 - not installed either
        return "0+unknown"


__version__ = _package_version()

from ._errors import ErrorCode, LibraryNotFoundError, OutOfMemoryError, SymmError  # noqa: E402
from ._loader import library_path
from ._pool import (
    alloc,
    backend,
    device_count,
    dump_snapshot,
    empty_cache,
    free,
    init,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    record_memory_history,
    record_stream,
    reset_peak_memory_stats,
    set_limit,
    set_expandable,
    set_memory_fraction,
    topology,
    version,
)
from .torch_allocator import extension_status, is_default, pool_allocator, use_as_default
from ._symmetric import (
    Handle,
    Store,
    empty,
    get_mem_pool,
    get_mempool_allocator,
    has_multicast_support,
    kernels_ready,
    kernels_status,
    rendezvous,
    rendezvous_ptr,
    symm_alloc,
    symm_free,
    world_within_direct_access,
    world_within_direct_access_store,
)
from ._backends import backend_init, get_backend, is_nccl_available, is_nvshmem_available, nccl_adopt_comm, set_backend
from ._collectives import (
    NCCL_FROM_BYTES,
    all_gather,
    all_reduce,
    all_reduce_algorithm,
    one_shot_all_reduce,
    push_all_reduce,
    push_all_reduce_workspace_size,
    push_workspace,
    reduce_scatter,
    two_shot_all_reduce,
)
from ._fused import fused_all_gather_matmul, fused_matmul_reduce_scatter

__all__ = [
    "Handle",
    "Store",
    "all_reduce",
    "all_reduce_algorithm",
    "empty",
    "get_mem_pool",
    "get_mempool_allocator",
    "has_multicast_support",
    "kernels_ready",
    "kernels_status",
    "one_shot_all_reduce",
    "push_all_reduce",
    "push_all_reduce_workspace_size",
    "push_workspace",
    "rendezvous",
    "rendezvous_ptr",
    "symm_alloc",
    "symm_free",
    "two_shot_all_reduce",
    "reduce_scatter",
    "NCCL_FROM_BYTES",
    "all_gather",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
    "topology",
    "backend_init",
    "get_backend",
    "is_nvshmem_available",
    "is_nccl_available",
    "nccl_adopt_comm",
    "set_backend",
    "world_within_direct_access",
    "world_within_direct_access_store",
    "ErrorCode",
    "LibraryNotFoundError",
    "OutOfMemoryError",
    "SymmError",
    "alloc",
    "backend",
    "device_count",
    "dump_snapshot",
    "empty_cache",
    "free",
    "init",
    "extension_status",
    "is_default",
    "library_path",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "record_memory_history",
    "pool_allocator",
    "record_stream",
    "reset_peak_memory_stats",
    "set_limit",
    "set_expandable",
    "set_memory_fraction",
    "use_as_default",
    "version",
    "register_torch_ops",
]

from ._torch_ops import register_torch_ops  # noqa: E402

# Compiled graphs name torch.ops.symm.* before any libsymm call: register
# them now when torch is there already (import torch, then symm); else
# register_torch_ops() does it.
import sys as _sys  # noqa: E402

if "torch" in _sys.modules:
    try:
        register_torch_ops()
    except Exception:  # noqa: BLE001 - never fail `import symm`; register_torch_ops() says why
        pass
