"""libsymm's collectives as PyTorch custom operators (torch.library), so
that graphs made by torch.compile can hold them (fullgraph included):

    symm.register_torch_ops()   # once; done at `import symm` when torch is imported already
    y = torch.ops.symm.push_all_reduce(x, group.group_name)
    y = torch.ops.symm.all_reduce(x, group.group_name)   # the algorithm libsymm chooses

Each operator takes the process group by name (a string, which a compiled
graph can carry), returns a new contiguous tensor and changes none of its
inputs; its fake implementation gives the shape, dtype and device, so
torch.compile traces it without running it.
"""

# No `from __future__ import annotations` here: torch.library reads the
# operators' annotations as types, and torch.Tensor is imported lazily.
_registered = False


def register_torch_ops() -> None:
    """Registers torch.ops.symm.* (idempotent). Needs torch."""
    global _registered
    if _registered:
        return
    import torch

    from ._symmetric import all_reduce, push_all_reduce

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

    _registered = True
