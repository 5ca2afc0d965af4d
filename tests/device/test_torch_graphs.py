"""libsymm and PyTorch past eager training, on a real GPU (issue 11): CUDA
graphs, make_graphed_callables, torch.compile, the plain-recipe OOM, MemPool
giving memory back, memory snapshots rendered by PyTorch's own viewer code.

    python3 -m pytest tests/device/test_torch_graphs.py -v -s
    python3 tests/device/test_torch_graphs.py                  # the same
    python3 tests/device/test_torch_graphs.py --child CHECK MODE   # one check; prints RESULT {json}

Modes (as in test_torch_pool.py):
- replace: symm.use_as_default() before any CUDA work; graphs use PyTorch's
  default private pools (g1.pool() when shared), driven through libsymm's hooks.
- mempool: pool = torch.cuda.MemPool(symm.pool_allocator().allocator());
  tensors are made inside use_mem_pool(pool), graphs and
  make_graphed_callables get pool=pool.id.
- native: PyTorch's own allocator; the reference, which also proves that a
  check itself is sound (a check that fails natively is a broken check).
- plain (check 8 only): PyTorch's documented recipe, CUDAPluggableAllocator(
  "libsymm.so", "symm_pool_alloc", "symm_pool_free"), without `import symm`.

Every check runs in a fresh interpreter: this file re-runs itself with
``--child CHECK MODE``; the child prints ``RESULT {json}`` as its last line and
the parent (pytest, which needs neither torch nor CUDA to collect) judges it and
prints one PASS/FAIL/SKIP line per check. The parent runs a native child only
where a verdict needs it, once (cached).

Facts of torch 2.11 these checks rely on (read from its source):
- torch.cuda.graph(g, pool=None, stream=None, capture_error_mode="global")
  synchronizes and calls torch.cuda.empty_cache() before capture_begin.
- make_graphed_callables(callables, sample_args, num_warmup_iters=3,
  allow_unused_input=False, pool=None): warm-up on a side stream, then captures
  forward and backward into one pool (graph_pool_handle() if pool is None).
- torch.cuda.empty_cache() releases a private pool's cached segments only once
  the pool is freeable (use_count 0: its MemPool deleted, its graphs gone).
  While a MemPool lives, PyTorch keeps its free segments cached above libsymm;
  so check 9's "alive" variant is judged against the same flow natively.
- torch.cuda._memory_viz: segment_plot(data) and trace_plot(data,
  plot_segments=False[, filter_freed=False]) pickle the snapshot into HTML;
  memory/segments/compare(..., format_flamegraph=...) call flamegraph.pl,
  which they download (no network here: an offline stand-in is passed);
  segsum(data) asserts that each segment's blocks add up to total_size and
  reads requested_size of active blocks; trace(data) reads action, addr, size
  (device_free for 'oom') and each segment's address and allocated_size.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
MiB = 1 << 20
GiB = 1 << 30
CHILD_TIMEOUT_S = 240
TOLERANCE = 64 * MiB  # device free memory "back to baseline" within this
OOM_BYTES = 1 << 45  # 35184372088832: far beyond any GPU


# =============================================================================
# Child side: one check in one mode, in its own process.
# =============================================================================


class Mode:
    """Sets up one allocator mode; scope() routes allocations made inside it."""

    def __init__(self, name: str, make_pool: bool = True):
        import torch

        self.name = name
        self.pool = None
        if name == "replace":
            import symm

            symm.use_as_default()  # before anything touches CUDA
        torch.cuda.init()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if name == "mempool":
            import symm

            symm.init(torch.cuda.device_count())
            if make_pool:
                self.pool = torch.cuda.MemPool(symm.pool_allocator().allocator())

    def uses_symm(self) -> bool:
        return self.name in ("replace", "mempool")

    def scope(self):
        """Allocations inside go to libsymm (replace: all of them anyway)."""
        import contextlib

        import torch

        if self.pool is None:
            return contextlib.nullcontext()
        return torch.cuda.use_mem_pool(self.pool)

    def graph_pool(self):
        """pool= for torch.cuda.graph / make_graphed_callables: pool.id in mempool mode."""
        return None if self.pool is None else self.pool.id


def symm_info(m: Mode) -> dict:
    """What libsymm saw: proof that the memory really went through it."""
    if not m.uses_symm():
        return {}
    import symm

    return {
        "symm_peak_reserved": symm.max_memory_reserved(0),
        "symm_peak_allocated": symm.max_memory_allocated(0),
        "symm_reserved": symm.memory_reserved(0),
    }


def compare(out, ref, rtol=1e-5, atol=1e-4) -> dict:
    import torch

    diff = float((out.double() - ref.double()).abs().max().item()) if out.numel() else 0.0
    return {
        "bitwise": bool(torch.equal(out, ref)),
        "close": bool(torch.allclose(out, ref, rtol=rtol, atol=atol)),
        "max_diff": diff,
    }


def warm_up(fn, stream, n: int = 3) -> None:
    """PyTorch's recipe: run the body a few times on a side stream before capturing."""
    import torch

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def check_capture_free(m: Mode) -> dict:
    """1. Intermediates freed inside the capture; replays with new inputs equal eager."""
    import torch

    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(512, 1024, generator=gen) for _ in range(6)]
    w_cpu = torch.randn(1024, 1024, generator=gen) / 32
    with m.scope():
        x = xs[0].cuda()
        w = w_cpu.cuda()

    def body():
        t1 = torch.relu(x @ w)
        t2 = t1 + 1
        del t1
        t3 = t2 * 2
        del t2
        return t3.sum(1)

    s = torch.cuda.Stream()
    with m.scope():
        warm_up(body, s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=m.graph_pool(), stream=s):
        out = body()
    rounds = []
    for xc in xs[1:]:
        x.copy_(xc)
        g.replay()
        xe = xc.cuda()
        ref = ((torch.relu(xe @ w) + 1) * 2).sum(1)
        torch.cuda.synchronize()
        rounds.append(compare(out, ref))
    return {"rounds": rounds, **symm_info(m)}


