"""The torch-free API over libsymm's caching pool: stats, limits, alloc/free.

Every function turns a C failure into a SymmError carrying symm_last_error().
The C library keeps the last error per thread and a success does not clear
it, so each call here clears it first and reads the code afterwards: a stale
error from an earlier call can never be reported twice.
"""

from __future__ import annotations

import ctypes
import operator
import os
import sys
from typing import Any

from ._errors import ErrorCode, OutOfMemoryError, SymmError, make_error
from ._loader import Stat, load


# ---- error plumbing ---------------------------------------------------------


def _last_error(lib) -> SymmError:
    """The calling thread's last failure as an exception."""
    code = lib.symm_last_error_code()
    raw = lib.symm_last_error() or b""
    return make_error(code, raw.decode("utf-8", "replace"))


def _python_call(depth: int = 2) -> str:
    """The public call being served, "symm.<function>" or "symm.<Class>.<method>":
    the function depth frames up (the caller of the helper that calls this)."""
    code = sys._getframe(depth).f_code
    return "symm." + getattr(code, "co_qualname", code.co_name)


def _call_void(fn, *args) -> None:
    """Calls a void C function and raises if it recorded a failure, naming
    the Python call that made it."""
    lib = load()
    lib.symm_clear_error()
    fn(*args)
    if lib.symm_last_error_code() != ErrorCode.OK:
        raise _from_call(_last_error(lib), _python_call(), fn.__name__)


def _call_rc(fn, *args) -> int:
    """Calls a C function returning SYMM_OK / SYMM_ERR_*; raises on failure,
    naming the Python call that made it."""
    lib = load()
    lib.symm_clear_error()
    rc = fn(*args)
    if rc != ErrorCode.OK:
        err = _last_error(lib)
        if err.code == ErrorCode.OK:  # the library returned a code but no message
            err = make_error(rc, f"{fn.__name__} failed with code {rc}")
        raise _from_call(err, _python_call(), fn.__name__)
    return rc


# ---- argument conversion ----------------------------------------------------

_SIZE_MAX = (1 << 64) - 1


def _nbytes(value: Any, call: str, what: str = "size") -> int:
    """A byte count given to call: an integer (anything with __index__, not
    a bool or a float), at least 0 and within size_t."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{call}: {what} must be an integer number of bytes, not {type(value).__name__} {value!r}")
    n = operator.index(value)
    if n < 0:
        raise ValueError(f"{call}: {what} must be >= 0 bytes, got {n}")
    if n > _SIZE_MAX:
        raise OutOfMemoryError(ErrorCode.OUT_OF_MEMORY,
                               f"{call}: {what} of {n} bytes is more than any device has (more than 2**64 - 1)")
    return n


def _from_call(err: SymmError, call: str, c_name: str) -> SymmError:
    """err, reworded to name the Python call the user made instead of the C
    entry point it went through (the C text after it stays)."""
    msg = err.message
    if msg.startswith(c_name + ": "):
        msg = msg[len(c_name) + 2:]
    return make_error(err.code, f"{call}: {msg}")


_DEVICE_FORMS = "an index (0), a string 'cuda' or 'cuda:0', or a torch.device of type cuda"


def _device(device: Any) -> int:
    """A device given the way PyTorch's torch.cuda functions take one: an
    integer index, "cuda" or "cuda:N", or a torch.device of type cuda
    (torch.device("cuda") and "cuda" without an index, and None, are device
    0). Anything else raises, naming the public call and the parameter: a
    float is no index (0.7 is not device 0), nor is "0" (PyTorch refuses it
    too: "Invalid device string"). An index the pool lacks (-1, or past the
    last device) is the library's SymmError (INVALID), naming the device."""
    given = device
    if device is None:
        return 0
    if not isinstance(device, (str, bool)) and not hasattr(type(device), "__index__") \
            and hasattr(device, "type") and hasattr(device, "index"):  # a torch.device
        if device.type != "cuda":
            raise ValueError(f"{_python_call()}: device {given!r} is not a cuda device (want {_DEVICE_FORMS})")
        device = device.index
        if device is None:
            return 0
    elif isinstance(device, str):
        kind, colon, index = device.partition(":")
        if kind != "cuda" or (colon and not (index.isascii() and index.isdigit()
                                             and (index == "0" or index[0] != "0"))):
            raise ValueError(f"{_python_call()}: device {given!r} is not a device (want {_DEVICE_FORMS})")
        return int(index) if colon else 0
    if isinstance(device, bool) or not hasattr(type(device), "__index__"):
        raise TypeError(f"{_python_call()}: device must be {_DEVICE_FORMS}, not {type(given).__name__} {given!r}")
    return operator.index(device)


