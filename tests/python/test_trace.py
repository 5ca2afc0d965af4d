"""symm.trace: PyTorch memory snapshots (pickles of plain dicts) to the CSV
trace `symm replay` reads. Needs neither torch nor libsymm.so: the conversions
run in fresh interpreters with SYMM_LIB pointing nowhere."""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, child_env, run_python

from symm import trace

MiB = 1 << 20


def fake_snapshot() -> dict:
    """The shape torch.cuda.memory._snapshot() returns: segments, and per
    device a list of events carrying more keys than the converter reads."""

    def ev(action, addr, size, stream=0, **extra):
        return {"action": action, "addr": addr, "size": size, "stream": stream,
                "time_us": 1700000000000000, "frames": [{"filename": "train.py", "line": 3, "name": "step"}], **extra}

    dev0 = [ev("alloc", 4096, 512)]
    dev1 = [
        ev("segment_alloc", 1 << 40, 2 * MiB),
        ev("alloc", 1 << 40, MiB, stream=0),
        ev("alloc", (1 << 40) + MiB, 4096, stream=94000000000000),
        ev("free_requested", 1 << 40, MiB),
        ev("free_completed", 1 << 40, MiB),
        ev("free_completed", 777, 512),  # allocated before recording began
        {"action": "oom", "device_free": 1024, "size": 3 * MiB, "stream": 0, "time_us": 1, "frames": []},
        ev("future_action", 1, 1),
        ev("snapshot", 0, 0),
        ev("segment_unmap", 1 << 41, 2 * MiB, compile_context="N/A", user_metadata=""),
    ]
    return {"segments": [], "device_traces": [dev0, dev1, []], "allocator_settings": {}}


EXPECTED = [
    ("segment_alloc", 1 << 40, 2 * MiB, 0),
    ("alloc", 1 << 40, MiB, 0),
    ("alloc", (1 << 40) + MiB, 4096, 94000000000000),
    ("free_requested", 1 << 40, MiB, 0),
    ("free_completed", 1 << 40, MiB, 0),
    ("free_completed", 777, 512, 0),
    ("oom", 0, 3 * MiB, 0),
    ("snapshot", 0, 0, 0),
    ("segment_unmap", 1 << 41, 2 * MiB, 0),
]


def test_from_snapshot_picks_the_busiest_device():
    assert trace.from_snapshot(fake_snapshot()) == EXPECTED
    assert trace.from_snapshot(fake_snapshot(), device=0) == [("alloc", 4096, 512, 0)]
    assert trace.from_snapshot(fake_snapshot(), device=2) == []
    rows, dev, skipped = trace.convert(fake_snapshot())
    assert dev == 1 and skipped == {"future_action": 1}


@pytest.mark.parametrize("snapshot, message", [
    ({"segments": []}, "no 'device_traces'"),
    ([1, 2], "no 'device_traces'"),
    ({"device_traces": {"0": []}}, "not a list of one list of events per device"),
    ({"device_traces": []}, "the snapshot has no device"),
    ({"device_traces": [[{"action": "alloc", "addr": 1, "size": -5, "stream": 0}]]},
     "device 0 event 0 (alloc): size -5 is not a non-negative 64-bit integer"),
    ({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 5, "stream": 0}]]},
     "device 0 event 0 (alloc): addr '0x10' is not"),
    ({"device_traces": [["alloc"]]}, "device 0 event 0: not a dict but str"),
])
def test_from_snapshot_errors(snapshot, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trace.from_snapshot(snapshot)


def test_device_out_of_range():
    with pytest.raises(ValueError, match=r"device 3 is not in the snapshot \(devices 0 to 2\)"):
        trace.from_snapshot(fake_snapshot(), device=3)


def convert_cli(*args: str) -> subprocess.CompletedProcess:
    """python -m symm.trace in a fresh interpreter that cannot load libsymm."""
    return subprocess.run([sys.executable, "-m", "symm.trace", *args],
                          env=child_env({"SYMM_LIB": "/nonexistent/libsymm.so"}),
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))


def test_import_needs_neither_torch_nor_library():
    proc = run_python("import sys, symm.trace, symm._loader as l; print('torch' in sys.modules, l._lib is None)",
                      env=child_env({"SYMM_LIB": "/nonexistent/libsymm.so"}))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def read_csv(path) -> list[str]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