def check_persist(m: Mode) -> dict:
    """2. Tensors made after the capture keep their values through 100 replays."""
    import contextlib

    import torch

    n = 1024
    gen = torch.Generator().manual_seed(2)
    with m.scope():
        x = torch.randn(n, n, generator=gen).cuda()
        w = (torch.randn(n, n, generator=gen) / 32).cuda()
    spans: list[tuple[int, int]] = []

    def body(record: bool = False):
        t1 = x @ w
        t2 = torch.relu(t1)
        t3 = t2 * 2 + 1
        if record:
            spans.extend((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (t1, t2, t3))
        del t1, t2
        out = t3.sum(1)
        del t3
        return out

    s = torch.cuda.Stream()
    with m.scope():
        warm_up(body, s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=m.graph_pool(), stream=s):
        out = body(record=True)

    # New tensors outside the graph, sized like its freed intermediates (4 MiB)
    # and others. In mempool mode they come from a second libsymm MemPool (and
    # from PyTorch's default pool): allocating from the graph's own MemPool
    # could legitimately reuse its free blocks by PyTorch's rules.
    scopes = [("default", contextlib.nullcontext)]
    pool2 = None
    if m.name == "mempool":
        import symm

        pool2 = torch.cuda.MemPool(symm.pool_allocator().allocator())
        scopes.append(("pool2", lambda: torch.cuda.use_mem_pool(pool2)))
    sizes = [4 * MiB] * 6 + [MiB] * 4 + [16 * MiB] * 2 + [2 * MiB] * 2 + [4096] * 4
    outside = []
    for k, (label, make_scope) in enumerate(scopes):
        with make_scope():
            for i, nbytes in enumerate(sizes):
                v = (17 + 13 * i + 101 * k) % 250 + 1
                t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                t.fill_(v)
                outside.append((label, t, v))
    torch.cuda.synchronize()
    aliased = [
        f"{label} {t.numel()} B at {t.data_ptr():#x} overlaps graph intermediate [{a:#x},{b:#x})"
        for label, t, _ in outside
        for a, b in spans
        if t.data_ptr() < b and a < t.data_ptr() + t.numel()
    ]

    def outside_bad() -> list[str]:
        return [f"{label} {t.numel()} B at {t.data_ptr():#x} lost its value {v}"
                for label, t, v in outside if not bool((t == v).all())]

    bad_outputs, first_bad, lost = [], None, []
    for i in range(100):
        torch.manual_seed(1000 + i)
        x.normal_()
        ref = torch.relu(x @ w).mul(2).add(1).sum(1)
        g.replay()
        churn = torch.full((MiB,), 7.0, device="cuda")  # 4 MiB outside the graph, right after it ran
        c = compare(out, ref)
        del churn
        if not c["close"]:
            bad_outputs.append(i)
            first_bad = first_bad or {"replay": i, **c}
        if i % 10 == 9 and not lost:
            lost = outside_bad()
    torch.cuda.synchronize()
    lost = lost or outside_bad()
    return {"replays": 100, "bad_outputs": bad_outputs[:20], "n_bad_outputs": len(bad_outputs),
            "first_bad": first_bad, "lost": lost[:10], "n_lost": len(lost), "aliased": aliased[:10],
            "n_outside": len(outside), "n_spans": len(spans), **symm_info(m)}


def check_shared(m: Mode) -> dict:
    """3. Two graphs in one pool (g2 captured with g1's pool), replayed in order."""
    import torch

    n = 512
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, n, generator=gen) for _ in range(9)]
    with m.scope():
        x1 = xs[0].cuda()
        w = (torch.randn(n, n, generator=gen) / 22).cuda()
        v = torch.randn(n, generator=gen).cuda()

    def body1():
        t = torch.relu(x1 @ w)
        u = t * 0.5
        del t
        return u + 1

    def body2(o1):
        t = torch.tanh(o1 @ w)
        u = t * v
        del t
        return u.sum(1)

    s = torch.cuda.Stream()
    with m.scope():
        warm_up(lambda: body2(body1()), s)
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=m.graph_pool(), stream=s):
        out1 = body1()
    shared = m.graph_pool() if m.pool is not None else g1.pool()
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=shared, stream=s):
        out2 = body2(out1)
    rounds = []
    for xc in xs[1:]:
        x1.copy_(xc)
        g1.replay()
        g2.replay()
        r1 = body1()
        r2 = body2(r1)
        torch.cuda.synchronize()
        rounds.append({"out1": compare(out1, r1), "out2": compare(out2, r2)})
    return {"rounds": rounds, **symm_info(m)}


def check_side_stream(m: Mode) -> dict:
    """4. A side stream forked and joined inside the capture; alloc and free on both."""
    import contextlib

    import torch

    n = 1024
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(n, n, generator=gen) for _ in range(7)]
    with m.scope():
        x = xs[0].cuda()
        w = (torch.randn(n, n, generator=gen) / 32).cuda()
    side = torch.cuda.Stream()

    def body(use_side: bool = True):
        cur = torch.cuda.current_stream()
        if use_side:
            side.wait_stream(cur)
        with torch.cuda.stream(side) if use_side else contextlib.nullcontext():
            a = x @ w  # allocated and freed on the side stream
            a2 = torch.relu(a)
            del a
            b = a2 * 3  # allocated on the side stream, used and freed on cur
            del a2
        c = torch.sin(x * 2)  # allocated and freed on cur
        c2 = c + 1
        del c
        if use_side:
            cur.wait_stream(side)
            b.record_stream(cur)
        out = (b + c2).sum(1)
        del b, c2
        return out

    s = torch.cuda.Stream()
    with m.scope():
        warm_up(body, s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=m.graph_pool(), stream=s):
        out = body()
    rounds = []
    for xc in xs[1:]:
        x.copy_(xc)
        g.replay()
        ref = body(use_side=False)
        torch.cuda.synchronize()
        rounds.append(compare(out, ref))
    return {"rounds": rounds, **symm_info(m)}


def param_digest(model) -> dict:
    import torch

    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    return {"sum": float(flat.sum().item()).hex(), "abs_sum": float(flat.abs().sum().item()).hex()}


