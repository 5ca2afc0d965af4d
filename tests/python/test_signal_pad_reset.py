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
