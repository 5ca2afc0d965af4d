"""Process groups as libsymm's Python functions take them: a ProcessGroup,
its name (PyTorch's group_name, which compiled graphs carry) or None (the
default group). The one place that turns them into a ProcessGroup, and the
one place that learns when torch destroys one (ensure_destroy_hook).
torch.distributed is imported at the first call, once.

The package's modules form a DAG; this one is at the bottom (it imports
none of them), so that every module that keeps per-group state registers
its step here instead of importing the others:

    _errors, _loader, _pool, _groups   the ctypes layer; groups
    _store                             Store, each group's store
    _backends                          backend choice and bootstrap
    _symmetric                         blocks, handles, rendezvous
    _fused, _group_state, _collectives collectives on symmetric memory
"""

from __future__ import annotations

import functools
import threading
import warnings

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


# ---- destroy_process_group -----------------------------------------------------
#
# What symm keeps for a group (the collectives' state and symmetric buffers,
# the fused workspaces, libsymm's store of the group) goes when torch destroys
# the group, before torch tears it down (its store and communicator still
# work then: freeing a symmetric buffer is collective under the NCCL and
# NVSHMEM backends). destroy_process_group is wrapped once per process
# (ensure_destroy_hook); the wrapper runs every registered step, by order,
# then torch's own. Each module registers its own step when it is imported.
# A group destroyed through a destroy_process_group imported before the
# wrapper was installed keeps its state until the process ends: a leak,
# never a wrong hit (the states are keyed by the group object).

BUFFERS = 0  # _group_state: the groups' states, their buffers, then _fused's workspaces
STORES = 1  # _store: the group's store, last (the group's link goes with it)

_steps: list = []  # (order, registration, step), sorted; under _hook_lock
_hook_lock = threading.Lock()
_hooked = False  # destroy_process_group is wrapped (under _hook_lock)


def add_destroy_step(order: int, step) -> None:
    """Registers step(groups), run at destroy_process_group(group) before
    torch's own: groups is None when every group goes (group None or WORLD,
    as torch destroys them all), else [group]. Steps run by order (BUFFERS,
    then STORES), then by registration."""
    with _hook_lock:
        _steps.append((order, len(_steps), step))
        _steps.sort(key=lambda s: s[:2])


def ensure_destroy_hook() -> None:
    """Wraps torch.distributed.destroy_process_group (and distributed_c10d's,
    the same function) so that it runs the registered steps first. Once per
    process: a function already wrapped is left alone, so a second import of
    this module does not wrap it twice. Called at a group's first use."""
    global _hooked
    with _hook_lock:
        if _hooked:
            return
        dist = torch_dist()
        mods = [m for m in (dist, getattr(dist, "distributed_c10d", None)) if m is not None]
        orig = next((getattr(m, "destroy_process_group") for m in mods if hasattr(m, "destroy_process_group")), None)
        if orig is not None and not getattr(orig, "_symm_forgets_groups", False):
            @functools.wraps(orig)
            def destroy_process_group(group=None, *args, **kwargs):
                _forget(group)
                return orig(group, *args, **kwargs)

            destroy_process_group._symm_forgets_groups = True
            for m in mods:
                if getattr(m, "destroy_process_group", None) is orig:
                    m.destroy_process_group = destroy_process_group
        _hooked = True


def _forget(group) -> None:
    """destroy_process_group(group)'s first step: every registered step.
    Never raises: a failure must not keep torch from destroying the group;
    it is reported as a warning, and the next step still runs."""
    try:
        every = group is None or group is getattr(torch_dist().group, "WORLD", None)
    except Exception:  # noqa: BLE001
        every = group is None
    with _hook_lock:
        steps = [s for _, _, s in _steps]
    for step in steps:
        try:
            step(None if every else [group])
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"symm: forgetting the state of a destroyed process group: {e}", RuntimeWarning, stacklevel=4)
