"""Symmetric memory: blocks every rank of a group maps, as in
torch.distributed._symmetric_memory.

Torch-free layer (ctypes): :class:`Store` (symm._store's, with each
process group's store), :func:`symm_alloc`, :func:`symm_free`,
:func:`rendezvous_ptr` and :class:`Handle`. The PyTorch layer (:func:`empty`,
:func:`rendezvous`, :func:`get_mempool_allocator`) sits on top and imports
torch lazily.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

from . import _codes, _ops_ext
from ._errors import ErrorCode, SymmError
from ._groups import resolve_group as _resolve_group
from ._loader import HandleInfo, load, library_path
from ._backends import _ensure_backend
from ._store import Store, group_store as _group_store
from ._pool import _call_rc, _call_void, _device, _from_call, _last_error, _nbytes, _python_call

SIGNAL_PAD_SIZE = 2048


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
        # The device's index for the extension's signals (None: the ctypes way).
        index = getattr(device, "index", None) if getattr(device, "type", None) == "cuda" else None
        self._cuda_index = index if isinstance(index, int) else None
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
        if stream is None and self._cuda_index is not None and self._ext_signal(2, 0, channel, timeout_ms):
            return
        _fast_rc(load().symm_barrier, self._h, int(channel), self._stream(stream), int(timeout_ms))

    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0, stream=None) -> None:
        # The C call has no timeout: on GPUs the put is queued on the stream; on host it waits at most SYMM_TIMEOUT_MS.
        if stream is None and self._cuda_index is not None and self._ext_signal(0, dst_rank, channel, 0):
            return
        _fast_rc(load().symm_put_signal, self._h, int(dst_rank), int(channel), self._stream(stream))

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0, stream=None) -> None:
        if stream is None and self._cuda_index is not None and self._ext_signal(1, src_rank, channel, timeout_ms):
            return
        _fast_rc(load().symm_wait_signal, self._h, int(src_rank), int(channel), self._stream(stream), int(timeout_ms))

    def _ext_signal(self, kind: int, peer, channel, timeout_ms) -> bool:
        """A put (kind 0), wait (1) or barrier (2) on the current stream
        through the extension (_ops_ext): True when done, False when it
        is not there or passed the call on (the ctypes way then checks and
        runs it); a failure raises, as the ctypes way does."""
        m = _ops_ext.loaded
        if m is None:
            m = _ops_ext.ops()
        if not m:
            return False
        try:
            rc = m.signal(kind, self._h, peer, channel, self._cuda_index, timeout_ms, -1)
        except TypeError:  # an argument pybind11 does not convert (a float): the ctypes way takes it
            return False
        if rc == 0:
            return True
        if rc > 0:
            _raise_rc(rc, ("symm_put_signal", "symm_wait_signal", "symm_barrier")[kind])
        return False

    def reset_signal_pad(self, timeout_ms: int = 0) -> None:
        """Zeroes this rank's signal pad once no peer can still be signalling
        into it, and returns once every rank of the group has done the same
        (symm_reset_signal_pad: each rank waits for its device's queued work,
        the ranks agree through the group's store, zero, and agree again).
        Every rank calls it, in the same order per group, with no signal of
        the handle under way. timeout_ms bounds each wait for the peers (0:
        the library's, SYMM_TIMEOUT_MS); a rank that does not come raises
        SymmError(TIMEOUT), one that fails SymmError(PEER), naming it; on
        GPUs a peer that meets the reset's barriers with a collective instead
        raises SymmError(MISMATCH) on both ranks, naming both calls."""
        _call_rc(load().symm_reset_signal_pad, self._h, int(timeout_ms))

    def reset_signal_pad_if_any(self, want: bool, timeout_ms: int = 0) -> bool:
        """reset_signal_pad decided by every rank together
        (symm_reset_signal_pad_if_any): each rank says whether it wants the
        reset; if any does, every rank resets and True is returned on every
        rank, else nothing is reset and False is returned. Every rank calls
        it, in the same order per group; errors as reset_signal_pad's."""
        reset = ctypes.c_int(0)
        _call_rc(load().symm_reset_signal_pad_if_any, self._h, 1 if want else 0, int(timeout_ms), ctypes.byref(reset))
        return bool(reset.value)

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
        dcode, ocode = _arg_codes("one_shot_all_reduce", dtype, op)
        _fast_rc(load().symm_one_shot_all_reduce, self._h, int(self.offset + offset), int(count), dcode,
                 ocode, int(out), int(local_input), self._stream(stream), int(timeout_ms))

    def two_shot_all_reduce_ptr(self, offset: int, count: int, dtype: str, out: int = 0, local_input: int = 0,
                                op: str = "sum", timeout_ms: int = 0, stream=None) -> None:
        """symm_two_shot_all_reduce on raw addresses (torch-free): count
        elements of dtype ("float32", "bfloat16" or "float16") at byte offset of every
        rank's buffer (from the handle's own start, self.offset included)
        are summed into every rank's buffer there (in place; out 0 means
        that address) and, when out is another address, copied into out."""
        dcode, ocode = _arg_codes("two_shot_all_reduce", dtype, op)
        at = int(self.offset + offset)
        if not out:
            out = self.buffer_ptrs[self.rank] + int(offset)
        _fast_rc(load().symm_two_shot_all_reduce, self._h, at, int(count), dcode, ocode, int(out),
                 int(local_input), self._stream(stream), int(timeout_ms))

    def reduce_scatter_ptr(self, offset: int, count: int, dtype: str, out: int = 0, local_input: int = 0,
                           op: str = "sum", timeout_ms: int = 0, stream=None) -> None:
        """symm_reduce_scatter on raw addresses (torch-free): every rank's
        buffer holds world shares of count elements of dtype ("float32",
        "bfloat16" or "float16") at byte offset (from the handle's own start,
        self.offset included); the rank-order sum of share rank of every
        rank's buffer goes to out (0: that share of this rank's buffer, in
        place). local_input (world × count elements) is copied in first."""
        dcode, ocode = _arg_codes("reduce_scatter", dtype, op)
        if not out:
            out = self.buffer_ptrs[self.rank] + int(offset) + self.rank * int(count) * _DTYPES[dtype].size
        _fast_rc(load().symm_reduce_scatter, self._h, int(self.offset + offset), int(count), dcode,
                 ocode, int(out), int(local_input), self._stream(stream), int(timeout_ms))

    def all_gather_ptr(self, offset: int, count: int, dtype: str, out: int = 0, local_input: int = 0,
                       timeout_ms: int = 0, stream=None) -> None:
        """symm_all_gather on raw addresses (torch-free): every rank's
        buffer holds world shares of count elements of dtype ("float32",
        "bfloat16" or "float16") at byte offset, share rank being this
        rank's input (copied there first from local_input when given); out
        (0: this rank's buffer there, in place) receives every rank's share
        at its place."""
        dcode, _ = _arg_codes("all_gather", dtype, None)
        if not out:
            out = self.buffer_ptrs[self.rank] + int(offset)
        _fast_rc(load().symm_all_gather, self._h, int(self.offset + offset), int(count), dcode,
                 int(out), int(local_input), self._stream(stream), int(timeout_ms))

    def push_all_reduce_ptr(self, in_ptr: int, out_ptr: int, count: int, dtype: str = "float32", op: str = "sum",
                            timeout_ms: int = 0, stream=None) -> None:
        """symm_push_all_reduce on raw addresses (torch-free), this handle
        being a push workspace (see :func:`push_all_reduce_workspace_size`):
        count elements of dtype ("float32", "bfloat16" or "float16") at
        in_ptr of every rank, summed into out_ptr (which may be in_ptr)."""
        dcode, ocode = _arg_codes("push_all_reduce", dtype, op)
        _fast_rc(load().symm_push_all_reduce, self._h, int(in_ptr), int(out_ptr), int(count), dcode,
                 ocode, self._stream(stream), int(timeout_ms))

    @property
    def push_max_bytes(self) -> int:
        """The largest message this handle takes as a push workspace."""
        return 8 * (self.buffer_size // (32 * self.world_size))


_DTYPES = _codes.names(_codes.Dtype)  # "float32" -> Dtype.FLOAT32 (include/symm.h's SYMM_DTYPES)
_TORCH_DTYPES: dict = {}


def _one_of(words) -> str:
    """"a, b or c": the words of a message that lists what is accepted."""
    words = list(words)
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def _fast_rc(fn, *args) -> None:
    """_call_rc for the signal and all-reduce calls: one C call when it
    succeeds (the library sets the last error whenever it fails)."""
    rc = fn(*args)
    if rc:
        _raise_rc(rc, fn.__name__)


def _raise_rc(rc: int, name: str) -> None:
    """Raises what C function name's failure rc (not 0) means: the
    library's last error, set by the failed call."""
    err = _last_error(load())
    if err.code == ErrorCode.OK:
        from ._errors import make_error

        err = make_error(rc, f"{name} failed with code {rc}")
    raise _from_call(err, _python_call(), name)


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
_OPS = _codes.names(_codes.ReduceOp)  # "sum" -> ReduceOp.SUM (SYMM_SUM)


def _arg_codes(fn: str, dtype: str, op: str | None = "sum") -> tuple[int, int]:
    """The C codes of dtype and op (None: the call has no op) for fn's
    call, or ValueError naming what is wrong: the one check of the *_ptr
    calls' names."""
    if dtype not in _DTYPES:
        raise ValueError(f"{fn}: dtype {dtype!r}: want {_one_of(_DTYPES)}")
    if op is not None and op not in _OPS:
        raise ValueError(f"{fn}: op {op!r}: only 'sum' is supported")
    return int(_DTYPES[dtype]), int(_OPS[op]) if op is not None else 0


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

    group = _resolve_group(group)
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


# Per block (its start on this rank): a finalizer of the tensor last
# rendezvoused there. A MemPool hands a freed block out again without telling
# libsymm; when that tensor is gone, the next rendezvous of the block zeroes
# its signal pad on every rank first (pad hygiene: a dirty pad would make the
# next barrier wait for ever): Handle.reset_signal_pad, which waits for the
# device's work and agrees with every rank before and after the zeroing.
_block_owner: dict = {}  # block start -> {id(tensor): weakref.finalize}


def rendezvous(tensor, group=None):
    """Maps every rank's block of tensor's storage; returns the Handle.
    group: a ProcessGroup or its name (PyTorch's group_name); None: the
    default group. A block handed out again by a MemPool has its signal pad
    zeroed on every rank before this returns."""
    import weakref

    import torch.distributed as dist

    group = _resolve_group(group)
    st = _group_store(group)
    name = getattr(group, "group_name", None) or "0"
    h = rendezvous_ptr(tensor.data_ptr(), st, f"torch-{name}", dist.get_rank(group),
                       dist.get_world_size(group), tensor.device)
    base = h.buffer_ptrs[h.rank]
    owners = _block_owner.setdefault(base, {})
    mine = owners.get(id(tensor))
    if owners and (mine is None or not mine.alive):
        # A new tensor on a block rendezvoused before: if every tensor this
        # rank rendezvoused on it is gone, the block was handed out again
        # (or the program let go of it) and its pad must start clean. What
        # is alive differs between ranks (a tensor in a reference cycle dies
        # later on one rank than on another), so the ranks decide together:
        # each says whether it wants the reset, and if any does, all reset.
        # A rank that reset alone would meet its peers' next collective with
        # the reset's barriers. A new tensor is one every rank makes (the
        # same program), so every rank asks; the same live tensor again asks
        # nothing (a call that one rank skips, as a failed collective may,
        # does not leave the ranks' agreements out of step).
        if h.reset_signal_pad_if_any(not any(f.alive for f in owners.values())):
            owners.clear()
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
