"""A signal pad's reset (Handle.reset_signal_pad, symm_reset_signal_pad) on
the host backend: real processes around a libsymm TCP store."""

from __future__ import annotations

import textwrap

from test_symmetric import run_ranks

RESET_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    p = symm.symm_alloc(4096)
    h = symm.rendezvous_ptr(p, st, "reset", rank, world)
    h.put_signal((rank + 1) % world, channel=3)  # nobody takes it: the next rank's pad is dirty
    try:
        h.reset_signal_pad(timeout_ms=-1)
        negative = None
    except symm.SymmError as e:
        negative = int(e.code)
    h.reset_signal_pad()
    pads = [bytes((ctypes.c_uint8 * h.signal_pad_size).from_address(h.signal_pad_ptrs[r])) for r in range(world)]
    clean = all(not any(b) for b in pads)
    st.set(f"looked/{rank}", b"1")
    for r in range(world):
        st.get(f"looked/{r}", timeout_ms=20000)  # nobody signals before everyone has looked
    h.barrier(channel=3, timeout_ms=5000)  # the dirty slot would have made it wait for ever
    symm.symm_free(p)
    print(json.dumps({"rank": rank, "negative": negative, "clean": clean}))
    """
)


def test_reset_signal_pad_zeroes_every_rank(tmp_path):
    """Handle.reset_signal_pad (symm_reset_signal_pad): a pad left dirty by
    a put nobody took is zero on every rank once the call returns anywhere,
    and a barrier on that channel goes through again."""
    for r in run_ranks(tmp_path, RESET_SCRIPT, 3):
        assert r["negative"] == 1, r  # SYMM_ERR_INVALID
        assert r["clean"] is True, r


IF_ANY_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    p = symm.symm_alloc(4096)
    h = symm.rendezvous_ptr(p, st, "if-any", rank, world)
    h.put_signal((rank + 1) % world, channel=3)  # nobody takes it: the next rank's pad is dirty
    pad = lambda: bytes((ctypes.c_uint8 * h.signal_pad_size).from_address(h.signal_pad_ptrs[rank]))
    nobody = h.reset_signal_pad_if_any(False)
    kept = any(pad())
    only_rank_1 = h.reset_signal_pad_if_any(rank == 1)
    clean = not any(pad())
    h.barrier(channel=3, timeout_ms=5000)  # the dirty slot would have made it wait for ever
    symm.symm_free(p)
    print(json.dumps({"rank": rank, "nobody": nobody, "kept": kept, "only_rank_1": only_rank_1, "clean": clean}))
    """
)


def test_reset_signal_pad_if_any_is_agreed(tmp_path):
    """Handle.reset_signal_pad_if_any (symm_reset_signal_pad_if_any): when no
    rank wants a reset, none happens; when rank 1 alone wants one, every
    rank resets and says so."""
    for r in run_ranks(tmp_path, IF_ANY_SCRIPT, 3):
        assert r == {"rank": r["rank"], "nobody": False, "kept": True, "only_rank_1": True, "clean": True}, r


# symm.rendezvous (the PyTorch layer) over a stand-in torch.distributed and
# tensors: real processes, the real library on the host backend.
TORCH_RENDEZVOUS_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys, types
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist = types.ModuleType("torch.distributed")
    class PG:
        group_name = "0"
    dist.group = types.SimpleNamespace(WORLD=PG())
    dist.get_rank = lambda g=None: rank
    dist.get_world_size = lambda g=None: world
    torch = types.ModuleType("torch"); torch.distributed = dist
    sys.modules["torch"], sys.modules["torch.distributed"] = torch, dist
    import symm
    from symm import _symmetric as s
    st = symm.Store.connect(addr, timeout_ms=20000)
    s._group_store = lambda group: st
    class T:  # a tensor at the start of a block
        def __init__(self, ptr):
            self.ptr, self.device, self.is_cuda = ptr, None, False
        def data_ptr(self):
            return self.ptr
    p = symm.symm_alloc(4096)
    def dirty(h):  # a signal nobody takes, in the next rank's pad
        h.put_signal((rank + 1) % world, channel=3)
    def pad_clean(h):
        return not any(bytes((ctypes.c_uint8 * h.signal_pad_size).from_address(h.signal_pad_ptrs[rank])))
    def meet(name):
        st.set(f"{name}/{rank}", b"1")
        for r in range(world):
            st.get(f"{name}/{r}", timeout_ms=20000)
    out = {"rank": rank}
    t1 = T(p)
    h = symm.rendezvous(t1)
    dirty(h)
    meet("dirty")
    # Rank 0's tensor is gone; rank 1's lives on (a reference cycle, say).
    keep = t1 if rank == 1 else None
    del t1
    t2 = T(p)  # the block handed out again
    h = symm.rendezvous(t2)
    out["recycled_clean"] = pad_clean(h)
    meet("looked")
    h.barrier(channel=3, timeout_ms=5000)  # a dirty slot would have passed it early or hung
    # The same live tensor again, on rank 0 alone (a collective rank 1
    # skips): nothing collective happens, so it returns at once...
    if rank == 0:
        symm.rendezvous(t2)
    meet("alone")
    # ...and the next new tensor still agrees on every rank.
    dirty(h)
    meet("dirty2")
    del t2, keep
    t3 = T(p)
    h = symm.rendezvous(t3)
    out["next_clean"] = pad_clean(h)
    meet("looked2")
    h.barrier(channel=3, timeout_ms=5000)
    symm.symm_free(p)
    print(json.dumps(out))
    """
)


def test_rendezvous_of_a_recycled_block_resets_on_every_rank(tmp_path):
    """symm.rendezvous of a new tensor on a block seen before: rank 0's old
    tensor is gone, rank 1's lives on; every rank resets (rank 1 alone would
    not have, and rank 0's reset would have met rank 1's next collective).
    The same live tensor again on one rank is not collective."""
    for r in run_ranks(tmp_path, TORCH_RENDEZVOUS_SCRIPT, 2):
        assert r == {"rank": r["rank"], "recycled_clean": True, "next_clean": True}, r