def _stream(stream: Any) -> int:
    """A raw cudaStream_t value (an integer from 0 to 2**64 - 1; None is 0)
    or a torch.cuda.Stream (its ``cuda_stream``). Anything else raises,
    naming the public call and the parameter, on every backend."""
    value = getattr(stream, "cuda_stream", stream)
    if value is None:
        return 0
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{_python_call()}: stream must be a cudaStream_t value (an int) or a torch.cuda.Stream, "
                        f"not {type(stream).__name__} {stream!r}")
    n = operator.index(value)
    if not 0 <= n <= _SIZE_MAX:
        raise ValueError(f"{_python_call()}: stream {n} is not a cudaStream_t value (from 0 to 2**64 - 1)")
    return n


def _pointer(ptr: Any) -> int:
    """Accepts an int address (None means NULL)."""
    return int(ptr or 0)


# ---- library ----------------------------------------------------------------


def topology(lib_dirs=None) -> dict:
    """The machine as `symm info --json` describes it (schema in the README):
    driver, devices, the link matrix, libraries, backends, as plain dicts and
    lists. NCCL and NVSHMEM are also looked for under this Python's
    site-packages (and lib_dirs). Works without a GPU ("driver": {"found": False})."""
    import json
    import site

    dirs = list(lib_dirs or [])
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # some virtualenvs
        pass
    arg = os.pathsep.join(dirs).encode()
    lib = load()
    n = ctypes.c_size_t()
    _call_rc(lib.symm_topology, arg, None, 0, ctypes.byref(n))
    for _ in range(3):  # the machine may change between the two calls
        buf = ctypes.create_string_buffer(n.value + 1)
        rc = lib.symm_topology(arg, buf, len(buf), ctypes.byref(n))
        if rc == 0:
            return json.loads(buf.value.decode())
    _call_rc(lib.symm_topology, arg, buf, len(buf), ctypes.byref(n))
    return json.loads(buf.value.decode())


def version() -> str:
    """The library's version string, e.g. "0.1.0"."""
    return load().symm_version().decode()


def backend() -> str:
    """The active backend ("cuda", "host"), or "" before the pool is initialized."""
    return (load().symm_pool_backend() or b"").decode()


def device_count() -> int:
    """Number of devices the pool serves (initializes the backend)."""
    lib = load()
    lib.symm_clear_error()
    n = lib.symm_pool_device_count()
    if n < 0:
        raise _last_error(lib)
    return n


def init(devices: int = 0) -> None:
    """Selects the backend and creates the pools now instead of at the first use.

    devices is advisory, as in symm_pool_init.
    """
    lib = load()
    _call_void(lib.symm_pool_init, int(devices))


# ---- stats ------------------------------------------------------------------


def memory_stats(device: Any = 0) -> dict[str, int]:
    """All statistics of a device, keyed as torch.cuda.memory_stats() keys them.

    Sized with a first call and retried if the library grew its list meanwhile.
    """
    lib = load()
    dev = _device(device)
    cap = 0
    buf = None
    while True:
        lib.symm_clear_error()
        n = lib.symm_pool_stats(dev, buf, cap)
        if n < 0:
            raise _last_error(lib)
        if n <= cap:
            return {buf[i].name.decode(): int(buf[i].value) for i in range(n)}
        cap = n
        buf = (Stat * cap)()


