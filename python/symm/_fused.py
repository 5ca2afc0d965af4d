"""Matmuls fused with an all-gather or a reduce-scatter over symmetric memory
(async tensor parallelism): PyTorch's fused_all_gather_matmul and
fused_matmul_reduce_scatter (torch.distributed._symmetric_memory, and the
operators torch.ops.symm_mem.*), with PyTorch's signatures, results, shapes
and strides::

    A, [Y] = symm.fused_all_gather_matmul(A_shard, [W1], 0, group.group_name)
    Z = symm.fused_matmul_reduce_scatter(Y, W2, "sum", 0, group.group_name)

The copy engines move the data while the SMs multiply; nothing uses
multicast.

All-gather then matmul: every rank copies its shard into its slot of the
group's fused workspace (a symmetric block per group and device) and meets
its peers (barrier, channel 1). The current stream then multiplies the local
shard at once, while a side stream copies the peers' shards out of their
workspaces into the gathered A in the order rank+1, rank+2, ... (at each step
every rank reads a different peer), recording an event after each; the
current stream multiplies each peer's shard once its event has passed.
Gathering along A's last dim (the matmul's reduction dim) multiplies each
shard by its rows of B and accumulates (addmm) in the output.

Matmul then reduce-scatter: the current stream multiplies the part of A @ B
that rank+1 owns, then rank+2's, ... into a staging tensor, and the side
stream pushes each one, after its event, into its owner's workspace at slot
`rank`; this rank's own part goes straight into its own slot. After the
barrier (channel 1) this rank's slots hold every rank's partial of its part,
reduced in one torch.sum / torch.mean over the rank dim (float32
accumulation for 16-bit types, rounded once), as PyTorch's reduce_partials.

Why no call overwrites what a peer still reads. The workspace is shared by
every fused call of the group on the device. Every access a rank makes to any
rank's workspace in a call (its copy-in, its reads of peers' slots, its
pushes into peers' slots, its reduction of its own slots) comes, in stream
order or through an event joining the side stream into the current one,
before its signal in the call's final barrier (channel 0). A rank leaves that
barrier only once every peer has signalled it, so every peer has finished
every access of the call. The next call's first access on this rank follows
the barrier in stream order (same stream; when the current stream changed,
the call waits on an event recorded after the last final barrier), so its
copy-in and its pushes never meet a peer's reads of the previous call, and
no peer's push of the next call reaches a slot this rank is still reducing.
Within a call the middle barrier (channel 1) orders writes before reads:
every rank's copy-in (all-gather) or every push into this rank
(reduce-scatter) is complete when a rank leaves it. The two barriers use two
channels, so that the signal of a rank already at the final barrier is never
taken by a peer still waiting in the middle one.

A call whose shapes need a larger workspace replaces it (every rank makes the
same calls with the same shapes, so all replace it at the same call): once
this device has finished the old one's last final barrier, every peer has
finished with it too, and it is freed. Replacing it is refused during CUDA
graph capture: make one call of the largest shape first.
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Sequence

from ._errors import ErrorCode, SymmError

FUSED_DTYPES = ("float16", "bfloat16", "float32", "float64")
REDUCE_OPS = ("sum", "avg")
WORKSPACE_MIN_BYTES = 1 << 20
_VIEW_CACHE_LIMIT = 256

# ---- torch-free: argument checks and plans ------------------------------------


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def check_int(fn: str, name: str, value) -> int:
    """value as an int; TypeError naming the argument for anything else
    (bool included: True is not a dimension)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{fn}: {name} must be an int, not {type(value).__name__} ({value!r})")
    return operator.index(value)


def check_dim(fn: str, name: str, value, ndim: int, what: str) -> int:
    """A dimension of a tensor with ndim dims (what names it). Negative dims
    are refused, as PyTorch's fused operators refuse them."""
    dim = check_int(fn, name, value)
    if not 0 <= dim < ndim:
        raise ValueError(f"{fn}: {name}={dim} is not a dimension of {what}: want 0 .. {ndim - 1}"
                         + (" (negative dims are refused, as PyTorch's fused operators do)" if dim < 0 else ""))
    return dim


