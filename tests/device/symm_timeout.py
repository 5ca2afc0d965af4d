"""Nothing hangs for ever: a signal that never comes, on real GPUs.

    SYMM_TIMEOUT_MS=1500 torchrun --nproc_per_node=2 tests/device/symm_timeout.py

Rank 1 queues a wait nobody answers, once with an explicit timeout_ms (the
call itself fails with SYMM_ERR_TIMEOUT naming the rank and channel) and once
with the default (the call returns, the watchdog fails the handle after
SYMM_TIMEOUT_MS, and the next call raises naming the rank and channel). Then
rank 0 sends the late signals and rank 1's streams drain. SYMM_PORT_BACKEND
picks the backend (CUDA, NVSHMEM, NCCL).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import symm

results = []


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    backend = os.environ.get("SYMM_PORT_BACKEND", "CUDA")
    if backend != "CUDA":
        symm.set_backend(backend)
    timeout_s = int(os.environ.get("SYMM_TIMEOUT_MS", "60000")) / 1000
    t = symm.empty(1024, device=dev)
    h = symm.rendezvous(t, dist.group.WORLD)
    # Everything that allocates comes first: while a stream is blocked in a
    # wait, CUDA calls that synchronize the device (memory mapping, copies
    # through the legacy stream) would block too.
    t2 = symm.empty(1024, device=dev)
    h2 = symm.rendezvous(t2, dist.group.WORLD)
    h.barrier(channel=0, timeout_ms=20000)
    torch.cuda.synchronize()
    # NCCL connects lazily at the first collective, and connecting can
    # synchronize the device: do it now, before any stream is left blocked.
    dist.barrier()
    torch.cuda.synchronize()
    if rank == 1:
        s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
        start = time.perf_counter()
        try:
            h.wait_signal(0, channel=5, timeout_ms=300, stream=s1)
            check("explicit timeout_ms: the call fails", False, "returned")
        except symm.SymmError as e:
            took = time.perf_counter() - start
            check("explicit timeout_ms: the call fails", e.code == 8 and "rank 0" in str(e) and "channel 5" in str(e),
                  f"{took * 1e3:.0f} ms: {str(e)[:160]}")
        start = time.perf_counter()
        h2.wait_signal(0, channel=6, stream=s2)  # default: watched in the background
        check("default timeout: the call only queues", time.perf_counter() - start < 0.5)
        time.sleep(timeout_s + 0.5)
        try:
            h2.barrier(channel=0)
            check("default timeout: the next call raises", False, "returned")
        except symm.SymmError as e:
            check("default timeout: the next call raises", e.code == 8 and "rank 0" in str(e) and "channel 6" in str(e),
                  str(e)[:200])
        dist.barrier()  # rank 0 now sends the late signals
        for name, s in (("explicit", s1), ("default", s2)):
            deadline = time.time() + 20
            while not s.query() and time.time() < deadline:
                time.sleep(0.01)
            check(f"{name}: the stream drains once the late signal comes", s.query())
    else:
        dist.barrier()
        h.put_signal(1, channel=5)
        h2.put_signal(1, channel=6)
        torch.cuda.synchronize()
        check("late signals sent", True)
    dist.barrier()
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  [timeout {backend} rank {rank}] {name}{': ' + detail if detail else ''}", flush=True)
    failed = sum(not ok for _, ok, _ in results)
    print(f"[timeout {backend} rank {rank}] {len(results) - failed} passed, {failed} failed", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
