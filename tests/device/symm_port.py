"""A script written against PyTorch's torch.distributed._symmetric_memory,
run unchanged on libsymm: only the import differs (SYMM_PORT_IMPL).

    SYMM_PORT_IMPL=symm  SYMM_PORT_BACKEND=CUDA torchrun --nproc_per_node=2 tests/device/symm_port.py
    SYMM_PORT_IMPL=torch SYMM_PORT_BACKEND=CUDA torchrun --nproc_per_node=2 tests/device/symm_port.py

SYMM_PORT_BACKEND: CUDA, NVSHMEM or NCCL (symm_mem.set_backend before any
allocation). Every rank prints one PASS/FAIL line per check and exits 1 on a
failure. tests/device/symm_gpus.sh runs it for every backend and both
implementations.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

if os.environ.get("SYMM_PORT_IMPL", "symm") == "torch":
    import torch.distributed._symmetric_memory as symm_mem
else:
    import symm as symm_mem  # the one line a port changes

# ---- everything below is PyTorch's API only --------------------------------

BACKEND = os.environ.get("SYMM_PORT_BACKEND", "CUDA")
TIMEOUT_MS = 20000
results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    results.append((name, bool(ok), detail))


def main() -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=device)
    group_name = dist.group.WORLD.group_name
    if BACKEND != "CUDA":  # the default: torch 2.11 refuses set_backend("CUDA") once its allocator is set up
        try:
            symm_mem.set_backend(BACKEND)
        except Exception as e:  # noqa: BLE001 - reported, then the run stops
            check(f"set_backend({BACKEND})", False, repr(e))
            return report(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    # empty + rendezvous with a group name; attributes.
    n = 1 << 16
    t = symm_mem.empty(n, dtype=torch.float32, device=device)
    check("empty: shape, dtype, device", t.shape == (n,) and t.dtype == torch.float32 and t.device == device)
    t.fill_(rank + 1)
    h = symm_mem.rendezvous(t, group_name)
    check("handle: rank, world_size", h.rank == rank and h.world_size == world)
    attrs = ("buffer_ptrs", "buffer_ptrs_dev", "signal_pad_ptrs", "signal_pad_ptrs_dev", "buffer_size",
             "signal_pad_size", "multicast_ptr", "offset")
    missing = [a for a in attrs if not hasattr(h, a)]
    check("handle attributes", not missing and len(h.buffer_ptrs) == world and h.buffer_size >= 4 * n, f"missing {missing}")
    check("get_backend(device)", symm_mem.get_backend(device) in (BACKEND, None), str(symm_mem.get_backend(device)))
    check("is_nvshmem_available() is a bool", isinstance(symm_mem.is_nvshmem_available(), bool))

    h.barrier(channel=0, timeout_ms=TIMEOUT_MS)
    torch.cuda.synchronize()
    ok = all(bool(h.get_buffer(r, (n,), torch.float32).eq(r + 1).all()) for r in range(world))
    check("get_buffer: every peer's values", ok)
    h.barrier(channel=3, timeout_ms=TIMEOUT_MS)  # everyone has read before anyone writes
    h.get_buffer(nxt, (n // 2,), torch.float32, storage_offset=n // 2).fill_(100 + rank)
    h.barrier(channel=1, timeout_ms=TIMEOUT_MS)
    torch.cuda.synchronize()
    check("write into the next rank's buffer", bool(t[n // 2:].eq(100 + prv).all()) and bool(t[: n // 2].eq(rank + 1).all()))

    # Every dtype through get_buffer and get_signal_pad.
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.bool, torch.complex64]
    dtypes += [d for d in (getattr(torch, x, None) for x in ("uint16", "uint32", "uint64", "float8_e4m3fn",
                                                              "float8_e5m2")) if d is not None]
    bad = []
    for dt in dtypes:
        try:
            b = h.get_buffer(nxt, (4, 2), dt)
            if b.dtype != dt or b.shape != (4, 2):
                bad.append(str(dt))
        except Exception as e:  # noqa: BLE001
            bad.append(f"{dt}: {e!r}")
    check(f"get_buffer of {len(dtypes)} dtypes", not bad, "; ".join(bad))
    try:
        pad = h.get_signal_pad(nxt, (8, 8), dtype=torch.uint64)
        check("get_signal_pad((8, 8), uint64)", pad.shape == (8, 8) and pad.dtype == torch.uint64)
    except Exception as e:  # noqa: BLE001
        check("get_signal_pad((8, 8), uint64)", False, repr(e))
    whole = h.get_signal_pad(rank)
    check("get_signal_pad default: whole pad, uint32", whole.dtype == torch.uint32 and whole.numel() * 4 == h.signal_pad_size)

    # Signals in a ring.
    for _ in range(10):
        h.put_signal(nxt, channel=2)
        h.wait_signal(prv, channel=2, timeout_ms=TIMEOUT_MS)
    torch.cuda.synchronize()
    check("put_signal / wait_signal ring", True)

    # The recycled block: a dirty pad must not survive into the next
    # allocation's first rendezvous (this hung for ever before).
    del h, t, whole
    x = symm_mem.empty(1, dtype=torch.float32, device=device)
    hx = symm_mem.rendezvous(x, group_name)
    hx.get_signal_pad(hx.rank).fill_(42)
    torch.cuda.synchronize()
    dist.barrier()
    del hx, x
    y = symm_mem.empty(1, dtype=torch.float32, device=device)
    t0 = time.perf_counter()
    hy = symm_mem.rendezvous(y, group_name)
    rdv_ms = (time.perf_counter() - t0) * 1e3
    nz = int(hy.get_signal_pad(hy.rank).count_nonzero())  # before any rank signals again
    check("recycled block: zero signal pad", nz == 0, f"{nz} slots set")
    dist.barrier()
    torch.cuda.synchronize()
    try:
        hy.barrier(channel=0, timeout_ms=TIMEOUT_MS)
        torch.cuda.synchronize()
        check("recycled block: barrier returns", True, f"rendezvous {rdv_ms:.2f} ms")
    except Exception as e:  # noqa: BLE001
        check("recycled block: barrier returns", False, repr(e))

    # Two empty() tensors never share a signal pad; get_mem_pool shares.
    a = symm_mem.empty(256, device=device)
    b = symm_mem.empty(256, device=device)
    ha, hb = symm_mem.rendezvous(a, group_name), symm_mem.rendezvous(b, group_name)
    check("empty(): own signal pads", ha.signal_pad_ptrs[rank] != hb.signal_pad_ptrs[rank])
    pool = symm_mem.get_mem_pool(device)
    check("get_mem_pool: a torch.cuda.MemPool", isinstance(pool, torch.cuda.MemPool))
    with torch.cuda.use_mem_pool(pool):
        c = torch.full((1024,), float(rank), device=device)
    hc = symm_mem.rendezvous(c, group_name)
    hc.barrier(channel=0, timeout_ms=TIMEOUT_MS)
    torch.cuda.synchronize()
    check("get_mem_pool tensor: peers read it", bool(hc.get_buffer(nxt, (1024,), torch.float32).eq(nxt).all()))
    torch.cuda.synchronize()
    dist.barrier()
    return report(rank)


def report(rank: int) -> int:
    impl = os.environ.get("SYMM_PORT_IMPL", "symm")
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  [{impl} {BACKEND} rank {rank}] {name}{': ' + detail if detail else ''}", flush=True)
    failed = sum(not ok for _, ok, _ in results)
    print(f"[{impl} {BACKEND} rank {rank}] {len(results) - failed} passed, {failed} failed", flush=True)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