def check_graphed_callables(m: Mode) -> dict:
    """5. make_graphed_callables on an MLP: 5 SGD steps equal eager's, bit for bit."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch import nn

    N, D_in, H, D_out = 64, 128, 256, 16
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(N, D_in, generator=gen), torch.randn(N, D_out, generator=gen)) for _ in range(5)]
    with m.scope():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(D_in, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, D_out)).cuda()
        control = copy.deepcopy(model)
        sample = torch.randn(N, D_in, device="cuda")
    kwargs = {"pool": m.graph_pool()} if m.pool is not None else {}
    graphed = torch.cuda.make_graphed_callables(model, (sample,), **kwargs)
    opt_g = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_c = torch.optim.SGD(control.parameters(), lr=0.1, momentum=0.9)
    losses = {"graphed": [], "eager": []}
    for label, net, opt in (("graphed", graphed, opt_g), ("eager", control, opt_c)):
        torch.manual_seed(5)
        for xb, yb in batches:
            with m.scope():
                xd, yd = xb.cuda(), yb.cuda()
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(net(xd), yd)
            loss.backward()
            opt.step()
            losses[label].append(float(loss.item()).hex())
    torch.cuda.synchronize()
    pairs = list(zip(model.parameters(), control.parameters()))
    equal = [bool(torch.equal(p, q)) for p, q in pairs]
    max_diff = max(float((p.double() - q.double()).abs().max().item()) for p, q in pairs)
    return {"n_params": len(pairs), "n_equal": sum(equal), "bitwise": all(equal), "max_diff": max_diff,
            "losses": losses, "digest": param_digest(model), **symm_info(m)}


def check_release(m: Mode) -> dict:
    """6. ~512 MiB of graph intermediates; after del g + empty_cache, memory is back."""
    import gc

    import torch

    n = 4096  # 64 MiB of fp32
    # Load the kernels first (lazy module loading takes device memory), outside any pool.
    small = torch.ones(n, device="cuda")
    tmp = small * 2.0
    tmp += small
    del small, tmp
    with m.scope():
        x = torch.randn(n, n, device="cuda")  # the static input: before the baseline, kept to the end

    def body():
        ts = [x * float(i + 1) for i in range(8)]  # 8 x 64 MiB alive at once
        out = ts[0] + ts[1]
        for t in ts[2:]:
            out += t
        del ts, t
        return out

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    base_free = torch.cuda.mem_get_info()[0]
    base_res = symm_info(m).get("symm_reserved")

    s = torch.cuda.Stream()
    with m.scope():
        warm_up(body, s, n=1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=m.graph_pool(), stream=s):
        out = body()
    rounds = []
    for i in range(3):
        torch.manual_seed(600 + i)
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        rounds.append(compare(out, x * 36.0))
    peak_free = torch.cuda.mem_get_info()[0]
    peak_res = symm_info(m).get("symm_reserved")

    del out, g
    if m.name == "mempool":  # the MemPool keeps its segments cached until it dies; after its graph, after x
        del x
        m.pool = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    after_free = torch.cuda.mem_get_info()[0]
    after_res = symm_info(m).get("symm_reserved")
    return {"rounds": rounds, "base_free": base_free, "peak_free": peak_free, "after_free": after_free,
            "base_res": base_res, "peak_res": peak_res, "after_res": after_res}


def exception_text(e: BaseException) -> str:
    """The message of e and of every exception chained to it (dynamo wraps)."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n<- ".join(parts)


def pluggable_refusal(message: str) -> bool:
    low = message.lower()
    return "checkpoolliveallocations" in low or "pluggable" in low


def check_compile(m: Mode) -> dict:
    """7. torch.compile(mode="reduce-overhead") in replace mode (libsymm's extension) and MemPool mode."""
    import torch
    import torch._dynamo

    def f(a, b):
        return torch.relu(a @ b) * 2.0 + torch.sin(a)

    def variant(compile_kwargs: dict) -> dict:
        out: dict = {"kwargs": repr(compile_kwargs)}
        i = -1
        try:
            torch._dynamo.reset()
            cf = torch.compile(f, **compile_kwargs)
            calls = []
            for i in range(5):
                with m.scope():
                    a = torch.randn(256, 256, device="cuda")
                    b = torch.randn(256, 256, device="cuda")
                y = cf(a, b).clone()  # cudagraph outputs are overwritten by the next replay
                calls.append(compare(y, f(a, b), rtol=1e-4, atol=1e-4))
            torch.cuda.synchronize()
            out.update(raised=False, calls=calls, ok=all(c["close"] for c in calls))
        except Exception as e:  # judged by the parent
            text = exception_text(e)
            out.update(raised=True, ok=False, failed_at_call=i, type=type(e).__name__,
                       message=text[:4000], pluggable_refusal=pluggable_refusal(text))
        try:
            from torch._dynamo.utils import counters

            out["inductor_counters"] = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
        except Exception:
            pass
        return out

    res = {"reduce_overhead": variant({"mode": "reduce-overhead"})}
    ro = res["reduce_overhead"]
    if ro["raised"] and not ro["pluggable_refusal"]:
        # Not the refusal we know: try cudagraph trees without inductor/Triton, to
        # tell an environment problem (no compiler, ...) from an allocator one.
        res["cudagraphs_backend"] = variant({"backend": "cudagraphs"})
    if m.name == "replace":
        res["_hard_exit"] = True  # after a refused capture PyTorch's teardown is not our business
    return res


def check_plain_oom(_m=None) -> dict:
    """8. PyTorch's plain recipe without `import symm`: OOM raises, naming size and device."""
    import torch

    lib = os.environ.get("SYMM_LIB") or str(ROOT / "build" / "libsymm.so")
    alloc_name = os.environ.get("SYMM_TEST_PLAIN_ALLOC", "symm_pool_alloc")
    free_name = os.environ.get("SYMM_TEST_PLAIN_FREE", "symm_pool_free")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, alloc_name, free_name)
    torch.cuda.memory.change_current_allocator(allocator)
    out: dict = {"lib": lib, "functions": [alloc_name, free_name]}

    try:
        z = torch.empty(0, device="cuda")
        z2 = torch.empty((0, 16), device="cuda")
        zs = float(z.sum().item())
        out["size0"] = {"ok": zs == 0.0 and z2.numel() == 0, "data_ptr": z.data_ptr()}
        del z, z2
    except Exception as e:
        out["size0"] = {"ok": False, "error": exception_text(e)[:1000]}

    try:
        t = torch.empty(OOM_BYTES, dtype=torch.uint8, device="cuda")
        out.update(raised=False, data_ptr=t.data_ptr())
        out["_hard_exit"] = True  # never free what came back (a NULL tensor)
        globals()["_leak"] = t
    except Exception as e:
        out.update(raised=True, type=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__],
                   message=str(e)[:3000])
    try:
        t2 = torch.empty(OOM_BYTES // 2, dtype=torch.uint8, device="cuda")
        out["second_raised"] = False
        globals()["_leak2"] = t2
        out["_hard_exit"] = True
    except Exception:
        out["second_raised"] = True

    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        g = torch.Generator().manual_seed(8)
        a_cpu = torch.randn(512, 512, generator=g)
        a = a_cpu.cuda()
        b = a @ a
        r = torch.arange(1 << 20, device="cuda", dtype=torch.int64)
        ok_sum = int(r.sum().item()) == (1 << 20) * ((1 << 20) - 1) // 2
        ok_mm = bool(torch.allclose(b.cpu(), a_cpu @ a_cpu, rtol=1e-2, atol=1e-1))  # memory, not precision
        out["works_after"] = {"ok": ok_sum and ok_mm, "arange_sum": ok_sum, "matmul": ok_mm}
    except Exception as e:
        out["works_after"] = {"ok": False, "error": exception_text(e)[:1000]}
    out["symm_imported"] = "symm" in sys.modules
    return out


def check_mempool_empty(m: Mode, variant: str) -> dict:
    """9. ~2 GiB in a MemPool, freed: empty_cache (pool alive) or del pool gives it back."""
    import gc

    import torch

    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    del a
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    base = torch.cuda.mem_get_info()[0]
    base_res = symm_info(m).get("symm_reserved")
    if m.name == "mempool":
        import symm

        pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
    else:
        pool = torch.cuda.MemPool()  # PyTorch's own cudaMalloc: the reference
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
        for i, t in enumerate(ts):
            t.fill_(i + 1)
    torch.cuda.synchronize()
    held = base - torch.cuda.mem_get_info()[0]
    values_ok = all(bool((t[:: 1 << 16] == i + 1).all()) for i, t in enumerate(ts))
    peak_res = symm_info(m).get("symm_reserved")
    del ts, t
    torch.cuda.synchronize()
    if variant == "alive":
        torch.cuda.empty_cache()
    else:
        del pool
        gc.collect()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    after = torch.cuda.mem_get_info()[0]
    after_res = symm_info(m).get("symm_reserved")
    res = {"variant": variant, "base_free": base, "held": held, "after_free": after, "retained": base - after,
           "values_ok": values_ok, "base_res": base_res, "peak_res": peak_res, "after_res": after_res}
    if variant == "alive":  # for the record: what deleting the pool afterwards gives back
        del pool
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        res["retained_after_del_pool"] = base - torch.cuda.mem_get_info()[0]
    return res


SEGMENT_KEYS = ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks")
BLOCK_KEYS = ("address", "size", "requested_size", "state", "frames")
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
TRACE_KEYS = ("action", "size", "stream", "time_us", "frames")  # and addr, or device_free for 'oom'
TRACE_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot",
                 "segment_map", "segment_unmap"}


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(frames, where: str, problems: list) -> None:
    if not isinstance(frames, list):
        problems.append(f"{where}: frames is {type(frames).__name__}, not a list")
        return
    for f in frames[:50]:
        if not (isinstance(f, dict) and isinstance(f.get("filename"), str) and is_int(f.get("line"))
                and isinstance(f.get("name"), str)):
            problems.append(f"{where}: frame {f!r} lacks filename/line/name")
            return


