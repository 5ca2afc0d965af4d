"""PyTorch's allocator settings at run time, on PyTorch's allocator and on libsymm.

    python3 tests/device/test_torch_settings.py            # every case, a PASS/FAIL table
    python3 tests/device/test_torch_settings.py --cases fraction_call,large_env

Each case runs the same script twice, each time in a fresh interpreter (the
allocator is swapped once per process): under PyTorch's own allocator
(native, the reference) and under symm.use_as_default() (libsymm's extension).
A case passes when libsymm observes what PyTorch does: a setting changed at
run time applies to the requests and segments that come after the call. The rows are written to $OUT/torch_settings.json (or
build/).
"""

from __future__ import annotations

import sys

from sides import child_result, judge, start  # noqa: E402
from sides import main as sides_main  # noqa: E402
MiB = 1 << 20

# case -> (environment's settings, what libsymm must do: "same" as PyTorch)
CASES = {
    "fraction_call": ("", "same"),  # per_process_memory_fraction by _accelerator_setAllocatorSettings
    "fraction_deprecated": ("", "same"),  # the same through torch.cuda.memory._set_allocator_settings
    "fraction_api": ("", "same"),  # set_per_process_memory_fraction, read back (one owner: libsymm)
    "split_same": ("max_split_size_mb:64", "same"),  # the pool's value again: accepted
    "split_reset": ("max_split_size_mb:64", "same"),  # a call without it resets it: a change
    "expandable_call": ("", "same"),  # the next segment is expandable
    "large_env": ("large_segment_size_mb:40", "same"),  # honoured from the environment
    "large_call": ("", "same"),  # the next segment has the new size
    "bad_value": ("", "same"),  # PyTorch refuses it before libsymm sees it
    "unknown_key": ("", "same"),
    "pinned_key": ("", "same"),  # PyTorch's pinned host allocator's: libsymm accepts it
}


def setter():
    import torch

    return getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings


def attempt(fn) -> dict:
    try:
        fn()
        return {"raised": None}
    except Exception as e:  # noqa: BLE001
        return {"raised": type(e).__name__, "message": str(e)[:400]}


def reserved_for(torch, nbytes: int) -> int:
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    grown = torch.cuda.memory_reserved() - before
    del t
    return grown


def run_case(case: str, torch) -> dict:
    total = torch.cuda.get_device_properties(0).total_memory
    if case in ("fraction_call", "fraction_deprecated"):
        fn = setter() if case == "fraction_call" else torch.cuda.memory._set_allocator_settings
        r = attempt(lambda: fn("per_process_memory_fraction:0.5"))
        r["fraction"] = round(torch.cuda.get_per_process_memory_fraction(0), 6)
        r["big_alloc"] = attempt(lambda: torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda"))["raised"]
        return r
    if case == "fraction_api":
        torch.cuda.set_per_process_memory_fraction(0.3, 0)
        r = {"fraction": round(torch.cuda.get_per_process_memory_fraction(0), 6)}
        r["big_alloc"] = attempt(lambda: torch.empty(int(total * 0.4), dtype=torch.uint8, device="cuda"))["raised"]
        return r
    if case == "split_same":
        r = attempt(lambda: setter()("max_split_size_mb:64"))
        r["max_split_size"] = torch.cuda.memory_stats().get("max_split_size")
        return r
    if case == "split_reset":
        r = attempt(lambda: setter()("per_process_memory_fraction:0.9"))
        r["max_split_size"] = torch.cuda.memory_stats().get("max_split_size")  # read once, as PyTorch does
        big = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        r["oversize_after"] = torch.cuda.memory_stats().get("oversize_allocations.current")
        del big
        return r
    if case == "expandable_call":
        r = attempt(lambda: setter()("expandable_segments:True"))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        segs = torch.cuda.memory._snapshot()["segments"]
        r["new_segment_expandable"] = any(g["is_expandable"] and g["address"] <= t.data_ptr() < g["address"] + g["total_size"]
                                          for g in segs)
        r["first_segment_fixed"] = any(not g["is_expandable"] for g in segs)
        del t
        r["back"] = attempt(lambda: setter()("expandable_segments:False"))["raised"]
        return r
    if case == "large_env":
        return {"reserved_mib_for_2mib": reserved_for(torch, 2 * MiB) // MiB}
    if case == "large_call":
        r = attempt(lambda: setter()("large_segment_size_mb:40"))
        r["reserved_mib_for_2mib"] = reserved_for(torch, 2 * MiB) // MiB
        return r
    if case == "bad_value":
        r = attempt(lambda: setter()("max_split_size_mb:1"))
        r.pop("message", None)
        return r
    if case == "unknown_key":
        r = attempt(lambda: setter()("no_such_key:1"))
        r.pop("message", None)
        return r
    if case == "pinned_key":
        return attempt(lambda: setter()("pinned_num_register_threads:8"))
    raise ValueError(case)


def child(case: str, alloc: str) -> int:
    return child_result(lambda: run_case(case, start(alloc)))


if __name__ == "__main__":
    sys.exit(sides_main(__file__, __doc__, CASES, child, "torch_settings.json", 180, conf=lambda case: CASES[case][0],
                        judge_case=lambda case, native, mine: judge(native, mine, drop=("message",))))
