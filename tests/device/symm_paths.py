"""Every collective through every way into it, bit for bit, on GPUs:

    python3 tests/device/symm_paths.py [WORLD]    # default 2; ranks share GPUs when fewer

The ways: ctypes (the Handle's *_ptr calls, through the C API), the Python
functions (symm.one_shot_all_reduce, ...: through libsymm's PyTorch
extension once the tensor's handle is known), the C++ operators
(torch.ops.symm.*_handle) eagerly, and those operators captured in a CUDA
graph and replayed. The C API launches from the handle's plan (no Go) when
a call has no timeout, through Go when it has one: both are used. For each
of one-shot, two-shot, reduce-scatter and all-gather, float32, bfloat16 and
float16, sizes from 4 KiB to 1 MiB (the push all-reduce: with a timeout,
without, in a graph; 4 and 64 KiB), every result equals the float32 sum in
rank order (rounded once to the dtype: what the kernels compute) in every
bit. Also: the extension is what the Python functions used (its operators
are loaded), torch.compile(fullgraph=True) of a function that calls an
operator gives the same bits, the signals through it carry data around a ring, and a call
the extension passes on (a non-contiguous out) still gets the ctypes
way's error. Each rank is a process (spawned); with fewer GPUs than ranks
the ranks share them (SYMM_ALLOW_OVERLAPPING_DEVICES=1) over a gloo group.
Rank 0 prints PASS/FAIL lines and a summary; exit status 0 when all pass.
"""

import os
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

KiB = 1 << 10
SIZES = [4 * KiB, 64 * KiB, 1 << 20]


def inputs(torch, world, n, dtype, seed):
    """Every rank's input (each rank makes all of them: the reference)."""
    return [torch.randn(n, generator=torch.Generator().manual_seed(seed * 131 + r)).to(dtype) for r in range(world)]


def rank_sum(torch, parts, dtype):
    """The float32 sum in rank order, rounded once to dtype."""
    acc = torch.zeros_like(parts[0], dtype=torch.float32)
    for p in parts:
        acc += p.float()
    return acc.to(dtype)