def validate_snapshot(snap, require_free: bool = True, native: bool = False) -> tuple[list, dict]:
    """Problems with snap as torch.cuda.memory._snapshot()'s structure, and counts.

    require_free: the workload must show a free event (not so in MemPool mode,
    where PyTorch caches above libsymm). native: PyTorch leaves 'frames' out of
    an event that has no context; only counted there.
    """
    problems: list[str] = []
    counts = {"segments": 0, "blocks": 0, "trace_entries": 0, "actions": {}, "events_without_frames": 0}
    if not isinstance(snap, dict):
        return [f"snapshot is {type(snap).__name__}, not a dict"], counts
    segs, traces = snap.get("segments"), snap.get("device_traces")
    if not isinstance(segs, list):
        problems.append("no 'segments' list")
        segs = []
    if not isinstance(traces, list):
        problems.append("no 'device_traces' list")
        traces = []
    counts["segments"] = len(segs)
    for i, seg in enumerate(segs):
        where = f"segment {i}"
        missing = [k for k in SEGMENT_KEYS if k not in seg]
        if missing:
            problems.append(f"{where}: missing {missing}")
            continue
        where = f"segment {i} at {seg['address']:#x}" if is_int(seg["address"]) else where
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream"):
            if not is_int(seg[k]):
                problems.append(f"{where}: {k} is {seg[k]!r}, not an int")
        if seg["segment_type"] not in ("small", "large"):
            problems.append(f"{where}: segment_type {seg['segment_type']!r}")
        pid = seg["segment_pool_id"]
        if not (isinstance(pid, (tuple, list)) and len(pid) == 2 and all(is_int(p) for p in pid)):
            problems.append(f"{where}: segment_pool_id {pid!r} is not two ints")
        if not isinstance(seg["is_expandable"], bool):
            problems.append(f"{where}: is_expandable {seg['is_expandable']!r} is not a bool")
        check_frames(seg["frames"], where, problems)
        blocks = seg["blocks"]
        if not isinstance(blocks, list) or not blocks:
            problems.append(f"{where}: no blocks")
            continue
        counts["blocks"] += len(blocks)
        expect = seg["address"]
        total = allocated = active = 0
        for j, b in enumerate(blocks):
            bwhere = f"{where} block {j}"
            bmissing = [k for k in BLOCK_KEYS if k not in b]
            if bmissing:
                problems.append(f"{bwhere}: missing {bmissing}")
                continue
            if not (is_int(b["address"]) and is_int(b["size"]) and is_int(b["requested_size"])):
                problems.append(f"{bwhere}: address/size/requested_size not ints: {b!r}"[:300])
                continue
            if b["state"] not in BLOCK_STATES:
                problems.append(f"{bwhere}: state {b['state']!r}")
            if b["address"] != expect:
                problems.append(f"{bwhere}: address {b['address']:#x}, expected {expect:#x} (blocks must tile the segment)")
            if b["size"] <= 0:
                problems.append(f"{bwhere}: size {b['size']}")
            if b["state"] == "active_allocated":
                allocated += b["size"]
                if b["requested_size"] > b["size"]:
                    problems.append(f"{bwhere}: requested_size {b['requested_size']} > size {b['size']}")
            if b["state"] in ("active_allocated", "active_pending_free"):
                active += b["size"]
            check_frames(b["frames"], bwhere, problems)
            expect = b["address"] + b["size"]
            total += b["size"]
        if total != seg["total_size"]:
            problems.append(f"{where}: blocks add up to {total}, total_size is {seg['total_size']}")
        if allocated != seg["allocated_size"]:
            problems.append(f"{where}: active_allocated blocks add up to {allocated}, allocated_size is {seg['allocated_size']}")
        if active != seg["active_size"]:
            problems.append(f"{where}: active blocks add up to {active}, active_size is {seg['active_size']}")
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            problems.append(f"device_traces[{d}] is {type(trace).__name__}, not a list")
            continue
        for k, e in enumerate(trace):
            counts["trace_entries"] += 1
            where = f"device {d} trace entry {k}"
            if not isinstance(e, dict):
                problems.append(f"{where}: {e!r} is not a dict"[:200])
                continue
            action = e.get("action")
            counts["actions"][str(action)] = counts["actions"].get(str(action), 0) + 1
            if action not in TRACE_ACTIONS:
                problems.append(f"{where}: action {action!r}")
            need = TRACE_KEYS + (("device_free",) if action == "oom" else ("addr",))
            if "frames" not in e:
                counts["events_without_frames"] += 1
                if native:
                    need = tuple(key for key in need if key != "frames")
            missing = [key for key in need if key not in e]
            if missing:
                problems.append(f"{where} ({action}): missing {missing}")
                continue
            for key in ("size", "stream", "time_us", "device_free" if action == "oom" else "addr"):
                if not is_int(e[key]):
                    problems.append(f"{where} ({action}): {key} is {e[key]!r}, not an int")
            if "frames" in e:
                check_frames(e["frames"], where, problems)
    if not traces or not any(traces):
        problems.append("device_traces is empty with history on")
    acts = counts["actions"]
    if not acts.get("alloc"):
        problems.append("no 'alloc' event recorded during the workload")
    if require_free and not (acts.get("free_requested") or acts.get("free_completed")):
        problems.append("no 'free_requested'/'free_completed' event recorded during the workload")
    return problems[:40], counts


