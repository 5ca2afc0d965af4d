"""Bad input and exhaustion: an error code and a message, never a crash, and
nothing lost (the stats are unchanged and the process goes on working)."""

from __future__ import annotations

import math
import re

import pytest

from conftest import MiB, pattern, read_bytes, write_bytes

SIZE_UNITS = (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("kB", 10**3), ("MB", 10**6), ("GB", 10**9))


def names_pointer(message: str, ptr: int) -> bool:
    """Whether the message shows the address, in hex (any case) or decimal."""
    low = message.lower()
    return hex(ptr) in low or f"{ptr:x}" in low or str(ptr) in message


def names_size(message: str, n: int) -> bool:
    """Whether the message states n bytes, exactly or in a rounded unit."""
    forms = {str(n), f"{n:,}", f"{n:_}", hex(n)}
    for unit, scale in SIZE_UNITS:
        for digits in range(0, 3):
            forms.add(f"{n / scale:.{digits}f} {unit}")
            forms.add(f"{n / scale:.{digits}f}{unit}")
    return any(f in message for f in forms)


def names_device(message: str, device: int) -> bool:
    return re.search(rf"(\bdev(ice)?\b\s*[=:#]?\s*|\b(cuda|host|gpu):){device}\b", message, re.I) is not None


def stable_stats(symm):
    return symm.memory_stats()


def test_free_unknown_pointer(symm):
    bogus = 0xDEAD0000
    before = stable_stats(symm)
    with pytest.raises(symm.SymmError) as info:
        symm.free(bogus, 4096)
    assert info.value.code == symm.ErrorCode.UNKNOWN_POINTER
    assert names_pointer(str(info.value), bogus), str(info.value)
    assert stable_stats(symm) == before


def test_double_free(symm):
    p = symm.alloc(4096)
    symm.free(p, 4096)
    before = stable_stats(symm)
    with pytest.raises(symm.SymmError) as info:
        symm.free(p, 4096)
    assert info.value.code == symm.ErrorCode.UNKNOWN_POINTER
    assert names_pointer(str(info.value), p), str(info.value)
    assert stable_stats(symm) == before


def test_free_of_interior_pointer_is_refused_and_block_kept(symm):
    p = symm.alloc(8192)
    write_bytes(p, pattern(8192, 3))
    try:
        before = stable_stats(symm)
        with pytest.raises(symm.SymmError) as info:
            symm.free(p + 512, 8192)
        assert info.value.code == symm.ErrorCode.UNKNOWN_POINTER
        assert stable_stats(symm) == before
        assert read_bytes(p, 8192) == pattern(8192, 3)
    finally:
        symm.free(p, 8192)


def test_record_stream_unknown_pointer(symm):
    with pytest.raises(symm.SymmError) as info:
        symm.record_stream(0xBEEF000, 1)
    assert info.value.code == symm.ErrorCode.UNKNOWN_POINTER


def test_error_is_not_reported_twice(symm):
    with pytest.raises(symm.SymmError):
        symm.free(0xDEAD0000, 1)
    symm.empty_cache()  # void call after a failure: must not raise the stale error
    symm.set_memory_fraction(1.0)
    p = symm.alloc(512)
    symm.free(p, 512)


@pytest.mark.parametrize("fraction", [1.5, -0.25, math.nan, math.inf])
def test_bad_memory_fraction(symm, fraction):
    before = stable_stats(symm)
    with pytest.raises(symm.SymmError) as info:
        symm.set_memory_fraction(fraction)
    assert info.value.code == symm.ErrorCode.INVALID
    assert info.value.message
    assert stable_stats(symm) == before


def test_bad_device_everywhere(symm):
    calls = (
        lambda d: symm.set_memory_fraction(0.5, d),
        lambda d: symm.set_limit(MiB, d),
        lambda d: symm.memory_stats(d),
        lambda d: symm.reset_peak_memory_stats(d),
        lambda d: symm.alloc(4096, d),
    )
    for device in (symm.device_count(), -1):
        for call in calls:
            with pytest.raises(symm.SymmError) as info:
                call(device)
            assert info.value.code == symm.ErrorCode.INVALID, repr(info.value)
    # device 0 is unaffected
    p = symm.alloc(4096)
    symm.free(p, 4096)