def run_rank(rank, world, port):
    import torch
    import torch.distributed as dist

    import symm
    from symm import _ops_ext

    ngpu = torch.cuda.device_count()
    own_gpu = ngpu >= world
    dev = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if own_gpu else "gloo", rank=rank, world_size=world,
                            device_id=dev if own_gpu else None)
    group = dist.group.WORLD
    results = []

    def check(name, ok, detail=""):
        results.append((name, bool(ok), detail))

    def same(a, b):
        return torch.equal(a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                           b.view(torch.uint8) if b.dtype != torch.uint8 else b)

    names = {0: "one_shot_all_reduce", 1: "two_shot_all_reduce", 2: "reduce_scatter", 3: "all_gather"}
    seed = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        es = torch.tensor([], dtype=dtype).element_size()
        for nbytes in SIZES:
            for kind in range(4):
                seed += 1
                n = nbytes // es  # elements per rank's tensor (world shares of n / world for rs/ag)
                if kind >= 2:
                    n -= n % world
                parts = inputs(torch, world, n, dtype, seed)
                if kind <= 1:
                    want = rank_sum(torch, parts, dtype)
                elif kind == 2:
                    want = rank_sum(torch, parts, dtype)[rank * (n // world):(rank + 1) * (n // world)]
                else:  # all-gather: share s of rank s
                    k = n // world
                    want = torch.cat([parts[s][s * k:(s + 1) * k] for s in range(world)])
                want = want.to(dev)
                mine = parts[rank].to(dev)
                x = symm.empty(n, dtype=dtype, device=dev)
                out_n = n // world if kind == 2 else n
                outs = {}
                where = f"{names[kind]} {dtype} {nbytes} B"
                fn = getattr(symm, names[kind])
                h = symm.rendezvous(x, group)
                # ctypes, with a timeout (through Go) and without (the plan).
                for way, timeout in (("ctypes+timeout", 5000), ("ctypes", 0)):
                    x.copy_(mine)
                    dist.barrier()
                    o = torch.full((out_n,), float("nan"), dtype=dtype, device=dev)
                    call = getattr(h, names[kind] + "_ptr")
                    count = n if kind <= 1 else n // world
                    dname = str(dtype).removeprefix("torch.")
                    call(0, count, dname, out=o.data_ptr(), timeout_ms=timeout)
                    torch.cuda.synchronize()
                    dist.barrier()
                    outs[way] = o
                # The Python function (twice: the first call may find the handle, the second surely does).
                for _ in range(2):
                    x.copy_(mine)
                    dist.barrier()
                    o = torch.full((out_n,), float("nan"), dtype=dtype, device=dev)
                    fn(x, group=group, out=o)
                    torch.cuda.synchronize()
                    dist.barrier()
                outs["python"] = o
                # The operator, eagerly, then captured and replayed.
                op = getattr(torch.ops.symm, names[kind] + "_handle")
                x.copy_(mine)
                dist.barrier()
                o = torch.full((out_n,), float("nan"), dtype=dtype, device=dev)
                op(x, h.handle, h.offset, world, o)
                torch.cuda.synchronize()
                dist.barrier()
                outs["operator"] = o
                og = torch.full((out_n,), float("nan"), dtype=dtype, device=dev)
                s = torch.cuda.Stream(device=dev)
                s.wait_stream(torch.cuda.current_stream())
                g = torch.cuda.CUDAGraph()
                with torch.cuda.stream(s):
                    x.copy_(mine)
                    torch.cuda.synchronize()
                    dist.barrier()
                    with torch.cuda.graph(g, stream=s):
                        op(x, h.handle, h.offset, world, og)
                torch.cuda.synchronize()
                dist.barrier()  # the capture launched nothing: every rank replays together
                for _ in range(3):
                    x.copy_(mine)
                    torch.cuda.synchronize()
                    dist.barrier()
                    g.replay()
                    torch.cuda.synchronize()
                    dist.barrier()
                outs["graph"] = og
                bad = [w for w, o in outs.items() if not same(o, want)]
                check(where, not bad, f"wrong in {bad}" if bad else "")
                del g
                torch.cuda.synchronize()
                dist.barrier()
    check("the extension's operators are loaded", bool(_ops_ext.ops()), "the Python functions used ctypes")

    # The push all-reduce: with a timeout (through Go), without (the plan,
    # once the workspace is set up), and captured in a graph.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for nbytes in (4 * KiB, 64 * KiB):
            seed += 1
            n = nbytes // torch.tensor([], dtype=dtype).element_size()
            parts = inputs(torch, world, n, dtype, seed)
            want = rank_sum(torch, parts, dtype).to(dev)
            mine = parts[rank].to(dev)
            outs = {}
            for way, timeout in (("timeout", 5000), ("plan", 0), ("plan again", 0)):
                o = torch.full((n,), float("nan"), dtype=dtype, device=dev)
                dist.barrier()
                symm.push_all_reduce(mine, group=group, out=o, timeout_ms=timeout)
                torch.cuda.synchronize()
                outs[way] = o
            og = torch.full((n,), float("nan"), dtype=dtype, device=dev)
            s = torch.cuda.Stream(device=dev)
            s.wait_stream(torch.cuda.current_stream())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    symm.push_all_reduce(mine, group=group, out=og)
            torch.cuda.synchronize()
            for _ in range(3):
                dist.barrier()
                g.replay()
                torch.cuda.synchronize()
            outs["graph"] = og
            bad = [w for w, o in outs.items() if not same(o, want)]
            check(f"push_all_reduce {dtype} {nbytes} B", not bad, f"wrong in {bad}" if bad else "")
            del g
            dist.barrier()

    # torch.compile, fullgraph, of a function that calls an operator and
    # uses what it wrote.
    x = symm.empty(4096, dtype=torch.float32, device=dev)
    h = symm.rendezvous(x, group)
    parts = inputs(torch, world, 4096, torch.float32, 999)
    want = rank_sum(torch, parts, torch.float32).to(dev) * 2

    @torch.compile(fullgraph=True)
    def twice_the_sum(x, out):
        torch.ops.symm.one_shot_all_reduce_handle(x, h.handle, h.offset, world, out)
        return out * 2

    try:
        ok = True
        for _ in range(2):
            x.copy_(parts[rank].to(dev))
            torch.cuda.synchronize()
            dist.barrier()
            got = twice_the_sum(x, torch.empty(4096, device=dev))
            torch.cuda.synchronize()
            dist.barrier()
            ok &= same(got, want)
        check("torch.compile(fullgraph=True) of the one-shot operator", ok, "" if ok else "wrong sums")
    except Exception as e:  # noqa: BLE001 - reported as the check's failure
        check("torch.compile(fullgraph=True) of the one-shot operator", False, f"{type(e).__name__}: {e}"[:400])
        dist.barrier()

    # Signals through the extension: a ring that carries data.
    x = symm.empty(1024, dtype=torch.int32, device=dev)
    h = symm.rendezvous(x, group)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    ok = True
    for rnd in range(20):
        peer = h.get_buffer(nxt, (1024,), torch.int32)
        peer.fill_(rank * 1000 + rnd)
        h.put_signal(nxt, channel=3)
        h.wait_signal(prv, channel=3)
        ok &= bool((x == prv * 1000 + rnd).all())
        h.barrier(channel=4)
    torch.cuda.synchronize()
    check("put/wait ring through the extension carries data", ok)

    # A call the extension passes on gets the ctypes way's error.
    y = symm.empty(256, dtype=torch.float32, device=dev)
    symm.one_shot_all_reduce(y, group=group, out=torch.empty(256, device=dev))
    torch.cuda.synchronize()
    try:
        symm.one_shot_all_reduce(y, group=group, out=torch.empty(512, device=dev)[::2])
        check("non-contiguous out refused", False, "no error")
    except ValueError as e:
        check("non-contiguous out refused", "contiguous" in str(e), str(e))
    dist.barrier()
    dist.destroy_process_group()
    return results


def worker(rank, world, port, q):
    try:
        q.put((rank, run_rank(rank, world, port), ""))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        import traceback

        q.put((rank, [], traceback.format_exc()))
        raise SystemExit(1) from e


def main():
    import multiprocessing as mp
    import queue
    import socket

    import torch

    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    if torch.cuda.device_count() < world:
        os.environ["SYMM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    ok, rows = True, {}
    try:
        for _ in procs:
            rank, res, tb = q.get(timeout=600)
            if tb:
                print(f"rank {rank} raised:\n{tb}", flush=True)
                ok = False
            rows[rank] = res
    except queue.Empty:
        print("symm_paths: a rank did not finish in 600 s; stopping the ranks", flush=True)
        ok = False
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
        ok &= p.exitcode == 0
    passed = failed = 0
    for rank in sorted(rows):
        for name, good, detail in rows[rank]:
            passed += good
            failed += not good
            if rank == 0 or not good:
                print(f"{'PASS' if good else 'FAIL'} rank {rank}: {name}{': ' + detail if detail else ''}", flush=True)
    ok &= failed == 0 and passed > 0
    print(f"symm_paths: {world} ranks, {passed} checks passed, {failed} failed:", "ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
