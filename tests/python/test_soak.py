"""Soak test of symmetric memory on the host backend: 8 processes each run
1000 cycles (× SYMM_SOAK_SCALE) of symm_alloc, rendezvous, check, symm_free
over one TCP store, and end with as many open descriptors and memfd mappings
as they had after their first cycle: nothing accumulates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from conftest import child_env

WORLD = 8


def soak_scale() -> float:
    v = os.environ.get("SYMM_SOAK_SCALE", "")
    if not v:
        return 1.0
    try:
        f = float(v)
    except ValueError:
        f = 0.0
    assert f > 0, f"SYMM_SOAK_SCALE={v!r}: want a positive number"
    return f


SOAK_RANK = textwrap.dedent(
    """
    import ctypes, json, os, sys, time, symm

    rank, world, addr, cycles = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    def memfd_maps():
        with open("/proc/self/maps") as f:
            return sum(1 for line in f if "memfd" in line)

    st = symm.Store.connect(addr, timeout_ms=60000)

    def barrier(name):
        # A rank that runs ahead sends its next rendezvous's note (with its
        # block's descriptor) early; the group's link reads it ahead and keeps
        # it (its descriptor open) for the next rendezvous. The counts are
        # taken where no rank can be ahead: the first before this rank has
        # entered the first barrier (no peer has begun cycle 1), the last
        # after every rank has stopped.
        st.set(f"{name}/{rank}", b"1")
        for r in range(world):
            st.get(f"{name}/{r}", timeout_ms=60000)

    base = None
    start = time.monotonic()
    for c in range(cycles):
        size = 4096 * (1 + (c * 7) % 16)  # 4 KiB to 64 KiB: blocks of several sizes
        p = symm.symm_alloc(size)
        mark = (rank * 31 + c) & 0xFF
        ctypes.memset(p, mark, 1)
        ctypes.memset(p + size - 1, mark ^ 0xFF, 1)
        h = symm.rendezvous_ptr(p, st, "soak", rank, world)
        assert h.world_size == world and h.buffer_size == size, (c, h.world_size, h.buffer_size)
        for r in range(world):
            want = (r * 31 + c) & 0xFF
            first = ctypes.c_uint8.from_address(h.buffer_ptrs[r]).value
            last = ctypes.c_uint8.from_address(h.buffer_ptrs[r] + size - 1).value
            assert (first, last) == (want, want ^ 0xFF), f"cycle {c}: rank {r}'s buffer holds {first}, {last}"
        if c == cycles - 1:
            mapped = memfd_maps()  # our block and every peer's: the count sees them
        symm.symm_free(p)
        if c == 0:
            base = {"fds": open_fds(), "memfd_maps": memfd_maps()}
            barrier("first")
    elapsed = time.monotonic() - start
    barrier("last")
    end = {"fds": open_fds(), "memfd_maps": memfd_maps()}
    st.close()
    print(json.dumps({"rank": rank, "cycles": cycles, "base": base, "end": end, "mapped": mapped,
                      "seconds": elapsed}))
    """
)


def test_soak_alloc_rendezvous_free(tmp_path):
    import symm

    cycles = max(1, int(1000 * soak_scale()))
    script = tmp_path / "soak_rank.py"
    script.write_text(SOAK_RANK)
    env = child_env({"SYMM_DEVICE": "host", "SYMM_RENDEZVOUS_TIMEOUT": "60s"})
    server = symm.Store.server()
    start = time.monotonic()
    try:
        procs = [
            subprocess.Popen([sys.executable, str(script), str(r), str(WORLD), server.address, str(cycles)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(WORLD)
        ]
        try:
            outs = [p.communicate(timeout=120 + 0.5 * cycles) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    finally:
        server.close()
    elapsed = time.monotonic() - start
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} failed (rc={p.returncode}):\n{out}\n{err}"
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    for res in results:
        assert res["cycles"] == cycles
        assert res["mapped"] >= res["base"]["memfd_maps"] + WORLD, res  # the check can see a mapping
        assert res["end"] == res["base"], (
            f"rank {res['rank']}: descriptors or memfd mappings grew over {cycles} cycles: "
            f"after the first {res['base']}, at the end {res['end']}")
    slowest = max(r["seconds"] for r in results)
    print(f"soak: {WORLD} processes x {cycles} cycles in {elapsed:.1f}s "
          f"(slowest rank {slowest:.1f}s, {1000 * slowest / cycles:.1f} ms/cycle)")
