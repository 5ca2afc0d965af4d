"""libsymm's fused matmul operators (symm.fused_all_gather_matmul,
symm.fused_matmul_reduce_scatter, torch.ops.symm.*) and the operators
torch.ops.symm.reduce_scatter / all_gather, on GPUs, beside NCCL and
PyTorch's own torch.ops.symm_mem.* fused operators.

    python3 tests/device/symm_fused.py [WORLD]       # default 2; one GPU per rank

One process per rank (spawned), one GPU each, an NCCL process group; NVLS
and multicast are off. Checks, on every rank:

- fused_all_gather_matmul against NCCL's all_gather_into_tensor + a float32
  matmul, for bfloat16 and float32, gather_dim 0 and 1 of matrices and 0, 1,
  2 of batches (the last dim: K sharded), return_A True and False, one to
  three Bs, odd shapes, non-contiguous A_shard and B: the gathered A
  bit for bit, A @ B within rounding; and against PyTorch's
  torch.ops.symm_mem.fused_all_gather_matmul: the same values within
  rounding, the same shapes and strides (where PyTorch's own result differs
  from the reference, as older PyTorch does along the last dim, that is
  reported as INFO, not compared);
- fused_matmul_reduce_scatter likewise against a float32 matmul +
  reduce_scatter_tensor and PyTorch's, "sum" and "avg", scatter_dim 0, 1, 2;
- a burst of fused calls of changing shapes (the workspace grows) with no
  host synchronization, one of them on another stream, each result checked;
- torch.ops.symm.reduce_scatter / all_gather on any CUDA tensor (odd sizes,
  non-contiguous, 2-D) against rank-order float32 sums and NCCL's gather,
  and torch.ops.symm.* (the four operators) under torch.compile(fullgraph=True)
  equal to eager, bit for bit (integer-valued float32 inputs);
- bad arguments raise TypeError / ValueError naming them, on every rank,
  before any communication (a good call works afterwards).

Then a benchmark, bfloat16, on tensor-parallel MLP shapes (PyTorch's
async-TP benchmark benchmarks/distributed/intra_node_comm/allgather_matmul.py:
M=16384, K=2752, N=8192; Llama-3 8B and 70B MLP projections, 8192 tokens,
split over WORLD ranks): all-gather-matmul (A_shard M/WORLD × K, B K × N) and
matmul-reduce-scatter (A M × K, B K × N, scattered along M), CUDA events,
5 warm-up calls, median of 20 (the slowest rank's): libsymm fused, PyTorch
fused (torch.ops.symm_mem.*), NCCL + unfused matmul, and the matmul alone.
PASS/FAIL/INFO lines, then the table (markdown); everything also in
$OUT/symm_fused.md when OUT is set. Exit status 0 when every check passes.
"""

import os
import socket
import statistics
import sys
import traceback
import warnings

# Multicast is never used: NVLS off for NCCL and NVSHMEM, off for PyTorch's
# symmetric memory.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

TOL = {"bfloat16": 2e-2, "float32": 1e-4}  # max |error| / max |reference|
WARMUP, ITERS = 5, 20


