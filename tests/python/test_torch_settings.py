"""PyTorch's allocator settings made at run time (symm_pool_set_allocator_settings,
which libsymm's PyTorch extension calls from torch._C._accelerator_setAllocatorSettings)
and the memory fraction libsymm keeps (symm_pool_memory_fraction), on the host
backend. Each case runs in a fresh interpreter: the pool is made once per process."""

from __future__ import annotations

import json

from conftest import child_env, run_json

PRELUDE = """
import ctypes, json, sys
from symm import _loader
lib = _loader.load()
def settings(text):
    lib.symm_clear_error()
    rc = lib.symm_pool_set_allocator_settings(text.encode())
    return [rc, lib.symm_last_error().decode()]
def fraction(dev=0):
    f = ctypes.c_double(-1)
    rc = lib.symm_pool_memory_fraction(dev, ctypes.byref(f))
    return [rc, f.value]
def reserved_for(n):
    p = lib.symm_pool_try_alloc(n, 0, None)
    st = (_loader.Stat * 512)()
    k = lib.symm_pool_stats(0, st, 512)
    r = {st[i].name.decode(): st[i].value for i in range(k)}["reserved_bytes.all.current"]
    lib.symm_pool_free(p, n, 0, None)
    return r
"""

MiB = 1 << 20


def test_before_the_pool_every_key_applies():
    out = run_json(PRELUDE + """
r = [settings("large_segment_size_mb:40"), settings("per_process_memory_fraction:0.5")]
print(json.dumps([r, reserved_for(2 << 20), fraction()]))
""")
    calls, reserved, frac = out
    assert calls == [[0, ""], [0, ""]]
    assert reserved == 40 * MiB  # large_segment_size_mb kept from the first call
    assert frac == [0, 0.5]


def test_after_the_pool_settings_apply_to_what_comes_next():
    env = child_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    out = run_json(PRELUDE + """
lib.symm_pool_init(0)
print(json.dumps([
    fraction(),
    settings("max_split_size_mb:64,per_process_memory_fraction:0.25"),
    fraction(),
    settings("large_segment_size_mb:40"),
    reserved_for(2 << 20),
    settings("large_segment_size_mb:20,expandable_segments:True"),
    settings("expandable_segments:False"),
    settings("max_split_size_mb:1"),
    lib.symm_pool_empty_cache(),
    reserved_for(2 << 20),
    fraction(3),
]))
""", env=env)
    f0, ok, f1, large, grown, exp_on, exp_off, bad, _, later, f3 = out
    assert f0 == [0, 1.0]
    assert ok == [0, ""] and f1 == [0, 1.0], "PyTorch's devices read the fraction once"
    assert large == [0, ""] and grown == 40 * MiB, "the next segment has the new size"
    assert exp_on == [0, ""] and exp_off == [0, ""]
    assert bad[0] == 1 and "max_split_size_mb:1" in bad[1]
    assert later == 20 * MiB, "segments after empty_cache have the size of the last call"
    assert f3[0] == 1  # no device 3


def test_null_arguments_are_refused():
    out = run_json(PRELUDE + """
lib.symm_clear_error()
rc = lib.symm_pool_set_allocator_settings(None)
msg = lib.symm_last_error().decode()
rc2 = lib.symm_pool_memory_fraction(0, None)
print(json.dumps([rc, msg, rc2, lib.symm_driver_proc(b"cuStreamIsCapturing")]))
""")
    assert out[0] == 1 and "settings is NULL" in out[1]
    assert out[2] == 1
    assert out[3] is None  # the host backend has no CUDA driver
