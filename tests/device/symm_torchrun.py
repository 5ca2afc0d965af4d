"""Symmetric memory on GPUs with PyTorch, one process per GPU:

    torchrun --nproc_per_node=N tests/device/symm_torchrun.py

Checks (every rank): rendezvous of a symm.empty tensor; each rank's pattern
read by every peer through the peer mapping; a copy written by one GPU into a
peer's buffer read back by the peer; put/wait signals around the ring with
pads zero again afterwards; same tensor and group -> same handle; subgroups;
a wait nobody answers reports a timeout; free unmaps everything. Then a
benchmark side by side with torch.distributed._symmetric_memory: rendezvous
time, peer-write bandwidth against copy_ between the same two GPUs, barrier
latency. Rank 0 prints PASS/FAIL lines and a table; $OUT/symm_gpu.md gets it.
"""

import os
import sys
import statistics
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402

MiB = 1 << 20
results = []


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    group = dist.group.WORLD
    n = MiB  # floats

    t = symm.empty(n, dtype=torch.float32, device=dev)
    t.fill_(rank + 1)
    h = symm.rendezvous(t, group)
    check("rendezvous", h.rank == rank and h.world_size == world, f"rank {h.rank}/{h.world_size}")
    h.barrier(channel=0, timeout_ms=10000)
    torch.cuda.synchronize()
    ok = all(bool((h.get_buffer(r, (n,), torch.float32) == r + 1).all()) for r in range(world))
    check("read every peer's pattern", ok)

    # One GPU writes into the next rank's buffer; the peer reads it back.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    h.barrier(channel=0, timeout_ms=10000)
    h.get_buffer(nxt, (n // 2,), torch.float32, storage_offset=n // 2).copy_(
        torch.full((n // 2,), 100.0 + rank, device=dev))
    h.barrier(channel=0, timeout_ms=10000)
    torch.cuda.synchronize()
    check("peer wrote into our buffer", bool((t[n // 2:] == 100.0 + prv).all()) and bool((t[: n // 2] == rank + 1).all()))

    for _ in range(5):
        h.put_signal(nxt, channel=1)
        h.wait_signal(prv, channel=1, timeout_ms=10000)
    torch.cuda.synchronize()
    pads = h.get_signal_pad(rank, dtype=torch.int32)
    # Channel 1's slots only: a faster peer may already be in the next barrier (channel 0).
    check("signal pads zero after use", int(pads[world: 2 * world].sum()) == 0, f"{pads[:2 * world].tolist()}")
    check("same tensor and group: same handle", symm.rendezvous(t, group).handle == h.handle)
    check("no multicast", not symm.has_multicast_support(rank))
    check("world within direct access", symm.world_within_direct_access(group) and h.world_within_direct_access())
    topo = symm.topology()
    check("topology: driver, devices, peer access", topo["driver"]["found"] and len(topo["devices"]) >= world
          and all(l["p2p"] for row in topo["links"] for l in row), str(topo["links"])[:200])

    # A tensor inside a block of get_mem_pool (the second small tensor shares
    # the first's segment): host and device pointer arrays both start at it.
    with torch.cuda.use_mem_pool(symm.get_mem_pool(dev)):
        a = torch.empty(256, dtype=torch.float32, device=dev)
        b = torch.empty(256, dtype=torch.float32, device=dev)
    b.fill_(1000 + rank)
    hb = symm.rendezvous(b, group)
    dev_arr = symm._symmetric._tensor_at(hb.buffer_ptrs_dev, (world,), torch.int64, dev)
    hb.barrier(channel=0, timeout_ms=10000)
    torch.cuda.synchronize()
    peers_ok = all(bool((hb.get_buffer(r, (256,), torch.float32) == 1000 + r).all()) for r in range(world))
    check("interior tensor: device array matches, peers read", hb.offset > 0 and dev_arr.tolist() == hb.buffer_ptrs and peers_ok,
          f"offset {hb.offset}, a at {a.data_ptr():#x}, b at {b.data_ptr():#x}")

    # Subgroups: each rank alone, and (if world >= 4) pairs.
    subs = [dist.new_group([r]) for r in range(world)]
    hs = symm.rendezvous(t, subs[rank])
    check("subgroup rendezvous", hs.world_size == 1 and hs.handle != h.handle)

    # A wait nobody answers: a clear timeout; then unblock the stream ourselves.
    s = torch.cuda.Stream(dev)
    try:
        h.wait_signal(prv, channel=5, timeout_ms=200, stream=s)
        check("unanswered wait times out", False, "returned")
    except symm.SymmError as e:
        check("unanswered wait times out", e.code == 8 and "rank" in str(e), str(e)[:100])
    pads[5 * world + prv] = 1  # the signal that never came, from the host side
    s.synchronize()
    check("stream released after the late signal", s.query())

    dist.barrier()
    bench(rank, world, dev, group)
    dist.barrier()
    del t, h, hs, a, b, hb
    torch.cuda.synchronize()
    report(rank, world)
    dist.destroy_process_group()


def timed_max(fn):
    """fn's wall time on the slowest rank, every rank starting after a
    barrier: what a collective call costs the job."""
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=torch.cuda.current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def timed(fn, reps=1):
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


bench_rows = []


# SYMM_BENCH_SIDES: "both" (default), "ours" or "theirs": with NVSHMEM on both
# sides, libsymm and PyTorch would each initialize NVSHMEM in one process, so
# symm_gpus.sh runs the two sides in two torchruns of one job.
SIDES = os.environ.get("SYMM_BENCH_SIDES", "both")


def bench(rank, world, dev, group):
    import torch.distributed._symmetric_memory as tsm
    from symm._symmetric import _group_store

    if os.environ.get("TORCH_SYMMMEM") == "NCCL" and hasattr(tsm, "set_backend"):
        try:
            tsm.set_backend("NCCL")
        except RuntimeError as e:  # not in every PyTorch build: say so, measure nothing
            if rank == 0:
                print(f"PyTorch's NCCL symmetric-memory backend does not run here: {e}", flush=True)
            return
    if os.environ.get("TORCH_SYMMMEM") == "NVSHMEM":
        # PyTorch registers its NVSHMEM allocator when asked whether NVSHMEM is there.
        ok = tsm.is_nvshmem_available() if hasattr(tsm, "is_nvshmem_available") else False
        if rank == 0:
            print(f"torch NVSHMEM available: {ok}", flush=True)
        try:
            cur = tsm.get_backend(dev) if hasattr(tsm, "get_backend") else None
            if cur != "NVSHMEM" and hasattr(tsm, "set_backend"):
                tsm.set_backend("NVSHMEM")
        except RuntimeError as e:
            if rank == 0:
                print(f"torch NVSHMEM backend: {e} (get_backend: {cur})", flush=True)
            raise
        if rank == 0:
            print(f"torch symmetric memory backend: {tsm.get_backend(dev)}", flush=True)
    try:
        tsm.enable_symm_mem_for_group(group.group_name)
    except Exception:  # newer torch needs no opt-in
        pass
    st = _group_store(group)
    nan = float("nan")
    if SIDES != "both":
        # One side only: time it, leave the other column empty.
        for size in (MiB, 256 * MiB, 1024 * MiB):
            n = size // 4

            def ours():
                p = symm.symm_alloc(size, rank)
                symm.rendezvous_ptr(p, st, f"bench{size}", rank, world, dev)
                symm.symm_free(p)

            def theirs():
                x = tsm.empty(n, dtype=torch.float32, device=dev)
                tsm.rendezvous(x, group.group_name)

            fn = ours if SIDES == "ours" else theirs
            fn()
            t = timed(fn) * 1e3
            bench_rows.append((f"rendezvous {size // MiB} MiB, {world} GPUs (ms)", t if SIDES == "ours" else nan,
                               t if SIDES == "theirs" else nan))
        n = 256 * MiB // 4
        src = torch.randn(n, device=dev)
        if SIDES == "ours":
            hx = symm.rendezvous(symm.empty(n, dtype=torch.float32, device=dev), group)
            peer = hx.get_buffer((rank + 1) % world, (n,), torch.float32)
            sym_barrier = lambda: hx.barrier(channel=0)  # noqa: E731
        else:
            tx = tsm.empty(n, dtype=torch.float32, device=dev)
            th = tsm.rendezvous(tx, group.group_name)
            peer = th.get_buffer((rank + 1) % world, (n,), torch.float32)
            sym_barrier = lambda: th.barrier(channel=0)  # noqa: E731
        peer.copy_(src)
        bw = 256 * MiB / timed(lambda: peer.copy_(src), reps=20) / 1e9
        bench_rows.append(("write 256 MiB into the peer, all ranks at once (GB/s)", bw if SIDES == "ours" else nan,
                           bw if SIDES == "theirs" else nan))
        t = timed(sym_barrier, reps=200) * 1e6
        bench_rows.append((f"barrier, {world} GPUs (µs, host-timed, 200 back to back)", t if SIDES == "ours" else nan,
                           t if SIDES == "theirs" else nan))
        return
    # Like with like: each side allocates a fresh block (not timed), times
    # the rendezvous alone (every rank after a dist.barrier, until the
    # slowest returns), then frees it (not timed); the median of REPS. Both
    # sides join the blocks with one group, as a program does with its
    # process group; the first rendezvous of a group is timed on its own.
    reps = int(os.environ.get("SYMM_RENDEZVOUS_REPS", "5"))
    firsts = []
    for k in range(reps):
        p = symm.symm_alloc(MiB, rank)
        firsts.append(timed_max(lambda p=p, k=k: symm.rendezvous_ptr(p, st, f"bench-first-{k}", rank, world, dev)))
        symm.symm_free(p)
    bench_rows.append((f"first rendezvous of a new group, 1 MiB, {world} GPUs (ms, median of {reps}; "
                       "opens the group's mailboxes through the store)", statistics.median(firsts) * 1e3, nan))
    for size in (MiB, 256 * MiB, 1024 * MiB):
        n = size // 4
        ours_t, theirs_t = [], []
        for k in range(reps + 1):  # the first of each is a warm-up
            p = symm.symm_alloc(size, rank)
            t = timed_max(lambda p=p: symm.rendezvous_ptr(p, st, "bench", rank, world, dev))
            symm.symm_free(p)  # peers keep their own reference to the memory
            x = tsm.empty(n, dtype=torch.float32, device=dev)
            u = timed_max(lambda x=x: tsm.rendezvous(x, group.group_name))
            del x
            if k:
                ours_t.append(t)
                theirs_t.append(u)
        bench_rows.append((f"rendezvous {size // MiB} MiB, {world} GPUs (ms, median of {reps}, allocation not timed)",
                           statistics.median(ours_t) * 1e3, statistics.median(theirs_t) * 1e3))

    # A block handed back to the pool and out again at the same size: its
    # handle is kept, rendezvous only starts its signals over.
    recycled = []
    for k in range(reps + 1):
        y = symm.empty(MiB // 4, dtype=torch.float32, device=dev)
        t = timed_max(lambda y=y: symm.rendezvous(y, group))
        del y
        if k:
            recycled.append(t)
    bench_rows.append((f"re-rendezvous of a recycled 1 MiB block, {world} GPUs (ms, median of {reps})",
                       statistics.median(recycled) * 1e3, float("nan")))

    n = 256 * MiB // 4
    x = symm.empty(n, dtype=torch.float32, device=dev)
    hx = symm.rendezvous(x, group)
    src = torch.randn(n, device=dev)
    peer = hx.get_buffer((rank + 1) % world, (n,), torch.float32)
    peer.copy_(src)
    ours = timed(lambda: peer.copy_(src), reps=20)
    other = (rank + 1) % world
    dst = torch.empty(n, device=torch.device("cuda", other))
    dst.copy_(src)
    base = timed(lambda: dst.copy_(src), reps=20)
    bench_rows.append(("write 256 MiB into the peer, all ranks at once (GB/s)", 256 * MiB / ours / 1e9, 256 * MiB / base / 1e9))

    ty = tsm.empty(MiB, dtype=torch.float32, device=dev)
    th = tsm.rendezvous(ty, group.group_name)
    hy = hx
    reps = 200
    a = timed(lambda: hy.barrier(channel=0), reps=reps)
    b = timed(lambda: th.barrier(channel=0), reps=reps)
    bench_rows.append((f"barrier, {world} GPUs (µs, host-timed, {reps} back to back)", a * 1e6, b * 1e6))


def report(rank, world):
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank != 0:
        return
    lines = []
    bad = 0
    for r, res in enumerate(gathered):
        for name, ok, detail in res:
            bad += not ok
            lines.append(f"{'PASS' if ok else 'FAIL'}  rank {r}  {name}  {detail}")
    ours_b = symm.get_backend()
    theirs_b = os.environ.get("TORCH_SYMMMEM", "CUDA")
    lines += ["", f"| {world} × {torch.cuda.get_device_name(0)} | libsymm ({ours_b}) | torch symmetric memory ({theirs_b}) | ratio |",
              "| --- | ---: | ---: | ---: |"]
    for name, a, b in bench_rows:
        lines.append(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f}× |")
    lines.append("(bandwidth row: the right column is tensor.copy_ between the same two GPUs)")
    text = "\n".join(lines)
    print(text, flush=True)
    if os.environ.get("OUT"):
        tag = os.environ.get("SYMM_RUN_TAG", "")
        with open(os.path.join(os.environ["OUT"], f"symm_gpu_{world}{tag}.md"), "w") as f:
            f.write(text + "\n")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
