"""PyTorch's memory history on PyTorch's allocator and on libsymm: the
behaviour PyTorch's test/test_cuda.py checks in test_memory_plots,
test_memory_plots_free_stack, test_memory_plots_metadata,
test_memory_plots_history_context, test_memory_plots_free_segment_stack,
test_cpp_memory_snapshot_pickle and test_memory_compile_regions.

    python3 tests/device/test_torch_history.py            # every case, a PASS/FAIL table
    python3 tests/device/test_torch_history.py --cases plots,metadata

Each case runs the same script twice, each time in a fresh interpreter (the
allocator is swapped once per process): under PyTorch's own allocator
(native, the reference) and under symm.use_as_default() (libsymm's
extension). A case passes when libsymm observes what PyTorch does: the same
facts (which stacks, annotations and events a snapshot shows) from both. The
rows are written to $OUT/torch_history.json (or build/).

The names of this file's functions are what the checks look for in the
snapshots' stacks; none of them, nor this file's name, contains
"empty_cache", which only torch.cuda.memory.empty_cache's own frame may
bring (the free_segment_stack case).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sides import child_result, start  # noqa: E402
from sides import main as sides_main  # noqa: E402
SCRIPT_NAME = Path(__file__).name
torch = None  # the child's torch (child() sets it): TorchScript resolves hist_script_fn's `torch` here

CASES = {
    "plots": "test_memory_plots: stacks by context and stacks, a round's stacks gone with the round",
    "free_stack": "test_memory_plots_free_stack: a free's stack only with context 'all'",
    "metadata": "test_memory_plots_metadata: every event carries the metadata set when it happened",
    "history_context": "test_memory_plots_history_context: context=None in between records no stack",
    "free_segment_stack": "test_memory_plots_free_segment_stack: empty_cache's stack only with context 'all'",
    "cpp_pickle": "test_cpp_memory_snapshot_pickle: the pickled snapshot's last event is the last alloc, its settings PyTorch's",
    "compile_regions": "test_memory_compile_regions: each event's compile region",
}


# ---- the cases: each returns the facts a snapshot shows ------------------------------------------------------------
def hist_plots_run(torch):
    x = torch.rand(128, 128, device="cuda")
    return x * x + x * x


def case_plots(torch) -> dict:
    from torch.cuda._memory_viz import segment_plot, trace_plot

    facts = {}
    # As PyTorch's test: C++ stacks ("all") on Linux, then Python only, then
    # no context; each round ends with history off.
    for i, (context, stacks) in enumerate((("all", "all"), ("all", "python"), (None, "python"))):
        try:
            torch.cuda.memory.empty_cache()
            torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks)
            hist_plots_run(torch)
            ss = torch.cuda.memory._snapshot()
            trace = [(e["action"], e["size"]) for e in ss["device_traces"][0]]
            # The plot with filter_freed drops the trace's freed pairs from ss
            # itself: the size is left in the inactive block's requested size.
            plots = [len(trace_plot(ss)) > 0, len(trace_plot(ss, filter_freed=True)) > 0, len(segment_plot(ss)) > 0]
            text = json.dumps(ss)
            if str(128 * 128 * 4) not in text:  # what the snapshot held, for the log
                print(f"plots round {i}: trace {trace[:40]}, blocks",
                      [(b["state"], b["size"], b["requested_size"]) for s in ss["segments"] for b in s["blocks"]][:20],
                      file=sys.stderr)
            facts[f"round{i}"] = {"context": context, "stacks": stacks, "plots": plots,
                                  "python_frame": "hist_plots_run" in text, "cpp_frame": "::rand" in text,
                                  "size": str(128 * 128 * 4) in text}
        finally:
            torch.cuda.memory._record_memory_history(None)
    return facts


def hist_the_alloc(box, torch):
    box.append(torch.rand(3, 4, device="cuda"))


def hist_the_free(box):
    box.clear()


def case_free_stack(torch) -> dict:
    facts = {}
    for context in ("alloc", "all", "state"):
        try:
            torch.cuda.memory.empty_cache()
            torch.cuda.memory._record_memory_history(context=context)
            box = []
            hist_the_alloc(box, torch)
            hist_the_free(box)
            ss = json.dumps(torch.cuda.memory._snapshot())
            facts[context] = {"free_frame": "hist_the_free" in ss, "alloc_frame": "hist_the_alloc" in ss}
        finally:
            torch.cuda.memory._record_memory_history(None)
    return facts


def case_metadata(torch) -> dict:
    facts = {}
    for context in ("alloc", "all", "state"):
        try:
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.memory.empty_cache()
            torch.cuda.memory._set_memory_metadata("metadata test")
            torch.cuda.memory._record_memory_history(context=context)
            x = torch.rand(3, 4, device="cuda")
            del x
            torch.cuda.memory.empty_cache()
            torch.cuda.memory._set_memory_metadata("")
            ss = torch.cuda.memory._snapshot()
            events = ss["device_traces"][0]
            facts[context] = {"events": len(events) > 0,
                              "all_annotated": all(e["user_metadata"] == "metadata test" for e in events)}
        finally:
            torch.cuda.memory._record_memory_history(None)
    facts["read_back"] = torch._C._cuda_getMemoryMetadata() if hasattr(torch._C, "_cuda_getMemoryMetadata") else None
    return facts


def hist_capture_one(box, torch):
    box[0] = torch.rand(4, 4, device="cuda")


def hist_not_captured(box, torch):
    box[0] = torch.rand(3, 4, device="cuda")


def hist_capture_two(box, torch):
    box[0] = torch.rand(4, 4, device="cuda")


def case_history_context(torch) -> dict:
    try:
        torch.cuda.memory.empty_cache()
        box = [None]
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        hist_capture_one(box, torch)
        torch.cuda.memory._record_memory_history(context=None)
        hist_not_captured(box, torch)
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        hist_capture_two(box, torch)
        ss = json.dumps(torch.cuda.memory._snapshot())
        return {name: name in ss for name in ("hist_capture_one", "hist_not_captured", "hist_capture_two")}
    finally:
        torch.cuda.memory._record_memory_history(None)


def case_free_segment_stack(torch) -> dict:
    facts = {}
    for context in ("alloc", "all", "state"):
        try:
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.memory.empty_cache()
            torch.cuda.memory._record_memory_history(context=context)
            x = torch.rand(3, 4, device="cuda")
            del x
            torch.cuda.memory.empty_cache()
            ss = torch.cuda.memory._snapshot()
            text = json.dumps(ss)
            facts[context] = {"empty_cache_frame": "empty_cache" in text,
                              "segment_free": any(e["action"] == "segment_free" for e in ss["device_traces"][0])}
        finally:
            torch.cuda.memory._record_memory_history(None)
    return facts


def case_cpp_pickle(_torch) -> dict:
    import pickle

    from torch.utils.cpp_extension import load_inline

    source = """
    #include <torch/csrc/cuda/memory_snapshot.h>
    py::object hist_pickled() { return py::bytes(torch::cuda::_memory_snapshot_pickled()); }
    void hist_record(bool e, bool ctx) { torch::cuda::_record_memory_history(e, ctx, 10, ctx, ctx); }
    """
    m = load_inline(name="symm_hist_snapshot", cpp_sources=[source], functions=["hist_pickled", "hist_record"])
    facts = {}
    for ctx in (False, True):
        try:
            m.hist_record(True, ctx)

            @torch.jit.script
            def hist_script_fn():
                return torch.rand(311, 411, device="cuda")

            t = hist_script_fn()
            data = m.hist_pickled()
            try:
                mem = pickle.loads(data)
            except Exception:
                import io
                import pickletools
                listing = io.StringIO()
                try:
                    pickletools.dis(data, listing)
                except Exception as e:  # noqa: BLE001
                    listing.write(f"{e}")
                print(f"cpp_pickle: {len(data)} bytes, starting {data[:64]!r}, where it breaks:",
                      listing.getvalue()[-1500:], file=sys.stderr)
                raise
            found, frames = False, {}
            for s in mem["segments"]:
                for b in s["blocks"]:
                    if b["state"] == "active_allocated" and b["requested_size"] == 311 * 411 * 4:
                        found = True
                        text = str(b["frames"])
                        frames = {"cpp": "::rand" in text, "script": "hist_script_fn" in text,
                                  "python": SCRIPT_NAME in text}
            last = mem["device_traces"][0][-1]
            facts[str(ctx)] = {"found": found, "frames": frames if ctx else None, "last_action": last["action"],
                               "last_size_is_request": last["size"] == 311 * 411 * 4,
                               "entries_at_most_10": len(mem["device_traces"][0]) <= 10,
                               "settings": mem["allocator_settings"]}
            del t
        finally:
            m.hist_record(False, False)
    return facts


def case_compile_regions(torch) -> dict:
    try:
        import triton  # noqa: F401
    except ImportError:
        return {"skipped": "no triton"}
    from torch import nn

    class HistModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear1 = nn.Linear(10, 10)
            self.linear2 = nn.Linear(10, 10)

        def forward(self, x):
            x = self.linear1(x)
            x = x + 1 if x.sum() > 0 else x - 1  # a graph break: two compiled regions
            return self.linear2(x)

    try:
        torch.cuda.memory.empty_cache()
        inp = torch.randn(1, 10, device="cuda")
        model = HistModel().to("cuda")
        compiled = torch.compile(model)
        torch.cuda.memory._record_memory_history(context="all", compile_context=True)
        compiled(inp)
        traces = torch.cuda.memory._snapshot()["device_traces"]
        dev = next((i for i, t in enumerate(traces) if t), 0)
        seq = []
        for e in traces[dev]:
            c = e["compile_context"]
            if c != "N/A" and (not seq or seq[-1] != c):
                seq.append(c)
        return {"sequence": seq, "raised": None}
    except RuntimeError as e:  # PyTorch's test accepts a RuntimeError; the type must match
        return {"raised": type(e).__name__}
    finally:
        torch.cuda.memory._record_memory_history(None)


def run_case(case: str, torch) -> dict:
    return globals()["case_" + case](torch)


# ---- the harness (sides.py) ------------------------------------------------------------------------------------------
def child(case: str, alloc: str) -> int:
    def facts():
        global torch
        torch = start(alloc)
        return run_case(case, torch)

    return child_result(facts)


# C++ stacks are symbolized slowly: 400 s a side.
if __name__ == "__main__":
    sys.exit(sides_main(__file__, __doc__, CASES, child, "torch_history.json", 400))
