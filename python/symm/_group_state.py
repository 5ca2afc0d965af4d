"""What the collectives keep for each live process group (the all-reduce
plans, the handle of each tensor's last rendezvous, the push workspace and
the scratch buffer), and how it goes when the group is destroyed."""

from __future__ import annotations

import threading

from ._fused import forget_group_workspaces
from ._groups import BUFFERS, add_destroy_step, ensure_destroy_hook, resolve_group as _resolve_group
from ._symmetric import symm_free

# ---- per-group state ------------------------------------------------------------
#
# What this module keeps for a process group (the all-reduce plans, the
# handle of each tensor's last rendezvous, the push workspace and the
# scratch buffer) lives in one _GroupState per live group, found by the
# group's id. Invariant: a state holds its group object, so while the state
# is registered no other object can have that id, and st.pg is the group
# the caller named: a new group can never be handed a dead one's state,
# whatever its id or name (WORLD is "0" again after destroy_process_group()
# and init_process_group()). None and a group's name are resolved to the
# group object on every call for the same reason: they name a different
# group after a destroy.
#
# destroy_process_group (wrapped once by _groups.ensure_destroy_hook) drops
# the states of the groups it destroys and frees their buffers before torch
# tears the group down (_forget_groups, this module's step, the first). A
# group destroyed by a destroy_process_group imported before the wrapper was
# installed keeps its state (and stays alive) until the process ends: a
# leak, never a wrong hit.
#
# _lock guards _groups; a state's lock serializes every change to its
# buffers (making or growing the scratch buffer, making the push workspace,
# freeing them), so two threads never both free the old scratch buffer or
# both make a new one. Those changes are rare and collective (a rendezvous
# waits for every rank): one lock per group, so that one group's rendezvous
# never holds up another's. Lock order: _lock, then a state's lock. The
# lookups of a call (dict reads) take no lock.


class _GroupState:
    """What this module keeps for one live process group (see above)."""

    __slots__ = ("pg", "name", "lock", "plans", "handles", "workspaces", "scratch")

    def __init__(self, pg, name: str):
        self.pg = pg  # held: no other object can take its id while registered
        self.name = name
        self.lock = threading.Lock()  # changes to workspaces and scratch
        # (device index, bytes, dtype, algorithm) -> the algorithm all_reduce runs
        self.plans: dict = {}
        # tensor's address -> (weak reference to the tensor, handle, offset, world size, rank)
        self.handles: dict = {}
        # device index -> (block address, push workspace Handle)
        self.workspaces: dict = {}
        # device index -> (block address, bytes, scratch Handle)
        self.scratch: dict = {}


_groups: dict = {}  # id(group) -> _GroupState, under _lock
_lock = threading.Lock()


def _group_state(group) -> _GroupState:
    """The state of group (a ProcessGroup, its name or None: WORLD), made at
    its first use. Raises ValueError when there is no such group (None
    before init_process_group, or after destroy_process_group). Every
    collective call comes here: the path of a state made is a dict read."""
    pg = _resolve_group(group)
    st = _groups.get(id(pg))
    if st is not None:
        return st  # st.pg is pg: see the invariant above
    if pg is None:
        raise ValueError(f"symm: no process group {group!r}: is torch.distributed initialized?")
    with _lock:
        st = _groups.get(id(pg))
        if st is None:
            ensure_destroy_hook()
            st = _groups[id(pg)] = _GroupState(pg, getattr(pg, "group_name", None) or "0")
        return st


def _forget_groups(groups) -> None:
    """This module's step of destroy_process_group (_groups.BUFFERS, the
    first): the states of groups (every group's for None) go, their buffers
    freed, then the fused collectives' workspaces. Before the groups' stores
    go (_store's step), which freeing does not meet through."""
    with _lock:
        if groups is None:
            states = list(_groups.values())
        else:
            states = [st for g in groups if (st := _groups.get(id(g))) is not None and st.pg is g]
        for st in states:
            _on_group_destroyed(st)
    forget_group_workspaces(None if groups is None else {getattr(g, "group_name", None) or "0" for g in groups})


add_destroy_step(BUFFERS, _forget_groups)


def _on_group_destroyed(st: _GroupState) -> None:
    """Drops group st.pg's state and frees the symmetric buffers it made (the
    scratch buffers, then the push workspaces, by device): the one place
    where libsymm learns that a group is gone, before torch destroys it (its
    store and communicator still work: symm_free is collective under the
    NCCL and NVSHMEM backends, and every rank destroys its groups in the
    same order). Freeing is safe once this device's work is done: every
    kernel on these buffers met every peer after its last access to them
    (the scratch buffer's growth relies on the same). Called under _lock."""
    _groups.pop(id(st.pg), None)
    with st.lock:
        _drop_state(st)


def _drop_state(st: _GroupState) -> None:
    """_on_group_destroyed's work, under st.lock."""
    st.plans.clear()
    st.handles.clear()
    bufs = [(dev, v[0]) for dev, v in sorted(st.scratch.items())] + \
           [(dev, v[0]) for dev, v in sorted(st.workspaces.items())]
    st.scratch.clear()
    st.workspaces.clear()
    if bufs:
        import torch

        for dev in sorted({dev for dev, _ in bufs}):
            torch.cuda.synchronize(dev)
        for _, ptr in bufs:
            symm_free(ptr)


def known_state(group):
    """group's state if it has one, else None, never making one: the fast
    paths' lookup (a dict read; None and a name are resolved as in
    _group_state)."""
    return _groups.get(id(group if group is not None and not isinstance(group, str) else _resolve_group(group)))
