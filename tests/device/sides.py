"""The two sides of a check against PyTorch's allocator, shared by the GPU
scripts that compare libsymm with it (test_torch_settings.py,
test_torch_history.py, test_torch_graph_reuse.py, test_torch_parity.py).

A case runs twice, each time in a fresh interpreter (PyTorch swaps its
allocator once per process): "native", PyTorch's own allocator, the
reference; and "symm", libsymm as PyTorch's allocator. The child prints one
line, RESULT followed by JSON: {"ok": true, "facts": ...} or {"ok": false,
"error": ...}; the parent reads it back (run_side) and a case passes when
both sides ran and their facts are equal (judge).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
# Never let NCCL, NVSHMEM or torch symmetric memory create multicast objects.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def base_env() -> dict:
    """The parent's environment for the children: multicast off, libsymm's
    package on PYTHONPATH, no allocator settings of the caller's."""
    env = dict(os.environ, **SAFE_ENV, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT / "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "SYMM_TORCH_ALLOCATOR"):
        env.pop(var, None)
    return env


def autoload_env(env: dict) -> dict:
    """env with libsymm installed the way `symm run` installs it
    (SYMM_TORCH_ALLOCATOR=1, symm/_boot first on PYTHONPATH): a child
    process the case starts inherits libsymm as a user's would."""
    env = dict(env, SYMM_TORCH_ALLOCATOR="1")
    env["PYTHONPATH"] = str(ROOT / "python" / "symm" / "_boot") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("SYMM_LIB", str(ROOT / "build" / "libsymm.so"))
    return env


def start(alloc: str, autoloaded: bool = False):
    """In the child: torch with the side's allocator, CUDA up. "symm" is
    symm.use_as_default(), or, when autoloaded, what SYMM_TORCH_ALLOCATOR=1
    installed; either way on libsymm's PyTorch extension."""
    import torch

    if alloc == "symm":
        import symm

        if autoloaded:
            assert symm.is_default(), "SYMM_TORCH_ALLOCATOR=1 did not install libsymm"
        else:
            symm.use_as_default()
        st = symm.extension_status()
        assert st["extension"], f"libsymm's PyTorch extension is not in use: {st['reason']}"
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the allocator is up
    return torch


def child_result(facts: Callable[[], object]) -> int:
    """In the child: runs facts() and prints its RESULT line."""
    t0 = time.monotonic()
    try:
        res = {"ok": True, "facts": facts()}
    except Exception as e:  # noqa: BLE001
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:]}
    res["seconds"] = round(time.monotonic() - t0, 2)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def run_side(script: str, case: str, alloc: str, env: dict, timeout: float) -> dict:
    """Runs `script --child case alloc` and returns its RESULT, with the
    end of its output under "log"."""
    # In a session of its own, so that a timeout stops what it started too (a
    # compiler of torch's load_inline, whose build lock, a plain file, would
    # be left behind for every later case to wait on).
    proc = subprocess.Popen([sys.executable, script, "--child", case, alloc], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    res = json.loads(lines[-1][7:]) if lines else {"ok": False, "error": f"exit {proc.returncode}"}
    res["log"] = (stdout + stderr)[-4000:]
    return res


def judge(native: dict, mine: dict, drop: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Whether both sides ran and their facts (less the keys in drop, for
    facts that are dicts) are equal, and why."""
    if not native.get("ok"):
        return False, "reference failed: " + native.get("error", "")[:200]
    if not mine.get("ok"):
        return False, "libsymm's run failed: " + mine.get("error", "")[:200]
    n, m = native["facts"], mine["facts"]
    if drop and isinstance(n, dict) and isinstance(m, dict):
        n = {k: v for k, v in n.items() if k not in drop}
        m = {k: v for k, v in m.items() if k not in drop}
    return n == m, f"native {json.dumps(n)} | symm {json.dumps(m)}"


def out_dir() -> Path:
    """Where rows go: $OUT, else build/."""
    out = Path(os.environ.get("OUT") or ROOT / "build")
    out.mkdir(parents=True, exist_ok=True)
    return out


def compare(cases: list[str], run: Callable[[str, str], dict], rows_file: str,
            judge_case: Callable[[str, dict, dict], tuple[bool, str]] | None = None) -> int:
    """Runs each case on both sides (run(case, alloc) -> RESULT), judges it
    (judge_case, else judge), prints a line per case and a table, and writes
    the rows to rows_file under out_dir(). Returns the exit status."""
    rows, failed = [], 0
    for case in cases:
        native, mine = run(case, "native"), run(case, "symm")
        ok, why = judge_case(case, native, mine) if judge_case else judge(native, mine)
        rows.append({"case": case, "ok": ok, "why": why, "native": native, "symm": mine})
        failed += not ok
        print(f"{case:<20} {'PASS' if ok else 'FAIL'}  {why[:240]}", flush=True)
    (out_dir() / rows_file).write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':<20} result")
    for r in rows:
        print(f"{r['case']:<20} {'PASS' if r['ok'] else 'FAIL'}")
    print(f"{len(rows) - failed}/{len(rows)} passed")
    return 1 if failed else 0


def main(script: str, doc: str, cases: dict, child: Callable[[str, str], int], rows_file: str, timeout: float,
         conf: Callable[[str], str] | None = None,
         judge_case: Callable[[str, dict, dict], tuple[bool, str]] | None = None) -> int:
    """The command line of a script whose cases run once per side: --cases,
    --timeout (seconds per side), and the hidden --child CASE ALLOC that
    run_side starts. conf(case), if given, is the PYTORCH_CUDA_ALLOC_CONF a
    case's children start with ("" for none)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--cases", default=",".join(cases))
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds per side")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "ALLOC"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(*a.child)
    env = base_env()

    def run(case: str, alloc: str) -> dict:
        e = dict(env)
        if conf is not None and conf(case):
            e["PYTORCH_CUDA_ALLOC_CONF"] = conf(case)
        return run_side(script, case, alloc, e, a.timeout)

    return compare(a.cases.split(","), run, rows_file, judge_case)
