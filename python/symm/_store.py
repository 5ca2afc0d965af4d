"""libsymm's rendezvous store from Python: :class:`Store` (a TCP store, torch-
free) and the store of each process group (:func:`group_store`), which the
backends' bootstrap, rendezvous and the collectives share. A group's store
is closed when torch destroys the group (a step of _groups' destroy hook)."""

from __future__ import annotations

import ctypes
import os

from . import _groups
from ._loader import load
from ._pool import _call_rc


class Store:
    """A libsymm TCP store: :meth:`server` starts one here, :meth:`connect` joins one."""

    def __init__(self, handle: int, address: str):
        self._h = handle
        self.address = address

    @classmethod
    def server(cls, addr: str = "", token: str | None = None) -> "Store":
        lib = load()
        out = ctypes.c_int64()
        bound = ctypes.create_string_buffer(256)
        tok = (token or "").encode()  # "": the library's SYMM_STORE_TOKEN
        _call_rc(lib.symm_store_server, addr.encode(), tok, ctypes.byref(out), bound, len(bound))
        return cls(out.value, bound.value.decode())

    @classmethod
    def connect(cls, addr: str, token: str | None = None, timeout_ms: int = 60000) -> "Store":
        lib = load()
        out = ctypes.c_int64()
        tok = (token or "").encode()  # "": the library's SYMM_STORE_TOKEN
        _call_rc(lib.symm_store_connect, addr.encode(), tok, int(timeout_ms), ctypes.byref(out))
        return cls(out.value, addr)

    def set(self, key: str, value: bytes) -> None:
        _call_rc(load().symm_store_set, self._h, key.encode(), value, len(value))

    def get(self, key: str, timeout_ms: int = 60000) -> bytes:
        lib = load()
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(4096)
        _call_rc(lib.symm_store_get, self._h, key.encode(), buf, len(buf), ctypes.byref(n), int(timeout_ms))
        if n.value > len(buf):
            buf = ctypes.create_string_buffer(n.value)
            _call_rc(lib.symm_store_get, self._h, key.encode(), buf, len(buf), ctypes.byref(n), int(timeout_ms))
        return buf.raw[: n.value]

    def add(self, key: str, delta: int) -> int:
        out = ctypes.c_int64()
        _call_rc(load().symm_store_add, self._h, key.encode(), int(delta), ctypes.byref(out))
        return out.value

    def close(self) -> None:
        if self._h:
            h, self._h = self._h, 0
            _call_rc(load().symm_store_close, h)

    @property
    def handle(self) -> int:
        return self._h

    def world_within_direct_access(self) -> bool:
        """True: a rendezvous succeeds only once every peer is mapped."""
        return True


_stores: dict = {}  # group tag -> Store


def group_store(group) -> Store:
    """libsymm's store for a process group: rank 0 starts a server and posts its
    address in the group's c10d store, so torchrun users need nothing else."""
    import torch.distributed as dist

    name = _group_tag(group)
    if name in _stores:
        return _stores[name]
    _groups.ensure_destroy_hook()  # the store goes with the group
    c10d_store = dist.distributed_c10d._get_default_store()
    key = f"symm_store_addr/{name}"
    if dist.get_rank(group) == 0:
        st = Store.server(os.environ.get("SYMM_STORE_ADDR", "127.0.0.1:0"))
        c10d_store.set(key, st.address)
    else:
        addr = c10d_store.get(key).decode()
        st = Store.connect(addr)
    _stores[name] = st
    return st


def _group_tag(group) -> str:
    import torch.distributed as dist

    c10d = getattr(dist, "distributed_c10d", None)
    return c10d._get_group_tag(group) if hasattr(c10d, "_get_group_tag") else str(group)


def forget_group_stores(groups=None) -> None:
    """Closes and forgets libsymm's store of each of groups (every group's
    for None): destroy_process_group's last step (_groups.STORES). Closing a
    store closes the links of the groups joined through it and forgets
    their handshake counts (symm_store_close), so a group made later under
    the same tag (WORLD again after destroy_process_group and
    init_process_group) meets its peers afresh, never through the old
    group's connections. Handles made over it stay usable."""
    if not _stores:
        return
    if groups is None:
        stores = list(_stores.values())
        _stores.clear()
    else:
        stores = [st for st in (_stores.pop(_group_tag(g), None) for g in groups) if st is not None]
    for st in stores:
        st.close()


_groups.add_destroy_step(_groups.STORES, forget_group_stores)
