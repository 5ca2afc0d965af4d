"""symm.all_reduce's choice per call (_all_reduce_plan), with a stand-in
torch.distributed (torch is not installed in CI) and the real library on
the host backend: the push for small messages, the two-shot above the
crossover, NCCL's own all-reduce from NCCL_FROM_BYTES when the group's
backend is NCCL and nothing forces an algorithm, and the choice kept per
shape so that a repeated call asks nothing again."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import sys, types
calls = []
dist = types.ModuleType("torch.distributed")
class PG:
    def __init__(self, name, backend): self.group_name, self.backend = name, backend
WORLD = PG("0", "nccl")
dist.group = types.SimpleNamespace(WORLD=WORLD)
dist.get_world_size = lambda pg: calls.append("world") or 2
dist.get_backend = lambda pg: calls.append("backend") or pg.backend
torch = types.ModuleType("torch"); torch.distributed = dist
sys.modules["torch"], sys.modules["torch.distributed"] = torch, dist
import symm
from symm import _collectives as c

class T:
    def __init__(self, dtype): self.dtype, self.device = dtype, types.SimpleNamespace(index=0)

MiB = 1 << 20
gloo = PG("g", "gloo")
print("4KiB", c._all_reduce_plan(T("bf16"), None, 4096, None))
print("1MiB", c._all_reduce_plan(T("bf16"), None, MiB, None))
print("2MiB", c._all_reduce_plan(T("bf16"), None, 2 * MiB, None))
print("64MiB", c._all_reduce_plan(T("bf16"), None, 64 * MiB, None))
print("64MiB gloo", c._all_reduce_plan(T("bf16"), gloo, 64 * MiB, None))
print("64MiB forced", c._all_reduce_plan(T("bf16"), None, 64 * MiB, "two_shot"))
print("at the threshold", c._all_reduce_plan(T("f32"), None, c.NCCL_FROM_BYTES, None))
print("below it", c._all_reduce_plan(T("f32"), None, c.NCCL_FROM_BYTES - 4, None))
n = len(calls)
for _ in range(100):
    c._all_reduce_plan(T("bf16"), None, 64 * MiB, None)
print("asked again", len(calls) - n)
'''


def run(env_extra=None):
    env = {"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin", "SYMM_DEVICE": "host",
           "SYMM_LIB": os.environ.get("SYMM_LIB", str(ROOT / "build" / "libsymm.so"))}
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return dict(line.rsplit(" ", 1) for line in r.stdout.strip().splitlines())


def test_the_choice_by_size_backend_and_argument():
    got = run()
    assert got == {"4KiB": "push", "1MiB": "push", "2MiB": "two_shot", "64MiB": "nccl", "64MiB gloo": "two_shot",
                   "64MiB forced": "two_shot", "at the threshold": "nccl", "below it": "two_shot",
                   "asked again": "0"}, got


def test_an_algorithm_forced_by_the_environment_keeps_libsymm():
    got = run({"SYMM_ALL_REDUCE": "two_shot"})
    assert got["64MiB"] == "two_shot" and got["4KiB"] == "two_shot", got
