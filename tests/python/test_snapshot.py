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
        again = symm.memory_snapshot()
    finally:
        symm.record_memory_history(enabled=None)
    assert symm.memory_snapshot()["device_traces"][0] == [], "off empties the history, as PyTorch's does"
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
    freed = next(bl for s in snap["segments"] for bl in s["blocks"] if bl["address"] == a)
    # As PyTorch's: a free block keeps the request of the allocation freed into it last.
    assert freed["state"] == "inactive" and freed["requested_size"] == 1000
    live = next(bl for bl in mine[0]["blocks"] if bl["address"] == b)
    assert live["state"] == "active_allocated" and live["requested_size"] == 3 * MiB
    assert live["frames"] and live["frames"][0]["name"] == "test_snapshot_structure_and_history"

    trace = snap["device_traces"][0]
    acts = [e["action"] for e in trace]
    assert "alloc" in acts and "free_requested" in acts and "free_completed" in acts
    # As in PyTorch, a snapshot's own "snapshot" event is recorded after its
    # history was taken: the last entry is a's free, with a's requested size.
    assert "snapshot" not in acts
    assert trace[-1]["action"] == "free_completed" and trace[-1]["addr"] == a and trace[-1]["size"] == 1000
    for e in trace:
        assert set(e) - {"addr", "device_free"} == TRACE_KEYS
    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == b]
    assert allocs and allocs[0]["frames"], "Python frames for an allocation through symm.alloc"
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)

    # The next snapshot lists that event, sized by the device's active bytes.
    ev = again["device_traces"][0][-1]
    assert ev["action"] == "snapshot" and ev["size"] == sum(s["active_size"] for s in snap["segments"] if s["device"] == 0)
    assert [e["action"] for e in again["device_traces"][0]].count("snapshot") == 1, "a size query records none"

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


def test_annotations_in_history():
    """symm_pool_set_annotation: each entry carries the user metadata and the
    compile context current when it was recorded ("N/A": none), as
    PyTorch's _set_memory_metadata and compile regions do; a NULL text is
    refused and changes nothing."""
    import symm
    from symm._loader import load

    lib = load()
    symm.record_memory_history(enabled="all", max_entries=1000)
    try:
        assert lib.symm_pool_set_annotation(b"metadata test", b"") == 0
        a = symm.alloc(1000)
        assert lib.symm_pool_set_annotation(b"", b"Torch-Compiled Region: 0/0") == 0
        symm.free(a, 1000)
        assert lib.symm_pool_set_annotation(None, b"x") != 0
        assert b"NULL" in lib.symm_last_error()
        assert lib.symm_pool_set_annotation(b"x", None) != 0
        assert lib.symm_pool_set_annotation(b"", b"") == 0
        b = symm.alloc(1000)
        trace = symm.memory_snapshot()["device_traces"][0]
        symm.free(b, 1000)
    finally:
        symm.record_memory_history(enabled=None)
    got = [(e["action"], e["user_metadata"], e["compile_context"]) for e in trace if e.get("addr") in (a, b)]
    allocs = [g for g in got if g[0] == "alloc"]
    assert allocs[0] == ("alloc", "metadata test", "N/A")
    assert allocs[-1] == ("alloc", "", "N/A")
    frees = [g for g in got if g[0].startswith("free")]
    assert frees == [("free_requested", "", "Torch-Compiled Region: 0/0"),
                     ("free_completed", "", "Torch-Compiled Region: 0/0")]
