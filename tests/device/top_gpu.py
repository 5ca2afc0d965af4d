"""symm top beside a real PyTorch training run on a GPU (libsymm as PyTorch's
allocator): the figures `symm top --json` reads from outside equal those the
process reports itself, the text view and a recorded chart are written.

    python3 tests/device/top_gpu.py            # from the repository root, build/ carried

Writes $OUT/top_once.txt, $OUT/top.json, $OUT/top_record.svg (OUT: else build/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYMM = ROOT / "build" / "symm"
OUT = Path(os.environ.get("OUT") or ROOT / "build")

# The training child: a small transformer, 40 steps of varying length; after
# step 20 it reports its own statistics, then holds still until told to go on.
CHILD = r"""
import json, os, sys, time
import symm
symm.use_as_default()
import torch
ctl = sys.argv[1]
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 6).cuda()
opt = torch.optim.AdamW(model.parameters(), 1e-4)
for step in range(40):
    x = torch.randn(16, 64 + 37 * (step % 7), 512, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step == 20:
        torch.cuda.synchronize()
        st = torch.cuda.memory_stats()
        keys = ("allocated_bytes.all.current", "reserved_bytes.all.current", "reserved_bytes.all.peak",
                "allocated_bytes.all.peak", "segment.all.current", "num_alloc_retries", "num_ooms")
        with open(os.path.join(ctl, "me.tmp"), "w") as f:
            json.dump({"pid": os.getpid(), **{k: st[k] for k in keys}}, f)
        os.rename(os.path.join(ctl, "me.tmp"), os.path.join(ctl, "me.json"))
        while not os.path.exists(os.path.join(ctl, "go")):
            time.sleep(0.01)
torch.cuda.synchronize()
"""


def main() -> int:
    ctl = OUT / "top_ctl"
    ctl.mkdir(parents=True, exist_ok=True)
    for f in ctl.iterdir():
        f.unlink()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    env.pop("SYMM_DEVICE", None)
    rec = subprocess.Popen([str(SYMM), "top", "--interval", "100ms", "-n", "400", "--record", str(OUT / "top_record.svg")],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ctl)], env=env)
    failures = []
    try:
        deadline = time.time() + 240
        while not (ctl / "me.json").exists():
            if child.poll() is not None or time.time() > deadline:
                print("the training child did not report", file=sys.stderr)
                return 1
            time.sleep(0.05)
        me = json.loads((ctl / "me.json").read_text())
        time.sleep(0.6)  # two refreshes of its page while it holds still
        out = subprocess.run([str(SYMM), "top", "--json"], env=env, capture_output=True, text=True, timeout=60)
        (OUT / "top.json").write_text(out.stdout)
        once = subprocess.run([str(SYMM), "top", "--once"], env=env, capture_output=True, text=True, timeout=60)
        (OUT / "top_once.txt").write_text(once.stdout)
        print(once.stdout)
        snap = {p["pid"]: p for p in json.loads(out.stdout)["processes"]}
        if me["pid"] not in snap:
            failures.append(f"pid {me['pid']} not listed by symm top --json")
        else:
            st = snap[me["pid"]]["devices"][0]["stats"]
            print(f"{'statistic':32} {'process':>14} {'symm top':>14}")
            for k, v in me.items():
                if k == "pid":
                    continue
                print(f"{k:32} {v:>14} {st[k]:>14}")
                # The page does not hand back the front cache's parked blocks
                # first, as memory_stats does: allocated may exceed by them.
                if k.startswith("allocated_bytes") and 0 <= st[k] - v <= 4 << 20:
                    continue
                if st[k] != v:
                    failures.append(f"{k}: process {v}, symm top {st[k]}")
            gpus = json.loads(out.stdout).get("gpus") or []
            print("gpus:", gpus, json.loads(out.stdout).get("gpu_error", ""))
            if not gpus:
                failures.append("no GPU memory from NVML")
    finally:
        (ctl / "go").touch()
        rc = child.wait(timeout=240)
        rec.terminate()
        rec.wait(timeout=30)
    if rc != 0:
        failures.append(f"training child rc={rc}")
    for f in failures:
        print("FAIL", f)
    print("top_gpu:", "PASS" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