def _stat(device: Any, key: str) -> int:
    return memory_stats(device).get(key, 0)


def memory_allocated(device: Any = 0) -> int:
    """Bytes in live allocations (``allocated_bytes.all.current``)."""
    return _stat(device, "allocated_bytes.all.current")


def max_memory_allocated(device: Any = 0) -> int:
    """Peak of memory_allocated since start or reset_peak_memory_stats()."""
    return _stat(device, "allocated_bytes.all.peak")


def memory_reserved(device: Any = 0) -> int:
    """Bytes the pool holds from the device, cached or in use (``reserved_bytes.all.current``)."""
    return _stat(device, "reserved_bytes.all.current")


def max_memory_reserved(device: Any = 0) -> int:
    """Peak of memory_reserved since start or reset_peak_memory_stats()."""
    return _stat(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device: Any = 0) -> None:
    """Resets every peak statistic of the device to its current value."""
    lib = load()
    _call_rc(lib.symm_pool_reset_peak, _device(device))


# ---- limits and cache -------------------------------------------------------


def empty_cache() -> None:
    """Returns every unused cached segment of every device to the driver."""
    lib = load()
    _call_void(lib.symm_pool_empty_cache)


def set_memory_fraction(fraction: float, device: Any = 0) -> None:
    """Caps the device's reserved memory at fraction (0 <= fraction <= 1) of its
    total; 0, as in PyTorch, is a cap of 0 bytes (only cached blocks serve)."""
    lib = load()
    _call_void(lib.symm_pool_set_memory_fraction, float(fraction), _device(device))


