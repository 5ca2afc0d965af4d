"""Memory history and snapshots on the host backend: the structure of
torch.cuda.memory._snapshot() (keys, states, tiling), events with Python
frames for symm.alloc(), the pickle of dump_snapshot, and bad arguments."""

from __future__ import annotations

import pickle

import pytest

from conftest import MiB

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "size", "stream", "time_us", "frames", "compile_context", "user_metadata"}


def test_snapshot_structure_and_history(tmp_path):
    import symm

    symm.record_memory_history(enabled="all", max_entries=1000)
    try:
        a = symm.alloc(1000)
        b = symm.alloc(3 * MiB)
        symm.free(a, 1000)
        snap = symm.memory_snapshot()
    finally:
        symm.record_memory_history(enabled=None)
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    mine = [s for s in snap["segments"] if any(bl["address"] == b for bl in s["blocks"])]
    assert len(mine) == 1
    for seg in snap["segments"]:
        assert set(seg) == SEGMENT_KEYS
        assert seg["segment_pool_id"] == (0, 0)
        assert sum(bl["size"] for bl in seg["blocks"]) == seg["total_size"], "blocks tile the segment"
        assert seg["allocated_size"] == sum(bl["size"] for bl in seg["blocks"] if bl["state"] == "active_allocated")
        for bl in seg["blocks"]:
            assert set(bl) == BLOCK_KEYS
            assert bl["state"] in ("active_allocated", "active_pending_free", "inactive")
    live = next(bl for bl in mine[0]["blocks"] if bl["address"] == b)
    assert live["state"] == "active_allocated" and live["requested_size"] == 3 * MiB
    assert live["frames"] and live["frames"][0]["name"] == "test_snapshot_structure_and_history"

    trace = snap["device_traces"][0]
    acts = [e["action"] for e in trace]
    assert "alloc" in acts and "free_requested" in acts and "free_completed" in acts and acts[-1] == "snapshot"
    for e in trace:
        assert set(e) - {"addr", "device_free"} == TRACE_KEYS
    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == b]
    assert allocs and allocs[0]["frames"], "Python frames for an allocation through symm.alloc"
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)

    path = tmp_path / "snap.pickle"
    symm.dump_snapshot(str(path))
    with open(path, "rb") as f:
        again = pickle.load(f)
    assert len(again["segments"]) == len(symm.memory_snapshot()["segments"])
    symm.free(b, 3 * MiB)
    symm.empty_cache()


def test_history_bad_arguments():
    import symm

    with pytest.raises(ValueError, match="enabled must be"):
        symm.record_memory_history(enabled="sometimes")
    with pytest.raises(ValueError, match="max_entries"):
        symm.record_memory_history(max_entries=0)
    symm.record_memory_history(enabled=None)


def test_torch_mode_without_torch():
    import symm

    assert symm._pool.load().symm_torch_mode() == 0
