"""Paired timing without torch or a GPU: bench/pairing.py's protocol with its
serving children (played here by small Python scripts), bench/bench_paired.py's
alternation of the pairs and its report, and bench/front_paired.py end to end
on the host backend with the real build/bench/bench_trace --serve. A child that
hangs, exits, skips or refuses a request fails the run with its name, within a
timeout, instead of hanging it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

SCRIPT = ROOT / "bench" / "bench_paired.py"
FRONT = ROOT / "bench" / "front_paired.py"
BENCH_TRACE = ROOT / "build" / "bench" / "bench_trace"  # make test-python builds it


def load(name, path):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bp():
    return load("symm_bench_paired", SCRIPT)


@pytest.fixture(scope="module")
def pairing(bp):
    return sys.modules["pairing"]  # the one bench_paired imported


def fake(tmp_path, name, body):
    """A serving child: `body` runs after its imports, with CONFIG, LOG and
    NS (this config's ns per call) defined."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent("""\
        import json, sys, time
        CONFIG, LOG, NS = sys.argv[1], sys.argv[2], float(sys.argv[3])
    """) + textwrap.dedent(body))
    return path


SERVE = """\
    print("READY", flush=True)
    seen = {}
    for line in sys.stdin:
        op, size = line.split()
        with open(LOG, "a") as f:
            f.write(f"{CONFIG} {op} {size}\\n")
        n = seen[line] = seen.get(line, 0) + 1  # the pair's number, from 1
        print("noise line", flush=True)  # other output is passed over
        print("SLICE " + json.dumps({"median_ns": NS * (2 if n % 2 else 1), "min_ns": NS}), flush=True)
"""


def start(pairing, script, config, log, ns):
    return pairing.Child(config, [sys.executable, str(script), config, str(log), str(ns)], env=None)


def test_pairs_alternate_and_ratios(bp, pairing, tmp_path):
    script, log = fake(tmp_path, "serve", SERVE), tmp_path / "order.log"
    kids = [start(pairing, script, "native", log, 100), start(pairing, script, "symm", log, 70)]
    try:
        for k in kids:
            k.expect("READY", 30)
        slices = bp.run_pairs(kids, (512, 1 << 20), 3, ops=("raw", "empty"))
    finally:
        for k in kids:
            k.close()
    order = log.read_text().split("\n")[:-1]
    assert len(order) == 3 * 2 * 2 * 2
    # Pair 0 of every cell native first, pair 1 symm first, cells in turn.
    assert order[:4] == ["native raw 512", "symm raw 512", "native raw 1048576", "symm raw 1048576"]
    assert order[8:10] == ["symm raw 512", "native raw 512"]
    # Each child's slices alternate 2x and 1x its cost, in step with the
    # other's, so every pair's ratio is 0.7 although the ns vary.
    cell = slices["raw"]["512"]
    assert cell == {"native": [200.0, 100.0, 200.0], "symm": [140.0, 70.0, 140.0]}
    meta = {"date": "d", "device": "dev", "torch": "t", "cuda": "c", "symm": "s"}
    md = bp.render(slices, ["native", "symm"], (512, 1 << 20), meta, 3, 7)
    assert "| raw_alloc + raw_delete | 512 B | 200 | 140 | 0.70× (0.70–0.70) |" in md
    assert "pinned to CPU 7" in md


def test_quartiles(pairing):
    assert pairing.quartiles([5, 1, 4, 2, 3, 6, 8, 7]) == (3, 5, 7)
    assert pairing.quartiles([1.5]) == (1.5, 1.5, 1.5)


def test_hung_child_times_out(pairing, tmp_path, monkeypatch):
    monkeypatch.setattr(pairing, "SLICE_TIMEOUT_S", 1)
    script = fake(tmp_path, "hang", 'print("READY", flush=True)\ntime.sleep(60)\n')
    k = start(pairing, script, "symm", tmp_path / "log", 1)
    try:
        k.expect("READY", 30)
        with pytest.raises(pairing.ChildError, match=r"symm: no 'SLICE' line within 1 s"):
            k.slice("raw 512")
    finally:
        k.proc.kill()
        k.close()


def test_child_exiting_before_ready_names_it(pairing, tmp_path):
    script = fake(tmp_path, "die", 'print("cannot load libsymm", flush=True)\nsys.exit(3)\n')
    k = start(pairing, script, "symm", tmp_path / "log", 1)
    with pytest.raises(pairing.ChildError, match=r"symm: exited \(rc=3\) before 'READY'.*cannot load libsymm"):
        k.expect("READY", 30)
    k.close()


def test_skipping_child_is_an_error(pairing, tmp_path):
    script = fake(tmp_path, "skip", 'print("SKIP rmm: cannot import rmm", flush=True)\n')
    k = start(pairing, script, "rmm", tmp_path / "log", 1)
    with pytest.raises(pairing.ChildError, match="SKIP rmm: cannot import rmm"):
        k.expect("READY", 30)
    k.close()


@pytest.mark.parametrize("args, message", [
    (["--configs", "native"], "want two or more distinct"),
    (["--configs", "native,native"], "want two or more distinct"),
    (["--configs", "native,bogus"], "want two or more distinct"),
    (["--pairs", "0"], "--pairs must be at least 1"),
    (["--cpu", "100000"], "--cpu 100000: not one of the CPUs"),
])
def test_bad_arguments(args, message):
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert message in p.stderr


def test_bench_torch_refuses_unknown_paths():
    env = {"SYMM_BENCH_PATHS": "raw,bogus", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_torch.py"), "--help"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0
    assert "SYMM_BENCH_PATHS=raw,bogus: unknown ['bogus']" in p.stderr


def serve_trace(pairing, tmp_path, rows, front_cache="1"):
    csv = tmp_path / "t.csv"
    csv.write_text("action,addr,size,stream\n" + "".join(
        f"alloc,{a},{s},0\nfree_completed,{a},{s},0\n" for a, s in rows))
    env = dict(os.environ, SYMM_DEVICE="host", SYMM_PUBLISH="0", SYMM_POOL_FRONT_CACHE=front_cache)
    return pairing.Child("trace", [str(BENCH_TRACE), str(csv), "--serve"], env)


END = re.compile(r"peak allocated (\d+) bytes, peak reserved (\d+) bytes, front cache hits (\d+) of (\d+) allocations")


def test_bench_trace_serves_slices_and_refuses_bad_requests(pairing, tmp_path):
    k = serve_trace(pairing, tmp_path, ((4096, 512), (8192, 1 << 20), (16384, 3 << 20)))
    try:
        k.expect("READY", 60)
        d = k.slice("5")
        assert d["passes"] == 5 and 0 < d["min_ns"] <= d["median_ns"]
        for bad in ("0", "1001", "abc", "3x", ""):
            with pytest.raises(pairing.ChildError, match="ERROR request .*: want a number of passes from 1 to 1000"):
                k.slice(bad)
        assert k.slice("1")["passes"] == 1  # still serving after the refusals
        m = END.fullmatch(k.finish("PEAKS ", 30))
        assert m
        # Each block is freed before the next: the largest is the peak. 7
        # passes (the first fills the pool) of 3 allocations, none served by
        # the front cache: parked blocks count as allocated, so each miss
        # would pass the peak with the others' blocks parked, and the pool
        # takes back everything parked before it places. No request then
        # finds a block of its size.
        assert int(m.group(1)) == 3 << 20 and int(m.group(2)) >= 3 << 20
        assert (int(m.group(3)), int(m.group(4))) == (0, 21)
    finally:
        k.close()


@pytest.mark.parametrize("front_cache", ["0", "1"])
def test_bench_trace_counts_front_cache_hits(pairing, tmp_path, front_cache):
    # Two 512 B blocks, one after the other: with the front cache on, every
    # request but the first finds the block the one before freed, parked on
    # its CPU. A request may miss when the thread moved to another CPU
    # while it waited for the parent (before each slice) or mid-pass.
    k = serve_trace(pairing, tmp_path, ((4096, 512), (8192, 512)), front_cache)
    try:
        k.expect("READY", 60)
        k.slice("5")
        k.slice("1")
        m = END.fullmatch(k.finish("PEAKS ", 30))
        assert m and int(m.group(1)) == 512 and int(m.group(4)) == 14
        hits = int(m.group(3))
        assert (hits == 0) if front_cache == "0" else (10 <= hits <= 13), hits
    finally:
        k.close()


def test_front_paired_end_to_end(tmp_path):
    # --against this very build: a third process, front cache on, in every pair.
    env = dict(os.environ, OUT=str(tmp_path))
    p = subprocess.run([sys.executable, str(FRONT), "--traces", "gpt2_train", "--pairs", "2", "--passes", "1",
                        "--bin", str(BENCH_TRACE), "--against", str(BENCH_TRACE)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "front_paired.md").read_text()
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in md.splitlines() if ln.startswith("| GPT-2 training |")]
    assert [r[2] for r in rows] == ["off", "on", "on, --against build"], md
    ratio = r"\d+\.\d\d× \(\d+\.\d\d–\d+\.\d\d\)"
    for r in rows:
        assert r[1] == "25,597" and re.fullmatch(r"[\d,]+", r[3])
        # The front cache leaves the peaks as they are: what the pool's own
        # replay of this trace reaches (bench/RESULTS.md), in every process.
        assert (r[6], r[7]) == ("14,590", "15,336"), r
    off, on, other = rows
    assert off[4:6] == ["–", "–"] and off[8] == "–"
    assert re.fullmatch(ratio, on[4]) and on[5] == "–" and re.fullmatch(r"\d+\.\d %", on[8])
    assert re.fullmatch(ratio, other[4]) and re.fullmatch(ratio, other[5]) and re.fullmatch(r"\d+\.\d %", other[8])


@pytest.mark.parametrize("args, message", [
    (["--traces", "bogus"], "want some of cnn_train"),
    (["--pairs", "0"], "want pairs >= 1 and passes from 1 to 1000"),
    (["--passes", "1001"], "want pairs >= 1 and passes from 1 to 1000"),
    (["--bin", "/nonexistent/bench_trace"], "--bin /nonexistent/bench_trace: not an executable"),
    (["--against", "/nonexistent/old"], "--against /nonexistent/old: not an executable"),
])
def test_front_paired_bad_arguments(args, message):
    p = subprocess.run([sys.executable, str(FRONT), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert message in p.stderr


REPLAY = ROOT / "bench" / "replay_paired.py"


@pytest.mark.parametrize("args, message", [
    (["--configs", "native"], "want two or more distinct configurations"),
    (["--configs", "native,bogus"], "want two or more distinct configurations"),
    (["--traces", "no_such_trace"], "got --configs native,symm --traces no_such_trace"),
    (["--pairs", "0"], "--pairs 0 --passes 1: want both at least 1"),
    (["--serve", "bogus", "--ext", "x", "--data", "y"], "--serve 'bogus': want one of"),
])
def test_replay_paired_bad_arguments(args, message):
    p = subprocess.run([sys.executable, str(REPLAY), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert message in p.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="checks the message torch's absence gives")
def test_replay_paired_without_torch_says_so():
    p = subprocess.run([sys.executable, str(REPLAY), "--traces", "gpt2_train"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert "torch is not importable; this benchmark runs on the GPU machine" in p.stderr
