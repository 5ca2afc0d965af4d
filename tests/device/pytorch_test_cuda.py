"""PyTorch's own allocator tests (its test/test_cuda.py), on PyTorch's
allocator and under libsymm, side by side.

    python3 tests/device/pytorch_test_cuda.py PATH/TO/test_cuda.py [--configs default,expandable]
        [--allocs native,symm] [-k EXPR] [--timeout S]

PyTorch's file is not part of libsymm (copy it from PyTorch's source tree;
torch.testing._internal needs the expecttest package). Each (allocator,
setting) pair runs the selected tests with pytest in one process, as a user
runs them: "native" is PyTorch's allocator, "symm" is libsymm installed the
way `symm run` installs it (SYMM_TORCH_ALLOCATOR=1 and symm/_boot on
PYTHONPATH); "default" has no allocator settings, "expandable" sets
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. The selection (-k) is the
allocator's tests: every test of TestCudaMallocAsync, TestBlockStateAbsorption,
TestMemPool and TestFXMemoryProfiler, and TestCuda's tests of memory, OOM,
fractions, record_stream, graphs and pools.

A row fails when a test passes on PyTorch's allocator and not under libsymm
in the same setting. JUnit files and logs go to $OUT (else build/), with
pytorch_test_cuda.json: every test's outcome per run. The table comes last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SELECT = ("TestCudaMallocAsync or TestBlockStateAbsorption or TestMemPool or TestFXMemoryProfiler or "
          "(TestCuda and (memory or alloc or oom or fraction or record_stream or graph or pool or snapshot or cach))")
CONFIGS = {"default": {}, "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | error | skipped, from pytest's JUnit file."""
    out: dict[str, str] = {}
    if not junit.is_file():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        out[name] = state
    return out


def run(test_file: Path, alloc: str, config: str, select: str, out: Path, timeout: float) -> dict:
    env = dict(os.environ, **SAFE_ENV, PYTHONUNBUFFERED="1", **CONFIGS[config])
    for var in ("PYTORCH_ALLOC_CONF", "SYMM_TORCH_ALLOCATOR"):
        env.pop(var, None)
    if config == "default":
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    paths = [str(test_file.parent)] + ([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if alloc == "symm":
        env["SYMM_TORCH_ALLOCATOR"] = "1"
        paths = [str(ROOT / "python" / "symm" / "_boot"), str(ROOT / "python")] + paths
        env.setdefault("SYMM_LIB", str(ROOT / "build" / "libsymm.so"))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    tag = f"{alloc}_{config}"
    # A fresh directory for the tests' own extensions (load_inline): torch's
    # build lock is a file, left behind when a run is stopped mid-build, and
    # every later run would wait on it for good.
    env["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix=f"torch_ext_{tag}_")
    junit = out / f"junit_{tag}.xml"
    junit.unlink(missing_ok=True)  # an earlier run's outcomes are not this one's
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file), "-k", select,
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    t0 = time.monotonic()
    with open(out / f"pytest_{tag}.log", "w") as log:
        # In a session of its own, so that a timeout stops its compilers too.
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(test_file.parent),
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    shutil.rmtree(env["TORCH_EXTENSIONS_DIR"], ignore_errors=True)
    return {"alloc": alloc, "config": config, "rc": rc, "seconds": round(time.monotonic() - t0, 1),
            "tests": outcomes(junit)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("test_file", type=Path)
    ap.add_argument("--configs", default="default,expandable")
    ap.add_argument("--allocs", default="native,symm")
    ap.add_argument("-k", dest="select", default=SELECT)
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "build")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for config in a.configs.split(","):
        for alloc in a.allocs.split(","):
            r = run(a.test_file.resolve(), alloc, config, a.select, out, a.timeout)
            n = {s: sum(v == s for v in r["tests"].values()) for s in ("passed", "failed", "skipped")}
            print(f"{alloc:<7} {config:<11} rc={r['rc']} {r['seconds']:>6} s  {n}", flush=True)
            runs.append(r)
    (out / "pytorch_test_cuda.json").write_text(json.dumps(runs, indent=1))
    # A run that was stopped or reported no test proves nothing: a failure.
    unfinished = [f"{r['alloc']}/{r['config']}" for r in runs if r["rc"] == "timeout" or not r["tests"]]
    worse = len(unfinished)
    print(f"\n{'setting':<11} {'native pass':>11} {'symm pass':>9}  passes on PyTorch's allocator, not under libsymm")
    for config in a.configs.split(","):
        by = {r["alloc"]: r["tests"] for r in runs if r["config"] == config}
        nat, mine = by.get("native", {}), by.get("symm", {})
        lost = sorted(t for t, s in nat.items() if s == "passed" and mine.get(t) != "passed")
        gained = sorted(t for t, s in mine.items() if s == "passed" and nat.get(t) != "passed")
        worse += len(lost)
        print(f"{config:<11} {sum(s == 'passed' for s in nat.values()):>11} {sum(s == 'passed' for s in mine.values()):>9}  "
              f"{len(lost)}: {' '.join(lost) or '-'}")
        if gained:
            print(f"{'':<33}passes only under libsymm: {' '.join(gained)}")
    if unfinished:
        print(f"no result (stopped, or no test reported): {' '.join(unfinished)}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
