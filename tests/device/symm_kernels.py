"""libsymm's kernels from PyTorch: signals and the one-shot all-reduce.

    python3 tests/device/symm_kernels.py [WORLD]      # default 2; ranks share GPUs when fewer
    python3 tests/device/symm_kernels.py --bench1     # one GPU, world 1: side by side with PyTorch
    python3 tests/device/symm_kernels.py --push [WORLD]  # the push all-reduce's checks and benchmark only

Each rank is a process (spawned). With a GPU per rank the process group is
NCCL; with fewer GPUs it is gloo (NCCL refuses two ranks on one GPU), ranks
share devices (SYMM_ALLOW_OVERLAPPING_DEVICES=1) and the reference sums come
from gloo on CPU copies. Checks: kernels ready; barriers; a put/wait ring that
carries data; symm.one_shot_all_reduce against dist.all_reduce for float32
and bfloat16 from 4 KiB to 4 MiB (with and without local_input); out shifted
against local_input refused (INVALID), out = local_input (in place) summed; out and
local_input aligned differently on each rank, 100 rounds, sums bit-exact; a rank that
does not come gives SymmError(TIMEOUT) naming it, and the stream goes on.
With a GPU per rank it then times, side by side in the same processes:
barrier (libsymm's kernel vs PyTorch's symmetric memory) and the all-reduce
(libsymm vs torch.ops.symm_mem.one_shot_all_reduce vs NCCL all_reduce, NVLS
off). --bench1 times what one GPU can compare: a put/wait pair to oneself and
the world-1 all-reduce, libsymm vs PyTorch, launch cost included.
SYMM_KERNELS_ONLY=misaligned runs the misaligned-pointer rounds alone (to try
an older library with SYMM_LIB). Rank 0 prints PASS/FAIL lines and tables;
$OUT/symm_kernels.md gets them.

The push all-reduce (symm.push_all_reduce, one kernel per call, no barrier;
run by default and alone with --push): float32, bfloat16 and float16, odd
sizes from 1 element to the workspace's limit, pointers 8-byte aligned, one
element off (differently on each rank) and in place, each bit for bit
against float32 sums in rank order and within rounding of a float64
reference; the same bits on every rank; 1,000 replays of a CUDA graph of 3
chained calls with the inputs changed between replays; a rank that stays
away from a call named in the others' SymmError(TIMEOUT). With a GPU per
rank, a benchmark: 20 all-reduces captured in one CUDA graph, replayed,
µs per op from 4 KiB to 1 MiB (bfloat16 and float32): the push
all-reduce, libsymm's one-shot, torch symm_mem one_shot / two_shot, NCCL.
Then symm.all_reduce (the algorithm chosen by size, or forced): None, push
and two_shot at 4 KiB .. 4 MiB against float64, the same bits on every
rank, the algorithm chosen at each size reported.
symm.reduce_scatter and symm.all_gather (rsag_rounds, beside the two-shot's
checks): exact against rank-order float32 sums / copies, float64, the same
bits on every rank, in place and not, a CUDA graph replayed; with --push a
benchmark beside NCCL's reduce_scatter_tensor and all_gather_into_tensor,
4 KiB .. 1 MiB per rank, graph-captured (rsag_bench).
"""

import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB << k for k in range(11)]  # 4 KiB .. 4 MiB
PUSH_BENCH_SIZES = [4 * KiB << k for k in range(9)]  # 4 KiB .. 1 MiB, the push workspace's default limit


def log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


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


