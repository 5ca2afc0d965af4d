"""The collectives' GPU check rounds that tests/device/symm_kernels.py runs
in every rank (split from it to keep each file short): two_shot_rounds,
rsag_rounds, push_rounds, all_reduce_rounds. Each takes (rank, world, dev,
group, check) and reports through check(name, ok, detail); every rank calls
the same rounds in the same order (they are collective).

The push all-reduce (symm.push_all_reduce, one kernel per call, no barrier):
float32, bfloat16 and float16, odd sizes from 1 element to the workspace's
limit, pointers 8-byte aligned, one element off (differently on each rank)
and in place, each bit for bit against float32 sums in rank order and
within rounding of a float64 reference; the same bits on every rank; 1,000
replays of a CUDA graph of 3 chained calls with the inputs changed between
replays; a rank that stays away from a call named in the others'
SymmError(TIMEOUT). symm.all_reduce (the algorithm chosen by size, or
forced): None, push and two_shot at 4 KiB .. 4 MiB against float64, the
same bits on every rank, the algorithm chosen at each size reported.
"""

import os
import time

KiB, MiB = 1 << 10, 1 << 20


def graph_replays(dev, calls, fill, want, outs, replays):
    """calls() warmed up on a side stream, captured in one CUDA graph and
    replayed `replays` times, fill(k) changing the inputs before replay k:
    after each replay every tensor of outs must equal want(k). (ok, detail)
    for check; a capture that fails is the finding."""
    import torch

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (rendezvous, kernels)
        fill(0)
        calls()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            calls()
        for k in range(replays):
            fill(k)
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            w = want(k)
            for i, o in enumerate(outs):
                if not bool((o == w).all()):
                    return False, f"replay {k}: output {i} {o[:4].tolist()} want {w}"
        return True, ""
    except Exception as e:  # noqa: BLE001 - a capture that fails is the finding
        return False, f"{type(e).__name__}: {e}"


def two_shot_rounds(rank, world, dev, group, check):
    """symm.two_shot_all_reduce: float32 and bfloat16, 4 KiB..4 MiB (and
    sizes that split unevenly into world shares), in place (the sum in the
    symmetric tensor), out of place and from a local input; bit for bit
    against the float32 sum in rank order (so the same bits on every rank,
    checked by all_gather too) and within rounding of float64; a CUDA graph
    of two calls replayed 1,000 times with new inputs. float16 as well."""
    import torch
    import torch.distributed as dist

    import symm

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
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

    def two_calls():
        symm.two_shot_all_reduce(g_in, group=group)
        symm.two_shot_all_reduce(g_in, group=group, out=g_out)

    ok, detail = graph_replays(dev, two_calls, lambda k: g_in.fill_(float(rank + 10 * k)),
                               lambda k: float(sum(r + 10 * k for r in range(world))) * world, [g_out, g_in], 1000)
    check("two_shot_all_reduce x2 captured in a CUDA graph, replayed 1000 times with new inputs", ok, detail)
    dist.barrier()


def rsag_rounds(rank, world, dev, group, check):
    """symm.reduce_scatter and symm.all_gather on symmetric tensors of world
    shares: reduce_scatter float32 and bfloat16 (bit for bit against the
    float32 sum of share rank in rank order, within rounding of float64, the
    same bits on every rank for the same share), all_gather float32,
    bfloat16 and float16 (exact copies); per-rank shares of 4 bytes .. 1 MiB
    and odd sizes; in place, out of place, from a local input and NCCL's
    in-place layout; a CUDA graph of both replayed 1,000 times with new
    inputs. reduce_scatter takes float16 too."""
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

    def rs_ag():
        symm.reduce_scatter(g_x, group=group)
        symm.all_gather(g_x, group=group, out=g_out)

    ok, detail = graph_replays(dev, rs_ag, lambda k: g_x.fill_(float(rank + 10 * k)),
                               lambda k: float(sum(r + 10 * k for r in range(world))), [g_out], 1000)
    check("reduce_scatter + all_gather captured in a CUDA graph, replayed 1000 times with new inputs", ok, detail)
    dist.barrier()


def push_rounds(rank, world, dev, group, check):
    """The push all-reduce's checks (see the top of this file)."""
    import hashlib

    import torch
    import torch.distributed as dist

    import symm

    ws = symm.push_workspace(group, dev)
    limit = ws.push_max_bytes
    check("push workspace set up", limit == (int(os.environ.get("SYMM_PUSH_MAX_BYTES", 1 << 20)) + 7) // 8 * 8,
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
