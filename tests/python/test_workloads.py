"""bench/workloads.py without a GPU: arguments, the trace CSV, the tables, the
parent's loop over children (with stand-in children), and the NVML poller
with a stand-in pynvml and without one. The workloads themselves need a GPU."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "bench" / "workloads.py"


@pytest.fixture(scope="module")
def wl():
    spec = importlib.util.spec_from_file_location("symm_bench_workloads", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "torch" not in mod.__dict__
    return mod


def test_parse_args_defaults(wl, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    a = wl.parse_args([])
    assert a.workloads == ["gpt2", "cnn", "llm_infer", "generate"]
    assert a.modes == ["native", "native_expandable", "symm", "symm_expandable", "symm_mempool"]
    assert (a.runs, a.timeout, a.record_trace, a.steps, a.child) == (3, 300, None, None, None)
    assert a.out == ROOT / "build" / "workloads.md"
    monkeypatch.setenv("OUT", "/tmp/o")
    assert wl.parse_args([]).out == Path("/tmp/o/workloads.md")


def test_parse_args_custom_and_errors(wl, tmp_path):
    a = wl.parse_args(["--workloads", "gpt2,cnn", "--modes", "native,symm", "--runs", "1",
                       "--record-trace", str(tmp_path), "--out", str(tmp_path / "x.md"), "--timeout", "10"])
    assert (a.workloads, a.modes, a.runs, a.timeout) == (["gpt2", "cnn"], ["native", "symm"], 1, 10)
    assert a.record_trace == tmp_path and a.out == tmp_path / "x.md"
    for bad in (["--workloads", "bert"], ["--modes", "native,rmm"], ["--runs", "0"]):
        with pytest.raises(SystemExit):
            wl.parse_args(bad)
    c = wl.parse_args(["--child", "cnn", "--mode", "symm_mempool", "--run", "2", "--steps", "4"])
    assert (c.child, c.mode, c.run, c.steps, c.trace_dir) == ("cnn", "symm_mempool", 2, 4, None)


def test_child_env_per_mode(wl, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage")
    monkeypatch.setenv("SYMM_POOL_EXPANDABLE", "1")
    monkeypatch.setenv("SYMM_POOL_FRONT_CACHE", "1")
    for mode in wl.MODES:
        env = wl.child_env(mode)
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert "SYMM_DEVICE" not in env
        assert str(ROOT / "python") in env["PYTHONPATH"].split(":")
        assert env.get("PYTORCH_CUDA_ALLOC_CONF") == ("expandable_segments:True" if mode == "native_expandable" else None)
        expandable = "_expandable" in mode and mode.startswith("symm")
        assert env.get("SYMM_POOL_EXPANDABLE") == ("1" if expandable else None)
        assert env.get("SYMM_POOL_UNMAP_FREE_PAGES") == ("0" if mode == "symm_expandable_keep" else None)
        assert env.get("SYMM_POOL_FRONT_CACHE") == ("1" if mode == "symm_front" else None)
        # Replace modes name whether libsymm's PyTorch extension is required
        # (1) or left out (0): a silent fallback would measure the wrong thing.
        want_ext = {"symm": "1", "symm_expandable": "1", "symm_hooks": "0", "symm_hooks_expandable": "0",
                    "symm_expandable_keep": "1", "symm_front": "1"}.get(mode)
        assert env.get("SYMM_TORCH_EXT") == want_ext, mode


def test_trace_csv_from_fake_snapshot(wl, tmp_path):
    snap = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": 1 << 40, "size": 20 << 20, "stream": 0, "time_us": 1, "frames": []},
        {"action": "alloc", "addr": (1 << 40) + 512, "size": 8192, "stream": 0},
        {"action": "free_requested", "addr": (1 << 40) + 512, "size": 8192, "stream": 0},
        {"action": "free_completed", "addr": (1 << 40) + 512, "size": 8192, "stream": 7},
        {"action": "snapshot", "size": 0, "stream": 0},  # no addr: written as 0
    ]]}
    path = tmp_path / "t" / "gpt2_trace.csv.gz"
    assert wl.write_trace_csv(snap, 0, path) == 5
    raw = gzip.open(path, "rb").read()
    assert b"\r" not in raw and raw.startswith(b"action,addr,size,stream\nsegment_alloc,1099511627776,20971520,0\n")
    rows = list(csv.reader(gzip.open(path, "rt")))
    assert rows[4] == ["free_completed", str((1 << 40) + 512), "8192", "7"]
    assert rows[5] == ["snapshot", "0", "0", "0"]
    assert wl.write_trace_csv({"device_traces": []}, 0, tmp_path / "empty.csv.gz") == 0


def _row(w, m, run, dev, res, al, ms, err=None):
    return {"workload": w, "mode": m, "run": run, "peak_device_mib": dev, "peak_device_src": "nvml",
            "peak_reserved_mib": res, "peak_alloc_mib": al, "median_step_ms": ms, "error": err,
            "device": "NVIDIA H100 80GB HBM3", "date": "2026-01-02 03:04 UTC"}


def test_render_table(wl):
    rows = [_row("gpt2", "native", r, d, 15854, 15067, ms) for r, d, ms in
            ((1, 16082, 100.0), (2, 16080, 102.0), (3, 16090, 101.0))]
    rows += [_row("gpt2", "symm", r, 15500, 15200, 15067, 99.0) for r in (1, 2)]
    rows.append(_row("gpt2", "symm", 3, None, None, None, None, err="timeout"))
    rows.append(_row("gpt2", "native", 0, 17000, 1, 1, 500.0))  # trace run: not in the table
    rows[-1]["trace"] = "/tmp/gpt2_trace.csv.gz"
    md = wl.render(rows, ["gpt2", "cnn"], ["native", "native_expandable", "symm"])
    print(md)
    assert "## gpt2 · NVIDIA H100 80GB HBM3 · 2026-01-02 03:04 UTC · peak device from nvml" in md
    assert "| native | 16082 / 16080 / 16090 | 16090 | 15854 | 15067 | 1.052 | 101.0 | 1.00× |  |" in md
    assert "| symm | 15500 / 15500 / – | 15500 | 15200 | 15067 | 1.009 | 99.0 | 0.98× | run 3: timeout |" in md
    assert "| native_expandable |" not in md  # a mode without rows gets no line
    assert "## cnn" not in md and "17000" not in md and "gpt2: /tmp/gpt2_trace.csv.gz" in md


def test_render_chunk_costs(wl):
    rows = []
    for r, maps in ((1, 480), (2, 520), (3, 500)):
        row = _row("gpt2", "symm_expandable_keep", r, 15000, 14900, 14800, 100.0)
        row["steps"] = 48
        row["chunk_stats"] = {"num_chunk_maps": maps, "num_chunk_unmaps": 240, "chunk_map_us": 4800,
                              "chunk_unmap_us": 960, "num_spare_chunks_reused": 96, "num_release_failures": 3}
        rows.append(row)
    rows.append(dict(_row("gpt2", "symm", 1, 15500, 15200, 15067, 99.0), steps=48,
                     chunk_stats={"num_chunk_maps": 0, "num_chunk_unmaps": 0, "chunk_map_us": 0,
                                  "chunk_unmap_us": 0, "num_spare_chunks_reused": 0}))
    md = wl.render(rows, ["gpt2"], ["symm", "symm_expandable_keep"])
    print(md)
    assert "| mode | maps | µs mapping | unmaps | µs unmapping | spare chunks reused | failed releases |" in md
    assert "| symm_expandable_keep | 10.4 | 100 | 5.0 | 20 | 2.0 | 0.06 |" in md
    assert "| symm | 0.0" not in md  # fixed segments: no chunk costs to show


def test_parse_result(wl):
    assert wl.parse_result("noise\nRESULT {\"a\": 1}\nRESULT {\"a\": 2}\nmore") == {"a": 2}
    assert wl.parse_result("") is None and wl.parse_result(None) is None


def test_nvml_index(wl, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert wl.nvml_index() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert wl.nvml_index() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert wl.nvml_index() == 0


def test_poller_without_pynvml_falls_back(wl, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails in the forked poller
    p = wl.Poller()
    assert p.start() is False and "pynvml" in p.error
    assert p.stop() is None


MiB = 1 << 20


def _fake_pynvml():
    """NVML whose first 5 reads (the poller's baseline) say 1001..1005 MiB, then 5001 MiB."""
    fake = types.ModuleType("pynvml")
    calls = {"n": 0}

    def info(handle):
        calls["n"] += 1
        assert handle == "h2"
        return types.SimpleNamespace(used=(1000 + calls["n"] if calls["n"] <= 5 else 5001) * MiB)

    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    fake.nvmlDeviceGetMemoryInfo = info
    return fake


def test_poller_with_fake_pynvml(wl, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    p = wl.Poller(index=2)
    assert p.start() is True, p.error
    time.sleep(0.3)
    t0 = time.time()
    r = p.stop()
    assert time.time() - t0 < 5 and r is not None
    assert r["baseline"] == 1001 * MiB  # the lowest of the reads before the child starts
    assert r["peak"] == 5001 * MiB and r["samples"] >= 10 and r["read_errors"] == 0
    assert p.proc is None


def _stub_children(wl, monkeypatch, script):
    """Makes the parent run `script` (python -c) instead of the real child."""
    monkeypatch.setattr(wl, "child_command", lambda w, m, r, t, s: [sys.executable, "-c", script, w, m, str(r)])


CHILD_OK = """
import json, sys
w, m, r = sys.argv[1], sys.argv[2], int(sys.argv[3])
if m == "symm_mempool":
    raise SystemExit(3)  # dies without a result
if m == "symm" and r == 2:
    raise RuntimeError("CUDA out of memory")  # a crash with a traceback, no result
print("noise")
print("RESULT " + json.dumps({"workload": w, "mode": m, "run": r, "peak_device_mib": 100.0 + r,
    "peak_device_src": "mem_get_info", "peak_alloc_mib": 50.0, "peak_reserved_mib": 60.0,
    "median_step_ms": 10.0 * (2 if m == "symm" else 1), "steps": 5, "error": None,
    "date": "2026-01-02 03:04 UTC", "device": "FakeGPU"}))
"""


def test_parent_loop_with_stub_children(wl, monkeypatch, tmp_path, capsys):
    _stub_children(wl, monkeypatch, CHILD_OK)
    out = tmp_path / "res" / "w.md"
    a = wl.parse_args(["--workloads", "cnn", "--modes", "native,symm,symm_mempool", "--runs", "2",
                       "--out", str(out), "--timeout", "120", "--no-nvml"])
    assert wl.parent_main(a) == 0
    rows = [json.loads(ln) for ln in (tmp_path / "res" / "w.jsonl").read_text().splitlines()]
    # interleaved: run 1 of every mode, then run 2
    assert [(r["mode"], r["run"]) for r in rows] == [
        ("native", 1), ("symm", 1), ("symm_mempool", 1), ("native", 2), ("symm", 2), ("symm_mempool", 2)]
    assert rows[2]["error"].startswith("rc=3") and rows[4]["error"].startswith("rc=1")
    assert "CUDA out of memory" in rows[4]["log"]
    assert all(r["peak_device_src"] == "mem_get_info" for r in rows)
    md = out.read_text()
    assert "| native | 101 / 102 | 102 | 60 | 50 | 1.200 | 10.0 | 1.00× |  |" in md
    assert "| symm | 101 / – | 101 | 60 | 50 | 1.200 | 20.0 | 2.00× | run 2: rc=1, no result |" in md
    assert "| symm_mempool | – / – | – |" in md
    stdout = capsys.readouterr().out
    assert stdout.rstrip().endswith(md.rstrip().splitlines()[-1])  # the table is printed last


def test_timed_out_child_is_a_row(wl, monkeypatch):
    _stub_children(wl, monkeypatch, "import time; print('started', flush=True); time.sleep(60)")
    a = wl.parse_args(["--timeout", "2", "--no-nvml"])
    t0 = time.time()
    row = wl.run_one("gpt2", "symm", 1, a, None)
    assert time.time() - t0 < 30
    assert (row["workload"], row["mode"], row["run"], row["error"]) == ("gpt2", "symm", 1, "timeout")
    assert row["peak_device_src"] == "mem_get_info" and row["peak_device_mib"] is None


def test_parent_uses_poller_and_records_trace_run(wl, monkeypatch, tmp_path):
    _stub_children(wl, monkeypatch, CHILD_OK)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setattr(wl, "nvml_index", lambda: 2)
    a = wl.parse_args(["--workloads", "gpt2", "--modes", "native", "--runs", "1", "--record-trace",
                       str(tmp_path / "tr"), "--out", str(tmp_path / "w.md")])
    wl.parent_main(a)
    rows = [json.loads(ln) for ln in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert [(r["mode"], r["run"]) for r in rows] == [("native", 0), ("native", 1)]
    for r in rows:
        assert r["peak_device_src"] == "nvml" and r["peak_device_mib"] == 4000.0
        assert r["peak_device_steps_mib"] == 100.0 + r["run"]


def test_child_without_torch_reports_error(wl):
    """The child prints a RESULT with the error even when torch is missing."""
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    import subprocess

    proc = subprocess.run([sys.executable, str(SCRIPT), "--child", "gpt2", "--mode", "native", "--run", "1"],
                          capture_output=True, text=True, timeout=60)
    res = wl.parse_result(proc.stdout)
    assert proc.returncode == 0 and res is not None
    assert res["workload"] == "gpt2" and "torch" in res["error"] and res["steps"] == 0


def test_llm_requests_deterministic(wl):
    reqs = wl.llm_requests()
    assert reqs == wl.llm_requests() and len(reqs) == 12
    assert all(b in (1, 4, 8, 16) and 64 <= p <= 1024 and 16 <= n <= 64 for b, p, n in reqs)
    assert max(p + n for _, p, n in reqs) <= 4096


# ---- the child's harness, in process, over a stand-in torch (and symm) ----


def _fake_torch(log: list):
    """Enough of torch.cuda for run_child: a device whose used memory the workload moves."""
    import contextlib

    torch = types.ModuleType("torch")
    torch.__version__ = "0.fake"
    state = {"used": 500 * MiB, "total": 80000 * MiB, "history": False}

    @contextlib.contextmanager
    def use_mem_pool(pool):
        log.append(("enter", pool))
        yield
        log.append(("exit", pool))

    def record(enabled="all", context="all", stacks="all", max_entries=0):
        log.append(("history", enabled, context, stacks, max_entries))
        state["history"] = enabled == "all"

    torch.cuda = types.SimpleNamespace(
        init=lambda: log.append("init"), set_device=lambda d: None, current_device=lambda: 0,
        get_device_name=lambda d: "FakeGPU", synchronize=lambda: None, empty_cache=lambda: log.append("empty_cache"),
        mem_get_info=lambda d: (state["total"] - state["used"], state["total"]),
        max_memory_allocated=lambda d: 3000 * MiB, max_memory_reserved=lambda d: 3300 * MiB,
        MemPool=lambda alloc: ("pool", alloc), use_mem_pool=use_mem_pool,
        memory=types.SimpleNamespace(_record_memory_history=record, _snapshot=lambda: {"device_traces": [[
            {"action": "alloc", "addr": 4096, "size": 512, "stream": 0},
            {"action": "free_completed", "addr": 4096, "size": 512, "stream": 0}]]}))
    return torch, state


def _fake_symm(log: list):
    symm = types.ModuleType("symm")
    symm.use_as_default = lambda: log.append("use_as_default")
    symm.pool_allocator = lambda: types.SimpleNamespace(allocator=lambda: "symm-alloc")
    symm.version = lambda: "0.1.0"
    symm.memory_stats = lambda d=0: {"allocated_bytes.all.peak": 2000 * MiB, "reserved_bytes.all.peak": 2100 * MiB}
    return symm


def _fake_workload(state, fail_at=None):
    def wl(torch, steps):
        state["used"] += 1000 * MiB  # the model
        yield
        for i in range(steps):
            if i == fail_at:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            state["used"] += 100 * MiB if i == 2 else 0
            time.sleep(0.02 if i < 3 else 0.001)  # slow warm-up steps must not count
            yield
    return wl


@pytest.mark.parametrize("mode", ["native", "native_expandable", "symm", "symm_expandable", "symm_mempool"])
def test_child_harness_with_fake_torch(wl, monkeypatch, mode, tmp_path, capsys):
    log: list = []
    torch, state = _fake_torch(log)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "symm", _fake_symm(log))
    monkeypatch.setitem(wl.WORKLOAD_FNS, "cnn", _fake_workload(state))
    wl.child_main(wl.parse_args(["--child", "cnn", "--mode", mode, "--run", "2", "--steps", "8"]))
    res = wl.parse_result(capsys.readouterr().out)
    assert res["error"] is None and res.get("teardown_error") is None, res
    assert (res["workload"], res["mode"], res["run"], res["steps"], res["device"]) == ("cnn", mode, 2, 8, "FakeGPU")
    assert res["peak_device_mib"] == 1100.0 and res["peak_device_src"] == "mem_get_info"
    assert res["median_step_ms"] < 15 and min(res["step_ms"][:3]) >= 15  # warm-up steps excluded
    if mode in ("symm", "symm_expandable"):
        assert (res["peak_alloc_mib"], res["peak_reserved_mib"]) == (2000.0, 2100.0)
        assert log.index("use_as_default") < log.index("init")  # before CUDA starts
    else:
        assert (res["peak_alloc_mib"], res["peak_reserved_mib"]) == (3000.0, 3300.0)
        assert "use_as_default" not in log
    pool_events = [e for e in log if isinstance(e, tuple) and e[0] in ("enter", "exit")]
    assert pool_events == ([("enter", ("pool", "symm-alloc")), ("exit", ("pool", "symm-alloc"))]
                           if mode == "symm_mempool" else [])
    assert not any(isinstance(e, tuple) and e[0] == "history" for e in log)  # no history in timed runs


def test_child_harness_oom_and_trace(wl, monkeypatch, tmp_path, capsys):
    log: list = []
    torch, state = _fake_torch(log)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(wl.WORKLOAD_FNS, "gpt2", _fake_workload(state, fail_at=5))
    wl.child_main(wl.parse_args(["--child", "gpt2", "--mode", "native", "--run", "0", "--trace-dir", str(tmp_path)]))
    res = wl.parse_result(capsys.readouterr().out)
    assert res["error"].startswith("RuntimeError: CUDA out of memory") and res["steps"] == 5
    assert res["peak_alloc_mib"] == 3000.0 and res["peak_device_mib"] == 1100.0
    assert ("history", "all", None, "python", 2_000_000) in log and ("history", None, "all", "all", 0) in log
    assert res["trace_rows"] == 2 and res["trace"] == str(tmp_path / "gpt2_trace.csv.gz")
    assert gzip.open(tmp_path / "gpt2_trace.csv.gz", "rt").read() == (
        "action,addr,size,stream\nalloc,4096,512,0\nfree_completed,4096,512,0\n")
