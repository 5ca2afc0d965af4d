"""Finds and loads libsymm.so once per process, and types every C function.

Why these choices:
- The library is loaded lazily, at the first call, so ``import symm`` works
  (and SymmError is importable) on machines where the library is missing;
  the failure then names every place that was searched.
- It is opened with RTLD_NODELETE | RTLD_GLOBAL: a Go c-shared library can
  never be unloaded, and PyTorch's CUDAPluggableAllocator dlopens the same
  path again later, which must give back this very copy (one Go runtime,
  one pool).
- libsymm reads its SYMM_* environment variables from the C environment at
  the first call that needs them (the pool's at the first pool call, the
  symmetric backend's at the first symmetric call), not when it is loaded:
  set them before that call; later changes are not seen.
- Every prototype of include/symm.h is declared here, so a wrong argument
  type is a ctypes error instead of a corrupted call.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from ._errors import LibraryNotFoundError, make_error

LIBRARY_NAME = "libsymm.so"
ENV_LIBRARY = "SYMM_LIB"

_PACKAGE_DIR = Path(__file__).resolve().parent


class Stat(ctypes.Structure):
    """symm_stat_t: one statistic, named as torch.cuda.memory_stats() names it."""

    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


class HandleInfo(ctypes.Structure):
    """symm_handle_info_t."""

    _fields_ = [
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("buffer_size", ctypes.c_size_t),
        ("signal_pad_size", ctypes.c_size_t),
        ("buffer_ptrs", ctypes.c_size_t),
        ("signal_pad_ptrs", ctypes.c_size_t),
        ("buffer_ptrs_dev", ctypes.c_size_t),
        ("signal_pad_ptrs_dev", ctypes.c_size_t),
    ]


class BlockInfo(ctypes.Structure):
    """symm_block_info_t: one block of a pool (symm_pool_blocks)."""

    _fields_ = [
        ("address", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("requested_size", ctypes.c_uint64),
        ("stream", ctypes.c_size_t),
        ("segment_address", ctypes.c_uint64),
        ("state", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


class PoolId(ctypes.Structure):
    """symm_pool_id_t: PyTorch's MempoolId_t (first, second)."""

    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]


_c_size_t = ctypes.c_size_t
_c_int = ctypes.c_int
_c_void_p = ctypes.c_void_p