def snapshot_keys(snap) -> dict:
    seg_keys, block_keys, frame_keys, trace_keys = set(), set(), set(), {}
    for seg in snap.get("segments", []):
        seg_keys |= set(seg)
        for b in seg.get("blocks", []):
            block_keys |= set(b)
            for f in (b.get("frames") or [])[:1]:
                frame_keys |= set(f)
    for trace in snap.get("device_traces", []):
        for e in trace:
            trace_keys.setdefault(str(e.get("action")), set()).update(e)
            for f in (e.get("frames") or [])[:1]:
                frame_keys |= set(f)
    return {"top": sorted(snap), "segment": sorted(seg_keys), "block": sorted(block_keys),
            "frame": sorted(frame_keys), "trace": {a: sorted(k) for a, k in trace_keys.items()}}


def render(snap) -> dict:
    """PyTorch's own viewer code over snap; flamegraph.pl replaced by an offline stand-in."""
    import copy
    import inspect

    from torch.cuda import _memory_viz as mv

    def offline_flamegraph(lines, *args, **kwargs):
        return lines  # the "folded stacks" text flamegraph.pl would draw

    calls = [
        ("segment_plot", "segment_plot", lambda: mv.segment_plot(copy.deepcopy(snap))),
        ("trace_plot", "trace_plot", lambda: mv.trace_plot(copy.deepcopy(snap))),
        ("trace_plot(plot_segments)", "trace_plot", lambda: mv.trace_plot(copy.deepcopy(snap), plot_segments=True)),
        ("memory", "memory", lambda: mv.memory(copy.deepcopy(snap), format_flamegraph=offline_flamegraph)),
        ("segments", "segments", lambda: mv.segments(copy.deepcopy(snap), format_flamegraph=offline_flamegraph)),
        ("compare", "compare", lambda: mv.compare(copy.deepcopy(snap["segments"]), [],
                                                  format_flamegraph=offline_flamegraph)),
        ("segsum", "segsum", lambda: mv.segsum(copy.deepcopy(snap))),
        ("trace", "trace", lambda: mv.trace(copy.deepcopy(snap))),
    ]
    if hasattr(mv, "trace_plot") and "filter_freed" in inspect.signature(mv.trace_plot).parameters:
        calls.append(("trace_plot(filter_freed)", "trace_plot",
                      lambda: mv.trace_plot(copy.deepcopy(snap), filter_freed=True)))
    out = {}
    for label, attr, fn in calls:
        if not hasattr(mv, attr):
            out[label] = {"absent": True}
            continue
        try:
            r = fn()
            out[label] = {"ok": isinstance(r, str) and len(r) > 0, "len": len(r) if isinstance(r, str) else None,
                          "type": type(r).__name__}
        except Exception as e:
            out[label] = {"ok": False, "error": exception_text(e)[:800]}
    return out