def two_shot_rounds(rank, world, dev, group, check):
    """symm.two_shot_all_reduce: float32 and bfloat16, 4 KiB..4 MiB (and
    sizes that split unevenly into world shares), in place (the sum in the
    symmetric tensor), out of place and from a local input; bit for bit
    against the float32 sum in rank order (so the same bits on every rank,
    checked by all_gather too) and within rounding of float64; a CUDA graph
    of two calls replayed with new inputs."""
    import torch
    import torch.distributed as dist

    import symm

    for dtype in (torch.float32, torch.bfloat16):
        es = 4 if dtype == torch.float32 else 2
        ity = torch.int32 if es == 4 else torch.int16
        bad = []
        for nbytes in (4 << 10, (4 << 10) + 12, 64 << 10, (256 << 10) + 4 * world + 8, 1 << 20, 4 << 20):
            n = nbytes // es
            srcs = [torch.randn(n, generator=torch.Generator().manual_seed(7919 * r + n), dtype=torch.float32).to(dtype)
                    for r in range(world)]
            acc = torch.zeros(n, dtype=torch.float32)
            for r in range(world):
                acc += srcs[r].float()
            exact = acc.to(dtype)
            ref64 = sum(s.double() for s in srcs)
            x = symm.empty(n, dtype=dtype, device=dev)
            for mode in ("in place", "out", "local", "local in place"):
                src = srcs[rank].to(dev)
                out = loc = None
                if mode in ("in place", "out"):
                    x.copy_(src)
                else:
                    x.zero_()
                    loc = src
                if mode == "out":
                    out = torch.empty_like(x)
                elif mode == "local in place":
                    out = loc
                res = symm.two_shot_all_reduce(x, group=group, out=out, local_input=loc)
                want_ptr = (out if out is not None else x).data_ptr()
                got = res.cpu()
                gathered = [torch.empty_like(res) for _ in range(world)]
                dist.all_gather(gathered, res.contiguous(), group=group)
                same = all(torch.equal(g.view(ity).cpu(), res.view(ity).cpu()) for g in gathered)
                tol = 1e-5 if dtype == torch.float32 else 1.6e-2
                close = torch.allclose(got.double(), ref64, rtol=tol, atol=tol * world)
                bits, buf = torch.equal(got.view(ity), exact.view(ity)), torch.equal(x.cpu().view(ity), exact.view(ity))
                if res.data_ptr() != want_ptr or not bits or not buf or not same or not close:
                    bad.append(f"{nbytes}B {mode}: returned its out {res.data_ptr() == want_ptr}, bits {bits}, "
                               f"buffer {buf}, same on every rank {same}, float64 {close}")
            del x
        check(f"two_shot_all_reduce {str(dtype)[6:]} 4 KiB..4 MiB, in place / out / local_input: bit for bit in rank "
              f"order, the same on every rank, within rounding of float64", not bad, "; ".join(bad[:3]))

    # A CUDA graph of two calls (in place, then out of place) replayed with new inputs.
    g_in = symm.empty(1 << 18, dtype=torch.float32, device=dev)
    g_out = torch.empty_like(g_in)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (rendezvous, kernels)
        g_in.fill_(1.0)
        symm.two_shot_all_reduce(g_in, group=group)
        symm.two_shot_all_reduce(g_in, group=group, out=g_out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            symm.two_shot_all_reduce(g_in, group=group)
            symm.two_shot_all_reduce(g_in, group=group, out=g_out)
        ok, detail = True, ""
        for k in range(5):
            g_in.fill_(float(rank + 10 * k))
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            want = float(sum(r + 10 * k for r in range(world))) * world
            good = bool((g_out == want).all()) and bool((g_in == want).all())
            ok &= good
            if not good:
                detail = f"replay {k}: out {g_out[:4].tolist()} in {g_in[:4].tolist()} want {want}"
    except Exception as e:  # noqa: BLE001 - a capture that fails is the finding
        ok, detail = False, f"{type(e).__name__}: {e}"
    check("two_shot_all_reduce x2 captured in a CUDA graph, replayed 5 times with new inputs", ok, detail)
    dist.barrier()


def rsag_rounds(rank, world, dev, group, check):
    """symm.reduce_scatter and symm.all_gather on symmetric tensors of world
    shares: reduce_scatter float32 and bfloat16 (bit for bit against the
    float32 sum of share rank in rank order, within rounding of float64, the
    same bits on every rank for the same share), all_gather float32,
    bfloat16 and float16 (exact copies); per-rank shares of 4 bytes .. 1 MiB
    and odd sizes; in place, out of place, from a local input and NCCL's
    in-place layout; a CUDA graph of both replayed with new inputs."""
    import hashlib

    import torch
    import torch.distributed as dist

    import symm

    def digests(t):
        mine = hashlib.sha256(t.contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
        every = [None] * world
        dist.all_gather_object(every, mine, group=group)
        return every

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        es = torch.empty((), dtype=dtype).element_size()
        ity = torch.int32 if es == 4 else torch.int16
        bad = []
        for nbytes in (4, 12, 4 << 10, (4 << 10) + 12, 64 << 10, (256 << 10) + 4, 1 << 20):
            n = nbytes // es
            srcs = [torch.randn(world * n, generator=torch.Generator().manual_seed(7919 * r + n),
                                dtype=torch.float32).to(dtype) for r in range(world)]
            x = symm.empty(world * n, dtype=dtype, device=dev)
            mine = srcs[rank].to(dev)
            for mode in ("in place", "out", "local", "local in place"):
                # All-gather: rank r's share r of its own input.
                piece = mine[rank * n:(rank + 1) * n]
                want = torch.cat([srcs[s][s * n:(s + 1) * n] for s in range(world)])
                x.zero_()
                out = loc = None
                if mode in ("in place", "out"):
                    x[rank * n:(rank + 1) * n].copy_(piece)
                if mode == "out":
                    out = torch.empty(world * n, dtype=dtype, device=dev)
                elif mode == "local":
                    out, loc = torch.empty(world * n, dtype=dtype, device=dev), piece.clone()
                elif mode == "local in place":
                    out = torch.zeros(world * n, dtype=dtype, device=dev)
                    out[rank * n:(rank + 1) * n].copy_(piece)
                    loc = out[rank * n:(rank + 1) * n]
                res = symm.all_gather(x, group=group, out=out, local_input=loc)
                if not torch.equal(res.cpu().view(ity), want.view(ity)):
                    bad.append(f"all_gather {nbytes}B/rank {mode}: not an exact copy")
                if dtype == torch.float16:
                    continue
                # Reduce-scatter: share rank of the rank-order float32 sum.
                acc = torch.zeros(n, dtype=torch.float32)
                for r in range(world):
                    acc += srcs[r][rank * n:(rank + 1) * n].float()
                exact = acc.to(dtype)
                ref64 = sum(s[rank * n:(rank + 1) * n].double() for s in srcs)
                out = loc = None
                if mode in ("in place", "out"):
                    x.copy_(mine)
                else:
                    x.zero_()
                    loc = mine.clone()
                if mode in ("out", "local"):
                    out = torch.empty(n, dtype=dtype, device=dev)
                elif mode == "local in place":
                    out = loc[rank * n:(rank + 1) * n]
                res = symm.reduce_scatter(x, group=group, out=out, local_input=loc)
                if mode == "in place" and res.data_ptr() != x[rank * n:].data_ptr():
                    bad.append(f"reduce_scatter {nbytes}B/rank in place: not the tensor's share")
                got = res.cpu()
                tol = 1e-5 if dtype == torch.float32 else 1.6e-2
                close = torch.allclose(got.double(), ref64, rtol=tol, atol=tol * world)
                bits = torch.equal(got.view(ity), exact.view(ity))
                if not bits or not close:
                    bad.append(f"reduce_scatter {nbytes}B/rank {mode}: bits {bits}, float64 {close}")
            # Every rank computes share s alike: the full sums through the all-gather agree everywhere.
            if dtype != torch.float16:
                x.copy_(mine)
                shares = symm.reduce_scatter(x, group=group, out=torch.empty(n, dtype=dtype, device=dev))
                x[rank * n:(rank + 1) * n].copy_(shares)
                full = symm.all_gather(x, group=group, out=torch.empty(world * n, dtype=dtype, device=dev))
                if len(set(digests(full))) != 1:
                    bad.append(f"{nbytes}B/rank: the reduced shares differ between ranks")
            del x
        check(f"reduce_scatter / all_gather {str(dtype)[6:]} 4 B..1 MiB per rank, in place / out / local_input / "
              f"NCCL in place: exact, in rank order, within rounding of float64, the same on every rank",
              not bad, "; ".join(bad[:3]))

    # A CUDA graph of a reduce-scatter then an all-gather (an all-reduce), replayed with new inputs.
    n = 1 << 16
    g_x = symm.empty(world * n, dtype=torch.float32, device=dev)
    g_out = torch.empty(world * n, dtype=torch.float32, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (rendezvous, kernels)
        g_x.fill_(1.0)
        symm.reduce_scatter(g_x, group=group)
        symm.all_gather(g_x, group=group, out=g_out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            symm.reduce_scatter(g_x, group=group)
            symm.all_gather(g_x, group=group, out=g_out)
        ok, detail = True, ""
        for k in range(5):
            g_x.fill_(float(rank + 10 * k))
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            want = float(sum(r + 10 * k for r in range(world)))
            good = bool((g_out == want).all())
            ok &= good
            if not good:
                detail = f"replay {k}: out {g_out[:4].tolist()} want {want}"
    except Exception as e:  # noqa: BLE001 - a capture that fails is the finding
        ok, detail = False, f"{type(e).__name__}: {e}"
    check("reduce_scatter + all_gather captured in a CUDA graph, replayed 5 times with new inputs", ok, detail)
    dist.barrier()


def push_rounds(rank, world, dev, group, check):
    """The push all-reduce's checks (see the top of this file)."""
    import hashlib

    import torch
    import torch.distributed as dist

    import symm

    ws = symm.push_workspace(group, dev)
    limit = ws.push_max_bytes
    check("push workspace set up", limit == int(os.environ.get("SYMM_PUSH_MAX_BYTES", symm._symmetric.PUSH_MAX_BYTES)),
          f"limit {limit} bytes")
    itype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}
    wide = torch.empty(limit // 2 + 16, dtype=torch.float32, device=dev)
    wide_out = torch.empty_like(wide)
    k = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        es = torch.empty((), dtype=dtype).element_size()
        bad, exact_bad, digests = [], [], []
        t0 = time.monotonic()
        for n in (1, 2, 3, 5, 7, 1023, 1024, 4097, 65537, limit // es):
            for mode in ("aligned", "offset", "in place"):
                ins = [torch.randn(n, generator=torch.Generator().manual_seed(7919 * k + r)).to(dtype) for r in range(world)]
                # one element off on the rank whose turn it is, two on the others
                off = 0 if mode == "aligned" else (1 if rank == k % world else 2)
                base = wide.view(dtype)
                x = base[off:off + n]
                x.copy_(ins[rank])
                o_off = 0 if mode == "aligned" else off + 1
                out = x if mode == "in place" else wide_out.view(dtype)[o_off:o_off + n]
                try:
                    res = symm.push_all_reduce(x, group=group, out=out)
                except symm.SymmError as e:
                    bad.append(f"{n} {mode}: {str(e)[:160]}")
                    k += 1
                    continue
                acc = torch.zeros(n, dtype=torch.float32)
                for r in range(world):
                    acc += ins[r].float()
                want = acc.to(dtype)
                got = res.cpu()
                if not torch.equal(got.view(itype[dtype]), want.view(itype[dtype])):
                    i = int((got.view(itype[dtype]) != want.view(itype[dtype])).nonzero()[0])
                    exact_bad.append(f"{n} {mode}: [{i}] {got[i].item()} want {want[i].item()}")
                ref = sum(t.double() for t in ins)
                scale = sum(t.double().abs() for t in ins) + 1e-30
                err = ((got.double() - ref).abs() / scale).max().item()
                if err > tol[dtype]:
                    bad.append(f"{n} {mode}: error {err:.2e} against float64")
                digests.append(hashlib.sha1(got.view(torch.uint8).numpy().tobytes()).hexdigest())
                k += 1
        name = str(dtype)[6:]
        check(f"push_all_reduce {name} 1 element .. {limit // es}, aligned / offset / in place, within rounding of float64",
              not bad, "; ".join(bad[:3]) or f"{time.monotonic() - t0:.2f} s")
        check(f"push_all_reduce {name}: bit for bit the float32 sum in rank order", not exact_bad, "; ".join(exact_bad[:3]))
        everyone = [None] * world
        dist.all_gather_object(everyone, digests, group=group)
        check(f"push_all_reduce {name}: the same bits on every rank", all(d == everyone[0] for d in everyone))

    # CUDA graph: 3 chained calls (o1 = sum x; o2 = sum o1; o2 = sum o2 in
    # place), replayed 1,000 times with new inputs each time.
    for dtype, n in ((torch.float32, 16384), (torch.bfloat16, 4096)):
        x = torch.empty(n, dtype=dtype, device=dev)
        o1, o2 = torch.empty_like(x), torch.empty_like(x)
        pattern = (torch.arange(n, device=dev) % 13).float()

        def chain():
            symm.push_all_reduce(x, group=group, out=o1)
            symm.push_all_reduce(o1, group=group, out=o2)
            symm.push_all_reduce(o2, group=group, out=o2)

        def expect(k):
            xs = [(pattern + (k % 7) + r).to(dtype) for r in range(world)]
            v = torch.zeros(n, device=dev)
            for t in xs:
                v += t.float()
            for _ in range(2):
                v = v.to(dtype)
                acc = torch.zeros(n, device=dev)
                for _ in range(world):
                    acc += v.float()
                v = acc
            return v.to(dtype)

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.copy_((pattern + rank).to(dtype))
            chain()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        bad = ""
        t0 = time.monotonic()
        try:
            with torch.cuda.graph(graph):
                chain()
            for k in range(1000):
                x.copy_((pattern + (k % 7) + rank).to(dtype))
                graph.replay()
                if not torch.equal(o2, expect(k)):
                    bad = f"replay {k}: {o2[:4].tolist()} want {expect(k)[:4].tolist()}"
                    break
        except Exception as e:  # noqa: BLE001 - a capture that fails is the finding
            bad = f"{type(e).__name__}: {str(e)[:200]}"
        torch.cuda.synchronize()
        check(f"push_all_reduce {str(dtype)[6:]}: a CUDA graph of 3 chained calls, 1000 replays with new inputs", not bad,
              bad or f"{time.monotonic() - t0:.2f} s")
        dist.barrier()

    # A rank that stays away from a call (after the workspace's first call):
    # the others time out naming it; their streams go on.
    late = dist.new_group(list(range(world)))
    y = torch.ones(1000, device=dev)
    symm.push_all_reduce(y, group=late, timeout_ms=20000)
    absent = world - 1
    if rank != absent:
        t0 = time.monotonic()
        try:
            symm.push_all_reduce(y, group=late, timeout_ms=300)
            check("push_all_reduce without a rank times out", False, "no error")
        except symm.SymmError as e:
            ms = (time.monotonic() - t0) * 1e3
            check("push_all_reduce without a rank times out naming it",
                  e.code == symm.ErrorCode.TIMEOUT and f"rank {absent}'s data" in str(e), f"{ms:.0f} ms: {str(e)[:200]}")
        z = torch.ones(1 << 20, device=dev)
        torch.cuda.synchronize()
        check("the stream goes on after the push timeout", float(z.sum()) == float(1 << 20))
    dist.barrier()


def all_reduce_rounds(rank, world, dev, group, check):
    """symm.all_reduce, the entry point that chooses the algorithm: with
    algorithm None (SYMM_ALL_REDUCE, else the measured crossovers), "push"
    and "two_shot", at 4 KiB, 256 KiB, 1 MiB and 4 MiB, float32 and
    bfloat16, against a float64 reference and the same bits on every rank;
    a push over the workspace's limit refused naming it; the algorithm
    chosen at each size reported; torch.ops.symm.all_reduce once."""
    import hashlib

    import torch
    import torch.distributed as dist

    import symm

    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3}
    limit = symm.push_workspace(group, dev).push_max_bytes
    chosen = {n: symm.all_reduce_algorithm(world, n, limit) for n in (4 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)}
    check(f"all_reduce: algorithm chosen for {world} ranks", True,
          ", ".join(f"{n // KiB} KiB: {a}" for n, a in chosen.items()))
    bad, digests, k = [], [], 0
    for dtype in (torch.float32, torch.bfloat16):
        es = torch.empty((), dtype=dtype).element_size()
        for nbytes in chosen:
            n = nbytes // es
            for algorithm in (None, "push", "two_shot"):
                ins = [torch.randn(n, generator=torch.Generator().manual_seed(104729 * k + r)).to(dtype)
                       for r in range(world)]
                k += 1
                x = ins[rank].to(dev)
                what = f"{str(dtype)[6:]} {nbytes // KiB} KiB {algorithm}"
                try:
                    got = symm.all_reduce(x, group=group, algorithm=algorithm).cpu()
                except symm.SymmError as e:
                    if not (algorithm == "push" and nbytes > limit and e.code == symm.ErrorCode.INVALID
                            and f"limit of {limit} bytes" in str(e)):
                        bad.append(f"{what}: {str(e)[:160]}")
                    continue
                if algorithm == "push" and nbytes > limit:
                    bad.append(f"{what}: over the push workspace's limit, not refused")
                if not torch.equal(x.cpu(), ins[rank]):
                    bad.append(f"{what}: the input changed")
                ref = sum(t.double() for t in ins)
                scale = sum(t.double().abs() for t in ins) + 1e-30
                err = ((got.double() - ref).abs() / scale).max().item()
                if err > tol[dtype]:
                    bad.append(f"{what}: error {err:.2e} against float64")
                digests.append(hashlib.sha1(got.view(torch.uint8).numpy().tobytes()).hexdigest())
    # in place, an odd bfloat16 count (padded through the scratch buffer)
    for algorithm in ("two_shot", "one_shot"):
        x = torch.full((1001,), float(rank + 1), dtype=torch.bfloat16, device=dev)
        symm.all_reduce(x, group=group, out=x, algorithm=algorithm)
        if not bool((x == world * (world + 1) // 2).all()):
            bad.append(f"bfloat16 1001 elements in place {algorithm}: {x[:4].tolist()}")
    check("all_reduce None / push / two_shot, float32 and bfloat16, 4 KiB .. 4 MiB, within rounding of float64",
          not bad, "; ".join(bad[:3]))
    everyone = [None] * world
    dist.all_gather_object(everyone, digests, group=group)
    check("all_reduce: the same bits on every rank", all(d == everyone[0] for d in everyone))
    try:
        symm.register_torch_ops()
        x = torch.full((4096,), float(rank), device=dev)
        y = torch.ops.symm.all_reduce(x, getattr(group, "group_name", "0"))
        check("torch.ops.symm.all_reduce", bool((y == world * (world - 1) / 2).all()), str(y[:2].tolist()))
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        check("torch.ops.symm.all_reduce", False, f"{type(e).__name__}: {e}")


def _graph_time(dev, fn, replays=50):
    """fn() 20 times captured in one CUDA graph, replayed: µs per fn (CUDA events)."""
    import torch
    import torch.distributed as dist

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (replays * 20)


def rsag_bench(rank, world, dev, group, rows):
    """reduce_scatter and all_gather, 20 captured in one CUDA graph and
    replayed, µs per op, per-rank output 4 KiB .. 1 MiB: libsymm (out of
    place, from the symmetric tensor) beside NCCL's reduce_scatter_tensor
    and all_gather_into_tensor."""
    import torch
    import torch.distributed as dist

    import symm

    for dtype in (torch.bfloat16, torch.float32):
        for nbytes in PUSH_BENCH_SIZES:
            n = nbytes // torch.empty((), dtype=dtype).element_size()
            x = symm.empty(world * n, dtype=dtype, device=dev).normal_()
            symm.rendezvous(x, group)
            full = torch.randn(world * n, device=dev).to(dtype)
            part = torch.empty(n, dtype=dtype, device=dev)
            gathered = torch.empty(world * n, dtype=dtype, device=dev)
            cells = [_graph_time(dev, lambda: symm.reduce_scatter(x, group=group, out=part)),
                     _graph_time(dev, lambda: dist.reduce_scatter_tensor(part, full, group=group)),
                     _graph_time(dev, lambda: symm.all_gather(x, group=group, out=gathered)),
                     _graph_time(dev, lambda: dist.all_gather_into_tensor(gathered, part, group=group))]
            rows.append((f"{str(dtype)[6:]} {nbytes // KiB} KiB", cells))
            del x


def push_bench(rank, world, dev, group, rows):
    """20 all-reduces captured in one CUDA graph, replayed; µs per op."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as tsm

    import symm

    gname = group.group_name
    try:
        tsm.set_backend("CUDA")
    except Exception:  # noqa: BLE001 - older torch: CUDA is the only one
        pass

    def graph_time(fn, replays=50):
        return _graph_time(dev, fn, replays)

    nan = float("nan")
    for dtype in (torch.bfloat16, torch.float32):
        for nbytes in PUSH_BENCH_SIZES:
            n = nbytes // torch.empty((), dtype=dtype).element_size()
            cells = []
            a = torch.randn(n, device=dev).to(dtype)
            o = torch.empty_like(a)
            cells.append(graph_time(lambda: symm.push_all_reduce(a, group=group, out=o)))
            s = symm.empty(n, dtype=dtype, device=dev).normal_()
            symm.rendezvous(s, group)
            cells.append(graph_time(lambda: symm.one_shot_all_reduce(s, group=group, out=o)))
            try:
                t = tsm.empty(n, dtype=dtype, device=dev).normal_()
                tsm.rendezvous(t, gname)
                cells.append(graph_time(lambda: torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", gname, o)))
                cells.append(graph_time(lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", gname)))
            except Exception as e:  # noqa: BLE001 - PyTorch's symmetric memory may be missing
                log(rank, f"torch symm_mem one_shot/two_shot at {nbytes} B: {type(e).__name__}: {str(e)[:200]}")
                cells += [nan] * (4 - len(cells))
            c = torch.randn(n, device=dev).to(dtype)
            cells.append(graph_time(lambda: dist.all_reduce(c, group=group)))
            # libsymm's two-shot, in place on its symmetric tensor (as torch's two_shot_all_reduce_).
            cells.append(graph_time(lambda: symm.two_shot_all_reduce(s, group=group)))
            rows.append((f"{str(dtype)[6:]} {nbytes // KiB} KiB", cells))


def run_rank(rank, world, port, bench1, push_only=False):
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
    results, rows, push_rows, rsag_rows = [], [], [], []

    def check(name, ok, detail=""):
        results.append((name, bool(ok), detail))

    check("kernels ready", symm.kernels_ready(dev.index), symm.kernels_status(dev.index))

    if os.environ.get("SYMM_KERNELS_ONLY") == "misaligned":
        misaligned_rounds(rank, world, dev, group, check)
    elif push_only:
        push_rounds(rank, world, dev, group, check)
        all_reduce_rounds(rank, world, dev, group, check)
    elif not bench1:
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
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture
            g_in.fill_(1.0)
            symm.one_shot_all_reduce(g_in, group=group, out=g_out)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                hg.barrier(channel=5)
                symm.one_shot_all_reduce(g_in, group=group, out=g_out)
            ok, detail = True, ""
            for k in range(3):
                g_in.fill_(float(rank + 10 * k))
                torch.cuda.synchronize()
                graph.replay()
                torch.cuda.synchronize()
                want = float(sum(r + 10 * k for r in range(world)))
                good = bool((g_out == want).all())
                ok &= good
                if not good:
                    detail = f"replay {k}: {g_out[:4].tolist()} want {want}"
        except Exception as e:  # noqa: BLE001 - a capture that fails is the finding
            ok, detail = False, f"{type(e).__name__}: {e}"
        check("barrier + one_shot_all_reduce captured in a CUDA graph, replayed 3 times", ok, detail)
        dist.barrier()

        push_rounds(rank, world, dev, group, check)
        all_reduce_rounds(rank, world, dev, group, check)

    # ---- timing ------------------------------------------------------------
    if own_gpu and not bench1 and world > 1:
        push_bench(rank, world, dev, group, push_rows)
        rsag_bench(rank, world, dev, group, rsag_rows)
    if own_gpu and not push_only:
        import torch.distributed._symmetric_memory as tsm

        gname = group.group_name
        torch_ok = True
        try:
            tsm.set_backend("CUDA")
        except Exception:  # noqa: BLE001 - older torch: CUDA is the only one
            pass

        def gpu_time(fn, reps):
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            dist.barrier()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            torch.cuda.synchronize()
            host = (time.perf_counter() - t0) / reps
            return a.elapsed_time(b) * 1e3 / reps, host * 1e6

        xs = symm.empty(4 * MiB, dtype=torch.uint8, device=dev)
        hs = symm.rendezvous(xs, group)
        try:
            xt = tsm.empty(4 * MiB, dtype=torch.uint8, device=dev)
            ht = tsm.rendezvous(xt, gname)
        except Exception as e:  # noqa: BLE001
            torch_ok = False
            log(rank, f"PyTorch symmetric memory unavailable: {e}")
        nan = float("nan")
        if bench1:
            ours = gpu_time(lambda: (hs.put_signal(rank, channel=1), hs.wait_signal(rank, channel=1)), 500)
            theirs = gpu_time(lambda: (ht.put_signal(rank, channel=1), ht.wait_signal(rank, channel=1)), 500) if torch_ok else (nan, nan)
            rows.append(("put_signal + wait_signal to oneself (µs per pair)", ours, theirs, (nan, nan)))
        else:
            ours = gpu_time(lambda: hs.barrier(channel=0), 500)
            theirs = gpu_time(lambda: ht.barrier(channel=0), 500) if torch_ok else (nan, nan)
            rows.append((f"barrier, {world} GPUs (µs)", ours, theirs, (nan, nan)))
        for dtype in (torch.bfloat16, torch.float32):
            for nbytes in SIZES:
                n = nbytes // (4 if dtype == torch.float32 else 2)
                a = symm.empty(n, dtype=dtype, device=dev).normal_()
                out = torch.empty_like(a)
                ours = gpu_time(lambda: symm.one_shot_all_reduce(a, group=group, out=out), 200)
                theirs = (nan, nan)
                if torch_ok:
                    b = tsm.empty(n, dtype=dtype, device=dev).normal_()
                    tsm.rendezvous(b, gname)
                    theirs = gpu_time(lambda: torch.ops.symm_mem.one_shot_all_reduce_out(b, "sum", gname, out), 200)
                c = torch.randn(n, device=dev).to(dtype)
                nccl = gpu_time(lambda: dist.all_reduce(c, group=group), 200)
                rows.append((f"all-reduce {str(dtype)[6:]} {nbytes // KiB} KiB, {world} GPU(s) (µs)", ours, theirs, nccl))

    gathered = [None] * world
    dist.all_gather_object(gathered, (results, rows))
    if rank == 0:
        report(world, backend, gathered, bench1, push_rows, push_only, rsag_rows)
    dist.destroy_process_group()
    return all(ok for res, _ in gathered for _, ok, _ in res)


def report(world, backend, gathered, bench1, push_rows=(), push_only=False, rsag_rows=()):
    import torch

    lines = [f"# libsymm kernels: {world} rank(s), {torch.cuda.device_count()} GPU(s) "
             f"({torch.cuda.get_device_name(0)}), process group {backend}, torch {torch.__version__}",
             f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    for r, (results, _) in enumerate(gathered):
        for name, ok, detail in results:
            if r == 0 or not ok:
                lines.append(f"{'PASS' if ok else 'FAIL'}  rank {r}: {name}" + (f" ({detail})" if detail else ""))
    rows = gathered[0][1]
    if rows:
        lines += ["", "GPU time per op from CUDA events over back-to-back ops (host µs per call in brackets); "
                  "ratio = libsymm / other, below 1 is faster", "",
                  "| op | libsymm | PyTorch symm_mem | ratio | NCCL | ratio |", "| --- | --- | --- | --- | --- | --- |"]
        for name, a, b, c in rows:
            def cell(x):
                return f"{x[0]:.2f} [{x[1]:.2f}]" if x[0] == x[0] else "–"
            ra = f"{a[0] / b[0]:.2f}" if b[0] == b[0] else "–"
            rc = f"{a[0] / c[0]:.2f}" if c[0] == c[0] else "–"
            lines.append(f"| {name} | {cell(a)} | {cell(b)} | {ra} | {cell(c)} | {rc} |")
    if push_rows:
        lines += ["", f"20 all-reduces captured in one CUDA graph, replayed; µs per op (CUDA events), {world} GPUs; "
                  "best other = the fastest of torch one_shot, torch two_shot and NCCL", "",
                  "| message | libsymm push | libsymm two-shot | libsymm one-shot | torch one_shot | torch two_shot | NCCL "
                  "| push / best other | two-shot / best other |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, cells in push_rows:
            push, one, t1, t2, nccl, two = (list(cells) + [float("nan")] * 6)[:6]
            others = [c for c in (t1, t2, nccl) if c == c]
            best = min(others) if others else float("nan")

            def ratio(x):
                return f"{x / best:.2f}" if x == x and best == best else "–"

            lines.append(f"| {name} | " + " | ".join(f"{c:.2f}" if c == c else "–" for c in (push, two, one, t1, t2, nccl))
                         + f" | {ratio(push)} | {ratio(two)} |")
    if rsag_rows:
        lines += ["", f"20 reduce-scatters or all-gathers captured in one CUDA graph, replayed; µs per op (CUDA events), "
                  f"{world} GPUs; message = each rank's share (reduce-scatter output, all-gather input)", "",
                  "| message | libsymm reduce_scatter | NCCL reduce_scatter_tensor | ratio "
                  "| libsymm all_gather | NCCL all_gather_into_tensor | ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, (rs, nrs, ag, nag) in rsag_rows:
            def f(x):
                return f"{x:.2f}" if x == x else "–"

            def q(a, b):
                return f"{a / b:.2f}" if a == a and b == b else "–"

            lines.append(f"| {name} | {f(rs)} | {f(nrs)} | {q(rs, nrs)} | {f(ag)} | {f(nag)} | {q(ag, nag)} |")
    text = "\n".join(lines)
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        suffix = "_bench1" if bench1 else f"_push_{world}" if push_only else f"_{world}"
        with open(os.path.join(out, f"symm_kernels{suffix}.md"), "w") as f:
            f.write(text + "\n")


def worker(rank, world, port, bench1, push_only, q):
    try:
        q.put((rank, run_rank(rank, world, port, bench1, push_only), ""))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        import traceback

        q.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from e


def main():
    import multiprocessing as mp
    import socket

    bench1 = "--bench1" in sys.argv
    push_only = "--push" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    world = 1 if bench1 else int(args[0]) if args else 2
    import torch

    if torch.cuda.device_count() < world:
        os.environ["SYMM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, bench1, push_only, q)) for r in range(world)]
    for p in procs:
        p.start()
    ok = True
    for _ in procs:
        rank, good, tb = q.get(timeout=900)
        if tb:
            print(f"rank {rank} raised:\n{tb}", flush=True)
        ok &= good
    for p in procs:
        p.join(timeout=60)
        ok &= p.exitcode == 0
    print("symm_kernels:", "ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