# name -> (argtypes, restype), in the order of include/symm.h.
PROTOTYPES: dict[str, tuple[list, object]] = {
    "symm_version": ([], ctypes.c_char_p),
    "symm_last_error": ([], ctypes.c_char_p),
    "symm_last_error_code": ([], _c_int),
    "symm_clear_error": ([], None),
    "symm_copy_last_error": ([ctypes.c_char_p, _c_size_t], _c_size_t),
    "symm_pool_alloc": ([_c_size_t, _c_int, _c_void_p], _c_void_p),
    "symm_pool_try_alloc": ([_c_size_t, _c_int, _c_void_p], _c_void_p),
    "symm_pool_free": ([_c_void_p, _c_size_t, _c_int, _c_void_p], None),
    "symm_pool_init": ([_c_int], None),
    "symm_torch_init": ([_c_int], None),
    "symm_pool_empty_cache": ([], None),
    "symm_pool_set_memory_fraction": ([ctypes.c_double, _c_int], None),
    "symm_pool_memory_fraction": ([_c_int, ctypes.POINTER(ctypes.c_double)], _c_int),
    "symm_pool_set_allocator_settings": ([ctypes.c_char_p], _c_int),
    "symm_driver_proc": ([ctypes.c_char_p], _c_void_p),
    "symm_pool_set_limit": ([_c_int, ctypes.c_uint64], _c_int),
    "symm_pool_set_expandable": ([_c_int], _c_int),
    "symm_pool_record_stream": ([_c_void_p, _c_void_p], None),
    "symm_pool_stats": ([_c_int, ctypes.POINTER(Stat), _c_int], _c_int),
    "symm_pool_reset_peak": ([_c_int], _c_int),
    "symm_pool_device_count": ([], _c_int),
    "symm_pool_backend": ([], ctypes.c_char_p),
    "symm_pool_begin_allocate_to_pool": ([_c_int, PoolId, _c_void_p], _c_int),
    "symm_pool_end_allocate_to_pool": ([_c_int, PoolId], _c_int),
    "symm_pool_release_pool": ([_c_int, PoolId], _c_int),
    "symm_pool_record_history": ([_c_int, _c_size_t], _c_int),
    "symm_pool_set_annotation": ([ctypes.c_char_p, ctypes.c_char_p], _c_int),
    "symm_pool_snapshot": ([ctypes.c_char_p, _c_size_t, ctypes.POINTER(_c_size_t)], _c_int),
    "symm_torch_mode": ([], _c_int),
    "symm_torch_own_allocator": ([_c_void_p], None),
    "symm_pool_block_of": ([_c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)], _c_int),
    "symm_pool_segment_of": (
        [_c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_c_int)],
        _c_int,
    ),
    "symm_pool_segment_chunk": ([_c_void_p, ctypes.POINTER(ctypes.c_uint64)], _c_int),
    "symm_pool_chunk_at": (
        [_c_void_p, _c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)],
        _c_int,
    ),
    "symm_pool_cache_info": ([_c_int, ctypes.POINTER(_c_size_t)], _c_int),
    "symm_pool_reset_accumulated": ([_c_int], _c_int),
    "symm_pool_blocks": ([_c_int, PoolId, ctypes.POINTER(BlockInfo), _c_int], _c_int),
    "symm_pool_restore_blocks": (
        [_c_int, PoolId, ctypes.POINTER(BlockInfo), _c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_c_int),
         ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_c_int)],
        _c_int,
    ),
    "symm_pool_alloc_segment": ([_c_size_t, _c_int, _c_void_p], _c_void_p),
    # Private pools as torch.cuda.MemPool makes them (the extension's calls):
    # segs is a symm_segment_allocator_t* (its C function pointers are the
    # extension's), passed as an address.
    "symm_pool_create_pool": ([_c_int, PoolId, _c_void_p], _c_int),
    "symm_pool_use_count": ([_c_int, PoolId], _c_int),
    "symm_pool_set_use_on_oom": ([_c_int, PoolId, _c_int], _c_int),
    "symm_pool_set_no_split": ([_c_int, PoolId], _c_int),
    "symm_pool_empty_pool": ([PoolId], _c_int),
    # Listings and the segment hook (the extension's snapshot and trace
    # trackers): arrays of symm_segment_info_t / symm_block_info_t /
    # symm_trace_entry_t, a symm_pool_settings_t* and a C function pointer,
    # passed as addresses.
    "symm_pool_snapshot_list": (
        [_c_void_p, ctypes.POINTER(_c_int), _c_void_p, ctypes.POINTER(_c_int), _c_void_p, ctypes.POINTER(_c_int)],
        _c_int,
    ),
    "symm_pool_settings": ([_c_void_p], _c_int),
    "symm_pool_set_segment_hook": ([_c_void_p, _c_void_p], _c_int),
    "symm_alloc": ([_c_size_t, _c_int, _c_void_p], _c_void_p),
    "symm_free": ([_c_void_p, _c_size_t, _c_int, _c_void_p], None),
    "symm_has_multicast_support": ([_c_int], _c_int),
    "symm_store_server": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, _c_size_t], _c_int),
    "symm_store_connect": ([ctypes.c_char_p, ctypes.c_char_p, _c_int, ctypes.POINTER(ctypes.c_int64)], _c_int),
    "symm_store_set": ([ctypes.c_int64, ctypes.c_char_p, ctypes.c_char_p, _c_size_t], _c_int),
    "symm_store_get": ([ctypes.c_int64, ctypes.c_char_p, ctypes.c_char_p, _c_size_t, ctypes.POINTER(_c_size_t), _c_int], _c_int),
    "symm_store_add": ([ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)], _c_int),
    "symm_store_close": ([ctypes.c_int64], _c_int),
    "symm_rendezvous": ([_c_void_p, ctypes.c_int64, ctypes.c_char_p, _c_int, _c_int, ctypes.POINTER(ctypes.c_int64)], _c_int),
    "symm_handle_info": ([ctypes.c_int64, ctypes.POINTER(HandleInfo)], _c_int),
    "symm_world_within_direct_access": ([ctypes.c_int64, ctypes.c_char_p, _c_int, _c_int, _c_int, ctypes.POINTER(_c_int)], _c_int),
    "symm_set_backend": ([ctypes.c_char_p], _c_int),
    "symm_get_backend": ([ctypes.c_char_p, _c_size_t], _c_int),
    "symm_nvshmem_available": ([], _c_int),
    "symm_nccl_available": ([], _c_int),
    "symm_nccl_adopt_comm": ([_c_void_p, _c_int], _c_int),
    "symm_backend_init": ([ctypes.c_int64, _c_int, _c_int, _c_int], _c_int),
    "symm_topology": ([ctypes.c_char_p, ctypes.c_char_p, _c_size_t, ctypes.POINTER(_c_size_t)], _c_int),
    "symm_add_library_dirs": ([ctypes.c_char_p], _c_int),
    "symm_put_signal": ([ctypes.c_int64, _c_int, _c_int, _c_void_p], _c_int),
    "symm_wait_signal": ([ctypes.c_int64, _c_int, _c_int, _c_void_p, _c_int], _c_int),
    "symm_barrier": ([ctypes.c_int64, _c_int, _c_void_p, _c_int], _c_int),
    "symm_reset_signal_pad": ([ctypes.c_int64, _c_int], _c_int),
    "symm_reset_signal_pad_if_any": ([ctypes.c_int64, _c_int, _c_int, ctypes.POINTER(_c_int)], _c_int),
    "symm_kernels_ready": ([_c_int], _c_int),
    "symm_one_shot_all_reduce": ([ctypes.c_int64, _c_size_t, _c_size_t, _c_int, _c_int, _c_void_p, _c_void_p,
                                  _c_void_p, _c_int], _c_int),
    "symm_two_shot_all_reduce": ([ctypes.c_int64, _c_size_t, _c_size_t, _c_int, _c_int, _c_void_p, _c_void_p,
                                  _c_void_p, _c_int], _c_int),
    "symm_reduce_scatter": ([ctypes.c_int64, _c_size_t, _c_size_t, _c_int, _c_int, _c_void_p, _c_void_p, _c_void_p,
                             _c_int], _c_int),
    "symm_all_gather": ([ctypes.c_int64, _c_size_t, _c_size_t, _c_int, _c_void_p, _c_void_p, _c_void_p, _c_int], _c_int),
    "symm_push_all_reduce_workspace_size": ([_c_int, _c_size_t], _c_size_t),
    "symm_all_reduce_algorithm": ([_c_int, _c_size_t, _c_size_t, _c_int, ctypes.POINTER(_c_int)], _c_int),
    "symm_all_reduce_setting": ([ctypes.POINTER(_c_int)], _c_int),
    "symm_push_max_bytes_setting": ([ctypes.POINTER(_c_size_t)], _c_int),
    "symm_push_all_reduce": ([ctypes.c_int64, _c_void_p, _c_void_p, _c_size_t, _c_int, _c_int, _c_void_p, _c_int],
                             _c_int),
}


