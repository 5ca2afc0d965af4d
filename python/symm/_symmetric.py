"""Symmetric memory: blocks every rank of a group maps, as in
torch.distributed._symmetric_memory.

Torch-free layer (ctypes): :class:`Store`, :func:`symm_alloc`, :func:`symm_free`,
:func:`rendezvous_ptr` and :class:`Handle`. The PyTorch layer (:func:`empty`,
:func:`rendezvous`, :func:`get_mempool_allocator`) sits on top and imports
torch lazily.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Sequence

from ._errors import ErrorCode, SymmError
from ._loader import HandleInfo, load, library_path
from ._pool import _call_rc, _call_void, _device, _from_call, _last_error, _nbytes, _python_call

SIGNAL_PAD_SIZE = 2048


class Store:
    """A libsymm TCP store: :meth:`server` starts one here, :meth:`connect` joins one."""

    def __init__(self, handle: int, address: str):
        self._h = handle
        self.address = address

    @classmethod
    def server(cls, addr: str = "", token: str | None = None) -> "Store":
        lib = load()
        out = ctypes.c_int64()
        bound = ctypes.create_string_buffer(256)
        tok = (token if token is not None else os.environ.get("SYMM_STORE_TOKEN", "")).encode()
        _call_rc(lib.symm_store_server, addr.encode(), tok, ctypes.byref(out), bound, len(bound))
        return cls(out.value, bound.value.decode())

    @classmethod
    def connect(cls, addr: str, token: str | None = None, timeout_ms: int = 60000) -> "Store":
        lib = load()
        out = ctypes.c_int64()
        tok = (token if token is not None else os.environ.get("SYMM_STORE_TOKEN", "")).encode()
        _call_rc(lib.symm_store_connect, addr.encode(), tok, int(timeout_ms), ctypes.byref(out))
        return cls(out.value, addr)

    def set(self, key: str, value: bytes) -> None:
        _call_rc(load().symm_store_set, self._h, key.encode(), value, len(value))

    def get(self, key: str, timeout_ms: int = 60000) -> bytes:
        lib = load()
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(4096)
        _call_rc(lib.symm_store_get, self._h, key.encode(), buf, len(buf), ctypes.byref(n), int(timeout_ms))
        if n.value > len(buf):
            buf = ctypes.create_string_buffer(n.value)
            _call_rc(lib.symm_store_get, self._h, key.encode(), buf, len(buf), ctypes.byref(n), int(timeout_ms))
        return buf.raw[: n.value]

    def add(self, key: str, delta: int) -> int:
        out = ctypes.c_int64()
        _call_rc(load().symm_store_add, self._h, key.encode(), int(delta), ctypes.byref(out))
        return out.value

    def close(self) -> None:
        if self._h:
            h, self._h = self._h, 0
            _call_rc(load().symm_store_close, h)

    @property
    def handle(self) -> int:
        return self._h

    def world_within_direct_access(self) -> bool:
        """True: a rendezvous succeeds only once every peer is mapped."""
        return True


def symm_alloc(size: int, device: Any = 0) -> int:
    """Allocates a symmetric block; returns the buffer's address. A size that
    is not an integer raises TypeError, a negative one ValueError."""
    size = _nbytes(size, "symm.symm_alloc")
    dev = _device(device)
    lib = load()
    lib.symm_clear_error()
    ptr = lib.symm_alloc(size, dev, None)
    if not ptr:
        call = f"symm.symm_alloc({size}, device={dev})"
        if lib.symm_last_error_code() != ErrorCode.OK:
            raise _from_call(_last_error(lib), call, "symm_alloc")
        raise SymmError(ErrorCode.INVALID, f"{call}: the library returned no block and no error")
    return ptr


def symm_free(ptr: int) -> None:
    lib = load()
    _call_void(lib.symm_free, ptr, 0, 0, None)


def has_multicast_support(device: Any = 0) -> bool:
    """Always False: libsymm never creates multicast objects."""
    return bool(load().symm_has_multicast_support(_device(device)))


class Handle:
    """A block joined with a group: peers' buffers and signal pads, signals."""

    def __init__(self, handle: int, device: Any = None):
        self._h = handle
        self._device = device
        self.device = device  # PyTorch's handle has .device too
        info = HandleInfo()
        _call_rc(load().symm_handle_info, handle, ctypes.byref(info))
        self.rank = info.rank
        self.world_size = info.world_size
        self.buffer_size = info.buffer_size
        self.signal_pad_size = info.signal_pad_size
        n = info.world_size
        self.buffer_ptrs = list((ctypes.c_uint64 * n).from_address(info.buffer_ptrs))
        self.signal_pad_ptrs = list((ctypes.c_uint64 * n).from_address(info.signal_pad_ptrs))
        self.buffer_ptrs_dev = info.buffer_ptrs_dev
        self.signal_pad_ptrs_dev = info.signal_pad_ptrs_dev
        self.offset = 0  # of the buffers seen here from the start of each rank's block
        self.multicast_ptr = 0  # libsymm never creates multicast objects

    @property
    def handle(self) -> int:
        return self._h

    def world_within_direct_access(self) -> bool:
        """True: a rendezvous succeeds only once every peer is mapped."""
        return True

    def _stream(self, stream) -> int:
        if stream is not None:
            return int(getattr(stream, "cuda_stream", stream))
        if self._device is not None:
            return _current_raw_stream(self._device)
        return 0

    def barrier(self, channel: int = 0, timeout_ms: int = 0, stream=None) -> None:
        """Every rank signals every other on channel, then waits for each
        (queued on the current stream, as PyTorch's barrier). timeout_ms > 0:
        the host also watches the stream and raises SymmError(TIMEOUT) naming
        the rank and channel if it has not drained in time. 0: a watchdog
        checks it in the background for SYMM_TIMEOUT_MS; a barrier that never
        completes fails the handle, and its next call raises SymmError(TIMEOUT).
        With the signal kernels a timeout fails the handle in both cases."""
        _fast_rc(load().symm_barrier, self._h, int(channel), self._stream(stream), int(timeout_ms))

    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0, stream=None) -> None:
        del timeout_ms  # the C call has none: on GPUs the put is queued on the stream; on host it waits at most SYMM_TIMEOUT_MS
        _fast_rc(load().symm_put_signal, self._h, int(dst_rank), int(channel), self._stream(stream))

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0, stream=None) -> None:
        _fast_rc(load().symm_wait_signal, self._h, int(src_rank), int(channel), self._stream(stream), int(timeout_ms))

    # ---- tensors (torch) ----

    def get_buffer(self, rank: int, sizes: Sequence[int], dtype, storage_offset: int = 0):
        """A tensor over rank's buffer, as mapped in this process (any dtype)."""
        import torch

        _check_rank("get_buffer", rank, self.world_size)
        sizes = _sizes(sizes)
        elem = _elem_size(dtype)
        numel = 1
        for s in sizes:
            numel *= s
        end = (storage_offset + numel) * elem
        if end > self.buffer_size:
            raise ValueError(f"get_buffer: {numel} elements at offset {storage_offset} need {end} bytes; "
                             f"the buffer has {self.buffer_size}")
        return _tensor_at(self.buffer_ptrs[rank] + storage_offset * elem, sizes, dtype, self._device)

    def get_signal_pad(self, rank: int, sizes: Sequence[int] | None = (), dtype=None, storage_offset: int = 0):
        """A tensor over rank's signal pad (PyTorch's defaults: the whole pad
        as uint32; any dtype)."""
        import torch

        _check_rank("get_signal_pad", rank, self.world_size)
        dtype = dtype or torch.uint32
        elem = _elem_size(dtype)
        sizes = _sizes(sizes) if sizes else (self.signal_pad_size // elem - storage_offset,)
        numel = 1
        for n in sizes:
            numel *= n
        if storage_offset < 0 or (storage_offset + numel) * elem > self.signal_pad_size:
            raise ValueError(f"get_signal_pad: {numel} elements of {dtype} at offset {storage_offset} do not fit "
                             f"the {self.signal_pad_size}-byte signal pad")
        return _tensor_at(self.signal_pad_ptrs[rank] + storage_offset * elem, sizes, dtype, self._device)

    def get_remote_tensor(self, peer: int, sizes: Sequence[int], dtype):
        """PyTorch's name for get_buffer(peer, sizes, dtype)."""
        return self.get_buffer(peer, sizes, dtype)

    def one_shot_all_reduce_ptr(self, offset: int, count: int, dtype: str, out: int, local_input: int = 0,
                                op: str = "sum", timeout_ms: int = 0, stream=None) -> None:
        """symm_one_shot_all_reduce on raw addresses (torch-free): count
        elements of dtype ("float32", "bfloat16" or "float16") at byte offset of every
        rank's buffer (from the handle's own start, self.offset included),
        summed into out."""
        if dtype not in _DTYPES:
            raise ValueError(f"one_shot_all_reduce: dtype {dtype!r}: want float32, bfloat16 or float16")
        if op not in _OPS:
            raise ValueError(f"one_shot_all_reduce: op {op!r}: only 'sum' is supported")
        _fast_rc(load().symm_one_shot_all_reduce, self._h, int(self.offset + offset), int(count), _DTYPES[dtype],
                 _OPS[op], int(out), int(local_input), self._stream(stream), int(timeout_ms))

    def two_shot_all_reduce_ptr(self, offset: int, count: int, dtype: str, out: int = 0, local_input: int = 0,
                                op: str = "sum", timeout_ms: int = 0, stream=None) -> None:
        """symm_two_shot_all_reduce on raw addresses (torch-free): count
        elements of dtype ("float32", "bfloat16" or "float16") at byte offset of every
        rank's buffer (from the handle's own start, self.offset included)
        are summed into every rank's buffer there (in place; out 0 means
        that address) and, when out is another address, copied into out."""
        if dtype not in _DTYPES:
            raise ValueError(f"two_shot_all_reduce: dtype {dtype!r}: want float32, bfloat16 or float16")
        if op not in _OPS:
            raise ValueError(f"two_shot_all_reduce: op {op!r}: only 'sum' is supported")
        at = int(self.offset + offset)
        if not out:
            out = self.buffer_ptrs[self.rank] + int(offset)
        _fast_rc(load().symm_two_shot_all_reduce, self._h, at, int(count), _DTYPES[dtype], _OPS[op], int(out),
                 int(local_input), self._stream(stream), int(timeout_ms))

    def reduce_scatter_ptr(self, offset: int, count: int, dtype: str, out: int = 0, local_input: int = 0,
                           op: str = "sum", timeout_ms: int = 0, stream=None) -> None:
        """symm_reduce_scatter on raw addresses (torch-free): every rank's
        buffer holds world shares of count elements of dtype ("float32",
        "bfloat16" or "float16") at byte offset (from the handle's own start,
        self.offset included); the rank-order sum of share rank of every
        rank's buffer goes to out (0: that share of this rank's buffer, in
        place). local_input (world × count elements) is copied in first."""
        if dtype not in _DTYPES:
            raise ValueError(f"reduce_scatter: dtype {dtype!r}: want float32, bfloat16 or float16")
        if op not in _OPS:
            raise ValueError(f"reduce_scatter: op {op!r}: only 'sum' is supported")
        if not out:
            out = self.buffer_ptrs[self.rank] + int(offset) + self.rank * int(count) * (4 if dtype == "float32" else 2)
        _fast_rc(load().symm_reduce_scatter, self._h, int(self.offset + offset), int(count), _DTYPES[dtype],
                 _OPS[op], int(out), int(local_input), self._stream(stream), int(timeout_ms))

    def all_gather_ptr(self, offset: int, count: int, dtype: str, out: int = 0, local_input: int = 0,
                       timeout_ms: int = 0, stream=None) -> None:
        """symm_all_gather on raw addresses (torch-free): every rank's
        buffer holds world shares of count elements of dtype ("float32",
        "bfloat16" or "float16") at byte offset, share rank being this
        rank's input (copied there first from local_input when given); out
        (0: this rank's buffer there, in place) receives every rank's share
        at its place."""
        if dtype not in _PUSH_DTYPES:
            raise ValueError(f"all_gather: dtype {dtype!r}: want float32, bfloat16 or float16")
        if not out:
            out = self.buffer_ptrs[self.rank] + int(offset)
        _fast_rc(load().symm_all_gather, self._h, int(self.offset + offset), int(count), _PUSH_DTYPES[dtype],
                 int(out), int(local_input), self._stream(stream), int(timeout_ms))

    def push_all_reduce_ptr(self, in_ptr: int, out_ptr: int, count: int, dtype: str = "float32", op: str = "sum",
                            timeout_ms: int = 0, stream=None) -> None:
        """symm_push_all_reduce on raw addresses (torch-free), this handle
        being a push workspace (see :func:`push_all_reduce_workspace_size`):
        count elements of dtype ("float32", "bfloat16" or "float16") at
        in_ptr of every rank, summed into out_ptr (which may be in_ptr)."""
        if dtype not in _PUSH_DTYPES:
            raise ValueError(f"push_all_reduce: dtype {dtype!r}: want float32, bfloat16 or float16")
        if op not in _OPS:
            raise ValueError(f"push_all_reduce: op {op!r}: only 'sum' is supported")
        _fast_rc(load().symm_push_all_reduce, self._h, int(in_ptr), int(out_ptr), int(count), _PUSH_DTYPES[dtype],
                 _OPS[op], self._stream(stream), int(timeout_ms))

    @property
    def push_max_bytes(self) -> int:
        """The largest message this handle takes as a push workspace."""
        return 8 * (self.buffer_size // (32 * self.world_size))


_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
_PUSH_DTYPES = _DTYPES
_TORCH_DTYPES: dict = {}


def _fast_rc(fn, *args) -> None:
    """_call_rc for the signal and all-reduce calls: one C call when it
    succeeds (the library sets the last error whenever it fails)."""
    rc = fn(*args)
    if rc:
        err = _last_error(load())
        if err.code == ErrorCode.OK:
            from ._errors import make_error

            err = make_error(rc, f"{fn.__name__} failed with code {rc}")
        raise _from_call(err, _python_call(), fn.__name__)


def _current_raw_stream(device) -> int:
    """The cudaStream_t of device's current stream (torch._C's raw getter:
    no Stream object is made)."""
    import torch

    idx = getattr(device, "index", device)
    if idx is None:
        idx = torch.cuda.current_device()
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return get(idx)
    return torch.cuda.current_stream(idx).cuda_stream
_allreduce_handles: dict = {}
_OPS = {"sum": 0}


def kernels_ready(device: Any = 0) -> bool:
    """True when libsymm's kernels (signals, one-shot all-reduce) run on
    device: NVRTC found, kernels compiled (or cached) and loaded. When False,
    last_error() says why; signals then use stream memory operations."""
    return bool(load().symm_kernels_ready(_device(device)))


def kernels_status(device: Any = 0) -> str:
    """"ready", or why the kernels cannot run on device."""
    if kernels_ready(device):
        return "ready"
    from ._pool import _last_error

    return str(_last_error(load()))


def _all_reduce_args(fn: str, tensor, op: str, local_input):
    """The checks the one-shot and two-shot all-reduce share: the dtype
    code, the element count and the local input's address (0: none)."""
    import torch

    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    code = _TORCH_DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{fn}: dtype {tensor.dtype}: want torch.float32, torch.bfloat16 or torch.float16")
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

    code, n, local = _all_reduce_args("one_shot_all_reduce", tensor, op, local_input)
    if out is None:
        out = torch.empty_like(local_input if local_input is not None else tensor)
    elif out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous():
        raise ValueError(f"one_shot_all_reduce: out must be a contiguous {tensor.dtype} tensor of {n} elements "
                         f"(got {out.dtype}, {out.numel()})")
    hit = _allreduce_handle(tensor, group)
    dev = tensor.device
    stream = _current_raw_stream(dev) if dev.type == "cuda" else 0
    _fast_rc(load().symm_one_shot_all_reduce, hit[1], hit[2], n, code, 0, out.data_ptr(), local, stream, int(timeout_ms))
    return out


def _allreduce_handle(tensor, group):
    """The handle of the last all-reduce on this tensor and group, while the
    tensor lives (a new tensor at the same address goes through rendezvous
    again, which resets a recycled block's signal pad): (weak reference to
    the tensor, handle, offset, world size, rank)."""
    key = (tensor.data_ptr(), group if group is None or isinstance(group, str) else id(group))
    hit = _allreduce_handles.get(key)
    if hit is None or hit[0]() is not tensor:
        import weakref

        h = rendezvous(tensor, group)
        hit = _allreduce_handles[key] = (weakref.ref(tensor), h.handle, h.offset, h.world_size, h.rank)
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
    code, n, local = _all_reduce_args("two_shot_all_reduce", tensor, op, local_input)
    if out is None:
        out = tensor
    elif out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous():
        raise ValueError(f"two_shot_all_reduce: out must be a contiguous {tensor.dtype} tensor of {n} elements "
                         f"(got {out.dtype}, {out.numel()})")
    hit = _allreduce_handle(tensor, group)
    dev = tensor.device
    stream = _current_raw_stream(dev) if dev.type == "cuda" else 0
    _fast_rc(load().symm_two_shot_all_reduce, hit[1], hit[2], n, code, 0, out.data_ptr(), local, stream, int(timeout_ms))
    return out


def _collective_args(fn: str, tensor, dtypes: dict, local_input, local_numel: int):
    """Checks of reduce_scatter and all_gather: the dtype code and the
    local input's address (0: none)."""
    code = dtypes.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{fn}: dtype {tensor.dtype}: want one of " + ", ".join(str(d) for d in dtypes))
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
    import torch

    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    if op != "sum":
        raise ValueError(f"reduce_scatter: op {op!r}: only 'sum' is supported")
    hit = _allreduce_handle(tensor, group)
    world, rank = hit[3], hit[4]
    if tensor.numel() % world:
        raise ValueError(f"reduce_scatter: the tensor's {tensor.numel()} elements do not split into {world} shares")
    n = tensor.numel() // world
    code, local = _collective_args("reduce_scatter", tensor, _TORCH_DTYPES, local_input, world * n)
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
    import torch

    if not _PUSH_TORCH_DTYPES:
        _PUSH_TORCH_DTYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    hit = _allreduce_handle(tensor, group)
    world = hit[3]
    if tensor.numel() % world:
        raise ValueError(f"all_gather: the tensor's {tensor.numel()} elements do not split into {world} shares")
    n = tensor.numel() // world
    code, local = _collective_args("all_gather", tensor, _PUSH_TORCH_DTYPES, local_input, n)
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


_push_workspaces: dict = {}
PUSH_MAX_BYTES = 1 << 20


def push_workspace(group=None, device: Any = None, max_bytes: int | None = None) -> Handle:
    """The push all-reduce workspace of group on device: a symmetric block
    of its own, allocated and rendezvoused on first use (collective: every
    rank of the group calls it, or push_all_reduce, at the same point) and
    kept for the life of the process. max_bytes (first use only) is its
    largest message: else SYMM_PUSH_MAX_BYTES, else 1 MiB."""
    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    dev = _cuda_device(device)
    name = getattr(group, "group_name", None) or "0"
    key = (name, dev.index)
    h = _push_workspaces.get(key)
    if h is not None:
        return h
    world = dist.get_world_size(group)
    if max_bytes is None:
        max_bytes = int(os.environ.get("SYMM_PUSH_MAX_BYTES", PUSH_MAX_BYTES))
    size = push_all_reduce_workspace_size(world, max_bytes)
    _ensure_backend(dev.index)
    ptr = symm_alloc(size, dev.index)
    try:
        h = rendezvous_ptr(ptr, _group_store(group), f"torch-{name}-push", dist.get_rank(group), world, dev)
    except BaseException:
        symm_free(ptr)
        raise
    _push_workspaces[key] = h
    return h


_PUSH_TORCH_DTYPES: dict = {}
_push_handles: dict = {}  # (group or its id, device index) -> workspace handle: no lookup per call


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

    if not _PUSH_TORCH_DTYPES:
        _PUSH_TORCH_DTYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    code = _PUSH_TORCH_DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"push_all_reduce: dtype {tensor.dtype}: want torch.float32, torch.bfloat16 or torch.float16")
    if op != "sum":
        raise ValueError(f"push_all_reduce: op {op!r}: only 'sum' is supported")
    if not tensor.is_contiguous():
        raise ValueError("push_all_reduce: the tensor must be contiguous")
    n = tensor.numel()
    if out is None:
        out = torch.empty_like(tensor)
    elif out.dtype != tensor.dtype or out.numel() != n or not out.is_contiguous() or out.device != tensor.device:
        raise ValueError(f"push_all_reduce: out must be a contiguous {tensor.dtype} tensor of {n} elements on "
                         f"{tensor.device} (got {out.dtype}, {out.numel()}, {out.device})")
    dev = tensor.device
    key = (group if group is None or isinstance(group, str) else id(group), dev.index)
    hid = _push_handles.get(key)
    if hid is None:
        hid = _push_handles[key] = push_workspace(group, dev).handle
    _fast_rc(load().symm_push_all_reduce, hid, tensor.data_ptr(), out.data_ptr(), n, code, 0, _current_raw_stream(dev),
             int(timeout_ms))
    return out


ALL_REDUCE_ALGORITHMS = ("auto", "push", "two_shot", "one_shot")  # SYMM_ALL_REDUCE_AUTO, _PUSH, ...


def _push_max_bytes_setting() -> int:
    """The largest message of a push workspace made now (SYMM_PUSH_MAX_BYTES,
    else 1 MiB), as the workspace takes it (rounded up to 8)."""
    n = int(os.environ.get("SYMM_PUSH_MAX_BYTES", PUSH_MAX_BYTES))
    return (n + 7) // 8 * 8


def all_reduce_algorithm(world_size: int, nbytes: int, push_max_bytes: int | None = None,
                         algorithm: str | None = None) -> str:
    """The algorithm ("push", "two_shot" or "one_shot") that
    :func:`all_reduce` runs for a message of nbytes bytes on world_size
    ranks (symm_all_reduce_algorithm, torch-free): algorithm when given and
    not "auto", else SYMM_ALL_REDUCE when it forces one, else the measured
    crossovers (the push up to 512 KiB on 2 ranks, 256 KiB on 3, 128 KiB on
    4 and more; the two-shot above), the push only up to push_max_bytes (the
    push workspace's limit; None: SYMM_PUSH_MAX_BYTES, else 1 MiB).
    Raises SymmError (INVALID: a bad SYMM_ALL_REDUCE, naming it, or a push
    asked for over the limit) or ValueError for an unknown algorithm."""
    if algorithm is None:
        algorithm = "auto"
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(f"all_reduce: algorithm {algorithm!r}: want None, 'auto', 'push', 'two_shot' or 'one_shot'")
    if push_max_bytes is None:
        push_max_bytes = _push_max_bytes_setting()
    chosen = ctypes.c_int(-1)
    _fast_rc(load().symm_all_reduce_algorithm, int(world_size), int(nbytes), int(push_max_bytes),
             ALL_REDUCE_ALGORITHMS.index(algorithm), ctypes.byref(chosen))
    return ALL_REDUCE_ALGORITHMS[chosen.value]


def _resolve_group(group):
    """(process group, its name) for a ProcessGroup, its name or None."""
    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    return group, getattr(group, "group_name", None) or "0"


_scratch: dict = {}  # (group name, device index) -> (pointer, bytes, Handle)
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

    group, name = _resolve_group(group)
    key = (name, dev.index)
    hit = _scratch.get(key)
    if hit is not None and hit[1] >= nbytes:
        return hit[2]
    size = max(SCRATCH_MIN_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
    if hit is not None:
        del _scratch[key]
        torch.cuda.synchronize(dev)
        symm_free(hit[0])
    _ensure_backend(dev.index)
    ptr = symm_alloc(size, dev.index)
    try:
        h = rendezvous_ptr(ptr, _group_store(group), f"torch-{name}-all_reduce", dist.get_rank(group),
                           dist.get_world_size(group), dev)
    except BaseException:
        symm_free(ptr)
        raise
    _scratch[key] = (ptr, size, h)
    return h


def all_reduce(tensor, op: str = "sum", group=None, out=None, algorithm: str | None = None, timeout_ms: int = 0):
    """All-reduce of any contiguous CUDA tensor over group, with the
    algorithm libsymm chooses (:func:`all_reduce_algorithm`: the push
    all-reduce for small messages, the two-shot for large ones, from
    measured crossovers; SYMM_ALL_REDUCE or algorithm="push", "two_shot" or
    "one_shot" forces one). Returns the sum in out (a new tensor when None;
    it may be tensor itself), in stream order on the current stream, the
    same bits on every rank. The push runs on the group's push workspace
    (:func:`push_all_reduce`); the two-shot and the one-shot copy tensor
    into the group's symmetric scratch buffer (allocated and rendezvoused on
    the first call, grown when a larger message comes: make one call of the
    largest size before capturing a CUDA graph). Every rank calls it with
    the same shape, dtype and algorithm, in the same order. float32 and
    bfloat16 (float16: the push only). Raises ValueError for a bad argument,
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
    pg, name = _resolve_group(group)
    es = tensor.element_size()
    ws = _push_workspaces.get((name, dev.index))
    push_max = ws.push_max_bytes if ws is not None else _push_max_bytes_setting()
    alg = all_reduce_algorithm(dist.get_world_size(pg), n * es, push_max, algorithm)
    if alg == "push":
        return push_all_reduce(tensor, group=group, out=out, timeout_ms=timeout_ms)
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: 0, torch.bfloat16: 1, torch.float16: 2})
    code = _TORCH_DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"all_reduce: dtype {tensor.dtype} with the {alg} all-reduce: want torch.float32 or "
                         f"torch.bfloat16 (float16 runs on the push only, up to {push_max} bytes)")
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


def _sizes(sizes) -> tuple:
    if isinstance(sizes, int):
        return (int(sizes),)
    return tuple(int(n) for n in sizes)


def _elem_size(dtype) -> int:
    import torch

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, not {dtype!r}")
    return dtype.itemsize


def _check_rank(fn: str, rank: int, world: int) -> None:
    if not 0 <= int(rank) < world:
        raise ValueError(f"{fn}: rank {rank} outside [0, {world})")


def _tensor_at(ptr: int, sizes: tuple, dtype, device):
    """A tensor of any dtype viewing memory at ptr: bytes through
    __cuda_array_interface__ (device memory) or ctypes (host memory), then
    reinterpreted as dtype, so unsigned, float8 and complex types work too."""
    import torch

    numel = 1
    for s in sizes:
        numel *= s
    nbytes = numel * dtype.itemsize
    if device is None:
        raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
        return torch.frombuffer(raw, dtype=torch.uint8)[:nbytes].view(dtype).view(sizes)

    class _View:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    return torch.as_tensor(_View(), device=device).view(dtype).view(sizes)


def world_within_direct_access_store(store: Store, group_name: str, rank: int, world_size: int, device: int = 0) -> bool:
    """Whether every rank of the group (each on its device) can map every
    other rank's memory; every rank calls it and gets the same answer (torch-free)."""
    out = ctypes.c_int()
    _call_rc(load().symm_world_within_direct_access, store.handle, group_name.encode(), int(rank), int(world_size),
             int(device), ctypes.byref(out))
    return bool(out.value)


def world_within_direct_access(group=None, device: Any = None) -> bool:
    """Whether every rank of a torch process group can map every other rank's
    GPU memory directly (peer access over NVLink or PCIe). Collective: every
    rank of the group calls it."""
    import torch
    import torch.distributed as dist

    group = group or dist.group.WORLD
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    dev = torch.cuda.current_device() if device is None else _device(device)
    name = getattr(group, "group_name", None) or "0"
    return world_within_direct_access_store(_group_store(group), f"torch-{name}", dist.get_rank(group),
                                            dist.get_world_size(group), dev)


def rendezvous_ptr(ptr: int, store: Store, group_name: str, rank: int, world_size: int, device=None) -> Handle:
    """Rendezvous of the block holding ptr (torch-free)."""
    out = ctypes.c_int64()
    _call_rc(load().symm_rendezvous, ptr, store.handle, group_name.encode(), int(rank), int(world_size),
             ctypes.byref(out))
    return Handle(out.value, device)


# ---- PyTorch layer ------------------------------------------------------------

_mempool_allocators: dict = {}
_mempools: dict = {}
_stores: dict = {}


def _lib_from_site_packages(var: str, rel: str) -> None:
    """Points var (SYMM_NVSHMEM_LIB, SYMM_NCCL_LIB) at pip's copy of the
    library (rel under site-packages) unless it is set already: libsymm
    also tries the loader path."""
    import site

    if os.environ.get(var):
        return
    try:
        dirs = site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:
        dirs = []
    for d in dirs:
        lib = os.path.join(d, *rel.split("/"))
        if os.path.exists(lib):
            os.environ[var] = lib
            return


def _nvshmem_from_site_packages() -> None:
    _lib_from_site_packages("SYMM_NVSHMEM_LIB", "nvidia/nvshmem/lib/libnvshmem_host.so.3")


def _nccl_from_site_packages() -> None:
    _lib_from_site_packages("SYMM_NCCL_LIB", "nvidia/nccl/lib/libnccl.so.2")


_TORCH_BACKEND_NAMES = {"cuda": "CUDA", "nvshmem": "NVSHMEM", "nccl": "NCCL"}


def set_backend(name: str) -> None:
    """Chooses the symmetric-memory backend: "cuda" (default), "nvshmem",
    "nccl" or "host", before the first symmetric allocation (as SYMM_BACKEND
    does). PyTorch's spellings ("CUDA", "NVSHMEM", "NCCL") work too."""
    name = str(name).lower()
    if name == "nvshmem":
        _nvshmem_from_site_packages()
    if name == "nccl":
        _nccl_from_site_packages()
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
    _nvshmem_from_site_packages()
    return bool(load().symm_nvshmem_available())


def is_nccl_available() -> bool:
    """Whether an NCCL with symmetric windows (2.27+) can be loaded here."""
    _nccl_from_site_packages()
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
    if backend == "nccl" and os.environ.get("SYMM_NCCL_ADOPT", "1") == "1" and _adopt_torch_comm(group, dev):
        _backend_ready[dev] = "adopted PyTorch's communicator"
        return
    backend_init(_group_store(group), dist.get_rank(group), dist.get_world_size(group), dev)
    _backend_ready[dev] = "own communicator"


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


def get_mempool_allocator(device: Any = 0):
    """A CUDAPluggableAllocator over symm_alloc/symm_free, for torch.cuda.MemPool."""
    import torch

    dev = _device(device)
    if dev not in _mempool_allocators:
        _mempool_allocators[dev] = torch.cuda.memory.CUDAPluggableAllocator(str(library_path()), "symm_alloc", "symm_free")
    return _mempool_allocators[dev].allocator()


def _torch(call: str):
    """torch, or an ImportError saying that call needs it (the rest of symm
    works without torch)."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"{call} makes PyTorch tensors and needs PyTorch with CUDA (importing torch failed: {e}); "
                          "symm.symm_alloc and the handle's raw-pointer calls work without torch") from e
    return torch


def _cuda_device(device):
    import torch

    dev = torch.device("cuda" if device is None else device)
    if isinstance(device, int):
        dev = torch.device("cuda", device)
    if dev.type != "cuda":
        raise ValueError(f"symmetric memory lives on CUDA devices, not {dev}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _pool(dev, shared: bool):
    """The device's MemPool over symm_alloc/symm_free: shared (get_mem_pool:
    PyTorch splits segments, tensors share blocks and signal pads) or not
    (empty: no_split, so each tensor is a block of its own with its own pad)."""
    import torch

    _ensure_backend(dev.index)
    key = (dev.index, shared)
    if key not in _mempools:
        if shared:
            _mempools[key] = torch.cuda.MemPool(get_mempool_allocator(dev.index))
        else:
            try:
                _mempools[key] = torch.cuda.MemPool(get_mempool_allocator(dev.index), no_split=True)
            except TypeError:  # torch < 2.9: no no_split; segments may then hold several tensors
                _mempools[key] = torch.cuda.MemPool(get_mempool_allocator(dev.index))
    return _mempools[key]


def get_mem_pool(device: Any = None):
    """The device's symmetric torch.cuda.MemPool (PyTorch's get_mem_pool):
    tensors allocated under ``torch.cuda.use_mem_pool(pool)`` live in
    symmetric blocks and may share one (and its signal pad); every rank must
    allocate the same sequence."""
    return _pool(_cuda_device(device), shared=True)


def empty(*size, dtype=None, device=None):
    """A tensor whose storage is a symmetric block of its own, with its own
    signal pad (PyTorch's empty); rendezvous it with :func:`rendezvous`.
    dtype defaults to torch's default dtype, device to the current CUDA device."""
    torch = _torch("symm.empty()")

    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dev = _cuda_device(device)
    with torch.cuda.use_mem_pool(_pool(dev, shared=False), device=dev):
        return torch.empty(size, dtype=dtype or torch.get_default_dtype(), device=dev)


def _group_store(group) -> Store:
    """libsymm's store for a process group: rank 0 starts a server and posts its
    address in the group's c10d store, so torchrun users need nothing else."""
    import torch.distributed as dist

    name = dist.distributed_c10d._get_group_tag(group) if hasattr(dist.distributed_c10d, "_get_group_tag") else str(group)
    if name in _stores:
        return _stores[name]
    c10d_store = dist.distributed_c10d._get_default_store()
    key = f"symm_store_addr/{name}"
    if dist.get_rank(group) == 0:
        st = Store.server(os.environ.get("SYMM_STORE_ADDR", "127.0.0.1:0"))
        c10d_store.set(key, st.address)
    else:
        addr = c10d_store.get(key).decode()
        st = Store.connect(addr)
    _stores[name] = st
    return st


# Per block (its start on this rank): a finalizer of the tensor last
# rendezvoused there. A MemPool hands a freed block out again without telling
# libsymm; when that tensor is gone, the next rendezvous of the block zeroes
# its signal pad on every rank first (pad hygiene: a dirty pad would make the
# next barrier wait for ever).
_block_owner: dict = {}  # block start -> {id(tensor): weakref.finalize}
_reset_seq: dict = {}


def _reset_pads(h: Handle, group, name: str) -> None:
    """Zeroes this rank's signal pad of h's block once no work is left on
    the device, then waits until every rank of the group has done the same."""
    import time

    import torch
    import torch.distributed as dist

    torch.cuda.synchronize(h.device)
    _tensor_at(h.signal_pad_ptrs[h.rank], (h.signal_pad_size,), torch.uint8, h.device).zero_()
    torch.cuda.synchronize(h.device)
    seq = _reset_seq[name] = _reset_seq.get(name, 0) + 1
    store = dist.distributed_c10d._get_default_store()
    # Ranks map the block at different addresses: the key is the group's
    # count of resets, which every rank advances in the same order.
    key = f"symm_pad_reset/{name}/{seq}"
    deadline = time.monotonic() + int(os.environ.get("SYMM_TIMEOUT_MS", "60000")) / 1000
    n = store.add(key, 1)
    while n < h.world_size:
        if time.monotonic() > deadline:
            raise SymmError(ErrorCode.TIMEOUT, f"rendezvous: {h.world_size - n} rank(s) of group {name} did not "
                            "reset the recycled block's signal pad in time")
        time.sleep(50e-6)
        n = store.add(key, 0)


def rendezvous(tensor, group=None):
    """Maps every rank's block of tensor's storage; returns the Handle.
    group: a ProcessGroup or its name (PyTorch's group_name); None: the
    default group. A block handed out again by a MemPool has its signal pad
    zeroed on every rank before this returns."""
    import weakref

    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    st = _group_store(group)
    name = getattr(group, "group_name", None) or "0"
    h = rendezvous_ptr(tensor.data_ptr(), st, f"torch-{name}", dist.get_rank(group),
                       dist.get_world_size(group), tensor.device)
    base = h.buffer_ptrs[h.rank]
    owners = _block_owner.setdefault(base, {})
    if owners and not any(f.alive for f in owners.values()):
        # Every tensor rendezvoused on this block is gone: the block was
        # handed out again (or the program let go of it): start clean.
        owners.clear()
        _reset_pads(h, group, name)
    for k in [k for k, f in owners.items() if not f.alive]:
        del owners[k]  # some other tensor of the block still lives
    if id(tensor) not in owners:
        owners[id(tensor)] = weakref.finalize(tensor, lambda: None)
    # A MemPool hands out tensors inside larger blocks: every rank allocates
    # the same sequence, so the tensor sits at the same offset in each block,
    # and the buffers seen from Python (host and device arrays) start at the
    # tensor. The signal pads stay the block's.
    off = tensor.data_ptr() - h.buffer_ptrs[h.rank]
    if off:
        import torch

        h.offset = off
        h.buffer_ptrs = [p + off for p in h.buffer_ptrs]
        h.buffer_size -= off
        if tensor.is_cuda:  # the handle keeps the array alive
            h._buffer_ptrs_dev = torch.tensor(h.buffer_ptrs, dtype=torch.int64, device=tensor.device)
            h.buffer_ptrs_dev = h._buffer_ptrs_dev.data_ptr()
        else:
            h._buffer_ptrs_host = (ctypes.c_uint64 * len(h.buffer_ptrs))(*h.buffer_ptrs)
            h.buffer_ptrs_dev = ctypes.addressof(h._buffer_ptrs_host)
    return h
