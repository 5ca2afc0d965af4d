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
