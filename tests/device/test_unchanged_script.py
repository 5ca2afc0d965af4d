"""libsymm under an unedited distributed script, on 2 GPUs.

    python3 tests/device/test_unchanged_script.py          # needs build/symm, build/libsymm.so

Runs tests/device/unchanged/train.py (set_device as its first CUDA line,
NCCL, DDP, DataLoader workers by fork and by spawn) three ways with
torchrun on 2 GPUs:
- native: PyTorch's allocator, the reference;
- symm run: `build/symm run -- python3 -m torch.distributed.run ...`;
- env: SYMM_TORCH_ALLOCATOR=1 with symm/_boot on PYTHONPATH, as an installed
  wheel's .pth line does it.
Each libsymm run must report PyTorch's allocator backend as "symm" on every
rank, train to the same losses bit for bit, and all-reduce correctly.
Prints a PASS/FAIL table last; exits 1 on a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "device" / "unchanged" / "train.py"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def launch(way: str, log_dir: Path) -> tuple[list[dict], float, str]:
    env = dict(os.environ, **SAFE_ENV)
    env.pop("SYMM_TORCH_ALLOCATOR", None)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT)]
    if way == "symm run":
        cmd = [str(ROOT / "build" / "symm"), "run", "--", *torchrun]
    else:
        cmd = torchrun
        if way == "env":
            env["SYMM_TORCH_ALLOCATOR"] = "1"
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(ROOT / "python" / "symm" / "_boot"), env.get("PYTHONPATH")]))
    start = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=str(ROOT))
    took = time.time() - start
    (log_dir / f"unchanged-{way.replace(' ', '_')}.log").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    results = [json.loads(l.split("RESULT ", 1)[1]) for l in p.stdout.splitlines() if "RESULT " in l]
    err = "" if p.returncode == 0 else f"rc={p.returncode}: {p.stderr.strip().splitlines()[-3:]}"
    return sorted(results, key=lambda r: r["rank"]), took, err


def main() -> int:
    log_dir = Path(os.environ.get("OUT", ROOT / "build" / "device-logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    ref = None
    for way in ("native", "symm run", "env"):
        results, took, err = launch(way, log_dir)
        want = "native" if way == "native" else "symm"
        problems = [err] if err else []
        if len(results) != 2:
            problems.append(f"{len(results)} ranks reported")
        for r in results:
            if r["backend"] != want:
                problems.append(f"rank {r['rank']} ran on {r['backend']!r}, want {want!r}")
            if not r["all_reduce_ok"]:
                problems.append(f"rank {r['rank']} all-reduce wrong")
        if way == "native":
            ref = results
        elif ref and results and [r["losses"] for r in results] != [r["losses"] for r in ref]:
            problems.append("losses differ from native")
        peak = max((r["reserved_peak"] for r in results), default=0) / 2**20
        rows.append((way, "FAIL" if problems else "PASS", f"{took:.1f}", f"{peak:.1f}", "; ".join(problems)))
        failed |= bool(problems)
    print("\n| run | result | seconds | peak reserved MiB (max rank) | problems |\n| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
