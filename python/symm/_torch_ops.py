"""libsymm's collectives as PyTorch custom operators (torch.library), so
that graphs made by torch.compile can hold them (fullgraph included):

    symm.register_torch_ops()   # once; done at `import symm` when torch is imported already
    y = torch.ops.symm.push_all_reduce(x, group.group_name)
    y = torch.ops.symm.all_reduce(x, group.group_name)   # the algorithm libsymm chooses
    s = torch.ops.symm.reduce_scatter(x, group.group_name)  # dim 0 split over the ranks
    a = torch.ops.symm.all_gather(x, group.group_name)      # dim 0 times the world size
    A, [Y] = torch.ops.symm.fused_all_gather_matmul(A_shard, [W], 0, group.group_name)
    Z = torch.ops.symm.fused_matmul_reduce_scatter(Y, W2, "sum", 0, group.group_name)

Each operator takes the process group by name (a string, which a compiled
graph can carry), returns new tensors and changes none of its inputs; its
fake implementation gives the shapes, dtypes, strides and device, so
torch.compile traces it without running it. The fused operators have
PyTorch's schemas (torch.ops.symm_mem.fused_all_gather_matmul,
fused_matmul_reduce_scatter).
"""

# No `from __future__ import annotations` here: torch.library reads the
# operators' annotations as types, and torch.Tensor is imported lazily.
_registered = False
_custom_ops_registered = False  # the custom_op part, done once even if the fused part fails
_libs: list = []  # torch.library.Library objects: an operator lives as long as its library

FUSED_SCHEMAS = {
    "fused_all_gather_matmul": "fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, "
                               "*, bool return_A=True) -> (Tensor?, Tensor[])",
    "fused_matmul_reduce_scatter": "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, "
                                   "str group_name) -> Tensor",
}


