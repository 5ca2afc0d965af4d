"""The README's and docs/'s GPU recipes (blocks marked <!-- recipe: gpu -->),
each run as printed in a fresh Python process from the repository root, with
build/libsymm.so and python/ on the path. The host recipes run in CI
(tests/python/test_recipes.py, which also lists these).

    python3 tests/device/recipes_gpu.py        # on a machine with a GPU; PASS/FAIL per recipe
"""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from test_recipes import gpu_recipes  # noqa: E402


def main() -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), SYMM_LIB=str(ROOT / "build" / "libsymm.so"))
    env.pop("SYMM_DEVICE", None)
    failed = 0
    for where, lang, code in gpu_recipes():
        if lang != "python":
            print(f"FAIL  {where}: no runner for {lang!r}")
            failed += 1
            continue
        got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        ok = got.returncode == 0
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {where}" + ("" if ok else f"\n{got.stdout}{got.stderr}"), flush=True)
    print(f"{len(gpu_recipes()) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
