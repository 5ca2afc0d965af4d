"""libsymm's collectives from PyTorch, the GPU checks: signals, barriers,
the one-shot, two-shot and push all-reduces, symm.all_reduce,
reduce-scatter and all-gather. The benchmarks are tests/device/symm_bench.py.

    python3 tests/device/symm_kernels.py [WORLD]         # default 2; ranks share GPUs when fewer
    python3 tests/device/symm_kernels.py --push [WORLD]  # the push all-reduce's and symm.all_reduce's checks only

Each rank is a process (spawned). With a GPU per rank the process group is
NCCL; with fewer GPUs it is gloo (NCCL refuses two ranks on one GPU), ranks
share devices (SYMM_ALLOW_OVERLAPPING_DEVICES=1) and the reference sums come
from gloo on CPU copies. SYMM_BACKEND (cuda, nvshmem, nccl) picks libsymm's
backend (tests/device/symm_backends.sh runs both others).

Checks, in this file: kernels ready; barriers; a put/wait ring that carries
data; symm.one_shot_all_reduce against dist.all_reduce for float32 and
bfloat16 from 4 KiB to 4 MiB (with and without local_input); out shifted
against local_input refused (INVALID), out = local_input (in place) summed;
out and local_input aligned differently on each rank, 100 rounds, sums
bit-exact (misaligned_rounds); a rank that does not come gives
SymmError(TIMEOUT) naming it, and the stream goes on; a barrier and the
all-reduce captured in a CUDA graph and replayed; rank 0's barrier or pad
reset against the others' all-reduce gives SymmError(MISMATCH) on every
rank (mismatch_rounds); a push workspace's first call captured in a graph,
then an eager call before the replay (push_capture_first). In symm_rounds.py (beside
this file): two_shot_rounds (symm.two_shot_all_reduce, in place / out /
local_input, bit for bit in rank order, a CUDA graph replayed), rsag_rounds
(symm.reduce_scatter and symm.all_gather, 4 B .. 1 MiB per rank, every
layout, a CUDA graph replayed), push_rounds (symm.push_all_reduce: odd sizes
up to the workspace's limit, offsets, in place, 1,000 graph replays, a rank
that stays away) and all_reduce_rounds (symm.all_reduce with each
algorithm, the choice per size reported). --push runs push_rounds and
all_reduce_rounds alone.

SYMM_KERNELS_ONLY=misaligned runs the misaligned-pointer rounds alone (to
try an older library with SYMM_LIB). Rank 0 prints PASS/FAIL lines;
$OUT/symm_kernels_<WORLD>.md (or symm_kernels_push_<WORLD>.md) gets them.
"""

import os
import sys
import time

# Never multicast: on the shared hosts a multicast object can take the GPUs out of service.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

from symm_rounds import all_reduce_rounds, graph_replays, push_rounds, rsag_rounds, two_shot_rounds  # noqa: E402 - beside this file

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB << k for k in range(11)]  # 4 KiB .. 4 MiB


def misaligned_rounds(rank, world, dev, group, check):
    """out and local_input one element into larger tensors (4-byte but not
    16-byte aligned) on one rank, aligned on the others, switching each
    round; 100 rounds, the sums checked bit for bit against float32 sums in
    rank order (what the kernel computes), rounded to bfloat16 for bfloat16."""
    import torch
    import torch.distributed as dist

    import symm

    for dtype, n in ((torch.float32, 8192), (torch.bfloat16, 8192)):
        x = symm.empty(n, dtype=dtype, device=dev)
        big_out = torch.empty(n + 8, dtype=dtype, device=dev)
        big_loc = torch.empty(n + 8, dtype=dtype, device=dev)
        bad = ""
        t0 = time.monotonic()
        for rnd in range(100):
            odd = rnd % world  # the rank whose pointers are misaligned
            shift = 1 if rank == odd else 0
            if dtype == torch.bfloat16 and shift:
                shift = 2  # 4 bytes: the kernel needs 4-byte alignment
            out = big_out[shift:shift + n]
            use_local = rnd % 3 != 0
            ins = [torch.randn(n, generator=torch.Generator().manual_seed(7919 * rnd + r)).to(dtype)
                   for r in range(world)]
            if use_local:
                loc = big_loc[shift:shift + n]
                loc.copy_(ins[rank])
                x.fill_(-1)
            else:
                x.copy_(ins[rank])
            try:
                symm.one_shot_all_reduce(x, group=group, out=out, local_input=loc if use_local else None,
                                         timeout_ms=5000)
            except symm.SymmError as e:
                bad = f"round {rnd}: {str(e)[:200]}"
                break
            acc = torch.zeros(n, dtype=torch.float32)
            for r in range(world):
                acc += ins[r].float()
            want = acc.to(dtype)
            got = out.cpu()
            if not torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)):
                k = int((got != want).nonzero()[0])
                bad = f"round {rnd} (local={use_local}, misaligned rank {odd}): word {k}: {got[k].item()} want {want[k].item()}"
                break
        dist.barrier()
        check(f"one_shot_all_reduce {str(dtype)[6:]} misaligned out/local_input on one rank, 100 rounds bit-exact",
              not bad, bad or f"{time.monotonic() - t0:.2f} s")
        del x


