"""libsymm's collectives from PyTorch: the one-shot and two-shot all-reduce,
reduce-scatter and all-gather on symmetric tensors, the push all-reduce on
any tensor, and all_reduce, which chooses among them (and NCCL) by size.
Every function here goes through the C library's entry points (include/symm.h)
and is exported by the symm package."""

from __future__ import annotations

import ctypes
from typing import Any

from . import _ops_ext
from ._codes import AllReduceAlgorithm, names as _names
from ._group_state import _group_state, _groups, known_state
from ._groups import resolve_group as _resolve_group
from ._loader import load
from ._pool import _from_call, _last_error
from ._symmetric import (_DTYPES, _TORCH_DTYPES, Handle, _cuda_device, _current_raw_stream, _ensure_backend, _fast_rc,
                         _one_of, _raise_rc, _tensor_at, rendezvous, rendezvous_ptr, symm_alloc, symm_free)
from ._store import group_store as _group_store

def _torch_dtypes() -> dict:
    """torch dtype -> the library's code (a Dtype: SYMM_FLOAT32, _BFLOAT16,
    _FLOAT16): every collective takes the same ones, each the torch dtype
    of its name. Filled at the first call (torch is imported only then)."""
    if not _TORCH_DTYPES:
        import torch

        _TORCH_DTYPES.update({getattr(torch, name): int(code) for name, code in _DTYPES.items()})
    return _TORCH_DTYPES

def _torch_dtype_code(fn: str, dtype, how: str = "") -> int:
    """The C code of torch dtype for fn's call (how: what the call does
    with it, for the message), or ValueError naming it: the one check of a
    tensor's dtype."""
    code = _torch_dtypes().get(dtype)
    if code is None:
        raise ValueError(f"{fn}: dtype {dtype}{how}: want {_one_of('torch.' + name for name in _DTYPES)}")
    return code


def _all_reduce_args(fn: str, tensor, op: str, local_input):
    """The checks the one-shot, two-shot and push all-reduce share: the
    dtype code, the element count and the local input's address (0: none)."""
    code = _torch_dtype_code(fn, tensor.dtype)
    if op != "sum":
        raise ValueError(f"{fn}: op {op!r}: only 'sum' is supported")
    if not tensor.is_contiguous():
        raise ValueError(f"{fn}: the tensor must be contiguous")
    n = tensor.numel()
    if local_input is None:
        return code, n, 0
    if local_input.dtype != tensor.dtype or local_input.numel() != n or not local_input.is_contiguous():
        raise ValueError(f"{fn}: local_input must be a contiguous {tensor.dtype} tensor of {n} elements")
    return code, n, local_input.data_ptr()


def one_shot_all_reduce(tensor, op: str = "sum", group=None, out=None, local_input=None, timeout_ms: int = 0):
    """PyTorch's symm_mem.one_shot_all_reduce: tensor lives in a symmetric
    block (symm.empty, or get_mem_pool) of every rank of group; each rank
    reads every peer's tensor over NVLink and returns the sum (a new tensor,
    or out), in stream order on the current stream. float32, bfloat16 and
    float16;
    the tensor's bytes must be a multiple of 4. local_input: copied into
    tensor first (PyTorch's one_shot_all_reduce_copy). Every rank calls it
    with the same shape. Raises SymmError (INVALID, NO_DEVICE when the
    kernels cannot run, TIMEOUT naming a rank that did not come)."""
    import torch

    if op == "sum" and tensor.is_cuda:
        if out is None:
            out = torch.empty_like(local_input if local_input is not None else tensor)
        if _ext_collective(0, tensor, group, out, local_input, timeout_ms):
            return out
    code, n, local = _all_reduce_args("one_shot_all_reduce", tensor, op, local_input)
    if out is None:
        out = torch.empty_like(local_input if local_input is not None else tensor)
    return _run_all_reduce("one_shot_all_reduce", tensor, group, out, n, code, local, timeout_ms)