def reduce_scatter_shape(fn: str, shape: tuple, world: int) -> tuple:
    """The shape torch.ops.symm.reduce_scatter returns for an input of shape:
    dim 0 split over the world (reduce_scatter_tensor's), torch-free."""
    if len(shape) == 0:
        raise ValueError(f"{fn}: the tensor has no dims: want at least one, whose size splits over {world} ranks")
    if shape[0] % world:
        raise ValueError(f"{fn}: dim 0 of the tensor (shape {list(shape)}) has {shape[0]} elements, which do not "
                         f"split evenly over {world} ranks")
    return (shape[0] // world,) + tuple(shape[1:])


def all_gather_shape(fn: str, shape: tuple, world: int) -> tuple:
    """The shape torch.ops.symm.all_gather returns for an input of shape: dim
    0 times the world (all_gather_into_tensor's; a 0-dim tensor gives
    (world,)), torch-free."""
    del fn
    if len(shape) == 0:
        return (world,)
    return (shape[0] * world,) + tuple(shape[1:])


def _padded_count(n: int, elem: int) -> int:
    """Elements per share that the kernels take (a share's bytes a multiple
    of 4): an odd count of 2-byte elements gets one more, moved and dropped."""
    return n + (n * elem) % 4 // elem


def _aligned(tensor):
    """tensor contiguous at a 4-byte aligned address (the kernels read
    local inputs 4 bytes at a time; a view one bfloat16 into a tensor is
    copied)."""
    t = tensor.contiguous()
    return t if t.data_ptr() % 4 == 0 else t.clone()


def _scratch_args(fn: str, tensor, group_name: str):
    """The checks torch.ops.symm.reduce_scatter and all_gather share: a CUDA
    tensor of a dtype the kernels take. Returns the group's ProcessGroup and
    the dtype's name as the handle's calls take it ("bfloat16")."""
    from ._collectives import _resolve_group, _torch_dtype_code

    if tensor.device.type != "cuda":
        raise ValueError(f"{fn}: the tensor is on {tensor.device}: want a CUDA tensor")
    _torch_dtype_code(fn, tensor.dtype)
    pg = _resolve_group(group_name)
    return pg, str(tensor.dtype).removeprefix("torch.")


def _reduce_scatter_tensor(tensor, group_name: str):
    """torch.ops.symm.reduce_scatter on any CUDA tensor: through the group's
    symmetric scratch buffer (the one symm.all_reduce uses)."""
    import torch

    from ._collectives import _all_reduce_scratch
    from ._symmetric import _current_raw_stream, _tensor_at

    fn = "torch.ops.symm.reduce_scatter"
    pg, dtype = _scratch_args(fn, tensor, group_name)
    world = pg.size()
    out = torch.empty(reduce_scatter_shape(fn, tuple(tensor.shape), world), dtype=tensor.dtype, device=tensor.device)
    n = out.numel()
    if n == 0:
        return out
    t = _aligned(tensor)
    dev, es = t.device, t.element_size()
    count = _padded_count(n, es)
    h = _all_reduce_scratch(pg, dev, world * count * es)
    stream = _current_raw_stream(dev)
    if count == n:
        h.reduce_scatter_ptr(0, n, dtype, out=out.data_ptr(), local_input=t.data_ptr(), stream=stream)
        return out
    _tensor_at(h.buffer_ptrs[h.rank], (world, count), t.dtype, dev)[:, :n].copy_(t.view(world, n))
    tmp = torch.empty(count, dtype=t.dtype, device=dev)
    h.reduce_scatter_ptr(0, count, dtype, out=tmp.data_ptr(), stream=stream)
    out.view(-1).copy_(tmp[:n])
    return out


def _all_gather_tensor(tensor, group_name: str):
    """torch.ops.symm.all_gather on any CUDA tensor: through the group's
    symmetric scratch buffer (the one symm.all_reduce uses)."""
    import torch

    from ._collectives import _all_reduce_scratch
    from ._symmetric import _current_raw_stream, _tensor_at

    fn = "torch.ops.symm.all_gather"
    pg, dtype = _scratch_args(fn, tensor, group_name)
    world, rank = pg.size(), pg.rank()
    out = torch.empty(all_gather_shape(fn, tuple(tensor.shape), world), dtype=tensor.dtype, device=tensor.device)
    n = tensor.numel()
    if n == 0:
        return out
    t = _aligned(tensor)
    dev, es = t.device, t.element_size()
    count = _padded_count(n, es)
    h = _all_reduce_scratch(pg, dev, world * count * es)
    stream = _current_raw_stream(dev)
    if count == n:
        h.all_gather_ptr(0, n, dtype, out=out.data_ptr(), local_input=t.data_ptr(), stream=stream)
        return out
    _tensor_at(h.buffer_ptrs[h.rank] + rank * count * es, (n,), t.dtype, dev).copy_(t.view(-1))
    tmp = torch.empty(world * count, dtype=t.dtype, device=dev)
    h.all_gather_ptr(0, count, dtype, out=tmp.data_ptr(), stream=stream)
    out.view(world, n).copy_(tmp.view(world, count)[:, :n])
    return out


def _group_size(group_name: str) -> int:
    from ._fused import _group_size as size

    return size(group_name)


def register_torch_ops() -> None:
    """Registers torch.ops.symm.* (idempotent). Needs torch."""
    global _registered, _custom_ops_registered
    if _registered:
        return
    import torch

    from . import _fused

    if not _custom_ops_registered:
        _register_custom_ops(torch)
        _custom_ops_registered = True

    # The fused operators return (Tensor?, Tensor[]), which custom_op cannot
    # infer: they are defined by schema, as PyTorch defines its own.
    lib = torch.library.Library("symm", "FRAGMENT")
    tag = getattr(torch._C.Tag, "needs_fixed_stride_order", None)
    tags = (tag,) if tag is not None else ()
    impls = {
        "fused_all_gather_matmul": (_fused.fused_all_gather_matmul, _fused._fused_all_gather_matmul_fake),
        "fused_matmul_reduce_scatter": (_fused.fused_matmul_reduce_scatter, _fused._fused_matmul_reduce_scatter_fake),
    }
    register_fake = getattr(torch.library, "register_fake", None)
    for name, (impl, fake) in impls.items():
        lib.define(FUSED_SCHEMAS[name], tags=tags)
        lib.impl(name, impl, "CUDA")
        if register_fake is not None:
            register_fake(f"symm::{name}", fake, lib=lib)
        else:  # torch < 2.4
            lib.impl(name, fake, "Meta")
    _libs.append(lib)
    _registered = True


def _register_custom_ops(torch) -> None:
    """The operators that torch.library.custom_op defines from annotations."""
    from ._collectives import all_reduce, push_all_reduce

    @torch.library.custom_op("symm::push_all_reduce", mutates_args=())
    def _push_all_reduce(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
        t = tensor.contiguous()
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return push_all_reduce(t, group=group_name, out=out)

    @_push_all_reduce.register_fake
    def _(tensor, group_name):
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)

    @torch.library.custom_op("symm::all_reduce", mutates_args=())
    def _all_reduce(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
        t = tensor.contiguous()
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return all_reduce(t, group=group_name, out=out)

    @_all_reduce.register_fake
    def _(tensor, group_name):
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)

    @torch.library.custom_op("symm::reduce_scatter", mutates_args=())
    def _reduce_scatter(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
        return _reduce_scatter_tensor(tensor, group_name)

    @_reduce_scatter.register_fake
    def _(tensor, group_name):
        shape = reduce_scatter_shape("torch.ops.symm.reduce_scatter", tuple(tensor.shape), _group_size(group_name))
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)

    @torch.library.custom_op("symm::all_gather", mutates_args=())
    def _all_gather(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
        return _all_gather_tensor(tensor, group_name)

    @_all_gather.register_fake
    def _(tensor, group_name):
        shape = all_gather_shape("torch.ops.symm.all_gather", tuple(tensor.shape), _group_size(group_name))
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
