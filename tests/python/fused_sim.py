"""The fused matmul operators' protocol on the CPU: WORLD threads are the
ranks, each rank's workspace is a CPU tensor every thread can reach, a
barrier is a threading.Barrier, streams and events are stand-ins (CPU work
runs in call order). Checks, for float32 and bfloat16, every gather_dim and
scatter_dim of matrices and batches, return_A, several Bs, odd shapes:

- fused_all_gather_matmul: A equals the concatenation of the shards, A @ B
  matches, and A's and the outputs' strides are those of PyTorch's
  reference implementation (_fused_all_gather_matmul_fallback's layout);
- fused_matmul_reduce_scatter ("sum", "avg"): the share of the sum of every
  rank's A @ B, contiguous;
- a run of calls with changing shapes, all-gathers and reduce-scatters
  mixed, the threads free to run ahead between barriers: a rank that
  overwrote a workspace a peer still reads would give a wrong result;
- the fake implementations (torch.compile's) give the real results' shapes,
  dtypes and strides.

    python3 tests/python/fused_sim.py    # needs torch (CPU is enough); prints "ok"
"""

import contextlib
import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402

import symm._fused as F  # noqa: E402

WORLD = 4
WS_BYTES = 1 << 22


class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass


class _Event:
    def record(self, stream=None):
        pass


torch.cuda.current_stream = lambda device=None: _Stream()
torch.cuda.Stream = lambda device=None: _Stream()
torch.cuda.Event = lambda *a, **k: _Event()
torch.cuda.stream = lambda s: contextlib.nullcontext()
torch.cuda.is_current_stream_capturing = lambda: False
F._check_operand = lambda *a, **k: None  # CPU tensors stand for CUDA ones here

_local = threading.local()
_bufs = [torch.zeros(WS_BYTES, dtype=torch.uint8) for _ in range(WORLD)]
_barrier = threading.Barrier(WORLD, timeout=60)
_channels_seen = set()


class _Handle:
    def __init__(self, rank):
        self.rank = rank

    def barrier(self, channel=0, timeout_ms=0, stream=None):
        _channels_seen.add(channel)
        # A random pause first: ranks reach barriers in any order.
        if random.random() < 0.3:
            threading.Event().wait(random.random() * 2e-3)
        _barrier.wait()

    def get_buffer(self, rank, sizes, dtype, storage_offset=0):
        es = dtype.itemsize
        n = 1
        for s in sizes:
            n *= s
        assert (storage_offset + n) * es <= WS_BYTES, "view past the workspace"
        return _bufs[rank][storage_offset * es:(storage_offset + n) * es].view(dtype).view(tuple(sizes))


_workspaces = [F._Workspace(0, WS_BYTES, _Handle(r)) for r in range(WORLD)]


def _group(name):
    return None, _local.rank, WORLD


def _workspace(fn, name, pg, rank, world, dev, nbytes):
    assert nbytes <= WS_BYTES
    return _workspaces[rank]


F._group = _group
F._group_size = lambda name: WORLD
F._workspace = _workspace


def run_ranks(fn):
    """fn(rank) on WORLD threads at once; their results by rank."""
    out, errors = [None] * WORLD, []

    def body(r):
        _local.rank = r
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append((r, e))
            _barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0][1]
    return out


