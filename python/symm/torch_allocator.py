"""PyTorch integration: libsymm as PyTorch's CUDA allocator.

pool_allocator() is libsymm's PyTorch extension where it can be built
(_torch_ext.py: a C++ subclass of torch's CUDAPluggableAllocator that answers
every torch.cuda memory call from libsymm's pool), else, after one warning,
torch's plain CUDAPluggableAllocator over symm_pool_alloc/free with the hooks
below. The notes that follow are about that fallback.

What PyTorch 2.11 does with it (torch/csrc/cuda/CUDAPluggableAllocator.cpp,
torch/csrc/cuda/Module.cpp, torch/cuda/memory.py):

- ``CUDAPluggableAllocator(path, alloc, free)`` dlopens path with ctypes and
  calls ``torch._C._cuda_customAllocator(alloc_addr, free_addr)``, which
  builds the C++ allocator and at once calls its ``init(0)``, before any hook
  can be attached: the hooks below are set on ``.allocator()`` afterwards.
- Replace mode, ``change_current_allocator``: allowed only while the current
  allocator is not initialized, i.e. before torch's lazy CUDA init. That init
  (CUDAHooks::init -> CUDACachingAllocator::init(num_devices)) then calls
  ``init_fn(num_devices)``, our symm_torch_init, which makes symm_pool_alloc
  throw std::runtime_error on failure: PyTorch does not check for NULL there,
  and the exception reaches Python as RuntimeError.
  ``torch.cuda.empty_cache()`` calls ``reset_fn()``,
  ``set_per_process_memory_fraction(f, d)`` calls ``memory_fraction_fn(f, d)``
  and ``Tensor.record_stream(s)`` calls ``record_stream_fn(ptr, s)``; without
  the hooks all three are silent no-ops.
- MemPool mode, ``torch.cuda.MemPool(pool_allocator().allocator())``: torch's
  own caching allocator stays current and asks us only for segments through
  raw_alloc/raw_delete; init_fn is never called, so symm_pool_alloc returns
  NULL on failure and PyTorch raises torch.OutOfMemoryError.
- The process-wide allocator can be swapped once, so the allocator object is
  built once and cached.
"""

from __future__ import annotations

import threading
import warnings

from . import _pool
from ._loader import function_address, library_path

_lock = threading.RLock()
_allocator = None
_installed = False