@pytest.mark.parametrize("name", ["out.csv.gz", "out.csv"])
def test_cli_writes_the_trace(tmp_path, name):
    snap = tmp_path / "snapshot.pickle"
    snap.write_bytes(pickle.dumps(fake_snapshot()))
    out = tmp_path / name
    proc = convert_cli(str(snap), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 9 events of device 1 to {out}" in proc.stdout
    assert "skipped events of unknown actions: 1 'future_action'" in proc.stderr
    with open(out, "rb") as f:
        assert (f.read(2) == b"\x1f\x8b") == name.endswith(".gz")
    lines = read_csv(out)
    assert lines[0] == "action,addr,size,stream"
    assert lines[1:] == [",".join(map(str, row)) for row in EXPECTED]

    proc = convert_cli(str(snap), "-o", str(out), "--device", "0")
    assert proc.returncode == 0, proc.stderr
    assert read_csv(out) == ["action,addr,size,stream", "alloc,4096,512,0"]


def test_cli_errors(tmp_path):
    nodt = tmp_path / "plain.pickle"
    nodt.write_bytes(pickle.dumps({"segments": []}))
    garbage = tmp_path / "garbage.pickle"
    garbage.write_bytes(b"action,addr,size,stream\n")
    out = tmp_path / "out.csv"
    for args, message in [
        ([str(nodt)], "symm.trace: not a memory snapshot with events: no 'device_traces'"),
        ([str(garbage)], f"symm.trace: {garbage}: not a readable pickle"),
        ([str(tmp_path / "none.pickle")], "symm.trace: [Errno 2] No such file or directory"),
        ([str(nodt), "--device", "x"], "argument --device: invalid int value: 'x'"),
    ]:
        proc = convert_cli(*args, "-o", str(out))
        assert proc.returncode == (2 if "--device" in args else 1), (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert not out.exists()
    proc = convert_cli(str(nodt))
    assert proc.returncode == 2 and "the following arguments are required: -o/--output" in proc.stderr


def test_libsymm_snapshot_converts(symm, tmp_path):
    """symm.dump_snapshot writes the same structure as PyTorch: it converts
    too, and its alloc/free pairs survive the trip."""
    symm.record_memory_history(enabled="all", max_entries=1000)
    try:
        a = symm.alloc(1000)
        b = symm.alloc(3 * MiB)
        symm.free(a, 1000)
        symm.free(b, 3 * MiB)
        path = tmp_path / "libsymm.pickle"
        symm.dump_snapshot(str(path))
    finally:
        symm.record_memory_history(enabled=None)
    rows = trace.from_snapshot(trace.load(str(path)))
    mine = [(act, addr, size) for act, addr, size, _ in rows if addr in (a, b) and act in ("alloc", "free_completed")]
    assert [(act, addr) for act, addr, _ in mine] == [("alloc", a), ("alloc", b), ("free_completed", a),
                                                      ("free_completed", b)]
    # libsymm's history records the sizes asked for, as PyTorch's does.
    sizes = {addr: size for act, addr, size in mine if act == "alloc"}
    assert sizes[a] == 1000 and sizes[b] == 3 * MiB
    assert all(size == sizes[addr] for act, addr, size in mine)
    # The dump's own "snapshot" event comes after its history was taken.
    assert rows[-1][:2] == ("free_completed", b) or list(rows[-1][:2]) == ["free_completed", b]


def symm_tool():
    """build/symm, or the tool on PATH; None when neither is there."""
    built = ROOT / "build" / "symm"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    return shutil.which("symm")


def test_replay_reads_the_output(tmp_path):
    """The CSV written here is what symm replay (Go) parses and replays."""
    tool = symm_tool()
    if tool is None:
        pytest.skip("no symm tool built (make cli)")
    if subprocess.run([tool, "replay", "--help"], capture_output=True).returncode != 0:
        pytest.skip(f"{tool} has no replay command (an older build)")
    snap = tmp_path / "snapshot.pickle"
    snap.write_bytes(pickle.dumps(fake_snapshot()))
    out = tmp_path / "out.csv.gz"
    assert convert_cli(str(snap), "-o", str(out)).returncode == 0
    proc = subprocess.run([tool, "replay", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1 pre-existing blocks, 0 lost frees" in proc.stdout