def set_limit(nbytes: int, device: Any = 0) -> None:
    """Caps the device's reserved memory at nbytes; 0 removes the cap."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"limit must be >= 0 bytes, got {nbytes}")
    lib = load()
    _call_rc(lib.symm_pool_set_limit, _device(device), nbytes)


def set_expandable(enabled: bool = True) -> None:
    """Chooses expandable segments for the pool (SYMM_POOL_EXPANDABLE=1 does
    the same). Once the pool exists, the choice applies to the segments made
    from then on; those made before keep their kind."""
    lib = load()
    _call_rc(lib.symm_pool_set_expandable, 1 if enabled else 0)


# ---- raw allocation ---------------------------------------------------------


def alloc(size: int, device: Any = 0, stream: Any = 0) -> int:
    """Allocates size bytes from the pool and returns the address (0 for size 0).

    The block must go back through free() with the same size, device and
    stream. Goes through symm_pool_try_alloc, which never throws: a failure
    is an exception here (OutOfMemoryError, SymmError), whatever mode PyTorch
    uses libsymm in, never a C++ exception through ctypes. A size that is not
    an integer raises TypeError, a negative one ValueError. device is an
    index, "cuda", "cuda:N" or a torch.device of type cuda (as PyTorch's
    torch.cuda functions take it); stream a cudaStream_t value or a
    torch.cuda.Stream. Anything else raises TypeError or ValueError naming
    the parameter.
    """
    size = _nbytes(size, "symm.alloc")
    dev = _device(device)
    lib = load()
    lib.symm_clear_error()
    ptr = lib.symm_pool_try_alloc(size, dev, _stream(stream))
    if ptr:
        if _frames_on:
            _record_frames(ptr)
        return ptr
    if size == 0:
        return 0
    call = f"symm.alloc({size}, device={dev})"
    if lib.symm_last_error_code() != ErrorCode.OK:
        raise _from_call(_last_error(lib), call, "symm_pool_try_alloc")
    raise SymmError(ErrorCode.INTERNAL, f"{call}: the library returned no block and no error")


def free(ptr: int, size: int = 0, device: Any = 0, stream: Any = 0) -> None:
    """Returns a block from alloc(); size, device and stream are those given to alloc()."""
    size = _nbytes(size, "symm.free")
    dev = _device(device)
    lib = load()
    lib.symm_clear_error()
    lib.symm_pool_free(_pointer(ptr), size, dev, _stream(stream))
    if lib.symm_last_error_code() != ErrorCode.OK:
        raise _from_call(_last_error(lib), f"symm.free({_pointer(ptr):#x}, {size}, device={dev})", "symm_pool_free")


def record_stream(ptr: int, stream: Any) -> None:
    """Marks the block holding ptr as used on stream, delaying its reuse elsewhere."""
    lib = load()
    _call_void(lib.symm_pool_record_stream, _pointer(ptr), _stream(stream))


# ---- memory history and snapshots -------------------------------------------

# Python frames of blocks allocated through alloc() while history is on,
# keyed by address (PyTorch's snapshots carry frames; C has none to give).
_frames: dict[int, list[dict]] = {}
_frames_on = False
_frames_max = 0


def _record_frames(ptr: int) -> None:
    import traceback

    if len(_frames) >= _frames_max:
        _frames.pop(next(iter(_frames)))
    _frames[ptr] = [
        {"filename": f.filename, "line": f.lineno or 0, "name": f.name}
        for f in reversed(traceback.extract_stack()[:-2])
    ]


def record_memory_history(enabled: Any = "all", context: Any = "all", stacks: Any = "all",
                          max_entries: int = 1 << 31, device: Any = None) -> None:
    """Starts or stops recording alloc/free/segment/oom events, as
    torch.cuda.memory._record_memory_history does (same arguments).

    enabled: "all" (or True) records every event with its time; None, False
    or "state" stop recording (a snapshot always shows the current state).
    max_entries bounds each device's ring of events. Python frames are kept
    for allocations made through symm.alloc() (context not None); events that
    come from PyTorch or C carry none. device is accepted for PyTorch's
    signature; history covers every device.
    """
    global _frames_on, _frames_max
    on = enabled in ("all", True)
    if not on and enabled not in (None, False, "state"):
        raise ValueError(f"enabled must be 'all', 'state', None, True or False, not {enabled!r}")
    max_entries = int(max_entries)
    if on and max_entries <= 0:
        raise ValueError(f"max_entries must be >= 1, got {max_entries}")
    lib = load()
    _call_rc(lib.symm_pool_record_history, 1 if on else 0, min(max_entries, (1 << 63) - 1) if on else 0)
    _frames_on = on and context is not None
    _frames_max = min(max_entries, 1 << 16)
    if on:
        _frames.clear()


def memory_snapshot() -> dict:
    """Every segment with its blocks, and each device's recorded events, in
    the structure of torch.cuda.memory._snapshot() ("segments",
    "device_traces", "allocator_settings"), which PyTorch's memory viewer
    (torch.cuda._memory_viz, pytorch.org/memory_viz) reads."""
    import json

    lib = load()
    n = ctypes.c_size_t()
    _call_rc(lib.symm_pool_snapshot, None, 0, ctypes.byref(n))
    for _ in range(5):  # the pool may grow between the size query and the copy
        buf = ctypes.create_string_buffer(n.value + 4096)
        lib.symm_clear_error()
        if lib.symm_pool_snapshot(buf, len(buf), ctypes.byref(n)) == 0:
            break
    else:
        _call_rc(lib.symm_pool_snapshot, buf, len(buf), ctypes.byref(n))
    snap = json.loads(buf.value.decode())
    for seg in snap["segments"]:
        seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] in _frames:
                b["frames"] = _frames[b["address"]]
    for trace in snap["device_traces"]:
        for e in trace:
            if e["action"] == "alloc" and e.get("addr") in _frames:
                e["frames"] = _frames[e["addr"]]
    return snap


def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles memory_snapshot() to filename, as torch.cuda.memory._dump_snapshot
    does; drag the file onto pytorch.org/memory_viz to see it."""
    import pickle

    snap = memory_snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snap, f)