_EXT_NAMES = ("symm_one_shot_all_reduce", "symm_two_shot_all_reduce", "symm_reduce_scatter", "symm_all_gather")


def _ext_collective(kind: int, tensor, group, out, local_input, timeout_ms) -> bool:
    """Collective kind (0 one-shot, 1 two-shot, 2 reduce-scatter, 3
    all-gather) through the extension (_ops_ext) when tensor is a CUDA
    tensor whose handle in group is known (a call on it went the ctypes way
    before): True when done; False when the caller must take the ctypes
    way, which checks and words every error (nothing was done); a failure
    of the C call raises, as the ctypes way does."""
    m = _ops_ext.loaded
    if m is None:  # not tried yet: only a CUDA tensor builds the extension
        if not tensor.is_cuda:
            return False
        m = _ops_ext.ops()
    if not m:
        return False
    st = known_state(group)
    if st is None:
        return False
    hit = st.handles.get(tensor.data_ptr())
    if hit is None or hit[0]() is not tensor:
        return False
    try:
        rc = m.collective(kind, tensor, out, local_input, hit[1], hit[2], hit[3], timeout_ms, -1)
    except TypeError:  # an argument pybind11 does not convert (a float timeout): the ctypes way takes it
        return False
    if rc == 0:
        return True
    if rc > 0:
        _raise_rc(rc, _EXT_NAMES[kind])
    return False


def _run_all_reduce(fn: str, tensor, group, out, n: int, code: int, local: int, timeout_ms: int):
    """Checks out, then runs symm_<fn> (the one-shot or two-shot kernel) on
    tensor's handle in group, in stream order on the current stream."""
    if out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous():
        raise ValueError(f"{fn}: out must be a contiguous {tensor.dtype} tensor of {n} elements "
                         f"(got {out.dtype}, {out.numel()})")
    hit = _allreduce_handle(tensor, group)
    dev = tensor.device
    stream = _current_raw_stream(dev) if dev.type == "cuda" else 0
    _fast_rc(getattr(load(), "symm_" + fn), hit[1], hit[2], n, code, 0, out.data_ptr(), local, stream, int(timeout_ms))
    return out


def _allreduce_handle(tensor, group):
    """The handle of the last all-reduce on this tensor and group, while the
    tensor lives (a new tensor at the same address goes through rendezvous
    again, which resets a recycled block's signal pad): (weak reference to
    the tensor, handle, offset, world size, rank)."""
    st = _group_state(group)
    key = tensor.data_ptr()
    hit = st.handles.get(key)
    if hit is None or hit[0]() is not tensor:
        import weakref

        h = rendezvous(tensor, st.pg)
        hit = st.handles[key] = (weakref.ref(tensor), h.handle, h.offset, h.world_size, h.rank)
    return hit


def two_shot_all_reduce(tensor, op: str = "sum", group=None, out=None, local_input=None, timeout_ms: int = 0):
    """PyTorch's symm_mem.two_shot_all_reduce_ (and two_shot_all_reduce_out
    with out): the all-reduce for large messages. tensor lives in a
    symmetric block of every rank of group; rank s sums the s-th of world
    contiguous shares of every rank's tensor and stores the sum into that
    share of every rank's tensor, so the call leaves the sum in tensor on
    every rank (in place) and returns tensor, or, with out, also copies it
    into out and returns out. local_input: copied into tensor first. In
    stream order on the current stream; float32, bfloat16 and float16, the tensor's
    bytes a multiple of 4; every rank calls it with the same shape; the
    same bits as one_shot_all_reduce. Raises SymmError (INVALID,
    NO_DEVICE when the kernels cannot run, TIMEOUT naming a rank that did
    not come)."""
    dst = tensor if out is None else out
    if op == "sum" and _ext_collective(1, tensor, group, dst, local_input, timeout_ms):
        return dst
    code, n, local = _all_reduce_args("two_shot_all_reduce", tensor, op, local_input)
    return _run_all_reduce("two_shot_all_reduce", tensor, group, tensor if out is None else out, n, code, local,
                           timeout_ms)


