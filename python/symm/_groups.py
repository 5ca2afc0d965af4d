"""Process groups as libsymm's Python functions take them: a ProcessGroup,
its name (PyTorch's group_name, which compiled graphs carry) or None (the
default group). The one place that turns them into a ProcessGroup.
torch.distributed is imported at the first call, once."""

from __future__ import annotations

_dist = None  # torch.distributed, once imported: no import statement per call


def torch_dist():
    """torch.distributed, imported once."""
    global _dist
    if _dist is None:
        import torch.distributed as dist

        _dist = dist
    return _dist


def resolve_group(group):
    """The process group for a ProcessGroup, its name or None (WORLD, or
    None before init_process_group and after destroy_process_group)."""
    if group is None:
        return torch_dist().group.WORLD
    if isinstance(group, str):
        return torch_dist().distributed_c10d._resolve_process_group(group)
    return group