def train_small_mlp(m: Mode) -> list:
    """3 SGD steps of a small MLP in m's scope; returns what stays alive."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    with m.scope():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(128, 256, device="cuda")
        y = torch.randn(128, 10, device="cuda")
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        odd = torch.empty(8 * MiB + 12345, dtype=torch.uint8, device="cuda")  # requested_size < size
        odd.fill_(3)
        gone = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        del gone
    torch.cuda.synchronize()
    return [model, opt, x, y, odd]


def check_snapshot(m: Mode) -> dict:
    """10. A snapshot shaped like torch.cuda.memory._snapshot(), rendered by _memory_viz."""
    import tempfile

    import torch

    res: dict = {}
    if m.name == "mempool":
        torch.autograd.set_multithreading_enabled(False)  # backward allocates on this thread, in the pool
    if m.name == "native":
        # Python stacks only: symbolizing C++ frames at snapshot time can take minutes; same keys.
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    else:
        import symm

        symm.record_memory_history(enabled="all", max_entries=100000)
    live = train_small_mlp(m)
    if m.name == "mempool":
        # PyTorch caches the pool's blocks above libsymm, so training frees nothing
        # there; a second pool, deleted, hands its segment back (raw_delete).
        import gc

        tmp_pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
        with torch.cuda.use_mem_pool(tmp_pool):
            t = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
            t.fill_(1)
        del t
        torch.cuda.synchronize()
        del tmp_pool
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot() if m.name == "native" else symm.memory_snapshot()
    res["problems"], res["counts"] = validate_snapshot(snap, require_free=m.name != "mempool",
                                                       native=m.name == "native")
    res["keys"] = snapshot_keys(snap)
    res["render"] = render(snap)
    if m.name == "native":
        torch.cuda.memory._record_memory_history(enabled=None)
        return res

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snapshot.pickle")
        try:
            symm.dump_snapshot(path)
            # Loaded as pytorch.org/memory_viz's users do: without symm or torch.
            code = ("import pickle, sys, json; s = pickle.load(open(sys.argv[1], 'rb')); "
                    "print(json.dumps({'type': type(s).__name__, 'segments': len(s['segments']), "
                    "'device_traces': len(s['device_traces'])}))")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            p = subprocess.run([sys.executable, "-I", "-c", code, path], capture_output=True, text=True,
                               timeout=60, env=env)
            res["dump"] = {"rc": p.returncode, "loaded": json.loads(p.stdout) if p.returncode == 0 else None,
                           "stderr": p.stderr[-1000:], "bytes": os.path.getsize(path),
                           "expected_segments": len(snap["segments"])}
        except Exception as e:
            res["dump"] = {"error": exception_text(e)[:1000]}

    if m.name == "mempool":
        # The pool's segments as PyTorch sees them: each must be an allocated block in libsymm's snapshot.
        torch_snap = torch.cuda.memory._snapshot()
        pool_id = tuple(m.pool.id)
        pool_segs = [s for s in torch_snap["segments"] if tuple(s["segment_pool_id"]) == pool_id]
        blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
        missing = [f"{s['address']:#x}+{s['total_size']}" for s in pool_segs
                   if not (s["address"] in blocks and blocks[s["address"]]["state"] == "active_allocated"
                           and blocks[s["address"]]["size"] >= s["total_size"])]
        res["pool"] = {"torch_segments": len(pool_segs), "missing_in_symm": missing[:10], "n_missing": len(missing)}

    symm.record_memory_history(enabled=None)
    n1 = sum(len(t) for t in symm.memory_snapshot()["device_traces"])
    with m.scope():
        junk = [torch.empty((i + 1) * MiB, dtype=torch.uint8, device="cuda") for i in range(4)]
        del junk
    torch.cuda.synchronize()
    n2 = sum(len(t) for t in symm.memory_snapshot()["device_traces"])
    res["off"] = {"entries_after_disable": n1, "entries_after_more_work": n2}
    del live
    return res


CHECKS = {
    "1-capture": check_capture_free,
    "2-persist": check_persist,
    "3-shared": check_shared,
    "4-side": check_side_stream,
    "5-graphed": check_graphed_callables,
    "6-release": check_release,
    "7-compile": check_compile,
    "8-plain-oom": check_plain_oom,
    "9-empty-alive": lambda m: check_mempool_empty(m, "alive"),
    "9-empty-delpool": lambda m: check_mempool_empty(m, "delpool"),
    "10-snapshot": check_snapshot,
}


def child_main(check: str, mode: str) -> None:
    import traceback

    start = time.time()
    try:
        if mode == "plain":
            result = CHECKS[check](None)
        else:
            m = Mode(mode, make_pool=not check.startswith("9-"))
            result = CHECKS[check](m)
    except Exception as e:  # the parent reports it as the check's failure
        result = {"error": exception_text(e)[:3000], "traceback": traceback.format_exc()[-6000:]}
    result["seconds"] = round(time.time() - start, 2)
    hard_exit = bool(result.pop("_hard_exit", False))
    print("RESULT " + json.dumps(result), flush=True)
    if hard_exit:
        sys.stderr.flush()
        os._exit(0)


# =============================================================================
# Parent side: pytest. Needs neither torch nor CUDA to collect.
# =============================================================================

if __name__ == "__main__" and len(sys.argv) >= 4 and sys.argv[1] == "--child":
    child_main(sys.argv[2], sys.argv[3])
    sys.exit(0)

import pytest  # noqa: E402  (children do not need pytest)

LINES: list[str] = []
_CACHE: dict = {}


def child_env() -> dict:
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS, before CUDA init
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    env.setdefault("SYMM_LIB", str(ROOT / "build" / "libsymm.so"))
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # compile in-process: no worker pool
    env.pop("SYMM_DEVICE", None)
    return env


def run_child(check: str, mode: str) -> dict:
    """Runs one check in a fresh interpreter and returns its RESULT (or raises)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", check, mode]
    start = time.time()
    try:
        proc = subprocess.run(cmd, env=child_env(), cwd=str(ROOT), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"child {check}/{mode} timed out after {CHILD_TIMEOUT_S} s:\n{(out + err)[-4000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    tail = (proc.stdout + proc.stderr)[-4000:]
    if not lines:
        last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise AssertionError(f"child {check}/{mode} died (rc={proc.returncode}): {last[0][:200]}\n{tail}")
    result = json.loads(lines[-1][len("RESULT "):])
    if proc.returncode != 0:
        raise AssertionError(f"child {check}/{mode} exited with rc={proc.returncode} after its RESULT "
                             f"(crash at teardown?): {json.dumps(result)[:300]}\n{tail}")
    result["_seconds"] = round(time.time() - start, 1)
    return result


def result_of(check: str, mode: str) -> dict:
    """run_child, once per (check, mode): native references serve several verdicts."""
    key = (check, mode)
    if key not in _CACHE:
        try:
            _CACHE[key] = run_child(check, mode)
        except AssertionError as e:
            _CACHE[key] = e
    r = _CACHE[key]
    if isinstance(r, AssertionError):
        raise AssertionError(str(r))
    if "error" in r:
        print(r.get("traceback", ""), flush=True)
        raise AssertionError(f"{check}/{mode} raised {r['error']}")
    return r


def report(status: str, check: str, mode: str, detail: str) -> None:
    """One compact line per check, printed now and again in the final table."""
    line = f"{status}  {check:<16} {mode:<8} {detail}"
    LINES.append(line)
    print("\n" + line, flush=True)


def judge(check: str, mode: str, fn) -> None:
    """Runs a check's child (or takes its cached result), lets fn judge it, reports either way."""
    try:
        result = result_of(check, mode)
        detail = fn(result)
    except pytest.skip.Exception as e:
        report("SKIP", check, mode, str(e)[:200])
        raise
    except BaseException as e:
        text = str(e).strip()
        report("FAIL", check, mode, text.splitlines()[0][:240] if text else type(e).__name__)
        raise
    report("PASS", check, mode, f"{detail} ({result['seconds']} s in the check, {result['_seconds']} s in all)")


@pytest.fixture(scope="module", autouse=True)
def gpu_and_summary():
    probe = subprocess.run([sys.executable, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"],
                           capture_output=True, text=True, timeout=180, env=child_env())
    if probe.returncode != 0:
        why = "no CUDA device" if probe.returncode == 3 else (probe.stderr.strip().splitlines() or ["no torch"])[-1]
        pytest.skip(f"torch with CUDA unavailable: {why}")
    yield
    if LINES:
        print("\n==== libsymm torch graph checks ====\n" + "\n".join(LINES), flush=True)


ALL_MODES = ["replace", "mempool", "native"]
MODES = ["replace", "mempool"]


def assert_used_symm(r: dict, mode: str) -> None:
    if mode != "native":
        assert r.get("symm_peak_reserved", 0) > 0, f"libsymm saw no memory: {r}"


def summarize_rounds(rounds: list) -> str:
    bitwise = all(x["bitwise"] for x in rounds)
    worst = max(x["max_diff"] for x in rounds)
    return "bit-identical to eager" if bitwise else f"max diff {worst:.3g} from eager"


@pytest.mark.parametrize("mode", ALL_MODES)
def test_1_capture_free(mode):
    def fn(r):
        rounds = r["rounds"]
        assert len(rounds) == 5, f"{len(rounds)} replays"
        bad = [i for i, x in enumerate(rounds) if not x["close"]]
        assert not bad, f"replay {bad[0]} differs from eager: max diff {rounds[bad[0]]['max_diff']:.3g}"
        assert_used_symm(r, mode)
        return f"capture with intermediates freed inside; 5 replays, new inputs, {summarize_rounds(rounds)}"

    judge("1-capture", mode, fn)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_2_persist_100(mode):
    def fn(r):
        assert not r["aliased"], f"tensors made after the capture overlap the graph's memory: {r['aliased'][:3]}"
        assert r["n_lost"] == 0, f"{r['n_lost']} tensors made after the capture were overwritten: {r['lost'][:3]}"
        assert r["n_bad_outputs"] == 0, f"{r['n_bad_outputs']} of 100 replays gave a wrong output: {r['first_bad']}"
        assert r["n_spans"] == 3, f"recorded {r['n_spans']} intermediate spans"
        assert_used_symm(r, mode)
        return f"{r['n_outside']} tensors made after the capture intact through 100 replays; outputs right"

    judge("2-persist", mode, fn)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_3_shared_pool(mode):
    def fn(r):
        rounds = r["rounds"]
        assert len(rounds) == 8
        for i, x in enumerate(rounds):
            for k in ("out1", "out2"):
                assert x[k]["close"], f"round {i}: {k} differs from eager: max diff {x[k]['max_diff']:.3g}"
        assert_used_symm(r, mode)
        flat = [x[k] for x in rounds for k in ("out1", "out2")]
        return f"g1, g2 in one pool, replayed in order 8 times, {summarize_rounds(flat)}"

    judge("3-shared", mode, fn)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_4_side_stream(mode):
    def fn(r):
        rounds = r["rounds"]
        assert len(rounds) == 6
        bad = [i for i, x in enumerate(rounds) if not x["close"]]
        assert not bad, f"replay {bad[0]} differs from eager: max diff {rounds[bad[0]]['max_diff']:.3g}"
        assert_used_symm(r, mode)
        return f"side stream forked and joined in the capture; 6 replays, {summarize_rounds(rounds)}"

    judge("4-side", mode, fn)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_5_graphed_callables(mode):
    def fn(r):
        assert r["n_params"] == 6
        if r["bitwise"]:
            if mode != "native":
                assert_used_symm(r, mode)
            return f"5 SGD steps graphed == eager bit for bit ({r['n_params']} tensors); last loss {float.fromhex(r['losses']['graphed'][-1]):.6g}"
        if mode == "native":
            assert r["max_diff"] <= 1e-5, f"graphed and eager differ by {r['max_diff']:.3g} natively"
            return f"natively graphed != eager bitwise (max diff {r['max_diff']:.3g}): symm modes judged by tolerance"
        native = result_of("5-graphed", "native")
        assert not native["bitwise"], (f"{r['n_equal']}/{r['n_params']} tensors bit-equal, max diff "
                                       f"{r['max_diff']:.3g}; natively they are bit-equal")
        assert r["max_diff"] <= 1e-5, f"graphed and eager differ by {r['max_diff']:.3g}"
        assert_used_symm(r, mode)
        return f"within {r['max_diff']:.3g} of eager (natively not bitwise either: {native['max_diff']:.3g})"

    judge("5-graphed", mode, fn)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_6_release_baseline(mode):
    def fn(r):
        bad = [i for i, x in enumerate(r["rounds"]) if not x["close"]]
        assert not bad, f"replay {bad[0]} wrong: {r['rounds'][bad[0]]}"
        used = r["base_free"] - r["peak_free"]
        assert used >= 400 * MiB, f"the graph held only {used / MiB:.0f} MiB of device memory: {r}"
        lost = r["base_free"] - r["after_free"]
        detail = f"graph held {used / MiB:.0f} MiB; after release free memory {-lost / MiB:+.1f} MiB vs baseline"
        if mode == "native":
            # The reference: CUDA keeps some memory of its own after a graph
            # (instantiation, cuBLAS workspaces of the capture stream), ~70 MiB
            # on an H200 with torch 2.11. libsymm is judged against this.
            return detail + " (PyTorch's own figure: the reference)"
        native = result_of("6-release", "native")
        native_lost = native["base_free"] - native["after_free"]
        assert lost <= native_lost + TOLERANCE, (
            f"device free memory is {lost / MiB:.1f} MiB below its baseline after del g + empty_cache, "
            f"PyTorch's own allocator {native_lost / MiB:.1f} MiB: {r}")
        detail += f" (native {-native_lost / MiB:+.1f} MiB)"
        if mode != "native":
            grew = r["peak_res"] - r["base_res"]
            assert grew >= 400 * MiB, f"symm reserved grew by {grew / MiB:.0f} MiB only: the memory did not come from libsymm"
            assert r["after_res"] <= r["base_res"], (f"symm.memory_reserved is {r['after_res']} after release, "
                                                     f"{(r['after_res'] - r['base_res']) / MiB:.1f} MiB above its baseline {r['base_res']}")
            detail += f"; symm reserved {r['base_res'] / MiB:.0f} -> {r['peak_res'] / MiB:.0f} -> {r['after_res'] / MiB:.0f} MiB"
        return detail

    judge("6-release", mode, fn)


def _compile_ok(v: dict) -> bool:
    return bool(v and not v.get("raised") and v.get("ok"))


def _skips(v: dict) -> str:
    n = sum(c for k, c in (v or {}).get("inductor_counters", {}).items() if "skip" in k)
    return f" (cudagraphs skipped {n} time(s): ran without graphs)" if n else ""


@pytest.mark.parametrize("mode", ALL_MODES)
def test_7_compile_reduce_overhead(mode):
    def fn(r):
        ro, cg = r["reduce_overhead"], r.get("cudagraphs_backend")
        if mode == "native":
            if _compile_ok(ro):
                return f"reduce-overhead: 5 calls right natively{_skips(ro)}"
            if _compile_ok(cg):
                return f"natively reduce-overhead fails ({ro.get('message', '')[:80]!r}); backend='cudagraphs' works"
            pytest.skip(f"torch.compile does not work here even natively: {ro.get('message', '')[:160]!r}")
        native = result_of("7-compile", "native")
        n_ro, n_cg = native["reduce_overhead"], native.get("cudagraphs_backend")
        if _compile_ok(n_ro):
            variant, name = ro, "reduce-overhead"
        elif _compile_ok(n_cg):
            variant, name = cg or ro, "backend='cudagraphs'" if cg else "reduce-overhead"
        else:
            pytest.skip(f"torch.compile fails natively too: {n_ro.get('message', '')[:160]!r}")
        if mode == "replace":
            # libsymm's PyTorch extension answers checkPoolLiveAllocations and
            # the checkpoint calls; without it (SYMM_TORCH_EXT=0, or no
            # compiler) torch 2.11 refuses every pluggable allocator.
            if os.environ.get("SYMM_TORCH_EXT") == "0":
                for v in (ro, cg):
                    if v and v.get("raised") and v.get("pluggable_refusal"):
                        first = v["message"].splitlines()[0][:160]
                        return f"expected failure without the extension: {first!r}"
            if _compile_ok(variant):
                return f"{name} in replace mode: 5 calls match eager{_skips(variant)}"
            raise AssertionError(f"{name} in replace mode: {variant.get('message') or variant.get('calls')!s:.300}")
        if not _compile_ok(variant):
            raise AssertionError(f"{name} in MemPool mode: {variant.get('message') or variant.get('calls')!s:.300}")
        return f"{name}: 5 calls with MemPool inputs match eager{_skips(variant)}"

    judge("7-compile", mode, fn)


def test_8_plain_recipe_oom():
    def fn(r):
        assert not r["symm_imported"], "the child imported symm"
        assert r["size0"]["ok"], f"a size-0 tensor failed: {r['size0']}"
        assert r["raised"], f"torch.empty(1 << 45) did not raise: data_ptr={r.get('data_ptr')}"
        msg = r["message"]
        assert str(OOM_BYTES) in msg, f"the message lacks the size {OOM_BYTES}: {msg[:300]!r}"
        assert re.search(r"\bdevice 0\b", msg), f"the message lacks 'device 0': {msg[:300]!r}"
        assert r["second_raised"], "a second oversize request did not raise"
        assert r["works_after"]["ok"], f"allocation/matmul after the OOM failed: {r['works_after']}"
        return f"{r['type']}: {msg.splitlines()[0][:140]!r}; size 0 works; works after"

    judge("8-plain-oom", "plain", fn)


@pytest.mark.parametrize("mode", ["mempool", "native"])
@pytest.mark.parametrize("variant", ["delpool", "alive"])
def test_9_mempool_empty_cache(variant, mode):
    check = f"9-empty-{variant}"

    def fn(r):
        assert r["values_ok"], "the pool's tensors did not hold their values"
        assert r["held"] >= 2 * GiB - TOLERANCE, f"2 GiB in the pool took only {r['held'] / MiB:.0f} MiB"
        kept = r["retained"]
        detail = f"held {r['held'] / GiB:.2f} GiB; after release {kept / MiB:.1f} MiB below baseline"
        if r.get("base_res") is not None:
            detail += f"; symm reserved {r['base_res'] / MiB:.0f} -> {r['peak_res'] / MiB:.0f} -> {r['after_res'] / MiB:.0f} MiB"
        if variant == "delpool" or mode == "native":
            if mode == "native" and variant == "alive":
                return detail + " (PyTorch's own behaviour with a live pool)"
            assert kept <= TOLERANCE, f"{kept / MiB:.0f} MiB still taken after del pool + empty_cache: {r}"
            if mode == "mempool":
                assert r["after_res"] <= r["base_res"], f"libsymm still reserves {(r['after_res'] - r['base_res']) / MiB:.0f} MiB"
            return detail
        native = result_of(check, "native")
        allowed = max(TOLERANCE, native["retained"] + TOLERANCE)
        assert kept <= allowed, (f"{kept / MiB:.0f} MiB still taken after empty_cache with the pool alive; natively "
                                 f"{native['retained'] / MiB:.0f} MiB: {r}")
        if native["retained"] > TOLERANCE:
            detail += (f" (PyTorch keeps a live MemPool's segments: natively {native['retained'] / MiB:.0f} MiB; "
                       f"after del pool {r['retained_after_del_pool'] / MiB:+.1f} MiB)")
        return detail

    judge(check, mode, fn)


def missing_keys(symm_keys: dict, native_keys: dict) -> dict:
    out = {}
    # Frames may be empty in symm's snapshot (events that do not come through its
    # Python API have none): frame keys are compared only where it has frames.
    parts = ("segment", "block", "frame") if symm_keys["frame"] else ("segment", "block")
    for part in parts:
        miss = sorted(set(native_keys[part]) - set(symm_keys[part]))
        if miss:
            out[part] = miss
    for action, keys in native_keys["trace"].items():
        if action in symm_keys["trace"]:
            miss = sorted(set(keys) - set(symm_keys["trace"][action]))
            if miss:
                out[f"trace[{action}]"] = miss
    return out


@pytest.mark.parametrize("mode", ALL_MODES)
def test_10_snapshot(mode):
    def fn(r):
        assert not r["problems"], f"{len(r['problems'])} problems: {r['problems'][:4]}"
        broken = {k: v for k, v in r["render"].items() if not v.get("absent") and not v.get("ok")}
        assert not broken, f"_memory_viz failed: {json.dumps(broken)[:400]}"
        rendered = sorted(k for k, v in r["render"].items() if v.get("ok"))
        c = r["counts"]
        detail = (f"{c['segments']} segments, {c['blocks']} blocks, {c['trace_entries']} events "
                  f"{c['actions']}; rendered by {', '.join(rendered)}")
        absent = sorted(k for k, v in r["render"].items() if v.get("absent"))
        if absent:
            detail += f" (absent in this torch: {absent})"
        if mode == "native":
            return detail
        d = r["dump"]
        assert "error" not in d, f"dump_snapshot failed: {d['error']}"
        assert d["rc"] == 0, f"the dumped pickle did not load without symm/torch: {d['stderr']}"
        assert d["loaded"]["type"] == "dict" and d["loaded"]["segments"] == d["expected_segments"], \
            f"dumped pickle has {d['loaded']} , expected {d['expected_segments']} segments"
        off = r["off"]
        assert off["entries_after_more_work"] <= off["entries_after_disable"], \
            f"record_memory_history(enabled=None) did not stop recording: {off}"
        native = result_of("10-snapshot", "native")
        miss = missing_keys(r["keys"], native["keys"])
        extra_top = sorted(set(native["keys"]["top"]) - set(r["keys"]["top"]))
        if mode == "mempool":
            p = r["pool"]
            assert p["torch_segments"] > 0, "PyTorch shows no segment of the MemPool"
            assert p["n_missing"] == 0, f"{p['n_missing']} of the pool's {p['torch_segments']} segments are not in symm's snapshot: {p['missing_in_symm']}"
            detail += f"; the pool's {p['torch_segments']} segments listed"
            if miss:
                detail += f"; keys native has and symm lacks (not judged in mempool mode): {miss}"
        else:
            assert not miss, f"keys native has and symm's snapshot lacks: {miss}"
            detail += "; every native segment/block/event key present"
        if extra_top:
            detail += f"; top-level keys only native has: {extra_top}"
        return detail + f"; dump {d['bytes']} B loads without symm"

    judge("10-snapshot", mode, fn)


if __name__ == "__main__":
    sys.exit(pytest.main([str(Path(__file__).resolve()), "-v", "-s", "-p", "no:cacheprovider"]))