class Ctx:
    """One rank's state: the group, the results, rank 0's log."""

    def __init__(self, rank, world, dev, group):
        self.rank, self.world, self.dev, self.group = rank, world, dev, group
        self.gname = group.group_name
        self.results = []  # (name, True/False/None for INFO, detail)
        self.lines = []  # rank 0: the log and the table, for $OUT
        self.seed = 0

    def check(self, name, ok, detail=""):
        self.results.append((name, bool(ok), detail))

    def info(self, text):
        self.results.append((text, None, ""))

    def agree(self, ok):
        """Whether every rank has ok (collective): ranks take the same branch
        around the collectives that follow."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([1 if ok else 0], device=self.dev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return bool(t.item())

    def log(self, text):
        if self.rank == 0:
            print(text, flush=True)
            self.lines.append(text)

    def randn(self, shape, dtype, scale=1.0):
        """Different on every rank and every call."""
        import torch

        self.seed += 1
        g = torch.Generator(device=self.dev)
        g.manual_seed(1_000_003 * self.rank + self.seed)
        return (torch.randn(shape, generator=g, device=self.dev, dtype=torch.float32) * scale).to(dtype)

    def randint(self, shape, lo=-3, hi=4):
        import torch

        self.seed += 1
        g = torch.Generator(device=self.dev)
        g.manual_seed(1_000_003 * self.rank + self.seed)
        return torch.randint(lo, hi, shape, generator=g, device=self.dev).float()


def dname(dtype):
    return str(dtype).replace("torch.", "")


def rel_err(got, want):
    got, want = got.float(), want.float()
    if want.numel() == 0:
        return 0.0
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()


def ref_all_gather(ctx, x, dim):
    """NCCL's all_gather_into_tensor along dim."""
    import torch
    import torch.distributed as dist

    moved = x.movedim(dim, 0).contiguous()
    out = torch.empty((ctx.world * moved.shape[0], *moved.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, moved, group=ctx.group)
    return out.movedim(0, dim)


def ref_reduce_scatter(ctx, c, dim, op):
    """NCCL's reduce_scatter_tensor along dim (c: float32)."""
    import torch
    import torch.distributed as dist

    moved = c.movedim(dim, 0).contiguous()
    out = torch.empty((moved.shape[0] // ctx.world, *moved.shape[1:]), dtype=c.dtype, device=c.device)
    dist.reduce_scatter_tensor(out, moved, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.AVG,
                               group=ctx.group)
    return out.movedim(0, dim)


# ---- all-gather-matmul ----------------------------------------------------------------


def ag_cases(world):
    """(name, A_shard shape, gather_dim, N of each B, how A_shard and B are laid out)."""
    return [
        ("matrix, gather 0, 3 Bs", (64, 128), 0, [32, 48, 16], "contiguous"),
        ("odd matrix, gather 0", (37, 29), 0, [13], "contiguous"),
        ("odd matrix, gather 1 (K sharded)", (37, 29), 1, [13, 5], "contiguous"),
        ("batch, gather 0", (2, 24, 40), 0, [24], "contiguous"),
        ("batch, gather 1, 2 Bs", (8, 6, 40), 1, [24, 8], "contiguous"),
        ("batch, gather 2 (K sharded)", (8, 24, 10), 2, [16], "contiguous"),
        ("A_shard transposed, B = W.t()", (48, 72), 0, [40], "transposed"),
        ("one row per rank", (1, 64), 0, [8], "contiguous"),
    ]


def ag_inputs(ctx, shape, g, ns, layout, dtype):
    import torch

    k = shape[-1] * ctx.world if g == len(shape) - 1 else shape[-1]
    if layout == "transposed":
        a = ctx.randn(tuple(reversed(shape)), dtype).t()  # a non-contiguous view
        bs = [ctx.randn((n, k), dtype, k ** -0.5).t() for n in ns]
    else:
        a = ctx.randn(shape, dtype)
        bs = [ctx.randn((k, n), dtype, k ** -0.5) for n in ns]
    assert a.shape == torch.Size(shape)
    return a, bs


def ag_rounds(ctx):
    import torch
    import torch.distributed._symmetric_memory as symm_mem_mod

    import symm

    for dtype in (torch.bfloat16, torch.float32):
        for name, shape, g, ns, layout in ag_cases(ctx.world):
            for return_A in (True, False):
                case = f"fused_all_gather_matmul {dname(dtype)} {name} {list(shape)} return_A={return_A}"
                a, bs = ag_inputs(ctx, shape, g, ns, layout, dtype)
                A_ref = ref_all_gather(ctx, a, g)
                want = [A_ref.float() @ b.float() for b in bs]
                try:
                    A, outs = symm.fused_all_gather_matmul(a, bs, g, ctx.gname, return_A=return_A)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a failure, reported
                    ctx.check(case, False, f"{type(e).__name__}: {str(e)[:300]}")
                    ctx.agree(False)
                    continue
                bad = []
                if return_A:
                    if A is None or A.shape != A_ref.shape or not torch.equal(A, A_ref):
                        bad.append(f"A differs from NCCL's gather (shape {None if A is None else list(A.shape)})")
                elif A is not None:
                    bad.append("return_A=False returned an A")
                if len(outs) != len(bs):
                    bad.append(f"{len(outs)} outputs for {len(bs)} Bs")
                for i, (o, w) in enumerate(zip(outs, want)):
                    if o.shape != w.shape or o.dtype != dtype:
                        bad.append(f"out {i}: {list(o.shape)} {o.dtype}, want {list(w.shape)} {dtype}")
                    elif rel_err(o, w) > TOL[dname(dtype)]:
                        bad.append(f"out {i}: max error {rel_err(o, w):.2e} of the largest value")
                ctx.check(case + " vs NCCL + matmul", not bad, "; ".join(bad))
                if not ctx.agree(not bad):
                    continue
                # PyTorch's own operator.
                try:
                    pA, pouts = torch.ops.symm_mem.fused_all_gather_matmul(a, bs, g, ctx.gname, return_A=return_A)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - PyTorch's limits, not ours
                    ctx.info(f"{case}: PyTorch's fused_all_gather_matmul raised {type(e).__name__}: {str(e)[:160]}")
                    continue
                p_ok = all(p.shape == w.shape and rel_err(p, w) <= TOL[dname(dtype)] for p, w in zip(pouts, want))
                if not p_ok:
                    has_last = hasattr(symm_mem_mod, "_fused_all_gather_matmul_last_gather_dim_impl")
                    ctx.info(f"{case}: PyTorch's result differs from the reference (shapes "
                             f"{[list(p.shape) for p in pouts]}; this torch has the last-dim path: {has_last}); "
                             "not compared")
                    continue
                diff = []
                if return_A and (pA is None or pA.stride() != A.stride()):
                    diff.append(f"A strides {A.stride()} vs PyTorch's {None if pA is None else pA.stride()}")
                for i, (o, p) in enumerate(zip(outs, pouts)):
                    if o.stride() != p.stride():
                        diff.append(f"out {i} strides {o.stride()} vs PyTorch's {p.stride()}")
                    if rel_err(o, p) > 2 * TOL[dname(dtype)]:
                        diff.append(f"out {i}: {rel_err(o, p):.2e} from PyTorch's")
                ctx.check(case + " vs torch.ops.symm_mem (values, shapes, strides)", not diff, "; ".join(diff))


# ---- matmul-reduce-scatter ----------------------------------------------------------------


def rs_cases(world):
    """(name, A shape, N, scatter_dim)."""
    w = world
    return [
        ("matrix, scatter 0", (16 * w, 64), 48, 0),
        ("odd matrix, scatter 0", (7 * w, 33), 19, 0),
        ("odd matrix, scatter 1 (columns)", (37, 33), 5 * w, 1),
        ("batch, scatter 0", (2 * w, 6, 40), 24, 0),
        ("batch, scatter 1", (2, 3 * w, 40), 24, 1),
        ("batch, scatter 2 (columns)", (5, 6, 40), 3 * w, 2),
        ("one row per rank", (w, 64), 8, 0),
    ]


def rs_rounds(ctx):
    import torch

    import symm

    for dtype in (torch.bfloat16, torch.float32):
        for name, ashape, n, s in rs_cases(ctx.world):
            for op in ("sum", "avg"):
                case = f"fused_matmul_reduce_scatter {dname(dtype)} {name} A {list(ashape)} N {n} {op}"
                k = ashape[-1]
                a = ctx.randn(ashape, dtype)
                b = ctx.randn((k, n), dtype, k ** -0.5)
                if name.startswith("odd matrix, scatter 0"):
                    b = ctx.randn((n, k), dtype, k ** -0.5).t()  # B non-contiguous too
                want = ref_reduce_scatter(ctx, a.float() @ b.float(), s, op)
                try:
                    out = symm.fused_matmul_reduce_scatter(a, b, op, s, ctx.gname)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    ctx.check(case, False, f"{type(e).__name__}: {str(e)[:300]}")
                    ctx.agree(False)
                    continue
                bad = []
                if out.shape != want.shape or out.dtype != dtype:
                    bad.append(f"{list(out.shape)} {out.dtype}, want {list(want.shape)} {dtype}")
                elif rel_err(out, want) > TOL[dname(dtype)]:
                    bad.append(f"max error {rel_err(out, want):.2e} of the largest value")
                if not out.is_contiguous():
                    bad.append(f"not contiguous: strides {out.stride()}")
                ctx.check(case + " vs matmul + NCCL reduce_scatter_tensor", not bad, "; ".join(bad))
                if not ctx.agree(not bad):
                    continue
                try:
                    p = torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, op, s, ctx.gname)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    ctx.info(f"{case}: PyTorch's fused_matmul_reduce_scatter raised {type(e).__name__}: "
                             f"{str(e)[:160]}")
                    continue
                if p.shape != want.shape or rel_err(p, want) > TOL[dname(dtype)]:
                    ctx.info(f"{case}: PyTorch's result differs from the reference (shape {list(p.shape)}); "
                             "not compared")
                    continue
                diff = []
                if p.stride() != out.stride():
                    diff.append(f"strides {out.stride()} vs PyTorch's {p.stride()}")
                if rel_err(out, p) > 2 * TOL[dname(dtype)]:
                    diff.append(f"{rel_err(out, p):.2e} from PyTorch's")
                ctx.check(case + " vs torch.ops.symm_mem (values, shape, strides)", not diff, "; ".join(diff))


# ---- bursts: the workspace shared and grown across calls ----------------------------------


def burst_rounds(ctx):
    """Fused calls back to back with no host synchronization, shapes
    changing (the workspace grows), all-gathers and reduce-scatters
    alternating, one call on another stream: each result against its
    reference, computed before the burst."""
    import torch

    import symm

    w = ctx.world
    dtype = torch.bfloat16
    plan = []
    for i in range(24):
        rows = [8, 512, 64, 2048, 16][i % 5]
        if i % 2 == 0:
            a = ctx.randn((rows, 256), dtype)
            b = ctx.randn((256, 96), dtype, 256 ** -0.5)
            plan.append(("ag", a, b, ref_all_gather(ctx, a, 0).float() @ b.float()))
        else:
            a = ctx.randn((rows * w, 192), dtype)
            b = ctx.randn((192, 80), dtype, 192 ** -0.5)
            plan.append(("rs", a, b, ref_reduce_scatter(ctx, a.float() @ b.float(), 0, "sum")))
    torch.cuda.synchronize()
    other = torch.cuda.Stream(device=ctx.dev)
    cur = torch.cuda.current_stream(ctx.dev)
    got = []
    for i, (kind, a, b, _) in enumerate(plan):
        # Call 7 on another stream that waits for nothing (its inputs are
        # ready): only the operators' own ordering keeps it after call 6
        # and call 8 after it.
        stream = other if i == 7 else cur
        with torch.cuda.stream(stream):
            if kind == "ag":
                got.append(symm.fused_all_gather_matmul(a, [b], 0, ctx.gname, return_A=False)[1][0])
            else:
                got.append(symm.fused_matmul_reduce_scatter(a, b, "sum", 0, ctx.gname))
    cur.wait_stream(other)
    torch.cuda.synchronize()
    bad = [f"call {i} ({kind}): error {rel_err(g, want):.2e}" for i, ((kind, _, _, want), g) in
           enumerate(zip(plan, got)) if g.shape != want.shape or rel_err(g, want) > TOL["bfloat16"]]
    ctx.check("24 fused calls back to back, shapes changing, one on another stream: every result right",
              not bad, "; ".join(bad[:4]))


# ---- torch.ops.symm.reduce_scatter / all_gather -----------------------------------------------


def collective_op_rounds(ctx):
    import torch
    import torch.distributed as dist

    w, r = ctx.world, ctx.rank
    shapes = [((w,), ""), ((3 * w,), ""), ((1024 * w,), ""), ((4097 * w,), ""), ((5 * w, 7), " transposed"),
              ((6 * w,), " one element into a tensor")]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape, how in shapes:
            if how == " transposed":
                x = ctx.randn((shape[1], shape[0]), dtype).t()  # non-contiguous
            elif how:
                x = ctx.randn((shape[0] + 1,), dtype)[1:]  # 2-byte aligned for 16-bit types
            else:
                x = ctx.randn(shape, dtype)
            alls = torch.empty((w, *shape), dtype=dtype, device=ctx.dev)
            dist.all_gather_into_tensor(alls, x.contiguous(), group=ctx.group)
            # all_gather: NCCL's gather, bit for bit.
            try:
                got = torch.ops.symm.all_gather(x, ctx.gname)
                ok = got.shape == (w * shape[0], *shape[1:]) and torch.equal(got, alls.flatten(0, 1))
                ctx.check(f"torch.ops.symm.all_gather {dname(dtype)} {list(shape)}{how} equals NCCL's", ok,
                          f"shape {list(got.shape)}")
            except Exception as e:  # noqa: BLE001
                ctx.check(f"torch.ops.symm.all_gather {dname(dtype)} {list(shape)}{how}", False,
                          f"{type(e).__name__}: {str(e)[:300]}")
            # reduce_scatter: the rank-order float32 sum of share r, rounded once.
            n0 = shape[0] // w
            acc = alls[0, r * n0:(r + 1) * n0].float()
            for q in range(1, w):
                acc = acc + alls[q, r * n0:(r + 1) * n0].float()
            want = acc.to(dtype)
            try:
                got = torch.ops.symm.reduce_scatter(x, ctx.gname)
                ok = got.shape == want.shape and torch.equal(got, want)
                err = rel_err(got, want) if got.shape == want.shape else "-"
                ctx.check(f"torch.ops.symm.reduce_scatter {dname(dtype)} {list(shape)}{how} equals rank-order "
                          "float32 sums", ok, f"shape {list(got.shape)}, max error {err}")
            except Exception as e:  # noqa: BLE001
                ctx.check(f"torch.ops.symm.reduce_scatter {dname(dtype)} {list(shape)}{how}", False,
                          f"{type(e).__name__}: {str(e)[:300]}")


def compile_rounds(ctx):
    """The four torch.ops.symm operators in torch.compile(fullgraph=True)
    graphs, compiled equal to eager bit for bit: integer-valued float32
    inputs make every op around them exact in any order."""
    import torch

    w, gname = ctx.world, ctx.gname

    def f_rs(x):
        return torch.ops.symm.reduce_scatter(x + 1, gname) * 2

    def f_ag(x):
        return torch.ops.symm.all_gather(x * 2, gname) - 1

    def f_fag(a, b):
        A, outs = torch.ops.symm.fused_all_gather_matmul(a, [b, b * 2], 0, gname, return_A=True)
        return A + 1, outs[0] * 2, outs[1]

    def f_fag_k(a, b):
        _, outs = torch.ops.symm.fused_all_gather_matmul(a, [b], 1, gname, return_A=False)
        return outs[0] - 1

    def f_frs(a, b):
        return torch.ops.symm.fused_matmul_reduce_scatter(a * 2, b, "sum", 0, gname) + 1

    def f_frs_avg(a, b):
        return torch.ops.symm.fused_matmul_reduce_scatter(a, b, "avg", 1, gname) * 4

    fns = [
        ("reduce_scatter", f_rs, lambda: (ctx.randint((8 * w, 5)),)),
        ("all_gather", f_ag, lambda: (ctx.randint((6, 5)),)),
        ("fused_all_gather_matmul gather 0, 2 Bs, return_A", f_fag,
         lambda: (ctx.randint((16, 32)), ctx.randint((32, 24)))),
        ("fused_all_gather_matmul gather 1 (K sharded), return_A=False", f_fag_k,
         lambda: (ctx.randint((16, 8)), ctx.randint((8 * w, 24)))),
        ("fused_matmul_reduce_scatter sum scatter 0", f_frs, lambda: (ctx.randint((8 * w, 32)), ctx.randint((32, 16)))),
        ("fused_matmul_reduce_scatter avg scatter 1", f_frs_avg,
         lambda: (ctx.randint((12, 32)), ctx.randint((32, 4 * w)))),
    ]
    for name, f, make in fns:
        try:
            torch._dynamo.reset()
            cf = torch.compile(f, fullgraph=True)
            bad = []
            for i in range(3):
                args = make()
                want = f(*args)
                got = cf(*args)
                torch.cuda.synchronize()
                want = want if isinstance(want, tuple) else (want,)
                got = got if isinstance(got, tuple) else (got,)
                for j, (x, y) in enumerate(zip(want, got)):
                    if x.shape != y.shape or not torch.equal(x, y):
                        bad.append(f"call {i} output {j}: shapes {list(x.shape)} {list(y.shape)}")
            ctx.check(f"torch.compile(fullgraph=True) with torch.ops.symm.{name}: equal to eager, 3 calls",
                      not bad, "; ".join(bad[:3]))
        except Exception as e:  # noqa: BLE001
            ctx.check(f"torch.compile(fullgraph=True) with torch.ops.symm.{name}", False,
                      f"{type(e).__name__}: {str(e)[:400]}")
    torch._dynamo.reset()


# ---- bad arguments ------------------------------------------------------------------------


def bad_argument_rounds(ctx):
    import torch

    import symm

    g, w = ctx.gname, ctx.world
    a = ctx.randn((8, 16), torch.bfloat16)
    b = ctx.randn((16, 4 * w), torch.bfloat16)
    cases = [
        ("A_shard 1-D", (ValueError,), ["A_shard must have at least 2 dims"],
         lambda: symm.fused_all_gather_matmul(a[0], [b], 0, g)),
        ("gather_dim 2 of a matrix", (ValueError,), ["gather_dim=2"],
         lambda: symm.fused_all_gather_matmul(a, [b], 2, g)),
        ("gather_dim -1", (ValueError,), ["negative dims are refused"],
         lambda: symm.fused_all_gather_matmul(a, [b], -1, g)),
        ("Bs a tensor", (TypeError,), ["Bs must be a list of tensors"],
         lambda: symm.fused_all_gather_matmul(a, b, 0, g)),
        ("B rows", (ValueError,), ["Bs[1] has 15 rows"],
         lambda: symm.fused_all_gather_matmul(a, [b, b[:15]], 0, g)),
        ("B dtype", (ValueError,), ["Bs[0] is torch.float32 and A_shard torch.bfloat16"],
         lambda: symm.fused_all_gather_matmul(a, [b.float()], 0, g)),
        ("A_shard on the CPU", (ValueError,), ["A_shard is on cpu"],
         lambda: symm.fused_all_gather_matmul(a.cpu(), [b], 0, g)),
        ("int8 A_shard", (ValueError,), ["A_shard is torch.int8"],
         lambda: symm.fused_all_gather_matmul(a.to(torch.int8), [b.to(torch.int8)], 0, g)),
        ("return_A not a bool", (TypeError,), ["return_A must be a bool"],
         lambda: symm.fused_all_gather_matmul(a, [b], 0, g, return_A=None)),
        ("group_name not a name", (TypeError,), ["group_name must be"],
         lambda: symm.fused_all_gather_matmul(a, [b], 0, 0)),
        ("reduce_op max", (ValueError,), ["reduce_op 'max'"],
         lambda: symm.fused_matmul_reduce_scatter(a, b, "max", 0, g)),
        ("B not a matrix", (ValueError,), ["B must be a matrix"],
         lambda: symm.fused_matmul_reduce_scatter(a, b[0], "sum", 0, g)),
        ("scatter_dim 2", (ValueError,), ["scatter_dim=2"],
         lambda: symm.fused_matmul_reduce_scatter(a, b, "sum", 2, g)),
        ("torch.ops.symm.fused_all_gather_matmul gather_dim 3", (ValueError, RuntimeError), ["gather_dim=3"],
         lambda: torch.ops.symm.fused_all_gather_matmul(a, [b], 3, g)),
        ("torch.ops.symm.fused_matmul_reduce_scatter reduce_op", (ValueError, RuntimeError), ["reduce_op 'max'"],
         lambda: torch.ops.symm.fused_matmul_reduce_scatter(a, b, "max", 0, g)),
        ("torch.ops.symm.reduce_scatter int32", (ValueError, RuntimeError), ["dtype torch.int32"],
         lambda: torch.ops.symm.reduce_scatter(torch.ones(w, device=ctx.dev, dtype=torch.int32), g)),
        ("torch.ops.symm.all_gather int32", (ValueError, RuntimeError), ["dtype torch.int32"],
         lambda: torch.ops.symm.all_gather(torch.ones(4, device=ctx.dev, dtype=torch.int32), g)),
    ]
    if w > 1:  # shapes that do not split over the ranks
        cases += [
            ("scatter dim does not split", (ValueError,), ["do not split evenly"],
             lambda: symm.fused_matmul_reduce_scatter(ctx.randn((2 * w - 1, 16), torch.bfloat16), b, "sum", 0, g)),
            ("torch.ops.symm.reduce_scatter dim 0 does not split", (ValueError, RuntimeError),
             ["do not split evenly"], lambda: torch.ops.symm.reduce_scatter(torch.ones(w + 1, 3, device=ctx.dev), g)),
        ]
    for name, types, words, call in cases:
        try:
            call()
        except types as e:
            msg = str(e)
            ctx.check(f"bad argument refused by name: {name}", all(x in msg for x in words),
                      f"{type(e).__name__}: {msg[:200]}")
            continue
        except Exception as e:  # noqa: BLE001
            ctx.check(f"bad argument refused by name: {name}", False, f"{type(e).__name__} (want "
                      f"{'/'.join(t.__name__ for t in types)}): {str(e)[:200]}")
            continue
        ctx.check(f"bad argument refused by name: {name}", False, "no exception")
    # Nothing was left half done: a good call of each works.
    A, outs = symm.fused_all_gather_matmul(a, [b], 0, g)
    z = symm.fused_matmul_reduce_scatter(A, b, "sum", 0, g)
    torch.cuda.synchronize()
    ctx.check("after the refusals, a fused all-gather-matmul and matmul-reduce-scatter run",
              outs[0].shape == (8 * w, 4 * w) and z.shape == (8, 4 * w))


# ---- benchmark ----------------------------------------------------------------------------


def timed(ctx, fn):
    """Median of ITERS calls after WARMUP (CUDA events), the slowest rank's, in ms."""
    import torch
    import torch.distributed as dist

    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group, device_ids=[ctx.dev.index])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(ITERS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(ITERS)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    t = torch.tensor([ms], device=ctx.dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return t.item()


def bench_shapes(world):
    """(op, M, K, N, where the shape comes from)."""
    def m(x):
        return x - x % world

    return [
        ("all-gather-matmul", m(16384), 2752, 8192, "PyTorch's allgather_matmul benchmark"),
        ("all-gather-matmul", m(8192), 4096, 14336 // world, "Llama-3 8B MLP up, 8192 tokens"),
        ("all-gather-matmul", m(8192), 8192, 28672 // world, "Llama-3 70B MLP up, 8192 tokens"),
        ("matmul-reduce-scatter", m(16384), 2752, 8192, "PyTorch's allgather_matmul shapes"),
        ("matmul-reduce-scatter", m(8192), 14336 // world, 4096, "Llama-3 8B MLP down, 8192 tokens"),
        ("matmul-reduce-scatter", m(8192), 28672 // world, 8192, "Llama-3 70B MLP down, 8192 tokens"),
    ]


def bench_rounds(ctx):
    import torch
    import torch.distributed as dist

    import symm

    nan = float("nan")
    w, g = ctx.world, ctx.gname
    dtype = torch.bfloat16
    rows = []
    for op, M, K, N, where in bench_shapes(w):
        if op == "all-gather-matmul":
            a = ctx.randn((M // w, K), dtype)
            b = ctx.randn((K, N), dtype, K ** -0.5)
            full = torch.empty((M, K), dtype=dtype, device=ctx.dev)

            def ours():
                return symm.fused_all_gather_matmul(a, [b], 0, g)

            def theirs():
                return torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, g)

            def nccl():
                dist.all_gather_into_tensor(full, a, group=ctx.group)
                return full, [full @ b]

            def mm():
                return full @ b
        else:
            a = ctx.randn((M, K), dtype)
            b = ctx.randn((K, N), dtype, K ** -0.5)
            part = torch.empty((M // w, N), dtype=dtype, device=ctx.dev)

            def ours():
                return symm.fused_matmul_reduce_scatter(a, b, "sum", 0, g)

            def theirs():
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, g)

            def nccl():
                dist.reduce_scatter_tensor(part, a @ b, group=ctx.group)
                return part

            def mm():
                return a @ b
        cells = []
        for label, fn in (("libsymm", ours), ("PyTorch", theirs), ("NCCL + matmul", nccl), ("matmul", mm)):
            try:
                cells.append(timed(ctx, fn))
            except Exception as e:  # noqa: BLE001 - a missing column, not a failed run
                ctx.info(f"benchmark {op} {M}x{K}x{N} {label}: {type(e).__name__}: {str(e)[:200]}")
                cells.append(nan)
        rows.append((op, M, K, N, where, cells))
    return rows


def table(ctx, rows, device_name):
    def f(x):
        return f"{x:.3f}" if x == x else "–"

    def q(x, y):
        return f"{x / y:.2f}" if x == x and y == y else "–"

    lines = ["", f"Fused matmul + collective, bfloat16, {ctx.world} × {device_name}, NCCL NVLS off, no multicast; "
             f"ms per call (CUDA events, median of {ITERS} after {WARMUP} warm-up calls, slowest rank). "
             "all-gather-matmul: A_shard (M/world × K) gathered along M, times B (K × N); "
             "matmul-reduce-scatter: A (M × K) times B (K × N), reduce-scattered along M. "
             "Ratios below 1: libsymm faster.", "",
             "| op | M | K | N | shape from | libsymm fused | PyTorch fused | NCCL + matmul | matmul alone "
             "| libsymm / PyTorch | libsymm / NCCL + matmul |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for op, M, K, N, where, (ours, theirs, nccl, mm) in rows:
        lines.append(f"| {op} | {M} | {K} | {N} | {where} | {f(ours)} | {f(theirs)} | {f(nccl)} | {f(mm)} "
                     f"| {q(ours, theirs)} | {q(ours, nccl)} |")
    return lines


# ---- the ranks ------------------------------------------------------------------------------


def run_rank(rank, world, port):
    import torch
    import torch.distributed as dist

    import symm

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    group = dist.group.WORLD
    ctx = Ctx(rank, world, dev, group)
    import torch.distributed._symmetric_memory as symm_mem

    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(ctx.gname)
    symm.register_torch_ops()
    ctx.log(f"torch {torch.__version__}, {world} × {torch.cuda.get_device_name(dev)}, libsymm {symm.version()}")
    ctx.check("kernels ready", symm.kernels_ready(dev.index), symm.kernels_status(dev.index))

    rounds = [("all-gather-matmul", ag_rounds), ("matmul-reduce-scatter", rs_rounds), ("bursts", burst_rounds),
              ("reduce_scatter / all_gather operators", collective_op_rounds), ("bad arguments", bad_argument_rounds),
              ("torch.compile", compile_rounds)]
    for name, fn in rounds:
        try:
            fn(ctx)
        except Exception as e:  # noqa: BLE001 - one failed round does not hide the others
            ctx.check(f"{name}: the round ran to its end", False, f"{type(e).__name__}: {str(e)[:300]}\n"
                      + traceback.format_exc()[-1500:])
        dist.barrier(group=group, device_ids=[dev.index])
        ctx.log(f"{name}: done")
    rows = []
    if os.environ.get("SYMM_FUSED_BENCH", "1") != "0":
        rows = bench_rounds(ctx)
    text = table(ctx, rows, torch.cuda.get_device_name(dev)) if rows else []
    dist.barrier(group=group, device_ids=[dev.index])
    dist.destroy_process_group()
    return ctx.results, ctx.lines, text


def worker(rank, world, port, q):
    try:
        q.put((rank, *run_rank(rank, world, port), ""))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        q.put((rank, [], [], [], traceback.format_exc()))
        raise SystemExit(1) from e


def merge(per_rank):
    """One line per check: PASS when every rank passed, else FAIL with the
    ranks that failed; INFO lines once."""
    order, seen = [], {}
    for rank in sorted(per_rank):
        for name, ok, detail in per_rank[rank]:
            if name not in seen:
                seen[name] = []
                order.append(name)
            seen[name].append((rank, ok, detail))
    lines, ok_all = [], True
    for name in order:
        entries = seen[name]
        if entries[0][1] is None:
            lines.append(f"INFO  {name}")
            continue
        bad = [(r, d) for r, ok, d in entries if not ok]
        if bad or len(entries) < len(per_rank):
            ok_all = False
            why = "; ".join(f"rank {r}: {d}" for r, d in bad[:4]) or f"only {len(entries)} ranks ran it"
            lines.append(f"FAIL  {name} ({why})")
        else:
            detail = entries[0][2]
            lines.append(f"PASS  {name}" + (f" ({detail})" if detail and name == "kernels ready" else ""))
    return lines, ok_all


def main():
    import multiprocessing as mp

    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    import torch

    if torch.cuda.device_count() < world:
        print(f"symm_fused: {world} ranks need {world} GPUs, {torch.cuda.device_count()} here", flush=True)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    per_rank, log0, table0, ok = {}, [], [], True
    for _ in procs:
        rank, results, lines, text, tb = q.get(timeout=900)
        if tb:
            print(f"rank {rank} raised:\n{tb}", flush=True)
            ok = False
        per_rank[rank] = results
        if rank == 0:
            log0, table0 = lines, text
    for p in procs:
        p.join(timeout=60)
        ok &= p.exitcode == 0
    lines, good = merge(per_rank)
    ok &= good
    status = f"symm_fused: {'ok' if ok else 'FAILED'} ({sum(x.startswith('PASS') for x in lines)} passed, " \
             f"{sum(x.startswith('FAIL') for x in lines)} failed, world {world})"
    for line in lines:
        print(line, flush=True)
    print(status, flush=True)
    for line in table0:
        print(line, flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "symm_fused.md"), "w") as f:
            f.write("\n".join(["# symm_fused", "", "```", *log0, *lines, status, "```", *table0]) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