def check_group_name(fn: str, group_name) -> str:
    """The process group's name: a str (PyTorch's group_name), or a
    ProcessGroup, whose group_name is taken."""
    if isinstance(group_name, str):
        if not group_name:
            raise ValueError(f"{fn}: group_name is empty: want a process group's name (group.group_name)")
        return group_name
    name = getattr(group_name, "group_name", None)
    if isinstance(name, str) and name:
        return name
    raise TypeError(f"{fn}: group_name must be a process group's name (str) or a ProcessGroup, "
                    f"not {type(group_name).__name__}")


def check_bool(fn: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be a bool, not {type(value).__name__} ({value!r})")
    return value


def check_reduce_op(fn: str, reduce_op) -> str:
    if not isinstance(reduce_op, str):
        raise TypeError(f"{fn}: reduce_op must be a str ('sum' or 'avg'), not {type(reduce_op).__name__}")
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"{fn}: reduce_op {reduce_op!r}: want 'sum' or 'avg'")
    return reduce_op


def check_dtype_name(fn: str, name: str, dtype_name: str) -> None:
    """dtype_name as torch prints it without "torch." ("bfloat16")."""
    if dtype_name not in FUSED_DTYPES:
        raise ValueError(f"{fn}: {name} is torch.{dtype_name}: want torch.float16, torch.bfloat16, torch.float32 "
                         "or torch.float64")


def _check_world(fn: str, world: int) -> int:
    world = int(world)
    if world < 1:
        raise ValueError(f"{fn}: the group has {world} ranks")
    return world


def peer_order(rank: int, world: int) -> list:
    """The peers in the order a rank serves them: rank+1, rank+2, ... (mod
    world), so that at each step every rank works with a different peer."""
    return [(rank + s) % world for s in range(1, world)]


def workspace_bytes(nbytes: int) -> int:
    """The size of a fused workspace for a call needing nbytes: a power of
    two, at least 1 MiB, so that growing shapes reallocate it rarely."""
    return max(WORKSPACE_MIN_BYTES, 1 << (max(int(nbytes), 1) - 1).bit_length())


class AllGatherMatmulPlan(NamedTuple):
    """What fused_all_gather_matmul computes for given shapes."""

    gather_dim: int
    last: bool  # gathering along A's last dim: K is sharded, each shard meets its rows of B
    rows: int  # rows of the shard flattened to a matrix (gather dim first)
    cols: int  # its columns (A_shard's last dim)
    A_shape: tuple  # the gathered A
    out_shapes: tuple  # of A @ B, for each B
    shard_numel: int


def all_gather_matmul_plan(shard_shape: Sequence[int], b_shapes: Sequence[Sequence[int]], gather_dim, world: int,
                           fn: str = "fused_all_gather_matmul") -> AllGatherMatmulPlan:
    """Checks fused_all_gather_matmul's shapes (torch-free): ValueError or
    TypeError naming the bad argument."""
    shard = tuple(int(s) for s in shard_shape)
    nd = len(shard)
    if nd < 2:
        raise ValueError(f"{fn}: A_shard must have at least 2 dims (a matrix, or a batch of them), "
                         f"got shape {list(shard)}")
    g = check_dim(fn, "gather_dim", gather_dim, nd, f"A_shard of shape {list(shard)}")
    world = _check_world(fn, world)
    last = g == nd - 1
    cols = shard[-1]
    k = cols * world if last else cols
    A_shape = list(shard)
    A_shape[g] *= world
    outs = []
    for i, b in enumerate(b_shapes):
        b = tuple(int(s) for s in b)
        if len(b) != 2:
            raise ValueError(f"{fn}: Bs[{i}] must be a matrix (2 dims), got shape {list(b)}")
        if b[0] != k:
            if last:
                raise ValueError(f"{fn}: Bs[{i}] has {b[0]} rows; gathering A_shard's last dim ({cols} per rank) "
                                 f"over {world} ranks gives A {k} columns, so A @ Bs[{i}] needs {k} rows")
            raise ValueError(f"{fn}: Bs[{i}] has {b[0]} rows and A_shard's last dim is {cols}: "
                             f"A @ Bs[{i}] needs them equal")
        outs.append(tuple(A_shape[:-1]) + (b[1],))
    return AllGatherMatmulPlan(g, last, _prod(shard[:-1]), cols, tuple(A_shape), tuple(outs), _prod(shard))