# (PyTorch hook setter, exported C function). Signatures, from Module.cpp:
# set_init_fn: void(int), set_reset_fn: void(), set_memory_fraction_fn:
# void(double, int), set_record_stream_fn: void(void*, cudaStream_t).
# CUDA graphs (torch 2.11's _CUDAPluggableAllocator): set_begin_allocate_to_pool:
# void(int, MempoolId_t, std::function<bool(cudaStream_t)>),
# set_end_allocate_to_pool_fn and set_release_pool: void(int, MempoolId_t);
# the C++ functors are in export/routes.cpp.
_HOOKS = (
    ("set_init_fn", "symm_torch_init"),
    ("set_reset_fn", "symm_pool_empty_cache"),
    ("set_memory_fraction_fn", "symm_pool_set_memory_fraction"),
    ("set_record_stream_fn", "symm_pool_record_stream"),
    ("set_begin_allocate_to_pool", "symm_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "symm_torch_end_allocate_to_pool"),
    ("set_release_pool", "symm_torch_release_pool"),
)


def _import_torch():
    """Imports torch lazily, so that the rest of symm works without it."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "symm.pool_allocator() and symm.use_as_default() need PyTorch with CUDA "
            f"(importing torch failed: {e}); the rest of symm works without torch"
        ) from e
    if not hasattr(torch._C, "_cuda_customAllocator"):
        raise ImportError(
            f"symm.pool_allocator() needs a CUDA build of PyTorch; torch {torch.__version__} "
            "has no CUDAPluggableAllocator"
        )
    return torch


class SymmAllocator:
    """libsymm's allocator as PyTorch takes it: a torch.cuda.memory._CUDAAllocator
    (defined once torch is imported) over the extension's C++ object."""


_status = {"extension": False, "reason": "not tried yet", "build_seconds": None}


def extension_status() -> dict:
    """Whether pool_allocator() runs on libsymm's PyTorch extension:
    {"extension": bool, "reason": why not ("" when it does), "build_seconds":
    seconds its build took in this process (None: it came from the cache)}."""
    return dict(_status)


def _extension_allocator(torch):
    """The extension's allocator, or None (with a warning) where it cannot be built."""
    from . import _torch_ext

    m = _torch_ext.mode()
    if m == "off":
        _status.update(extension=False, reason=f"{_torch_ext.ENV_MODE}=0")
        return None
    try:
        ext = _torch_ext.load()
        raw = ext.make_allocator(str(library_path()))
    except _torch_ext.ExtensionUnavailable as e:
        _status.update(extension=False, reason=str(e))
        if m == "require":
            raise
        warnings.warn(
            f"symm: libsymm's PyTorch extension is not available: {e}. Falling back to torch's plain "
            f"CUDAPluggableAllocator with libsymm's hooks, where {_torch_ext.LOST}. "
            f"({_torch_ext.ENV_MODE}=0 silences this; {_torch_ext.ENV_MODE}=1 makes it an error)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    _status.update(extension=True, reason="", build_seconds=_torch_ext.build_seconds())
    cls = type("SymmAllocator", (torch.cuda.memory._CUDAAllocator, SymmAllocator), {})
    return cls(raw)


def _hooked_allocator(torch):
    """torch's CUDAPluggableAllocator over symm_pool_alloc/free with every hook attached."""
    from torch.cuda.memory import CUDAPluggableAllocator

    allocator = CUDAPluggableAllocator(library_path(), "symm_pool_alloc", "symm_pool_free")
    raw = allocator.allocator()
    for setter, c_name in _HOOKS:
        if not hasattr(raw, setter):
            if setter in ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool"):
                continue  # torch < 2.3: no CUDA-graph hooks; graphs in replace mode fail there
            raise ImportError(f"torch {torch.__version__}'s CUDAPluggableAllocator has no {setter}")
        getattr(raw, setter)(function_address(c_name))
    return allocator


def pool_allocator():
    """The process's libsymm allocator for PyTorch.

    Returns the same object on every call. Use it with
    ``torch.cuda.memory.change_current_allocator`` (or use_as_default()), or
    pass ``pool_allocator().allocator()`` to ``torch.cuda.MemPool``.

    It is libsymm's PyTorch extension (a CUDAPluggableAllocator subclass,
    built at first use: see extension_status()) where a C++ compiler, torch's
    headers and CUDA's runtime headers are found; otherwise torch's plain
    CUDAPluggableAllocator with libsymm's hooks, after one warning that names
    what is missing and what is lost.
    """
    global _allocator
    torch = _import_torch()
    with _lock:
        if _allocator is None:
            _pool.load()  # the extension finds libsymm's functions in this copy
            allocator = _extension_allocator(torch)
            if allocator is None:
                allocator = _hooked_allocator(torch)
            # PyTorch is loaded now: let the library find its allocator pointer
            # (MemPool mode hands segments back; replace mode throws on OOM).
            _pool.load().symm_torch_mode()
            _allocator = allocator
        del torch
        return _allocator


def use_as_default():
    """Makes libsymm the allocator of every CUDA tensor in this process.

    Must run before the first CUDA allocation (before torch initializes CUDA).
    Calling it again is harmless. Returns pool_allocator().
    """
    global _installed
    torch = _import_torch()
    with _lock:
        allocator = pool_allocator()
        if not _installed:
            try:
                torch.cuda.memory.change_current_allocator(allocator)
            except RuntimeError as e:
                raise RuntimeError(
                    f"symm.use_as_default() came too late: {e}. Call it before anything "
                    "initializes CUDA in this process (the first CUDA tensor, "
                    "torch.cuda.init(), ...), or use torch.cuda.MemPool("
                    "symm.pool_allocator().allocator()) instead"
                ) from e
            _installed = True
        return allocator


def is_default() -> bool:
    """Whether use_as_default() made libsymm PyTorch's current allocator."""
    return _installed
