"""PyTorch's allocator trace trackers under libsymm, as ProcessGroupNCCL uses
them (2 GPUs, no torchrun: torch.multiprocessing spawn, NCCL, world 2).

With TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 ProcessGroupNCCL
registers every segment of the current allocator with NCCL when it makes a
communicator (from torch.cuda.memory._snapshot()'s segments) and every later
segment through the allocator trace trackers it attaches (SEGMENT_ALLOC:
ncclCommRegister; SEGMENT_FREE: ncclCommDeregister). libsymm's extension
passes libsymm's segment events to those trackers (symm_pool_set_segment_hook;
python/symm/_torch_ext_snapshot.h). Each rank, on each allocator (PyTorch's
own as the reference, then libsymm's in replace mode):

  - makes a tensor before the process group (registered from the snapshot);
  - makes the group (device_id: the communicator is made at once);
  - makes a 64 MiB tensor (a new segment: registered through the tracker),
    all-reduces it and the first one, and checks the sums (1 + 2 = 3);
  - frees them and empties the cache (SEGMENT_FREE: deregistered), then
    all-reduces once more in a fresh segment.

NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG (NCCL's registration subsystem, the
NCCL_REG bit of nccl.h's ncclDebugLogSubSys) writes NCCL's registration lines
to one file per process; they are printed per allocator, with their count.
The script fails if an all-reduce is wrong, a rank fails, or NCCL printed
registration lines with PyTorch's allocator and none with libsymm's.

    python tests/device/test_torch_trackers.py            # both allocators
    python tests/device/test_torch_trackers.py symm       # one

(after `make device`, or with the symm package installed; needs 2 GPUs.)
"""

from __future__ import annotations

import os

# Multicast is never used (DESIGN.md): before torch (and NCCL) load.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2
MiB = 1 << 20
ALLOCS = ("native", "symm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install(alloc: str):
    """Makes alloc the process's CUDA allocator (before any CUDA call)."""
    import torch

    if alloc == "symm":
        try:
            import symm
        except ImportError:  # the checkout's package
            sys.path.insert(0, str(ROOT / "python"))
            import symm

        symm.use_as_default()
        st = symm.extension_status()
        assert st["extension"], f"libsymm's PyTorch extension is not in use: {st['reason']}"
    return torch


def all_reduce_checked(torch, dist, t, rank: int, what: str) -> None:
    t.fill_(float(rank + 1))
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = float(sum(range(1, WORLD + 1)))
    bad = (t != want).sum().item()
    assert bad == 0, f"{what}: {bad} of {t.numel()} elements are not {want} (first {t.flatten()[0].item()})"


def worker(rank: int, alloc: str, port: int, outdir: str) -> None:
    res = {"rank": rank, "alloc": alloc, "ok": False}
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
        torch = install(alloc)
        import torch.distributed as dist

        torch.cuda.set_device(rank)
        early = torch.empty(4 * MiB // 4, dtype=torch.float32, device="cuda")  # before the group: from the snapshot
        res["segments_before_group"] = len(torch.cuda.memory._snapshot()["segments"])
        dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=torch.device("cuda", rank))
        late = torch.empty(64 * MiB // 4, dtype=torch.float32, device="cuda")  # a new segment: the tracker
        all_reduce_checked(torch, dist, late, rank, "64 MiB tensor made after the group")
        all_reduce_checked(torch, dist, early, rank, "4 MiB tensor made before the group")
        del late, early
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # SEGMENT_FREE: deregistered first
        again = torch.empty(32 * MiB // 4, dtype=torch.float32, device="cuda")
        all_reduce_checked(torch, dist, again, rank, "32 MiB tensor after empty_cache")
        res["segments_at_end"] = len(torch.cuda.memory._snapshot()["segments"])
        try:
            res["allocator"] = torch.cuda.get_allocator_backend()
        except Exception as e:  # noqa: BLE001 - a name only
            res["allocator"] = f"? ({type(e).__name__})"
        dist.barrier()
        dist.destroy_process_group()
        res["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported to the parent
        res["error"] = f"{type(e).__name__}: {e}"
        res["tb"] = traceback.format_exc()[-3000:]
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(res))


def run(alloc: str) -> dict:
    import torch.multiprocessing as mp

    outdir = tempfile.mkdtemp(prefix=f"symm-trackers-{alloc}-")
    os.environ["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] = "1"
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "REG"
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(outdir, "nccl.%h.%p.log")
    mp.spawn(worker, args=(alloc, free_port(), outdir), nprocs=WORLD, join=True)
    ranks = [json.loads(Path(outdir, f"rank{r}.json").read_text()) for r in range(WORLD)]
    lines = []
    for f in sorted(Path(outdir).glob("nccl.*.log")):
        lines += [ln.rstrip() for ln in f.read_text(errors="replace").splitlines() if "NCCL INFO" in ln]
    return {"ranks": ranks, "reg_lines": lines, "dir": outdir}


def main() -> int:
    import torch

    if torch.cuda.device_count() < WORLD:
        print(f"test_torch_trackers: needs {WORLD} GPUs, found {torch.cuda.device_count()}")
        return 2
    allocs = [a for a in sys.argv[1:] if a in ALLOCS] or list(ALLOCS)
    results, failed = {}, False
    for alloc in allocs:
        r = results[alloc] = run(alloc)
        print(f"== {alloc}: NCCL registration lines (NCCL_DEBUG_SUBSYS=REG): {len(r['reg_lines'])}; logs in {r['dir']}")
        for ln in r["reg_lines"][:40]:
            print("   ", ln)
        if len(r["reg_lines"]) > 40:
            print(f"    ... {len(r['reg_lines']) - 40} more")
        for rk in r["ranks"]:
            status = "ok" if rk["ok"] else f"FAILED: {rk.get('error')}\n{rk.get('tb', '')}"
            print(f"   rank {rk['rank']} ({rk.get('allocator', '?')}): segments {rk.get('segments_before_group')} -> "
                  f"{rk.get('segments_at_end')}: {status}")
            failed |= not rk["ok"]
    if "native" in results and "symm" in results:
        n, s = len(results["native"]["reg_lines"]), len(results["symm"]["reg_lines"])
        if n > 0 and s == 0:
            print("FAILED: NCCL registered segments under PyTorch's allocator and none under libsymm's: "
                  "the trace trackers were not called")
            failed = True
        elif n == 0 and s == 0:
            print("note: NCCL printed no registration lines with either allocator (an NCCL without REG "
                  "logging, or registration off): only the all-reduce results were checked")
    print("test_torch_trackers:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