def _collective_args(fn: str, tensor, local_input, local_numel: int):
    """Checks of reduce_scatter and all_gather: the dtype code and the
    local input's address (0: none)."""
    code = _torch_dtype_code(fn, tensor.dtype)
    if not tensor.is_contiguous():
        raise ValueError(f"{fn}: the tensor must be contiguous")
    if local_input is None:
        return code, 0
    if local_input.dtype != tensor.dtype or local_input.numel() != local_numel or not local_input.is_contiguous():
        raise ValueError(f"{fn}: local_input must be a contiguous {tensor.dtype} tensor of {local_numel} elements "
                         f"(got {local_input.dtype}, {local_input.numel()})")
    return code, local_input.data_ptr()


def reduce_scatter(tensor, op: str = "sum", group=None, out=None, local_input=None, timeout_ms: int = 0):
    """Reduce-scatter (NCCL's semantics, PyTorch's reduce_scatter_tensor) on
    a symmetric tensor: tensor (world × n elements) lives in a symmetric
    block of every rank of group; rank r receives the sum of share r
    (elements r·n .. r·n+n−1) of every rank's tensor, in rank order with
    float32 accumulation (the same bits on every rank), in out (n elements,
    any CUDA memory) or, without out, in place in its own tensor's share r,
    returned as a view. local_input (world × n elements) is copied into
    tensor first; out may be local_input's share r. float32, bfloat16 and float16,
    n's bytes a multiple of 4; in stream order on the current stream; every
    rank calls it with the same shape. Raises ValueError or SymmError
    (INVALID, NO_DEVICE, TIMEOUT naming a rank that did not come)."""
    if op != "sum":
        raise ValueError(f"reduce_scatter: op {op!r}: only 'sum' is supported")
    if out is not None and _ext_collective(2, tensor, group, out, local_input, timeout_ms):
        return out
    hit = _allreduce_handle(tensor, group)
    world, rank = hit[3], hit[4]
    if tensor.numel() % world:
        raise ValueError(f"reduce_scatter: the tensor's {tensor.numel()} elements do not split into {world} shares")
    n = tensor.numel() // world
    code, local = _collective_args("reduce_scatter", tensor, local_input, world * n)
    if out is None:
        out = tensor.view(-1)[rank * n:(rank + 1) * n]
    elif out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous():
        raise ValueError(f"reduce_scatter: out must be a contiguous {tensor.dtype} tensor of {n} elements "
                         f"(got {out.dtype}, {out.numel()})")
    dev = tensor.device
    stream = _current_raw_stream(dev) if dev.type == "cuda" else 0
    _fast_rc(load().symm_reduce_scatter, hit[1], hit[2], n, code, 0, out.data_ptr(), local, stream, int(timeout_ms))
    return out


def all_gather(tensor, group=None, out=None, local_input=None, timeout_ms: int = 0):
    """All-gather (NCCL's semantics, PyTorch's all_gather_into_tensor) on a
    symmetric tensor: tensor (world × n elements) lives in a symmetric
    block of every rank of group, and share r of rank r's tensor is its
    input (copied there first from local_input, n elements, when given).
    Every rank's out (world × n elements, any CUDA memory), or without out
    its tensor itself (in place), receives rank s's share s at share s;
    returns it. local_input may be out's share r (NCCL's in place).
    float32, bfloat16 and float16 (a copy), n's bytes a multiple of 4; in
    stream order on the current stream; every rank calls it with the same
    shape. Raises ValueError or SymmError (INVALID, NO_DEVICE, TIMEOUT)."""
    dst = tensor if out is None else out
    if _ext_collective(3, tensor, group, dst, local_input, timeout_ms):
        return dst
    hit = _allreduce_handle(tensor, group)
    world = hit[3]
    if tensor.numel() % world:
        raise ValueError(f"all_gather: the tensor's {tensor.numel()} elements do not split into {world} shares")
    n = tensor.numel() // world
    code, local = _collective_args("all_gather", tensor, local_input, n)
    if out is None:
        out = tensor
    elif out.dtype != tensor.dtype or out.numel() != world * n or not out.is_contiguous():
        raise ValueError(f"all_gather: out must be a contiguous {tensor.dtype} tensor of {world * n} elements "
                         f"(got {out.dtype}, {out.numel()})")
    dev = tensor.device
    stream = _current_raw_stream(dev) if dev.type == "cuda" else 0
    _fast_rc(load().symm_all_gather, hit[1], hit[2], n, code, out.data_ptr(), local, stream, int(timeout_ms))
    return out


