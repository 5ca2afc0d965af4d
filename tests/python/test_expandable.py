"""Expandable segments from Python (host backend): chosen before the pool
exists, with set_expandable or SYMM_POOL_EXPANDABLE, or changed later for the
segments that come after; memory grows in place and goes back at empty_cache. Each case runs a fresh interpreter (the pool is made
once per process)."""

from conftest import child_env, run_json

CHILD = r"""
import json, symm
MiB = 1 << 20
if CHOOSE is not None:
    symm.set_expandable(CHOOSE)
ptrs = [symm.alloc(3 * MiB) for _ in range(5)]
st = symm.memory_stats(0)
snap = symm.memory_snapshot()
out = {
    "contiguous": all(b - a == 3 * MiB for a, b in zip(ptrs, ptrs[1:])),
    "reserved": st["reserved_bytes.all.current"],
    "segments": st["segment.all.current"],
    "expandable": [s["is_expandable"] for s in snap["segments"]],
}
try:
    symm.set_expandable(not out["expandable"][0])  # from now on, the other kind
    out["switch"] = "accepted"
    q = symm.alloc(3 * MiB)
    out["kinds_after_switch"] = sorted(s["is_expandable"] for s in symm.memory_snapshot()["segments"])
    symm.free(q, 3 * MiB)
except symm.SymmError as e:
    out["switch"] = e.code.name
symm.set_expandable(out["expandable"][0])  # the pool's own choice again
for p in ptrs:
    symm.free(p, 3 * MiB)
symm.empty_cache()
out["after_empty"] = symm.memory_reserved(0)
print(json.dumps(out))
"""


def run(choose, env=None):
    return run_json(CHILD.replace("CHOOSE", repr(choose)), env=child_env(env or {}, unset=("SYMM_POOL_EXPANDABLE",)))


def test_set_expandable_before_first_allocation():
    out = run(True)
    assert out["expandable"] == [True]
    assert out["contiguous"], "five 3 MiB blocks follow each other in one range"
    assert out["reserved"] == 16 << 20, "15 MiB in 2 MiB chunks: no 3 MiB growth takes a whole 20 MiB chunk"
    assert out["segments"] == 1
    assert out["switch"] == "accepted", "once the pool exists, the choice applies to later segments"
    assert out["kinds_after_switch"] == [False, True], "a fixed segment beside the expandable one"
    assert out["after_empty"] == 0, "empty_cache releases both kinds"


def test_chunk_size_from_the_environment():
    out = run(True, {"SYMM_POOL_EXPANDABLE_CHUNK": "2MiB"})
    assert out["contiguous"]
    assert out["reserved"] == 16 << 20, "15 MiB mapped in 2 MiB chunks"
    out = run(True, {"SYMM_POOL_EXPANDABLE_CHUNK": "4MiB"})
    assert out["contiguous"]
    assert out["reserved"] == 16 << 20, "the first 4 MiB one big chunk, each growth after it 2 MiB chunks"
    assert out["after_empty"] == 0


def test_environment_variable_and_default():
    assert run(None, {"SYMM_POOL_EXPANDABLE": "1"})["expandable"] == [True]
    fixed = run(None)
    assert fixed["expandable"] == [False]
    assert fixed["reserved"] == 20 << 20, "the default: one 20 MiB fixed segment"


def test_call_wins_over_environment():
    assert run(False, {"SYMM_POOL_EXPANDABLE": "1"})["expandable"] == [False]
