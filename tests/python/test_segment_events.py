"""Segment events (symm_pool_set_segment_hook) against PyTorch's: the
workload of tests/data/torch_segment_events.json on the host backend, through
the C ABI with the front cache on and off, gives the hook the sequence of
segment events (kinds, addresses, sizes, device, stream) that PyTorch's
CUDACachingAllocator gives its allocator trace trackers for it. That
expected sequence was derived from PyTorch's source and then recorded from
PyTorch on a GPU (tests/device/record_segment_events.py), which gave the
same events: the data file's note says how. libsymm's PyTorch
extension hands these events to PyTorch's trackers (ProcessGroupNCCL's
TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK); the GPU check of that is
tests/device/test_torch_trackers.py. Each case runs in a fresh interpreter:
the pool of this one caches what other tests left."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, child_env, run_json

RECORDING = ROOT / "tests" / "data" / "torch_segment_events.json"

CHILD = r"""
import ctypes, json, sys
from symm._loader import load

rec = json.load(open(sys.argv[1]))
lib = load()

class PoolID(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64)]

class TraceEntry(ctypes.Structure):  # symm_trace_entry_t
    _fields_ = [("device", ctypes.c_int32), ("action", ctypes.c_int32), ("address", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("stream", ctypes.c_size_t), ("time_us", ctypes.c_int64),
                ("pool_id", PoolID), ("user_metadata", ctypes.c_char_p), ("compile_context", ctypes.c_char_p)]

HOOK = ctypes.CFUNCTYPE(None, ctypes.POINTER(TraceEntry), ctypes.c_int, ctypes.c_void_p)
NAMES = {3: "segment_alloc", 4: "segment_free", 7: "segment_map", 8: "segment_unmap"}
events = []
in_call = []  # the libsymm call under way when the hook ran

@HOOK
def hook(ev, n, ctx):
    for i in range(n):
        e = ev[i]
        events.append([NAMES.get(e.action, e.action), e.address, e.size, e.device, e.stream,
                       [e.pool_id.first, e.pool_id.second], in_call[-1] if in_call else None])

lib.symm_pool_set_segment_hook.argtypes = [HOOK, ctypes.c_void_p]
lib.symm_pool_set_segment_hook.restype = ctypes.c_int
alloc, free = lib.symm_pool_alloc, lib.symm_pool_free
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.symm_pool_init(1)
assert lib.symm_pool_set_segment_hook(hook, None) == 0
streams = {"s0": 0, "s1": 0x7000}
addrs, sizes, on = {}, {}, {}
for i, op in enumerate(rec["workload"]):
    in_call.append(i)
    if op[0] == "alloc":
        _, name, size, st = op
        addrs[name], sizes[name], on[name] = alloc(size, 0, streams[st]), size, streams[st]
    elif op[0] == "free":
        free(addrs[op[1]], sizes[op[1]], 0, on[op[1]])
    else:
        lib.symm_pool_empty_cache()
    in_call.pop()
assert lib.symm_pool_set_segment_hook(HOOK(), None) == 0  # NULL: off
print(json.dumps({"events": events, "addrs": addrs, "streams": streams}))
"""


@pytest.mark.parametrize("front", ["1", "0"])
def test_segment_events_match_pytorch(front):
    rec = json.loads(RECORDING.read_text())
    out = run_json(CHILD, str(RECORDING), env=child_env({"SYMM_POOL_FRONT_CACHE": front, "SYMM_POOL_EXPANDABLE": "0"}))
    addrs, streams = out["addrs"], out["streams"]
    got = [e[:5] for e in out["events"]]
    want = [[kind, addrs[a], size, dev, streams[st]] for kind, a, size, dev, st in rec["expected"]]
    assert got == want
    assert all(e[5] == [0, 0] for e in out["events"]), "default pool: pool id (0, 0)"
    # Each event reached the hook during the call that caused it: a segment
    # alloc during its allocation, the frees during empty_cache.
    ops = rec["workload"]
    for e in out["events"]:
        assert e[6] is not None, f"{e}: delivered outside any call"
        op = ops[e[6]]
        if e[0] == "segment_alloc":
            assert op[0] == "alloc" and addrs[op[1]] == e[1], (e, op)
        else:
            assert op[0] == "empty_cache", (e, op)


def test_segment_events_expandable():
    """Expandable segments: libsymm maps runs of its own 20 MiB chunks, one
    range for small and large requests, where PyTorch maps 2 MiB chunks for
    small requests and 20 MiB ones for large ones in separate segments, so
    the runs differ from PyTorch's by design; what holds is that only maps
    and unmaps are told, in whole chunks, and that empty_cache unmaps all
    that was mapped."""
    out = run_json(CHILD, str(RECORDING), env=child_env({"SYMM_POOL_EXPANDABLE": "1"}))
    kinds = {e[0] for e in out["events"]}
    assert kinds == {"segment_map", "segment_unmap"}, kinds
    assert all(e[2] % (2 << 20) == 0 for e in out["events"])
    mapped = sum(e[2] for e in out["events"] if e[0] == "segment_map")
    unmapped = sum(e[2] for e in out["events"] if e[0] == "segment_unmap")
    assert mapped == unmapped > 0
