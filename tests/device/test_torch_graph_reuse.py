"""graph_capture_record_stream_reuse on PyTorch's allocator and on libsymm.

    python3 tests/device/test_torch_graph_reuse.py            # every case, a PASS/FAIL table
    python3 tests/device/test_torch_graph_reuse.py --cases fan3_on,pair_off

A tensor made on the capturing stream is read on other streams inside a CUDA
graph capture, marked with record_stream and deleted. With the setting on,
PyTorch's allocator hands its block out again in the same capture only once
every stream that read it has joined the capturing stream (the capture graph
orders those reads first); with it off, only after the capture. Each case
runs in a fresh interpreter twice: on PyTorch's own allocator (the
reference) and under symm.use_as_default() (libsymm's extension), and passes
when libsymm observes what PyTorch does: which requests get the freed
block, and that the replayed graph computes the right values. Rows go to
$OUT/torch_graph_reuse.json (or build/).
"""

from __future__ import annotations

import sys

from sides import child_result, judge, start  # noqa: E402
from sides import main as sides_main  # noqa: E402

# case -> (readers of the freed tensor, how the setting is given: "call",
# "env" or "off")
CASES = {
    "pair_on": (1, "call"),  # one reader stream (PyTorch's 2-stream test's shape)
    "pair_env": (1, "env"),  # the same, set in PYTORCH_CUDA_ALLOC_CONF
    "pair_off": (1, "off"),
    "fan3_on": (3, "call"),  # three readers joined in two steps (the 4-stream shape)
    "fan3_off": (3, "off"),
}
N = 64  # floats per tensor: one small block each


def scenario(torch, readers: int) -> dict:
    """Capture on `main`; `readers` side streams read `src` and write their own
    outputs; src is deleted after record_stream. Requests are made at three
    moments: while no reader has joined, after some have (fan-in through a
    middle stream), and after all have. Returns which of them got src's
    block, and whether replay computed src+k on reader k."""
    main = torch.cuda.Stream()
    side = [torch.cuda.Stream() for _ in range(readers)]
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    facts = {}
    with torch.cuda.stream(main):
        g.capture_begin()
        keep = [torch.zeros(N, device="cuda")]  # made first, so later requests cannot take their place
        src = torch.full((N,), 1.0, device="cuda")
        src_ptr = src.data_ptr()
        outs = []
        for k, s in enumerate(side, start=2):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                outs.append(src + float(k))
            src.record_stream(s)
        del src
        early = torch.empty(N, device="cuda")
        facts["no_join"] = early.data_ptr() == src_ptr
        keep.append(early)
        if readers > 1:
            # Fan in all but the first reader onto the last one, and the
            # first onto main: main has not yet seen the others' reads.
            last = side[-1]
            for s in side[1:-1]:
                last.wait_stream(s)
            with torch.cuda.stream(last):
                outs[-1].mul_(1.0)
            main.wait_stream(side[0])
            keep[0].add_(1.0)
            partial = torch.empty(N, device="cuda")
            facts["partial_join"] = partial.data_ptr() == src_ptr
            keep.append(partial)
            main.wait_stream(last)
        else:
            main.wait_stream(side[0])
        keep[0].add_(1.0)
        late = torch.empty(N, device="cuda")
        facts["all_joined"] = late.data_ptr() == src_ptr
        late.fill_(-7.0)  # written over src's block, after every read of it
        keep.append(late)
        g.capture_end()
    torch.cuda.synchronize()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    facts["replay_right"] = all(bool((o == 1.0 + k).all()) for k, o in enumerate(outs, start=2))
    return facts


def child(case: str, alloc: str) -> int:
    def facts():
        torch = start(alloc)
        readers, how = CASES[case]
        if how == "call":
            torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        out = scenario(torch, readers)
        if how == "call":
            torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
            out["second_off"] = scenario(torch, readers)  # turned off at run time
        return out

    return child_result(facts)


def judge_case(case: str, native: dict, mine: dict) -> tuple[bool, str]:
    ok, why = judge(native, mine)
    # The reference itself must show the feature, or the case proves
    # nothing (a torch without the setting reuses nothing in capture).
    nf = native.get("facts") or {}
    if ok and CASES[case][1] != "off" and not nf.get("all_joined"):
        ok, why = False, "PyTorch itself did not reuse after the join (torch too old?): " + why
    return ok, why


if __name__ == "__main__":
    sys.exit(sides_main(__file__, __doc__, CASES, child, "torch_graph_reuse.json", 180,
                        conf=lambda case: "graph_capture_record_stream_reuse:True" if CASES[case][1] == "env" else "",
                        judge_case=judge_case))