def site_dirs() -> list[str]:
    """This Python's site-packages directories, where pip puts NVIDIA's
    wheels (NCCL, NVSHMEM, NVRTC): site's own, then the other site-packages
    on sys.path (a virtual environment's, a --target), absolute, each once."""
    import site
    import sys

    dirs: list[str] = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # virtualenv's old site.py
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    out: list[str] = []
    for d in dirs:
        d = os.path.abspath(d)
        if os.pathsep not in d and d not in out:
            out.append(d)
    return out


def _tell_library_dirs(lib: ctypes.CDLL) -> None:
    """Tells libsymm, once and before any call can open them, where pip's
    NCCL, NVSHMEM and NVRTC may be: this Python's site-packages
    (symm_add_library_dirs; the wheels' sub-paths are libsymm's to know, and
    a SYMM_*_LIB variable still wins). NCCL and NVSHMEM open when their
    backend starts, NVRTC at the first kernel compilation: after this."""
    rc = lib.symm_add_library_dirs(os.pathsep.join(site_dirs()).encode())
    if rc != 0:
        msg = (lib.symm_last_error() or b"").decode(errors="replace")
        raise make_error(rc, msg)


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None


def candidates(environ=None) -> list[tuple[str, Path]]:
    """The places searched, in order, each with a word saying why it is there.

    SYMM_LIB, when set, is the only candidate: a user who names a file means
    that file, and silently loading another copy would hide the mistake.
    """
    environ = os.environ if environ is None else environ
    explicit = environ.get(ENV_LIBRARY)
    if explicit:
        return [(f"${ENV_LIBRARY}", Path(explicit).expanduser())]
    return [
        ("package directory", _PACKAGE_DIR / LIBRARY_NAME),
        ("repository build directory", (_PACKAGE_DIR / ".." / ".." / "build" / LIBRARY_NAME).resolve()),
    ]


def find_library(environ=None) -> Path:
    """Returns the first existing candidate, or raises LibraryNotFoundError listing all."""
    tried = candidates(environ)
    for _, path in tried:
        if path.is_file():
            return path.resolve()
    where = "\n".join(f"  - {path} ({why})" for why, path in tried)
    hint = (
        f"check the path in {ENV_LIBRARY}"
        if tried[0][0].startswith("$")
        else f"build it with `make` in the repository, copy it into {_PACKAGE_DIR}, "
        f"or set {ENV_LIBRARY}=/path/to/{LIBRARY_NAME}"
    )
    raise LibraryNotFoundError(f"{LIBRARY_NAME} not found; searched:\n{where}\n{hint}")


def _declare(lib: ctypes.CDLL, path: Path) -> None:
    """Sets argtypes/restype of every function; a missing one means a stale library."""
    missing = []
    for name, (argtypes, restype) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.argtypes = argtypes
        fn.restype = restype
    if missing:
        raise LibraryNotFoundError(
            f"{path} does not export {', '.join(missing)}: it is older or newer than "
            f"this Python package (rebuild it, or point {ENV_LIBRARY} at a matching one)"
        )


def load() -> ctypes.CDLL:
    """Loads libsymm once (thread-safe) and returns the typed handle."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = find_library()
            mode = os.RTLD_NODELETE | os.RTLD_GLOBAL
            try:
                lib = ctypes.CDLL(str(path), mode=mode)
            except OSError as e:
                raise LibraryNotFoundError(f"could not load {path}: {e}") from e
            _declare(lib, path)
            _tell_library_dirs(lib)
            _path = str(path)
            _lib = lib
    return _lib


def library_path() -> str:
    """The absolute path of the loaded library (loading it if needed)."""
    load()
    assert _path is not None
    return _path


def function_address(name: str) -> int:
    """The address of an exported C function, for PyTorch's set_*_fn hooks."""
    addr = ctypes.cast(getattr(load(), name), ctypes.c_void_p).value
    if not addr:
        raise LibraryNotFoundError(f"{name} has no address in {library_path()}")
    return addr
