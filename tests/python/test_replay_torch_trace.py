"""bench/replay_torch.py without torch or a GPU: the host-side trace compiler (slot pairing, reuse,
skipped rows, stream indices), its binary file, and the report. The replay itself needs a GPU."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "bench" / "replay_torch.py"
GPT2 = ROOT / "bench" / "testdata" / "gpt2_train_trace.csv.gz"


@pytest.fixture(scope="module")
def rt():
    spec = importlib.util.spec_from_file_location("symm_bench_replay_torch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_trace(path, rows):
    with gzip.open(path, "wt", newline="") as f:
        f.write("action,addr,size,stream\n")
        f.writelines(",".join(str(x) for x in r) + "\n" for r in rows)
    return path


SMALL = [
    ("segment_alloc", 1000, 2 << 20, 0),
    ("alloc", 1000, 512, 0),            # slot 0
    ("alloc", 2000, 1024, 0),           # slot 1
    ("free_requested", 1000, 512, 0),   # not a free yet
    ("free_completed", 1000, 512, 0),   # frees slot 0
    ("alloc", 3000, 256, 7),            # reuses slot 0; stream 7 is index 1
    ("free_completed", 9999, 64, 0),    # never allocated: skipped
    ("alloc", 4000, 0, 0),              # size 0: skipped
    ("alloc", 5000, 128, 9),            # slot 2; stream 9 is index 2
    ("alloc", 2000, 2048, 7),           # address still live: its block is freed first (a lost free)
    ("free_completed", 3000, 256, 7),   # frees slot 0
    ("free_completed", 3000, 256, 7),   # a double free: skipped
]


def test_compile_small_trace(rt, tmp_path):
    c = rt.compile_trace(write_trace(tmp_path / "t.csv.gz", SMALL))
    assert list(c["op"]) == [1, 1, 0, 1, 1, 0, 1, 0]
    assert list(c["slot"]) == [0, 1, 0, 0, 2, 1, 1, 0]
    assert list(c["size"]) == [512, 1024, 512, 256, 128, 1024, 2048, 256]
    assert list(c["stream"]) == [0, 0, 0, 1, 2, 0, 1, 1]
    assert c["stream_ids"] == [7, 9]
    assert {k: c[k] for k in ("rows", "allocs", "frees", "lost_frees", "unmatched_frees", "skipped", "ops",
                              "nslots", "streams", "live_at_end", "peak_live_bytes")} == dict(
        rows=12, allocs=5, frees=3, lost_frees=1, unmatched_frees=2, skipped=1, ops=8, nslots=3, streams=3,
        live_at_end=2, peak_live_bytes=256 + 128 + 2048)  # 1024 freed before 2048


def test_compile_plain_csv_and_bad_header(rt, tmp_path):
    plain = tmp_path / "t.csv"
    plain.write_text("action, addr, size, stream\nalloc,8,512,0\nfree_completed,8,512,0\n")
    c = rt.compile_trace(plain)
    assert (list(c["op"]), c["nslots"], c["live_at_end"]) == ([1, 0], 1, 0)
    (tmp_path / "bad.csv").write_text("a,b,c,d\n")
    with pytest.raises(ValueError, match="header"):
        rt.compile_trace(tmp_path / "bad.csv")


def test_compiled_file_round_trip(rt, tmp_path):
    c = rt.compile_trace(write_trace(tmp_path / "t.csv.gz", SMALL))
    rt.write_compiled(c, tmp_path / "t.bin")
    back = rt.read_compiled(tmp_path / "t.bin")
    assert (back["ops"], back["nslots"], back["streams"]) == (8, 3, 3)
    for key in ("op", "slot", "size", "stream"):
        assert back[key] == c[key]
    assert rt.columns_bytes(back) == rt.columns_bytes(c)
    assert len(rt.columns_bytes(c)) == 8 * 4 * 8  # what the extension checks: 4 int64 columns


def test_compile_gpt2_trace(rt):
    c = rt.compile_trace(GPT2)
    with gzip.open(GPT2, "rt") as f:
        actions = [r[0] for r in csv.reader(f)][1:]
    assert c["allocs"] == actions.count("alloc")
    assert c["rows"] == len(actions)
    live = set()
    for op, slot in zip(c["op"], c["slot"]):
        if op:
            assert slot not in live, "an alloc must get a free slot"
            live.add(slot)
        else:
            assert slot in live, "a free must name a slot allocated and still live"
            live.discard(slot)
        assert 0 <= slot < c["nslots"]
    assert len(live) == c["live_at_end"]
    assert c["ops"] == c["allocs"] + c["frees"] == len(c["op"])
    assert c["streams"] == 1 and c["stream_ids"] == [] and set(c["stream"]) == {0}


def test_imports_and_dry_runs_without_torch(rt, tmp_path):
    assert "torch" not in rt.__dict__
    trace = write_trace(tmp_path / "small_trace.csv.gz", SMALL)
    # torch blocked: an import of it would fail; the dry run must not need it.
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = ['replay_torch.py', '--dry-run', '--traces', {str(trace)!r}]; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "| small | 12 | 5 | 3 | 1 | 2 | 1 | 3 | 3 | 2 |" in proc.stdout


def test_child_env_matches_workloads(rt):
    env = rt.child_env("symm_expandable")
    assert (env["SYMM_POOL_EXPANDABLE"], env["SYMM_TORCH_EXT"], env["NCCL_NVLS_ENABLE"]) == ("1", "1", "0")
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT / "python")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert rt.child_env("native_expandable")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_render(rt, tmp_path):
    comps = {"small": rt.compile_trace(write_trace(tmp_path / "t.csv.gz", SMALL))}
    MiB = 1 << 20

    def row(config, rnd, ns, reserved=100 * MiB):
        return dict(config=config, trace="small", round=rnd, ns_per_call=[9000.0] + ns, alloc_errors=0,
                    peak_reserved_pass1=reserved, peak_reserved=reserved, peak_allocated_pass1=90 * MiB)

    rows = [row("native", 1, [100, 110, 120]), dict(row("symm", 1, [50, 60, 70]), direct_ns_per_call=[30, 40, 35]),
            row("native", 2, [200, 200, 200]), row("symm", 2, [50, 50, 50], 101 * MiB),
            dict(config="symm", trace="small", round=3, error="timed out after 300 s")]
    preds = {"small": dict(default=99 * MiB, default_front=1, expandable=1, expandable_front=1, recorded=98 * MiB,
                           rows_replayed=8)}
    meta = dict(date="d", gpu="g", torch="t", symm="s", command="c", passes=4, rounds=3, predictions="p")
    md = rt.render(rows, comps, preds, meta, ["native", "symm"])
    # native: round medians 110 and 200; symm: 60 and 50; ratios 60/110 and 50/200, median 0.40.
    assert "| native | 155 | 110–200 | 1.00× (1.00) | – | 9,000 | 100 | 98 | 100 | 90 |  |" in md
    assert ("| symm | 55 | 50–60 | 0.40× (0.25–0.55) | 35 | 9,000 | 100–101 | 99 | 100–101 | 90 | "
            "round 3: timed out after 300 s |") in md
    assert rt.failed(rows[-1]) == "timed out after 300 s" and not rt.failed(rows[0])
    assert rt.failed(dict(rows[0], alloc_errors=2)) == "2 failed calls"