def push_all_reduce_workspace_size(world_size: int, max_bytes: int) -> int:
    """Bytes of a push all-reduce workspace for world_size ranks and messages
    of up to max_bytes bytes (4 × world_size × max_bytes, rounded up to 8)."""
    lib = load()
    lib.symm_clear_error()
    n = lib.symm_push_all_reduce_workspace_size(int(world_size), int(max_bytes))
    if not n:
        raise _from_call(_last_error(lib), f"symm.push_all_reduce_workspace_size({world_size}, {max_bytes})",
                         "symm_push_all_reduce_workspace_size")
    return n



def push_workspace(group=None, device: Any = None, max_bytes: int | None = None) -> Handle:
    """The push all-reduce workspace of group on device: a symmetric block
    of its own, allocated and rendezvoused on first use (collective: every
    rank of the group calls it, or push_all_reduce, at the same point) and
    kept while the group lives (destroy_process_group frees it). max_bytes
    (first use only) is its largest message: else SYMM_PUSH_MAX_BYTES, else
    1 MiB."""
    import torch.distributed as dist

    st = _group_state(group)
    dev = _cuda_device(device)
    hit = st.workspaces.get(dev.index)
    if hit is not None:
        return hit[1]
    with st.lock:
        if _groups.get(id(st.pg)) is not st:
            raise ValueError(f"push_workspace: process group {st.name!r} was destroyed")
        hit = st.workspaces.get(dev.index)
        if hit is not None:
            return hit[1]
        world = dist.get_world_size(st.pg)
        if max_bytes is None:
            max_bytes = _push_max_bytes_setting()
        size = push_all_reduce_workspace_size(world, max_bytes)
        _ensure_backend(dev.index)
        ptr = symm_alloc(size, dev.index)
        try:
            h = rendezvous_ptr(ptr, _group_store(st.pg), f"torch-{st.name}", dist.get_rank(st.pg), world, dev)
        except BaseException:
            symm_free(ptr)
            raise
        st.workspaces[dev.index] = (ptr, h)
        return h


def push_all_reduce(tensor, op: str = "sum", group=None, out=None, timeout_ms: int = 0):
    """All-reduce for small messages in one kernel with no barrier (the LL
    protocol: every rank pushes its tensor, flag in the same store, into
    every peer's slot of the group's workspace, then sums what arrived in
    rank order): returns the sum (a new tensor, or out, which may be tensor
    itself), in stream order on the current stream, the same bits on every
    rank. tensor is any contiguous CUDA tensor of float32, bfloat16 or
    float16 (not a symmetric one), at most the workspace's limit
    (SYMM_PUSH_MAX_BYTES, 1 MiB by default). Every rank calls it with the
    same shape and dtype, in the same order. Capturable in CUDA graphs:
    make one call first (it allocates and sets up the group's workspace).
    Raises SymmError (INVALID: bad argument or over the limit, naming it;
    NO_DEVICE when the kernels cannot run; TIMEOUT naming a rank that did not
    come, after which the group's workspace has failed)."""
    import torch

    if op == "sum" and tensor.is_cuda:
        if out is None:
            out = torch.empty_like(tensor)
        if _ext_push(tensor, group, out, timeout_ms):
            return out
    code, n, _ = _all_reduce_args("push_all_reduce", tensor, op, None)
    if out is None:
        out = torch.empty_like(tensor)
    elif out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous() or out.device != tensor.device:
        raise ValueError(f"push_all_reduce: out must be a contiguous {tensor.dtype} tensor of {n} elements on "
                         f"{tensor.device} (got {out.dtype}, {out.numel()}, {out.device})")
    dev = tensor.device
    hit = _group_state(group).workspaces.get(dev.index)
    hid = hit[1].handle if hit is not None else push_workspace(group, dev).handle
    _fast_rc(load().symm_push_all_reduce, hid, tensor.data_ptr(), out.data_ptr(), n, code, 0, _current_raw_stream(dev),
             int(timeout_ms))
    return out