def test_limit_then_oversized_alloc_raises_oom_and_process_goes_on(symm):
    symm.empty_cache()
    base = symm.memory_reserved()
    symm.set_limit(base + 64 * MiB)
    small = symm.alloc(16 * MiB)  # under the limit: fine
    write_bytes(small, pattern(4096, 5))
    ooms = symm.memory_stats().get("num_ooms")
    allocated = symm.memory_allocated()
    request = 100 * MiB + 12345
    with pytest.raises(symm.OutOfMemoryError) as info:
        symm.alloc(request)
    err = info.value
    assert isinstance(err, symm.SymmError) and isinstance(err, MemoryError) and isinstance(err, RuntimeError)
    assert err.code == symm.ErrorCode.OUT_OF_MEMORY
    assert names_size(str(err), request), f"message does not name the size {request}: {err}"
    assert names_device(str(err), 0), f"message does not name device 0: {err}"
    assert symm.memory_allocated() == allocated
    if ooms is not None:
        assert symm.memory_stats()["num_ooms"] == ooms + 1
    assert read_bytes(small, 4096) == pattern(4096, 5)
    symm.free(small, 16 * MiB)

    symm.set_limit(0)  # cap removed: the same request now succeeds
    big = symm.alloc(request)
    write_bytes(big, pattern(request, 6))
    assert read_bytes(big, request) == pattern(request, 6)
    symm.free(big, request)


def test_set_memory_fraction_accepts_valid_values(symm):
    for fraction in (1.0, 0.5, 1e-3, 0.0, 1.0):
        symm.set_memory_fraction(fraction)
    p = symm.alloc(4096)
    symm.free(p, 4096)


def test_memory_fraction_zero_is_a_cap_of_zero_bytes(symm):
    """As in PyTorch: nothing new can be allocated, and the cap lifts again."""
    symm.empty_cache()
    symm.set_memory_fraction(0.0)
    try:
        with pytest.raises(symm.SymmError) as info:
            symm.alloc(1 << 20)
        assert info.value.code == symm.ErrorCode.OUT_OF_MEMORY
    finally:
        symm.set_memory_fraction(1.0)
    p = symm.alloc(1 << 20)
    symm.free(p, 1 << 20)


def test_error_types():
    import symm

    assert issubclass(symm.SymmError, RuntimeError)
    assert issubclass(symm.OutOfMemoryError, symm.SymmError)
    assert issubclass(symm.OutOfMemoryError, MemoryError)
    e = symm.SymmError(4, "free of unknown pointer 0x10")
    assert str(e) == "free of unknown pointer 0x10" and e.code == symm.ErrorCode.UNKNOWN_POINTER


def test_alloc_never_aborts_after_pytorch_init():
    """After PyTorch's init hook (symm_torch_init), a failed symm_pool_alloc
    throws a C++ exception only when PyTorch's own code calls it: through
    ctypes an exception would abort Python. symm.alloc() raises a Python
    exception, a direct ctypes call of symm_pool_alloc gets NULL and the last
    error, and the pool keeps working (the recipe of
    change_current_allocator(pool_allocator()) done by hand, without torch)."""
    from conftest import run_json

    out = run_json(
        """
import json, symm
from symm._loader import load
lib = load()
lib.symm_torch_init(1)          # what PyTorch's init does in replace mode
try:
    symm.alloc(1 << 50)
    err = None
except symm.OutOfMemoryError as e:
    err = [int(e.code), str(e)]
direct = lib.symm_pool_alloc(1 << 50, 0, None)
direct_err = [lib.symm_last_error_code(), lib.symm_last_error().decode()]
p = symm.alloc(4096)
symm.free(p, 4096)
print(json.dumps({"err": err, "ok": bool(p), "direct": direct, "direct_err": direct_err}))
"""
    )
    assert out["ok"]
    assert out["direct"] is None, out
    assert out["direct_err"][0] == 2 and out["direct_err"][1].startswith("symm_pool_alloc: "), out
    assert out["err"] and out["err"][0] == 2 and out["err"][1].startswith("symm.alloc(1125899906842624, device=0): "), out
    assert "1125899906842624" in out["err"][1], out


def test_weak_arguments_get_clear_errors(symm):
    """Each bad argument names the Python call and what was wrong with it."""
    cases = [
        (lambda: symm.alloc(1.5), TypeError, "symm.alloc: size must be an integer number of bytes, not float 1.5"),
        (lambda: symm.alloc(True), TypeError, "not bool True"),
        (lambda: symm.alloc(-5), ValueError, "symm.alloc: size must be >= 0 bytes, got -5"),
        (lambda: symm.alloc(2**70), symm.OutOfMemoryError, "symm.alloc: size of 1180591620717411303424 bytes is more than any device"),
        (lambda: symm.alloc(2**62), symm.OutOfMemoryError, "symm.alloc(4611686018427387904, device=0): "),
        (lambda: symm.symm_alloc(-5), ValueError, "symm.symm_alloc: size must be >= 0 bytes, got -5"),
        (lambda: symm.symm_alloc("4096"), TypeError, "symm.symm_alloc: size must be an integer number of bytes, not str"),
        (lambda: symm.free(0x3039, 16), symm.SymmError, "symm.free(0x3039, 16, device=0): unknown pointer"),
    ]
    for call, kind, says in cases:
        with pytest.raises(kind) as e:
            call()
        assert says in str(e.value), (says, str(e.value))
        assert "symm_pool_try_alloc" not in str(e.value) and "returned NULL" not in str(e.value)