def mismatch_rounds(rank, world, dev, group, check):
    """Meetings carry their kind: rank 0's barrier, or its pad reset (a reset
    one rank decided alone), against the others' one-shot all-reduce is
    SymmError(MISMATCH) on every rank, naming both calls; never a pass in
    which the all-reduce reads before the inputs are in. Fresh blocks, so
    every rank's count of meetings starts alike: each case's block is kept
    until both have run, as a block handed out again would bring back its
    handle, which the mismatch failed for good."""
    import torch
    import torch.distributed as dist

    import symm

    kept = []
    for what in ("barrier", "reset_signal_pad"):
        x = symm.empty(1024, dtype=torch.float32, device=dev)
        h = symm.rendezvous(x, group)
        x.fill_(float(rank + 1))
        name = f"rank 0's {what} against the others' one_shot_all_reduce: MISMATCH on every rank"
        try:
            if rank == 0 and what == "barrier":
                h.barrier(channel=0, timeout_ms=5000)
            elif rank == 0:
                h.reset_signal_pad(timeout_ms=5000)
            else:
                symm.one_shot_all_reduce(x, group=group, timeout_ms=5000)
            check(name, False, "no error")
        except symm.SymmError as e:
            check(name, e.code == symm.ErrorCode.MISMATCH and f"rank 0's {what}" in str(e)
                  and "one_shot_all_reduce (before the reads)" in str(e), str(e)[:240])
        torch.cuda.synchronize()
        dist.barrier()
        kept.append((x, h))
    del kept