def _ext_push(tensor, group, out, timeout_ms) -> bool:
    """push_all_reduce through the extension (_ops_ext) once the group has
    a workspace on tensor's device: as _ext_collective."""
    m = _ops_ext.loaded
    if m is None:
        m = _ops_ext.ops()
    if not m:
        return False
    st = known_state(group)
    hit = st.workspaces.get(tensor.get_device()) if st is not None else None
    if hit is None:
        return False
    try:
        rc = m.push(tensor, out, hit[1].handle, timeout_ms, -1)
    except TypeError:  # an argument pybind11 does not convert: the ctypes way takes it
        return False
    if rc == 0:
        return True
    if rc > 0:
        _raise_rc(rc, "symm_push_all_reduce")
    return False


# SYMM_ALL_REDUCE_AUTO, _PUSH, ... by code: ("auto", "push", "two_shot", "one_shot").
ALL_REDUCE_ALGORITHMS = tuple(_names(AllReduceAlgorithm))


def _push_max_bytes_setting() -> int:
    """The largest message of a push workspace made now: the library's
    SYMM_PUSH_MAX_BYTES, else 1 MiB, as the workspace takes it (rounded up
    to 8; symm_push_max_bytes_setting). Raises SymmError (INVALID) naming a
    bad value."""
    got = ctypes.c_size_t(0)
    _fast_rc(load().symm_push_max_bytes_setting, ctypes.byref(got))
    return got.value


def _all_reduce_setting() -> str:
    """What the library's SYMM_ALL_REDUCE sets: "auto" or the algorithm it
    forces (symm_all_reduce_setting). Raises SymmError (INVALID) naming a bad
    setting."""
    got = ctypes.c_int(-1)
    _fast_rc(load().symm_all_reduce_setting, ctypes.byref(got))
    return ALL_REDUCE_ALGORITHMS[got.value]


def all_reduce_algorithm(world_size: int, nbytes: int, push_max_bytes: int | None = None,
                         algorithm: str | None = None) -> str:
    """The algorithm ("push", "two_shot" or "one_shot") that
    :func:`all_reduce` runs for a message of nbytes bytes on world_size
    ranks (symm_all_reduce_algorithm, torch-free): algorithm when given and
    not "auto", else SYMM_ALL_REDUCE when it forces one, else the measured
    crossovers (the push up to 1 MiB on 2 ranks, 256 KiB on 3, 128 KiB on
    4 and more; the two-shot above), the push only up to push_max_bytes (the
    push workspace's limit; None: SYMM_PUSH_MAX_BYTES, else 1 MiB).
    Raises SymmError (INVALID: a bad SYMM_ALL_REDUCE, naming it, or a push
    asked for over the limit) or ValueError for an unknown algorithm."""
    if algorithm is None:
        algorithm = "auto"
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        want = _one_of(["None"] + [repr(a) for a in ALL_REDUCE_ALGORITHMS])
        raise ValueError(f"all_reduce: algorithm {algorithm!r}: want {want}")
    if push_max_bytes is None:
        push_max_bytes = _push_max_bytes_setting()
    chosen = ctypes.c_int(-1)
    _fast_rc(load().symm_all_reduce_algorithm, int(world_size), int(nbytes), int(push_max_bytes),
             ALL_REDUCE_ALGORITHMS.index(algorithm), ctypes.byref(chosen))
    return ALL_REDUCE_ALGORITHMS[chosen.value]


