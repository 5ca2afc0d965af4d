"""Records, on a GPU, the segment events PyTorch's own CUDACachingAllocator
gives its allocator trace trackers for the workload of
tests/data/torch_segment_events.json, and compares them with the file's
"expected" sequence, which the host-backend test
(tests/python/test_segment_events.py) holds libsymm to.

    python3 tests/device/record_segment_events.py            # compare; exit 1 on a difference
    python3 tests/device/record_segment_events.py --write    # also store the recording in the file

The events are the segment_* entries of torch.cuda.memory._snapshot()'s
device trace, which record_trace writes from the same calls that feed the
trackers. The workload runs in a fresh interpreter on PyTorch's default
allocator (no libsymm), with no expandable segments; addresses are named by
the allocation whose pointer they equal, streams as s0 (the default
stream) and s1 (any other).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "torch_segment_events.json"

CHILD = r"""
import json, sys
import torch

rec = json.load(open(sys.argv[1]))
torch.cuda.init()
side = torch.cuda.Stream()
streams = {"s0": torch.cuda.default_stream(), "s1": side}
torch.cuda.memory._record_memory_history(max_entries=100000)
addrs, on = {}, {}
for op in rec["workload"]:
    if op[0] == "alloc":
        _, name, size, st = op
        addrs[name] = torch.cuda.caching_allocator_alloc(size, 0, streams[st])
        on[name] = st
    elif op[0] == "free":
        torch.cuda.caching_allocator_delete(addrs[op[1]])
    else:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
names = {v: k for k, v in addrs.items()}
stream_names = {streams["s0"].cuda_stream: "s0", side.cuda_stream: "s1"}
events = []
for e in snap["device_traces"][0]:
    if e["action"].startswith("segment_"):
        events.append([e["action"], names.get(e["addr"], hex(e["addr"])), e["size"], 0,
                       stream_names.get(e["stream"], hex(e["stream"]))])
print(json.dumps({"events": events, "torch": torch.__version__,
                  "device": torch.cuda.get_device_name(0)}))
"""


def record() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "SYMM_TORCH_ALLOCATOR")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(DATA)], env=env, capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        sys.exit(f"record_segment_events: the PyTorch child failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def dump(data: dict) -> str:
    """The data file's layout: one note line, one operation or event per line."""
    parts = []
    for key, val in data.items():
        if isinstance(val, list):
            rows = ",\n".join("    " + json.dumps(v) for v in val)
            parts.append(f"  {json.dumps(key)}: [\n{rows}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(val)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="store the recording as the file's expected sequence")
    a = ap.parse_args()
    data = json.loads(DATA.read_text())
    got = record()
    want = data["expected"]
    print(f"PyTorch {got['torch']} on {got['device']}: {len(got['events'])} segment events")
    for i in range(max(len(got["events"]), len(want))):
        g = got["events"][i] if i < len(got["events"]) else None
        w = want[i] if i < len(want) else None
        print(f"{'  ' if g == w else '!='} recorded {g}  expected {w}")
    same = got["events"] == want
    print("record_segment_events: " + ("the recording equals the expected sequence" if same
                                       else "the recording differs from the expected sequence"))
    if a.write:
        data["expected"] = got["events"]
        data["recorded_with"] = f"torch {got['torch']} on {got['device']} (tests/device/record_segment_events.py)"
        DATA.write_text(dump(data))
        print(f"wrote {DATA}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