def randn(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def close(got, want, dtype):
    got, want = got.float(), want.float()
    return got.shape == want.shape and ((got - want).abs().max() <= TOL[dtype] * want.abs().max().clamp_min(1)).item()


def fallback_layout_ag(shards, Bs, g):
    """PyTorch's _fused_all_gather_matmul_fallback, the all-gather done by a
    concatenation: (A, outputs) with its strides."""
    w = len(shards)
    A = torch.cat([s.contiguous() for s in shards])  # all_gather_into_tensor
    if g == shards[0].dim() - 1:
        A_mm = torch.cat(A.chunk(w), dim=-1)
        return A_mm, [torch.matmul(A_mm.float(), B.float()) for B in Bs]
    A = A.view(w, *shards[0].shape).movedim(g + 1, 1).flatten(0, 1)
    return A.movedim(0, g), [torch.matmul(A.float(), B.float()).movedim(0, g) for B in Bs]


def check_all_gather(shape, g, ns, dtype, return_A, seed):
    k = shape[-1] * WORLD if g == len(shape) - 1 else shape[-1]
    shards = [randn(shape, dtype, seed + r) for r in range(WORLD)]
    Bs = [[randn((k, n), dtype, seed + 100 * r + i, k ** -0.5) for i, n in enumerate(ns)] for r in range(WORLD)]
    got = run_ranks(lambda r: F.fused_all_gather_matmul(shards[r], Bs[r], g, "sim", return_A=return_A))
    fake = F._fused_all_gather_matmul_fake(shards[0], Bs[0], g, "sim", return_A=return_A)
    where = f"all-gather {dtype} shard {list(shape)} gather_dim {g} Ns {ns} return_A {return_A}"
    for r in range(WORLD):
        A, outs = got[r]
        want_A, want_outs = fallback_layout_ag(shards, Bs[r], g)
        if return_A:
            assert A is not None and torch.equal(A, want_A), f"{where}: rank {r}: A"
            assert A.stride() == want_A.stride(), f"{where}: A strides {A.stride()} vs {want_A.stride()}"
            assert fake[0].shape == A.shape and fake[0].stride() == A.stride(), f"{where}: fake A"
        else:
            assert A is None and fake[0] is None, f"{where}: A returned"
        assert len(outs) == len(ns) == len(fake[1])
        for i, (o, w) in enumerate(zip(outs, want_outs)):
            assert o.dtype == dtype and close(o, w, dtype), f"{where}: rank {r} output {i}"
            assert o.stride() == w.stride(), f"{where}: output {i} strides {o.stride()} vs {w.stride()}"
            assert fake[1][i].shape == o.shape and fake[1][i].stride() == o.stride(), f"{where}: fake output {i}"


def check_reduce_scatter(ashape, n, s, op, dtype, seed):
    k = ashape[-1]
    As = [randn(ashape, dtype, seed + r) for r in range(WORLD)]
    Bs = [randn((k, n), dtype, seed + 50 + r, k ** -0.5) for r in range(WORLD)]
    got = run_ranks(lambda r: F.fused_matmul_reduce_scatter(As[r], Bs[r], op, s, "sim"))
    full = sum(torch.matmul(a.float(), b.float()) for a, b in zip(As, Bs))
    if op == "avg":
        full = full / WORLD
    fake = F._fused_matmul_reduce_scatter_fake(As[0], Bs[0], op, s, "sim")
    where = f"reduce-scatter {dtype} A {list(ashape)} N {n} scatter_dim {s} {op}"
    for r in range(WORLD):
        want = full.chunk(WORLD, dim=s)[r]
        assert got[r].dtype == dtype and close(got[r], want, dtype), f"{where}: rank {r}"
        assert got[r].is_contiguous(), f"{where}: strides {got[r].stride()}"
        assert fake.shape == got[r].shape and fake.stride() == got[r].stride(), f"{where}: fake"


def main():
    random.seed(1)
    w = WORLD
    seed = 0
    for dtype in (torch.float32, torch.bfloat16):
        for shape, g, ns in [((16, 32), 0, [8, 24, 4]), ((7, 5), 0, [3]), ((7, 5), 1, [3, 6]), ((2, 6, 10), 0, [4]),
                             ((8, 3, 10), 1, [4, 2]), ((8, 6, 5), 2, [7]), ((1, 9), 0, [2]), ((3, 4), 0, [])]:
            for return_A in (True, False):
                seed += 1000
                check_all_gather(shape, g, ns, dtype, return_A, seed)
        for ashape, n, s in [((4 * w, 16), 12, 0), ((3 * w, 7), 5, 0), ((9, 7), 2 * w, 1), ((2 * w, 3, 10), 6, 0),
                             ((2, 3 * w, 10), 6, 1), ((5, 3, 10), w, 2), ((w, 8), 3, 0)]:
            for op in ("sum", "avg"):
                seed += 1000
                check_reduce_scatter(ashape, n, s, op, dtype, seed)

    # Calls of changing shapes back to back; threads run ahead between barriers.
    plan = []
    for i in range(40):
        rows = [2, 64, 8, 256, 1][i % 5]
        plan.append(("ag", rows) if i % 2 == 0 else ("rs", rows))
    inputs = []
    for i, (kind, rows) in enumerate(plan):
        if kind == "ag":
            inputs.append([(randn((rows, 24), torch.float32, 7 * i + r), randn((24, 8), torch.float32, 9 * i + r))
                           for r in range(w)])
        else:
            inputs.append([(randn((rows * w, 24), torch.float32, 7 * i + r), randn((24, 8), torch.float32, 9 * i + r))
                           for r in range(w)])

    def burst(r):
        outs = []
        for (kind, _), per_rank in zip(plan, inputs):
            a, b = per_rank[r]
            if kind == "ag":
                outs.append(F.fused_all_gather_matmul(a, [b], 0, "sim", return_A=False)[1][0])
            else:
                outs.append(F.fused_matmul_reduce_scatter(a, b, "sum", 0, "sim"))
        return outs

    got = run_ranks(burst)
    for i, ((kind, _), per_rank) in enumerate(zip(plan, inputs)):
        for r in range(w):
            if kind == "ag":
                want = torch.cat([a for a, _ in per_rank]) @ per_rank[r][1]
            else:
                want = sum(a @ b for a, b in per_rank).chunk(w)[r]
            assert close(got[r][i], want, torch.float32), f"burst call {i} ({kind}) rank {r}"
    assert _channels_seen == {0, 1}, _channels_seen
    print("ok")


if __name__ == "__main__":
    main()