def push_capture_first(rank, world, dev, check):
    """A push workspace whose first call is captured in a CUDA graph (its
    set-up captured, not run), then an eager call before any replay: the
    eager call sets the workspace up itself and sums right (it read a
    workspace never cleared when a queued set-up counted as done); then the
    replay sums right too."""
    import torch
    import torch.distributed as dist

    import symm

    g2 = dist.new_group(list(range(world)))
    symm.push_workspace(g2, dev)  # the rendezvous, outside the capture
    x = torch.full((4096,), float(rank + 1), device=dev)
    out = torch.zeros_like(x)
    want = float(sum(r + 1 for r in range(world)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        symm.push_all_reduce(x, group=g2, out=out)
    out.zero_()
    try:
        symm.push_all_reduce(x, group=g2, out=out)
        torch.cuda.synchronize()
        eager = bool((out == want).all())
        detail = f"eager: {out[:4].tolist()}"
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        replay = bool((out == want).all())
        detail += f"; replay: {out[:4].tolist()}"
        check("push_all_reduce: first call captured, an eager call before the replay, then the replay", eager and replay, detail)
    except symm.SymmError as e:
        check("push_all_reduce: first call captured, an eager call before the replay, then the replay", False, str(e)[:240])
    dist.barrier()


def run_rank(rank, world, port, push_only=False):
    import torch
    import torch.distributed as dist

    import symm

    ngpu = torch.cuda.device_count()
    own_gpu = ngpu >= world
    dev = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if own_gpu else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, device_id=dev if own_gpu else None)
    group = dist.group.WORLD
    results = []

    def check(name, ok, detail=""):
        results.append((name, bool(ok), detail))

    check("kernels ready", symm.kernels_ready(dev.index), symm.kernels_status(dev.index))

    if os.environ.get("SYMM_KERNELS_ONLY") == "misaligned":
        misaligned_rounds(rank, world, dev, group, check)
    elif push_only:
        push_rounds(rank, world, dev, group, check)
        all_reduce_rounds(rank, world, dev, group, check)
    else:
        t = symm.empty(4 * MiB, dtype=torch.uint8, device=dev)
        h = symm.rendezvous(t, group)
        for i in range(100):
            h.barrier(channel=i % 24)
        torch.cuda.synchronize()
        check("100 barriers", True)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        ok = True
        for r in range(10):
            peer = h.get_buffer(nxt, (1024,), torch.int32, storage_offset=1024 * 256)
            peer.fill_(rank * 1000 + r)
            h.put_signal(nxt, channel=30)
            h.wait_signal(prv, channel=30, timeout_ms=20000)
            mine = h.get_buffer(rank, (1024,), torch.int32, storage_offset=1024 * 256)
            ok &= bool((mine == prv * 1000 + r).all())
            h.barrier(channel=30, timeout_ms=20000)
        check("put/wait ring carries data", ok)

        for dtype in (torch.float32, torch.bfloat16):
            bad = []
            for nbytes in SIZES:
                n = nbytes // (4 if dtype == torch.float32 else 2)
                x = symm.empty(n, dtype=dtype, device=dev)
                g = torch.Generator(device="cpu").manual_seed(1000 * rank + n)
                src = torch.randn(n, generator=g, dtype=torch.float32).to(dtype)
                for local in (False, True):
                    if local:
                        loc = src.to(dev)
                        x.zero_()
                        out = symm.one_shot_all_reduce(x, group=group, local_input=loc)
                    else:
                        x.copy_(src)
                        out = symm.one_shot_all_reduce(x, group=group)
                    ref = src.float().to(dev) if own_gpu else src.float()
                    dist.all_reduce(ref, group=group)
                    got = out.float().cpu()
                    want = ref.cpu()
                    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
                    err = ((got - want).abs() / (want.abs() + 1e-3)).max().item()
                    if not torch.allclose(got, want, rtol=tol, atol=tol * world):
                        bad.append(f"{nbytes}B local={local}: max rel err {err:.2e}")
                del x
            check(f"one_shot_all_reduce {str(dtype)[6:]} 4 KiB..4 MiB vs dist.all_reduce", not bad, "; ".join(bad[:3]))

        # out overlapping local_input at a shift (blocks would overwrite input
        # other blocks have not copied in yet) is refused on every rank before
        # any signal; out = local_input (in place) works.
        n = 1 << 16
        x = symm.empty(n, dtype=torch.float32, device=dev)
        src = torch.arange(n, dtype=torch.float32, device=dev) + rank
        wide = torch.zeros(n + 1, dtype=torch.float32, device=dev)
        wide[:n].copy_(src)
        try:
            symm.one_shot_all_reduce(x, group=group, out=wide[1:], local_input=wide[:n])
            check("out shifted against local_input is refused", False, "no error")
        except symm.SymmError as e:
            check("out shifted against local_input is refused", e.code == symm.ErrorCode.INVALID
                  and "overlaps local_input" in str(e) and "shift of +4 bytes" in str(e), str(e)[:200])
        check("a refused all-reduce writes nothing", torch.equal(wide[:n], src) and float(wide[n]) == 0.0)
        loc = src.clone()
        res = symm.one_shot_all_reduce(x, group=group, out=loc, local_input=loc)
        want = sum(torch.arange(n, dtype=torch.float32) + r for r in range(world))
        check("one_shot_all_reduce in place (out = local_input)",
              res.data_ptr() == loc.data_ptr() and torch.equal(loc.cpu(), want))
        del x

        misaligned_rounds(rank, world, dev, group, check)
        two_shot_rounds(rank, world, dev, group, check)
        rsag_rounds(rank, world, dev, group, check)

        # A rank that stays away: the others time out naming it; streams go on.
        y = symm.empty(1024, dtype=torch.float32, device=dev)
        symm.rendezvous(y, group)
        absent = world - 1
        if rank != absent:
            t0 = time.monotonic()
            try:
                symm.one_shot_all_reduce(y, group=group, timeout_ms=300)
                check("all-reduce without a rank times out", False, "no error")
            except symm.SymmError as e:
                ms = (time.monotonic() - t0) * 1e3
                check("all-reduce without a rank times out", e.code == symm.ErrorCode.TIMEOUT and f"rank {absent}" in str(e),
                      f"{ms:.0f} ms: {str(e)[:160]}")
            z = torch.ones(1 << 20, device=dev)
            torch.cuda.synchronize()
            check("the stream goes on after the timeout", float(z.sum()) == float(1 << 20))
        dist.barrier()

        # CUDA graphs: a barrier and the all-reduce captured once, replayed
        # with new inputs (the kernels launch on the capture stream; their
        # timeouts need no host call, so capture is not broken).
        g_in = symm.empty(1 << 18, dtype=torch.float32, device=dev)
        hg = symm.rendezvous(g_in, group)
        g_out = torch.empty_like(g_in)

        def barrier_and_all_reduce():
            hg.barrier(channel=5)
            symm.one_shot_all_reduce(g_in, group=group, out=g_out)

        ok, detail = graph_replays(dev, barrier_and_all_reduce, lambda k: g_in.fill_(float(rank + 10 * k)),
                                   lambda k: float(sum(r + 10 * k for r in range(world))), [g_out], 3)
        check("barrier + one_shot_all_reduce captured in a CUDA graph, replayed 3 times", ok, detail)
        dist.barrier()

        mismatch_rounds(rank, world, dev, group, check)
        push_capture_first(rank, world, dev, check)
        push_rounds(rank, world, dev, group, check)
        all_reduce_rounds(rank, world, dev, group, check)

    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        report(world, backend, gathered, push_only)
    dist.destroy_process_group()
    return all(ok for res in gathered for _, ok, _ in res)


def report(world, backend, gathered, push_only=False):
    import torch

    import symm

    lines = [f"# libsymm kernels: {world} rank(s), {torch.cuda.device_count()} GPU(s) "
             f"({torch.cuda.get_device_name(0)}), process group {backend}, libsymm backend {symm.get_backend()}, "
             f"torch {torch.__version__}",
             f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    for r, results in enumerate(gathered):
        for name, ok, detail in results:
            if r == 0 or not ok:
                lines.append(f"{'PASS' if ok else 'FAIL'}  rank {r}: {name}" + (f" ({detail})" if detail else ""))
    text = "\n".join(lines)
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        suffix = f"_push_{world}" if push_only else f"_{world}"
        with open(os.path.join(out, f"symm_kernels{suffix}.md"), "w") as f:
            f.write(text + "\n")


def worker(rank, world, port, push_only, q):
    try:
        q.put((rank, run_rank(rank, world, port, push_only), ""))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        import traceback

        q.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from e


def main():
    import multiprocessing as mp
    import queue
    import socket

    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    if "--bench1" in flags:
        print("symm_kernels.py: the benchmarks moved to tests/device/symm_bench.py "
              "(python3 tests/device/symm_bench.py --bench1)", file=sys.stderr)
        return 2
    unknown = [a for a in flags if a != "--push"]
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if unknown or len(args) > 1 or (args and not args[0].isdigit()):
        print(f"usage: {sys.argv[0]} [--push] [WORLD]   (benchmarks: tests/device/symm_bench.py)", file=sys.stderr)
        return 2
    push_only = "--push" in flags
    world = int(args[0]) if args else 2
    import torch

    if torch.cuda.device_count() < world:
        os.environ["SYMM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, push_only, q)) for r in range(world)]
    for p in procs:
        p.start()
    ok = True
    try:
        for _ in procs:
            rank, good, tb = q.get(timeout=900)
            if tb:
                print(f"rank {rank} raised:\n{tb}", flush=True)
            ok &= good
    except queue.Empty:
        print("symm_kernels: a rank did not finish in 900 s; stopping the ranks", flush=True)
        ok = False
        for p in procs:
            if p.is_alive():
                p.kill()
    for p in procs:
        p.join(timeout=60)
        ok &= p.exitcode == 0
    print("symm_kernels:", "ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
