"""libsymm's symmetric-memory backends from Python: choosing one (cuda,
nvshmem, nccl) and joining the backend's world (through the store, or
PyTorch's NCCL communicator) before the first symmetric allocation on a
device. NVSHMEM's and NCCL's libraries are found by libsymm, in the
site-packages the loader tells it (symm._loader)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

from ._errors import ErrorCode, SymmError
from ._loader import load
from ._pool import _call_rc
from ._store import Store, group_store

_TORCH_BACKEND_NAMES = {"cuda": "CUDA", "nvshmem": "NVSHMEM", "nccl": "NCCL"}


def set_backend(name: str) -> None:
    """Chooses the symmetric-memory backend: "cuda" (default), "nvshmem",
    "nccl" or "host", before the first symmetric allocation (as SYMM_BACKEND
    does). PyTorch's spellings ("CUDA", "NVSHMEM", "NCCL") work too."""
    name = str(name).lower()
    _call_rc(load().symm_set_backend, name.encode())


def get_backend(device: Any = None) -> str:
    """The symmetric-memory backend in use (or that will be used): libsymm's
    name ("cuda", "nvshmem", "nccl", "host"); with a device argument, as
    PyTorch's get_backend(device) is called, PyTorch's spelling ("CUDA",
    "NVSHMEM", "NCCL"; "host" has none and stays "host")."""
    buf = ctypes.create_string_buffer(32)
    _call_rc(load().symm_get_backend, buf, len(buf))
    name = buf.value.decode()
    if device is not None:
        return _TORCH_BACKEND_NAMES.get(name, name)
    return name


def is_nvshmem_available() -> bool:
    """Whether NVSHMEM's host library (3.x) can be loaded here."""
    return bool(load().symm_nvshmem_available())


def is_nccl_available() -> bool:
    """Whether an NCCL with symmetric windows (2.27+) can be loaded here."""
    return bool(load().symm_nccl_available())


def nccl_adopt_comm(comm_ptr: int, device: int) -> None:
    """Gives the NCCL backend an existing ncclComm_t (same libnccl.so.2)."""
    _call_rc(load().symm_nccl_adopt_comm, ctypes.c_void_p(int(comm_ptr)), int(device))


def backend_init(store: Store, rank: int, world_size: int, device: int = 0) -> None:
    """Joins the backend's world (NVSHMEM: collective bootstrap through store)."""
    _call_rc(load().symm_backend_init, store.handle, int(rank), int(world_size), int(device))


_backend_ready: dict = {}


def _ensure_backend(dev: int) -> None:
    """Under NVSHMEM, initializes it once with the default process group."""
    backend = get_backend()
    if _backend_ready.get(dev) or backend not in ("nvshmem", "nccl"):
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        raise SymmError(ErrorCode.INVALID, f"the {backend} backend needs torch.distributed initialized "
                        "(it bootstraps through the default process group's store)")
    group = dist.group.WORLD
    if backend == "nccl" and _nccl_adopt_wanted() and _adopt_torch_comm(group, dev):
        _backend_ready[dev] = "adopted PyTorch's communicator"
        return
    backend_init(group_store(group), dist.get_rank(group), dist.get_world_size(group), dev)
    _backend_ready[dev] = "own communicator"


def _nccl_adopt_wanted() -> bool:
    """SYMM_NCCL_ADOPT: 1 (the default) adopts PyTorch's NCCL communicator, 0
    makes libsymm's own; another value is refused (SymmError INVALID naming
    the variable) rather than read as 0."""
    v = os.environ.get("SYMM_NCCL_ADOPT", "")
    if v in ("", "1"):
        return True
    if v == "0":
        return False
    raise SymmError(ErrorCode.INVALID, f"SYMM_NCCL_ADOPT={v!r}: want 1 or 0")


def _adopt_torch_comm(group, dev: int) -> bool:
    """Adopts the NCCL communicator of the group's ProcessGroupNCCL when
    PyTorch exposes it (_comm_ptr), so that windows registered by rendezvous
    are windows of the communicator torch.distributed's collectives use."""
    import torch
    import torch.distributed as dist

    try:
        pg = group._get_backend(torch.device("cuda", dev))
        if not hasattr(pg, "_comm_ptr"):
            return False
        dist.barrier(group=group, device_ids=[dev])  # PyTorch makes its communicator lazily
        ptr = pg._comm_ptr()
        if not ptr:
            return False
        nccl_adopt_comm(ptr, dev)
        return True
    except (RuntimeError, AttributeError, SymmError):
        return False


def backend_status(device: int = 0) -> str:
    """How the backend was set up on device by the PyTorch layer ("" if not)."""
    return str(_backend_ready.get(device, ""))