def test_devices_are_taken_as_pytorch_takes_them(symm):
    """An index, "cuda", "cuda:N" and a torch.device of type cuda name a
    device; anything else is refused naming the call and the parameter."""

    class Device:  # what the pool reads of a torch.device: its type and index
        def __init__(self, type, index=None):
            self.type, self.index = type, index

        def __repr__(self):
            return f"device(type={self.type!r}, index={self.index!r})"

    for device in (0, "cuda", "cuda:0", Device("cuda", 0), Device("cuda"), None):
        p = symm.alloc(4096, device=device)
        symm.free(p, 4096, device=device)
        assert symm.memory_stats(device) == symm.memory_stats(0)
    last = symm.device_count()
    with pytest.raises(symm.SymmError) as e:
        symm.alloc(4096, device=f"cuda:{last}")
    assert e.value.code == symm.ErrorCode.INVALID and names_device(str(e.value), last), str(e.value)
    forms = "an index (0), a string 'cuda' or 'cuda:0', or a torch.device of type cuda"
    for device, kind, says in [
        (0.7, TypeError, f"symm.alloc: device must be {forms}, not float 0.7"),
        (1.0, TypeError, "symm.alloc: device must be"),
        (True, TypeError, "not bool True"),
        (b"0", TypeError, "not bytes"),
        ("0", ValueError, f"symm.alloc: device '0' is not a device (want {forms})"),
        ("cuda:", ValueError, "device 'cuda:' is not a device"),
        ("cuda:01", ValueError, "device 'cuda:01' is not a device"),
        ("cuda:-1", ValueError, "device 'cuda:-1' is not a device"),
        ("cuda:0 ", ValueError, "device 'cuda:0 ' is not a device"),
        ("cpu", ValueError, "device 'cpu' is not a device"),
        (Device("cpu"), ValueError, "symm.alloc: device device(type='cpu', index=None) is not a cuda device"),
    ]:
        with pytest.raises(kind) as e:
            symm.alloc(4096, device=device)
        assert says in str(e.value), (device, str(e.value))
    with pytest.raises(TypeError, match=r"^symm.memory_stats: device must be"):
        symm.memory_stats(0.5)


def test_streams_are_refused_by_name(symm):
    """A stream is a cudaStream_t value or a torch.cuda.Stream, on every
    backend (host included): anything else is refused naming the parameter."""

    class Stream:  # what the pool reads of a torch.cuda.Stream
        cuda_stream = 0x7F00

    p = symm.alloc(4096, stream=Stream())
    symm.free(p, 4096, stream=0x7F00)
    before = stable_stats(symm)
    for stream, kind, says in [
        ("x", TypeError, "symm.alloc: stream must be a cudaStream_t value (an int) or a torch.cuda.Stream, not str 'x'"),
        (1.5, TypeError, "not float 1.5"),
        (-1, ValueError, "symm.alloc: stream -1 is not a cudaStream_t value (from 0 to 2**64 - 1)"),
        (2**64, ValueError, "stream 18446744073709551616 is not a cudaStream_t value"),
    ]:
        with pytest.raises(kind) as e:
            symm.alloc(4096, stream=stream)
        assert says in str(e.value), (stream, str(e.value))
    with pytest.raises(ValueError, match=r"^symm.free: stream -1 "):
        symm.free(p, 4096, stream=-1)
    with pytest.raises(TypeError, match=r"^symm.record_stream: stream must be"):
        symm.record_stream(p, "x")
    assert stable_stats(symm) == before


def test_empty_without_torch_explains(tmp_path):
    """symm.empty() in a process without torch says what it needs."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import symm\n"
        "try:\n    symm.empty(4)\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "symm.empty() makes PyTorch tensors and needs PyTorch with CUDA" in out.stdout, out.stdout + out.stderr


def test_errors_name_the_python_call(symm):
    """A failure reported by the library names the Python call that made it,
    not the C entry point behind it."""
    for call, says in [
        (lambda: symm.set_limit(5, device=9), "symm.set_limit: invalid argument: device 9"),
        (lambda: symm.record_stream(0x1234, 0), "symm.record_stream: unknown pointer"),
        (lambda: symm.set_memory_fraction(2.0), "symm.set_memory_fraction: invalid argument"),
    ]:
        with pytest.raises(symm.SymmError) as e:
            call()
        assert str(e.value).startswith(says), str(e.value)
        assert "symm_pool_" not in str(e.value), str(e.value)
