"""NCCL backend with PyTorch, one process per GPU:

    SYMM_BACKEND=nccl torchrun --nproc_per_node=N tests/device/nccl_allreduce.py

Tensors from a torch.cuda.MemPool over libsymm's NCCL backend (ncclMemAlloc
memory; the pool registered with the NCCL process group where PyTorch offers
register_mem_pool; each tensor rendezvoused, which registers its block as a
symmetric window on the communicator libsymm adopted from PyTorch):
all_reduce results are checked at every size, then all_reduce latency and
bus bandwidth from 8 KiB to 256 MiB against ordinary PyTorch tensors.
Rank 0 prints PASS/FAIL lines and a table; $OUT/nccl_allreduce.md gets it.
"""

import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    results, rows = [], []
    symm.set_backend(os.environ.get("SYMM_BACKEND", "nccl"))
    probe = symm.empty(1024, dtype=torch.float32, device=dev)  # sets the backend up
    status = symm._backends.backend_status(rank)
    results.append(("backend is nccl", symm.get_backend() == "nccl", f"{symm.get_backend()}, {status}"))
    pool = symm._symmetric._mempools[rank]
    pg = dist.group.WORLD._get_backend(dev)
    registered = False
    if hasattr(pg, "register_mem_pool"):
        try:
            pg.register_mem_pool(pool)
            registered = True
        except Exception as e:  # noqa: BLE001
            results.append(("register_mem_pool", False, str(e)[:200]))
    results.append(("pool registered with the process group", registered, ""))

    size = 8 * KiB
    while size <= 256 * MiB:
        n = size // 4
        x = symm.empty(n, dtype=torch.float32, device=dev)
        h = symm.rendezvous(x, dist.group.WORLD)  # registers the block as a window
        y = torch.empty(n, dtype=torch.float32, device=dev)
        want = world * (world + 1) / 2
        x.fill_(rank + 1)
        dist.all_reduce(x)
        y.fill_(rank + 1)
        dist.all_reduce(y)
        torch.cuda.synchronize()
        ok = bool((x == want).all()) and bool((y == want).all())
        results.append((f"all_reduce {fmt(size)} on a pool tensor", ok, f"x[0]={x[0].item()} want {want}"))
        reps = 200 if size <= MiB else 50
        tx, ty = timed(lambda: dist.all_reduce(x), reps), timed(lambda: dist.all_reduce(y), reps)
        bus = lambda t: 2 * (world - 1) / world * size / t / 1e9  # noqa: E731
        rows.append((fmt(size), tx * 1e6, ty * 1e6, bus(tx), bus(ty)))
        del h, x, y
        size *= 4 if size < MiB else 2
    del probe
    report(rank, world, results, rows)
    # Teardown order: the pool's blocks are windows of PyTorch's communicator
    # and registered with the process group, so they go before it does.
    torch.cuda.synchronize()
    if registered:
        pg.deregister_mem_pool(pool)
    symm._symmetric._mempools.clear()
    del pool
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def fmt(n):
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def timed(fn, reps):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def report(rank, world, results, rows):
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank != 0:
        return
    bad = 0
    lines = []
    for r, res in enumerate(gathered):
        for name, ok, detail in res:
            bad += not ok
            lines.append(f"{'PASS' if ok else 'FAIL'}  rank {r}  {name}  {detail}")
    lines += ["", f"| all_reduce fp32, {world} × {torch.cuda.get_device_name(0)} | pool (registered) µs | ordinary µs | ratio | pool bus GB/s | ordinary bus GB/s |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s, a, b, ba, bb in rows:
        lines.append(f"| {s} | {a:.1f} | {b:.1f} | {a / b:.2f}× | {ba:.1f} | {bb:.1f} |")
    text = "\n".join(lines)
    print(text, flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "nccl_allreduce.md"), "w") as f:
            f.write(text + "\n")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