SCRATCH_MIN_BYTES = 1 << 20


def _all_reduce_scratch(group, dev, nbytes: int) -> Handle:
    """The symmetric scratch buffer of group on dev for the one-shot and
    two-shot of all_reduce: allocated and rendezvoused on first use, and
    again, twice as large as needed (at least 1 MiB, a power of two), when a
    larger message comes (collective: every rank calls with the same sizes;
    the old one is freed once this device's work is done, by which time
    every peer is done with it too: each kernel meets every peer after its
    last access)."""
    import torch
    import torch.distributed as dist

    st = _group_state(group)
    hit = st.scratch.get(dev.index)
    if hit is not None and hit[1] >= nbytes:
        return hit[2]
    # One thread at a time frees the old buffer and makes the new one; a
    # second finds the first's, large enough, and makes none.
    with st.lock:
        if _groups.get(id(st.pg)) is not st:
            raise ValueError(f"all_reduce: process group {st.name!r} was destroyed")
        hit = st.scratch.get(dev.index)
        if hit is not None and hit[1] >= nbytes:
            return hit[2]
        size = max(SCRATCH_MIN_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        if hit is not None:
            del st.scratch[dev.index]
            torch.cuda.synchronize(dev)
            symm_free(hit[0])
        _ensure_backend(dev.index)
        ptr = symm_alloc(size, dev.index)
        try:
            h = rendezvous_ptr(ptr, _group_store(st.pg), f"torch-{st.name}", dist.get_rank(st.pg),
                               dist.get_world_size(st.pg), dev)
        except BaseException:
            symm_free(ptr)
            raise
        st.scratch[dev.index] = (ptr, size, h)
        return h


# Messages from this size up, of a tensor outside symmetric memory, go to
# the process group's own all-reduce when it is NCCL: the two-shot would
# first copy the tensor into the symmetric scratch buffer and the sum back
# out, two passes over HBM that cost more than NCCL's whole call there. On
# 2 × H200 (2026-11-26, tests/device/symm_bench.py 2, 96 blocks, µs, bf16):
# 16 MiB 78.5 through the scratch buffer against 83.2 for NCCL, 64 MiB 319
# against 250, 256 MiB 1246 against 887. Larger worlds keep this size
# (not yet measured on more GPUs). A symmetric tensor needs no copy:
# two_shot_all_reduce runs in place on it at every size.
NCCL_FROM_BYTES = 32 << 20

def _all_reduce_plan(tensor, group, nbytes: int, algorithm) -> str:
    """The algorithm all_reduce runs for this group, device, size, dtype
    and argument: all_reduce_algorithm's choice, or "nccl" for a large
    message when nothing forces one and the group's backend is NCCL. Kept
    per shape, so that a repeated call pays for none of the lookups."""
    import torch.distributed as dist

    st = _group_state(group)
    key = (tensor.device.index, nbytes, tensor.dtype, algorithm)
    alg = st.plans.get(key)
    if alg is not None:
        return alg
    pg = st.pg
    ws = st.workspaces.get(tensor.device.index)
    push_max = ws[1].push_max_bytes if ws is not None else _push_max_bytes_setting()
    alg = all_reduce_algorithm(dist.get_world_size(pg), nbytes, push_max, algorithm)
    forced = (algorithm not in (None, "auto")) or _all_reduce_setting() != "auto"
    if alg != "push" and not forced and nbytes >= NCCL_FROM_BYTES and dist.get_backend(pg) == "nccl":
        alg = "nccl"
    st.plans[key] = alg
    return alg


def all_reduce(tensor, op: str = "sum", group=None, out=None, algorithm: str | None = None, timeout_ms: int = 0):
    """All-reduce of any contiguous CUDA tensor over group, with the
    algorithm libsymm chooses (:func:`all_reduce_algorithm`: the push
    all-reduce for small messages, the two-shot for large ones, from
    measured crossovers; SYMM_ALL_REDUCE or algorithm="push", "two_shot" or
    "one_shot" forces one). From NCCL_FROM_BYTES (32 MiB) on, unless an
    algorithm is forced, a group whose backend is NCCL runs its own
    all_reduce on the tensor instead (it needs no copy into symmetric
    memory; timeout_ms does not apply to it). Returns the sum in out (a new tensor when None;
    it may be tensor itself), in stream order on the current stream, the
    same bits on every rank. The push runs on the group's push workspace
    (:func:`push_all_reduce`); the two-shot and the one-shot copy tensor
    into the group's symmetric scratch buffer (allocated and rendezvoused on
    the first call, grown when a larger message comes: make one call of the
    largest size before capturing a CUDA graph). Every rank calls it with
    the same shape, dtype and algorithm, in the same order. float32,
    bfloat16 and float16. Raises ValueError for a bad argument,
    SymmError as the algorithm's own call does."""
    import torch
    import torch.distributed as dist

    if op != "sum":
        raise ValueError(f"all_reduce: op {op!r}: only 'sum' is supported")
    if not tensor.is_contiguous() or tensor.device.type != "cuda":
        raise ValueError(f"all_reduce: the tensor must be a contiguous CUDA tensor (got one on {tensor.device}, "
                         f"contiguous: {tensor.is_contiguous()})")
    n = tensor.numel()
    if out is None:
        out = torch.empty_like(tensor)
    elif out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous() or out.device != tensor.device:
        raise ValueError(f"all_reduce: out must be a contiguous {tensor.dtype} tensor of {n} elements on "
                         f"{tensor.device} (got {out.dtype}, {out.numel()}, {out.device})")
    dev = tensor.device
    es = tensor.element_size()
    alg = _all_reduce_plan(tensor, group, n * es, algorithm)
    if alg == "push":
        return push_all_reduce(tensor, group=group, out=out, timeout_ms=timeout_ms)
    pg = _resolve_group(group)
    if alg == "nccl":
        if out.data_ptr() != tensor.data_ptr():
            out.copy_(tensor)
        dist.all_reduce(out, group=pg)
        return out
    code = _torch_dtype_code("all_reduce", tensor.dtype, f" with the {alg} all-reduce")
    if n == 0:
        return out
    count = n + (n * es) % 4 // es  # an odd bfloat16 count: one element more, summed and dropped
    h = _all_reduce_scratch(pg, dev, count * es)
    buf = h.buffer_ptrs[h.rank]
    stream = _current_raw_stream(dev)
    local = tensor.data_ptr()
    if count != n:
        _tensor_at(buf, (count,), tensor.dtype, dev)[:n].copy_(tensor)
        local = 0
    if alg == "two_shot":
        dst = out.data_ptr() if count == n else buf
        _fast_rc(load().symm_two_shot_all_reduce, h.handle, h.offset, count, code, 0, dst, local, stream,
                 int(timeout_ms))
        if count != n:
            out.copy_(_tensor_at(buf, (count,), tensor.dtype, dev)[:n].view(out.shape))
        return out
    dst = out if count == n else torch.empty(count, dtype=tensor.dtype, device=dev)
    _fast_rc(load().symm_one_shot_all_reduce, h.handle, h.offset, count, code, 0, dst.data_ptr(), local, stream,
             int(timeout_ms))
    if count != n:
        out.copy_(dst[:n].view(out.shape))
    return out