class MatmulReduceScatterPlan(NamedTuple):
    """What fused_matmul_reduce_scatter computes for given shapes."""

    scatter_dim: int
    last: bool  # scattering along the output's last dim: each rank owns columns of B
    chunk: tuple  # (rows, cols) of the part of A @ B that one rank owns, as a matrix
    out_shape: tuple  # this rank's result


def matmul_reduce_scatter_plan(a_shape: Sequence[int], b_shape: Sequence[int], reduce_op, scatter_dim, world: int,
                               fn: str = "fused_matmul_reduce_scatter") -> MatmulReduceScatterPlan:
    """Checks fused_matmul_reduce_scatter's shapes and reduce_op
    (torch-free): ValueError or TypeError naming the bad argument."""
    a = tuple(int(s) for s in a_shape)
    b = tuple(int(s) for s in b_shape)
    nd = len(a)
    if nd < 2:
        raise ValueError(f"{fn}: A must have at least 2 dims (a matrix, or a batch of them), got shape {list(a)}")
    if len(b) != 2:
        raise ValueError(f"{fn}: B must be a matrix (2 dims), got shape {list(b)}")
    check_reduce_op(fn, reduce_op)
    s = check_dim(fn, "scatter_dim", scatter_dim, nd, f"A of shape {list(a)}")
    world = _check_world(fn, world)
    if b[0] != a[-1]:
        raise ValueError(f"{fn}: B has {b[0]} rows and A's last dim is {a[-1]}: A @ B needs them equal")
    full = list(a[:-1]) + [b[1]]
    if full[s] % world:
        raise ValueError(f"{fn}: dim {s} of A @ B (shape {full}) has {full[s]} elements, which do not split "
                         f"evenly over {world} ranks")
    out = list(full)
    out[s] //= world
    rows = _prod(a[:-1])
    last = s == nd - 1
    chunk = (rows, b[1] // world) if last else (rows // world, b[1])
    return MatmulReduceScatterPlan(s, last, chunk, tuple(out))


# ---- torch layer ----------------------------------------------------------------


def _check_tensor(fn: str, name: str, t, torch) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, not {type(t).__name__}")


def _check_operand(fn: str, name: str, t, ref, ref_name: str, torch) -> None:
    """t: a CUDA tensor of a dtype the fused operators take, on ref's device
    and of ref's dtype."""
    _check_tensor(fn, name, t, torch)
    if t.device.type != "cuda":
        raise ValueError(f"{fn}: {name} is on {t.device}: the fused operators take CUDA tensors")
    check_dtype_name(fn, name, str(t.dtype).replace("torch.", ""))
    if t is ref:
        return
    if t.device != ref.device:
        raise ValueError(f"{fn}: {name} is on {t.device} and {ref_name} on {ref.device}: want one device")
    if t.dtype != ref.dtype:
        raise ValueError(f"{fn}: {name} is {t.dtype} and {ref_name} {ref.dtype}: want one dtype")


def check_all_gather_matmul_args(fn: str, torch, A_shard, Bs, group_name, return_A) -> tuple:
    """The checks that need no process group: (group name, list of Bs).
    torch may be a stand-in with Tensor (tests)."""
    name = check_group_name(fn, group_name)
    _check_tensor(fn, "A_shard", A_shard, torch)
    if isinstance(Bs, torch.Tensor):
        raise TypeError(f"{fn}: Bs must be a list of tensors, not a Tensor (pass [B])")
    if not isinstance(Bs, (list, tuple)):
        raise TypeError(f"{fn}: Bs must be a list of tensors, not {type(Bs).__name__}")
    Bs = list(Bs)
    _check_operand(fn, "A_shard", A_shard, A_shard, "A_shard", torch)
    for i, B in enumerate(Bs):
        _check_operand(fn, f"Bs[{i}]", B, A_shard, "A_shard", torch)
    check_bool(fn, "return_A", return_A)
    return name, Bs


def check_matmul_reduce_scatter_args(fn: str, torch, A, B, group_name) -> str:
    """The checks that need no process group: the group name."""
    name = check_group_name(fn, group_name)
    _check_operand(fn, "A", A, A, "A", torch)
    _check_operand(fn, "B", B, A, "A", torch)
    return name


def _group(name: str):
    """(process group, rank, world size) of a group name."""
    from ._groups import resolve_group

    pg = resolve_group(name)
    return pg, pg.rank(), pg.size()


def _group_size(name: str) -> int:
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    get = getattr(c10d, "_get_group_size_by_name", None)
    if get is not None:
        return get(name)
    return c10d._resolve_process_group(name).size()


class _Workspace:
    """A group's fused workspace on one device: the symmetric block, its
    handle, cached views of every rank's buffer, and an event recorded after
    the last call's final barrier."""

    def __init__(self, ptr: int, size: int, handle):
        self.ptr = ptr
        self.size = size
        self.handle = handle
        self.views: dict = {}
        self.done = None

    def view(self, rank: int, shape: tuple, dtype, offset: int = 0):
        """A tensor over rank's buffer: shape elements of dtype from element offset."""
        key = (rank, tuple(shape), dtype, offset)
        v = self.views.get(key)
        if v is None:
            if len(self.views) >= _VIEW_CACHE_LIMIT:
                self.views.clear()
            v = self.views[key] = self.handle.get_buffer(rank, tuple(shape), dtype, offset)
        return v


_workspaces: dict = {}  # (group name, device index) -> _Workspace
_side_streams: dict = {}  # device index -> torch.cuda.Stream


def forget_group_workspaces(names=None) -> None:
    """Frees the fused workspaces of the groups named (every group's for
    None): destroy_process_group's step (_collectives' hook), so that a
    group made later under the same name (WORLD is "0" again) never finds
    the old group's workspace and its peers. Every rank destroys its groups
    in the same order, and the device's work is done first (freeing is
    collective under the NCCL and NVSHMEM backends)."""
    keys = [k for k in _workspaces if names is None or k[0] in names]
    if not keys:
        return
    import torch

    from ._symmetric import symm_free

    for dev in sorted({k[1] for k in keys}):
        torch.cuda.synchronize(dev)
    for k in sorted(keys):
        symm_free(_workspaces.pop(k).ptr)


def _workspace(fn: str, name: str, pg, rank: int, world: int, dev, nbytes: int) -> _Workspace:
    """The group's fused workspace on dev, at least nbytes large: allocated
    and rendezvoused on first use, replaced when a call needs more
    (collective: every rank makes the same calls with the same shapes)."""
    import torch

    from ._symmetric import _ensure_backend, _group_store, rendezvous_ptr, symm_alloc, symm_free

    key = (name, dev.index)
    ws = _workspaces.get(key)
    if ws is not None and ws.size >= nbytes:
        return ws
    if torch.cuda.is_current_stream_capturing():
        raise SymmError(ErrorCode.INVALID, f"{fn}: group {name} needs a fused workspace of {nbytes} bytes on {dev} "
                        f"(it has {ws.size if ws is not None else 0}), which cannot be allocated during CUDA graph "
                        "capture: make one call of the largest shape before capturing")
    size = workspace_bytes(nbytes)
    if ws is not None:
        # The old block's last use ended with a final barrier: once this
        # device is past it, every peer is done with this rank's block.
        del _workspaces[key]
        torch.cuda.synchronize(dev)
        symm_free(ws.ptr)
    _ensure_backend(dev.index)
    ptr = symm_alloc(size, dev.index)
    try:
        h = rendezvous_ptr(ptr, _group_store(pg), f"torch-{name}", rank, world, dev)
    except BaseException:
        symm_free(ptr)
        raise
    ws = _workspaces[key] = _Workspace(ptr, size, h)
    return ws


def _side_stream(dev):
    import torch

    s = _side_streams.get(dev.index)
    if s is None:
        s = _side_streams[dev.index] = torch.cuda.Stream(device=dev)
    return s


def _begin(ws: _Workspace, cur) -> bool:
    """Orders this call after the last one's final barrier when the current
    stream changed; returns whether the stream is capturing a graph (then
    no event crosses the capture's edge)."""
    import torch

    capturing = torch.cuda.is_current_stream_capturing()
    if ws.done is not None and not capturing:
        cur.wait_event(ws.done)
    return capturing


def _end(ws: _Workspace, cur, capturing: bool) -> None:
    """The final barrier. Every access this call made to any workspace, on
    either stream (the side stream is joined into cur before this), comes
    before this rank's signal; a rank leaves the barrier only when every
    peer has signalled, so no peer still reads or writes any workspace for
    this call, and the next call may write (the module's documentation has
    the whole argument)."""
    import torch

    ws.handle.barrier(channel=0, stream=cur)
    if not capturing:
        ev = torch.cuda.Event()
        ev.record(cur)
        ws.done = ev


def _ag_layout(A_shard, Bs, g: int, world: int):
    """PyTorch's layout of fused_all_gather_matmul: (last, leading dims, the
    shard as a matrix, the gathered A as a matrix, the outputs as matrices).
    Also the fake implementation's."""
    last = g == A_shard.dim() - 1
    if last:
        leading = list(A_shard.shape[:-1])
        shard = A_shard.flatten(0, -2)
    else:
        moved = A_shard.movedim(g, 0)
        leading = [world] + list(moved.shape[:-1])
        shard = moved.flatten(0, -2)
    rows, cols = shard.shape[0], shard.shape[1]
    A_flat = shard.new_empty(rows * world, cols)
    if last:
        outputs = [shard.new_empty(rows, B.shape[1], dtype=B.dtype) for B in Bs]
    else:
        outputs = [A_flat.new_empty(rows * world, B.shape[1], dtype=B.dtype) for B in Bs]
    return last, leading, shard, A_flat, outputs


def _ag_finish(last: bool, leading: list, g: int, world: int, A_flat, outputs, return_A: bool):
    """The matrices back in A_shard's dims, with PyTorch's strides."""
    import torch

    if last:
        A = None
        if return_A:
            rows = A_flat.shape[0] // world
            A = torch.cat([A_flat.narrow(0, r * rows, rows) for r in range(world)], dim=-1)
            A = A.view(*leading, A.shape[-1])
        return A, [o.view(*leading, o.shape[-1]) for o in outputs]

    def unflatten(t):
        return t.view(*leading, t.shape[-1]).flatten(0, 1).movedim(0, g)

    return (unflatten(A_flat) if return_A else None), [unflatten(o) for o in outputs]


def fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    """PyTorch's fused_all_gather_matmul: A is the all-gather of A_shard
    along gather_dim over the group (rank r's shard at place r), and the
    result is (A, [A @ B for B in Bs]), or (None, [...]) with
    return_A=False; shapes and strides as PyTorch's. Every rank calls it
    with the same shapes. A_shard and every B are CUDA tensors of one device
    and one dtype (float16, bfloat16, float32, float64); B is a matrix whose
    rows match A's last dim (gathering along A's last dim: world × A_shard's).
    In stream order on the current stream: the peers' shards are copied by
    the copy engines on a side stream while the current one multiplies (see
    the module's documentation). Raises TypeError or ValueError naming a bad
    argument (before any communication), SymmError as the barriers do."""
    fn = "fused_all_gather_matmul"
    from ._symmetric import _torch

    torch = _torch(f"symm.{fn}()")
    name, Bs = check_all_gather_matmul_args(fn, torch, A_shard, Bs, group_name, return_A)
    pg, rank, world = _group(name)
    plan = all_gather_matmul_plan(A_shard.shape, [B.shape for B in Bs], gather_dim, world, fn)
    g = plan.gather_dim
    last, leading, shard, A_flat, outputs = _ag_layout(A_shard, Bs, g, world)
    rows = plan.rows
    shards = [A_flat.narrow(0, r * rows, rows) for r in range(world)]
    if last:
        kc = plan.cols
        b_parts = [[B.narrow(0, r * kc, kc) for r in range(world)] for B in Bs]

        def consume(x, src: int, first: bool) -> None:
            for o, parts in zip(outputs, b_parts):
                if first:
                    torch.mm(x, parts[src], out=o)
                else:
                    o.addmm_(x, parts[src])
    else:
        out_parts = [[o.narrow(0, r * rows, rows) for r in range(world)] for o in outputs]

        def consume(x, src: int, first: bool) -> None:
            del first
            for B, parts in zip(Bs, out_parts):
                torch.mm(x, B, out=parts[src])

    dev = A_shard.device
    nbytes = plan.shard_numel * A_shard.element_size()
    if world == 1 or nbytes == 0:  # nothing to move
        shards[rank].copy_(shard)
        consume(shard, rank, True)
        for src in peer_order(rank, world):
            consume(shards[src], src, False)
        return _ag_finish(last, leading, g, world, A_flat, outputs, return_A)

    ws = _workspace(fn, name, pg, rank, world, dev, nbytes)
    cur = torch.cuda.current_stream(dev)
    side = _side_stream(dev)
    capturing = _begin(ws, cur)
    sshape, dtype = tuple(shard.shape), shard.dtype
    ws.view(rank, sshape, dtype).copy_(shard)
    ws.handle.barrier(channel=1, stream=cur)  # every rank's shard is in its workspace
    side.wait_stream(cur)
    consume(shard, rank, True)
    for src in peer_order(rank, world):
        with torch.cuda.stream(side):
            shards[src].copy_(ws.view(src, sshape, dtype))
        ev = torch.cuda.Event()
        ev.record(side)
        cur.wait_event(ev)
        consume(shards[src], src, False)
    if return_A:
        with torch.cuda.stream(side):
            shards[rank].copy_(shard)
    cur.wait_stream(side)
    _end(ws, cur, capturing)
    return _ag_finish(last, leading, g, world, A_flat, outputs, return_A)


def _fused_all_gather_matmul_fake(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    """Shapes, dtypes and strides of fused_all_gather_matmul (torch.compile)."""
    world = _group_size(group_name)
    g = check_dim("fused_all_gather_matmul", "gather_dim", gather_dim, A_shard.dim(), "A_shard")
    last, leading, _, A_flat, outputs = _ag_layout(A_shard, Bs, g, world)
    return _ag_finish(last, leading, g, world, A_flat, outputs, return_A)


def _rs_reduce(stacked, plan: MatmulReduceScatterPlan, moved_shape: list, world: int, reduce_op: str):
    """This rank's result from its world partials (stacked: world × chunk
    elements, rank r's partial at slot r): one reduction over the rank dim
    writing a contiguous result (float32 accumulation for 16-bit types)."""
    if plan.last:
        v = stacked.view(world, *plan.chunk)
        out = v.sum(0) if reduce_op == "sum" else v.mean(0)
        return out.view(*plan.out_shape)
    s = plan.scatter_dim
    leading = [world] + list(moved_shape[:-1])
    leading[1] //= world
    v = stacked.view(*leading, plan.chunk[1]).movedim(1, s + 1).movedim(0, s)
    out = v.sum(s) if reduce_op == "sum" else v.mean(s)
    return out if out.is_contiguous() else out.contiguous()


def fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    """PyTorch's fused_matmul_reduce_scatter: the reduce-scatter of A @ B
    along scatter_dim over the group ("sum", or "avg": the sum over the
    world size), a new contiguous tensor whose scatter_dim is 1/world of A @
    B's, rank r's part being part r. Every rank calls it with the same
    shapes. A and B are CUDA tensors of one device and one dtype (float16,
    bfloat16, float32, float64), B a matrix with A's last dim as rows; A @ B's
    scatter_dim must split evenly. In stream order on the current stream:
    each part is pushed to its owner by the copy engines on a side stream
    while the current one multiplies the next (see the module's
    documentation); each rank's partials are reduced with float32
    accumulation for 16-bit types. Raises TypeError or ValueError naming a
    bad argument (before any communication), SymmError as the barriers do."""
    fn = "fused_matmul_reduce_scatter"
    from ._symmetric import _torch

    torch = _torch(f"symm.{fn}()")
    name = check_matmul_reduce_scatter_args(fn, torch, A, B, group_name)
    pg, rank, world = _group(name)
    plan = matmul_reduce_scatter_plan(A.shape, B.shape, reduce_op, scatter_dim, world, fn)
    rc, nc = plan.chunk
    ce = rc * nc
    if plan.last:
        a2 = A.flatten(0, -2)
        moved_shape = list(A.shape)

        def produce(d: int, out) -> None:
            torch.mm(a2, B.narrow(1, d * nc, nc), out=out)
    else:
        moved = A.movedim(plan.scatter_dim, 0)
        moved_shape = list(moved.shape)
        x = moved.flatten(0, -2)

        def produce(d: int, out) -> None:
            torch.mm(x.narrow(0, d * rc, rc), B, out=out)

    dev = A.device
    if world == 1 or ce == 0:  # nothing to move
        stacked = A.new_empty(world * ce)
        if world == 1:
            produce(0, stacked.view(rc, nc))
        return _rs_reduce(stacked, plan, moved_shape, world, reduce_op)

    ws = _workspace(fn, name, pg, rank, world, dev, world * ce * A.element_size())
    cur = torch.cuda.current_stream(dev)
    side = _side_stream(dev)
    capturing = _begin(ws, cur)
    peers = peer_order(rank, world)
    stage = A.new_empty((len(peers), rc, nc))
    for i, d in enumerate(peers):
        produce(d, stage[i])
        ev = torch.cuda.Event()
        ev.record(cur)
        side.wait_event(ev)
        with torch.cuda.stream(side):
            ws.view(d, (rc, nc), A.dtype, rank * ce).copy_(stage[i])  # into d's slot `rank`
    produce(rank, ws.view(rank, (rc, nc), A.dtype, rank * ce))
    cur.wait_stream(side)
    ws.handle.barrier(channel=1, stream=cur)  # every peer's push into this rank is complete
    out = _rs_reduce(ws.view(rank, (world * ce,), A.dtype), plan, moved_shape, world, reduce_op)
    _end(ws, cur, capturing)
    return out


def _fused_matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    """Shape and dtype of fused_matmul_reduce_scatter (torch.compile): contiguous."""
    world = _group_size(group_name)
    s = check_dim("fused_matmul_reduce_scatter", "scatter_dim", scatter_dim, A.dim(), "A")
    shape = list(A.shape[:-1]) + [B.shape[1]]
    shape[s] = shape[s] // world
    return A.new_empty(shape)
