"""A process whose requests are all small, on two streams: the memory each
allocator reserves for it, expandable segments on. PyTorch's small pool maps
2 MiB pages; libsymm's expandable segments map a chunk of the driver's
granularity (2 MiB) unless a segment grows by a whole big chunk.

    python3 tests/device/small_requests.py        # prints one table; exits 1 if libsymm reserves more than PyTorch

Each mode runs in a child process (the allocator is chosen before CUDA starts).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def child(mode: str) -> None:
    import torch
    symm = None
    if mode == "symm_expandable":
        import symm
        symm.use_as_default()
    torch.cuda.init()
    torch.cuda.set_device(0)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    g = torch.Generator().manual_seed(1)
    live = {0: [], 1: []}
    for step in range(2000):
        i = step % 2
        with torch.cuda.stream(streams[i]):
            n = int(torch.randint(512, 256 << 10, (1,), generator=g)) // 4
            live[i].append(torch.empty(n, dtype=torch.float32, device="cuda").fill_(1.0))
            while sum(t.numel() * 4 for t in live[i]) > 1536 << 10:  # at most 1.5 MiB live per stream
                live[i].pop(0)
    torch.cuda.synchronize()
    if symm is not None:
        st = symm.memory_stats(0)
        reserved, alloc = st["reserved_bytes.all.peak"], st["allocated_bytes.all.peak"]
    else:
        reserved, alloc = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    print("RESULT " + json.dumps({"mode": mode, "peak_reserved": reserved, "peak_allocated": alloc}))


def main() -> int:
    rows = []
    for mode in ("native_expandable", "symm_expandable"):
        env = dict(os.environ, **SAFE_ENV)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
        env.setdefault("SYMM_LIB", str(ROOT / "build" / "libsymm.so"))
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if mode == "native_expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        else:
            env.update({"SYMM_POOL_EXPANDABLE": "1", "SYMM_TORCH_EXT": "1"})
        p = subprocess.run([sys.executable, __file__, "--child", mode], env=env, capture_output=True, text=True, timeout=300)
        out = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not out:
            print(f"{mode}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
            return 1
        rows.append(json.loads(out[-1][len("RESULT "):]))
    print("| allocator, expandable segments | peak reserved MiB | per stream (2 streams) | peak allocated MiB |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['mode']} | {r['peak_reserved'] / MiB:.1f} | {r['peak_reserved'] / MiB / 2:.1f} | {r['peak_allocated'] / MiB:.2f} |")
    return 0 if rows[-1]["peak_reserved"] <= rows[0]["peak_reserved"] else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        sys.exit(main())
