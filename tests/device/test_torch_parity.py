"""What PyTorch's own allocator tests (test/test_cuda.py) check, ported: each
case observes one behaviour on PyTorch's allocator and under libsymm, in the
same run, with default settings and with expandable segments.

    python3 tests/device/test_torch_parity.py [--cases a,b] [--configs default,expandable]

Each (case, setting) runs twice, each time in a fresh interpreter (the
allocator is swapped once per process): "native" (PyTorch's allocator, the
reference) and "symm" (libsymm installed by SYMM_TORCH_ALLOCATOR=1 with
symm/_boot on PYTHONPATH, as `symm run` does, so that a child process the
case starts inherits libsymm as a user's would). The child prints one JSON
line of facts; a case passes when libsymm's facts equal PyTorch's. Rows go
to $OUT/torch_parity.json (else build/); the table comes last.

Cases (the PyTorch tests they stand for in brackets):
  split_expandable   max_split_size_mb and expandable_segments changed at run
                     time under a memory fraction; the out-of-memory retry
                     releases both kinds of segment [test_max_split_expandable]
  gc_expandable      garbage_collection_threshold with expandable segments
                     turned on at run time [test_garbage_collect_expandable]
  roundup_runtime    roundup_power2_divisions at run time, single value and
                     per interval; reset by a later call; bad texts raise
                     ValueError [test_allocator_settings]
  oom_max_split      an impossible request with max_split_size_mb set at run
                     time [test_raises_oom_max_split_size_mb_setting_True]
  mempool_expandable a MemPool over another allocator beside expandable
                     segments turned on at run time [test_mempool_expandable]
  fraction_zero      set/get_per_process_memory_fraction at 0 and 1
                     [test_get_per_process_memory_fraction]
  child_fraction     a child process with per_process_memory_fraction in its
                     settings [test_allocator_memory_fraction_setting]
  child_backend      a child that asks for backend:cudaMallocAsync
                     [test_allocator_backend]
  accelerator_stats  torch.accelerator's memory calls [test_memory_stats]
  oom_messages       the out-of-memory messages of absurd sizes [test_out_of_memory]
  uncached_raw_alloc raw_alloc with the caching allocator turned off
                     [test_cachingAllocator_raw_alloc]
  generators_graphs  active blocks of graph-safe generator states registered
                     with several graphs, back to the baseline once the graphs
                     go [test_memory_stats_of_multiple_generators_and_graphs]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from sides import autoload_env, base_env, child_result, judge, out_dir, run_side, start  # noqa: E402
CONFIGS = {"default": "", "expandable": "expandable_segments:True"}
MiB = 1 << 20


def raised(fn) -> str | None:
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


def ones_mib(torch, n):
    return torch.ones(n * MiB, dtype=torch.int8, device="cuda")


def with_fraction_for(torch, mib, fn):
    """Runs fn with the memory fraction that leaves mib MiB beyond what is
    reserved now; the fraction goes back to what it was."""
    orig = torch.cuda.get_per_process_memory_fraction()
    torch.cuda.empty_cache()
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction((mib * MiB + torch.cuda.memory_reserved()) / total)
    try:
        return fn()
    finally:
        torch.cuda.set_per_process_memory_fraction(orig)


def case_split_expandable(torch):
    setter = torch.cuda.memory._set_allocator_settings

    def body():
        setter("expandable_segments:False,max_split_size_mb:40")
        a = ones_mib(torch, 40)
        setter("expandable_segments:True,max_split_size_mb:40")
        b = ones_mib(torch, 40)
        setter("expandable_segments:False,max_split_size_mb:40")
        c = ones_mib(torch, 40)
        fourth = raised(lambda: ones_mib(torch, 40))
        del a, b, c
        after = raised(lambda: ones_mib(torch, 120))  # the retry releases both kinds
        return {"fourth": fourth, "after_release": after}

    try:
        return with_fraction_for(torch, 120, body)
    finally:
        setter("expandable_segments:False")


def case_gc_expandable(torch):
    setter = torch.cuda.memory._set_allocator_settings

    def body():
        setter("expandable_segments:False,garbage_collection_threshold:0.5")
        a = ones_mib(torch, 40)
        setter("expandable_segments:True,garbage_collection_threshold:0.5")
        b = ones_mib(torch, 40)
        del a, b
        return {"after_collect": raised(lambda: ones_mib(torch, 80))}

    try:
        return with_fraction_for(torch, 120, body)
    finally:
        setter("expandable_segments:False")


def case_roundup_runtime(torch):
    setter = torch.cuda.memory._set_allocator_settings
    key = "active_bytes.all.allocated"

    def grown(n_floats):
        torch.cuda.empty_cache()
        before = torch.cuda.memory_stats()[key]
        t = torch.rand(n_floats, device="cuda")
        d = torch.cuda.memory_stats()[key] - before
        del t
        return d

    out = {"plain": grown(21 * MiB)}
    setter("roundup_power2_divisions:4")
    out["div4"] = grown(21 * MiB)
    setter("garbage_collection_threshold:0.5,max_split_size_mb:40")  # resets the divisions
    out["reset"] = grown(21 * MiB)
    setter("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
    out["intervals_84mib"] = grown(21 * MiB)
    out["intervals_400mib"] = grown(100 * MiB)
    setter("release_lock_on_cudamalloc:True")
    out["lock"] = grown(21 * MiB)
    out["bad"] = [raised(lambda t=t: torch._C._accelerator_setAllocatorSettings(t))
                  for t in ("foo:1,bar:2", "garbage_collection_threshold:1.2", "max_split_size_mb:2",
                            "release_lock_on_cudamalloc:none", "pinned_num_register_threads:1024")]
    setter("")
    return out


def case_oom_max_split(torch):
    setter = torch.cuda.memory._set_allocator_settings
    setter("max_split_size_mb:1024")
    torch.cuda.empty_cache()
    try:
        return {"raised": raised(lambda: torch.empty(1 << 40, device="cuda"))}
    finally:
        setter("")


def case_mempool_expandable(torch):
    from test_torch_mempools import counting_allocator

    setter = torch.cuda.memory._set_allocator_settings
    torch.cuda.empty_cache()
    setter("expandable_segments:True")
    try:
        alloc, _ = counting_allocator(torch)
        pool = torch.cuda.MemPool(alloc.allocator())
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(MiB // 4, device="cuda")
        b = torch.empty(MiB // 4, device="cuda")  # the default pool: an expandable segment
        segs = torch.cuda.memory.memory_snapshot()
        out = {"segments": len(segs), "expandable": sum(bool(s["is_expandable"]) for s in segs)}
        del a, b, pool
        return out
    finally:
        setter("expandable_segments:False")


def case_fraction_zero(torch):
    orig = torch.cuda.get_per_process_memory_fraction()
    out = {}
    try:
        torch.cuda.set_per_process_memory_fraction(1.0)
        out["one"] = torch.cuda.get_per_process_memory_fraction()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.0)
        out["zero"] = torch.cuda.get_per_process_memory_fraction()
        out["alloc_at_zero"] = raised(lambda: torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
        torch.cuda.set_per_process_memory_fraction(0.25)
        out["quarter"] = torch.cuda.get_per_process_memory_fraction()
    finally:
        torch.cuda.set_per_process_memory_fraction(orig)
    out["restored"] = torch.cuda.get_per_process_memory_fraction() == orig
    return out


CHILD_FRACTION = """
import torch
d = torch._C._cuda_getDevice()
print(torch.cuda.memory.get_per_process_memory_fraction(d), end="")
"""


def case_child_fraction(torch):
    out = {}
    for value in ("0.0", "0.5", "1.0", "-0.1", "1.1"):
        env = dict(os.environ)
        conf = [x for x in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if x and not x.startswith("per_process")]
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf + [f"per_process_memory_fraction:{value}"])
        p = subprocess.run([sys.executable, "-c", CHILD_FRACTION], env=env, capture_output=True, text=True, timeout=120)
        out[value] = {"rc": p.returncode == 0, "stdout": p.stdout if p.returncode == 0 else "",
                      "names_the_setting": "per_process_memory_fraction is invalid" in p.stderr}
    return out


CHILD_BACKEND = """
import os
os.environ["PYTORCH_ALLOC_CONF"] = "max_split_size_mb:20,backend:cudaMallocAsync,release_lock_on_cudamalloc:none"
import torch
torch.cuda.init()
print(torch.cuda.get_allocator_backend())
"""


def case_child_backend(torch):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    p = subprocess.run([sys.executable, "-c", CHILD_BACKEND], env=env, capture_output=True, text=True, timeout=120)
    return {"rc": p.returncode, "backend": p.stdout.strip()}


def case_accelerator_stats(torch):
    acc = torch.accelerator
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    out = {"allocated_is_peak": acc.memory_allocated() == acc.max_memory_allocated(),
           "reserved_is_peak": acc.memory_reserved() == acc.max_memory_reserved()}
    before = acc.memory_stats()["active_bytes.all.current"]
    t = torch.randn(256, device="cuda")
    out["active_delta"] = acc.memory_stats()["active_bytes.all.current"] - before
    out["freed_while_live"] = acc.memory_stats()["active_bytes.all.freed"]
    del t
    acc.empty_cache()
    out["active_back"] = acc.memory_stats()["active_bytes.all.current"] - before
    out["freed_after"] = acc.memory_stats()["active_bytes.all.freed"]
    acc.reset_peak_memory_stats()
    out["same_as_cuda"] = acc.memory_allocated() == torch.cuda.memory_allocated()
    return out


def case_oom_messages(torch):
    t = torch.zeros(1024, device="cuda")
    out = {}
    for name, n in (("800M_GiB", 1024**3 * 800000000), ("8G_GiB", 1024**3 * 8000000000)):
        try:
            torch.empty(n, dtype=torch.int8, device="cuda")
            out[name] = "no error"
        except RuntimeError as e:
            msg = str(e)
            out[name] = {"type": type(e).__name__,
                         "tried_800M_GiB": f"Tried to allocate 800000000.00 GiB. GPU {t.device.index} has a total capacity of" in msg,
                         "more_than_1EB": "Tried to allocate more than 1EB memory" in msg}
    t.fill_(1)
    out["later_kernel_ok"] = bool((t == 1).all().item())
    return out


def case_uncached_raw_alloc(torch):
    key = "requested_bytes.all.allocated"
    dev = torch._C._cuda_getDevice()
    stream = torch._C._cuda_getCurrentRawStream(dev)

    def requested(n):
        start = torch.cuda.memory_stats()[key]
        p = torch._C._cuda_cudaCachingAllocator_raw_alloc(n, stream)
        got = torch.cuda.memory_stats()[key] - start
        torch._C._cuda_cudaCachingAllocator_raw_delete(p)
        return got

    torch.cuda.empty_cache()
    torch._C._cuda_resetAccumulatedMemoryStats(dev)
    try:
        torch.cuda.caching_allocator_enable(False)
        off = requested(MiB)
        t = torch.ones(1000, device="cuda")  # a tensor while off: its own allocation
        value = float(t.sum().item())
        del t
    finally:
        torch.cuda.caching_allocator_enable(True)
    return {"off": off, "tensor_while_off": value, "on": requested(MiB)}


def case_generators_graphs(torch):
    import gc

    def stats():
        s = torch.cuda.memory_stats()
        return s["active.all.current"], s["active_bytes.all.current"]

    def task(graph):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            graph.capture_begin()
            torch.rand(1, device="cuda")
            graph.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        graph.replay()

    out = []
    for n_graphs, n_gens in ((1, 1), (3, 2), (10, 20)):
        base = stats()
        graphs = [torch.cuda.CUDAGraph() for _ in range(n_graphs)]
        gen = torch.cuda.default_generators[0]
        states = [gen.graphsafe_get_state()] + [gen.clone_state() for _ in range(1, n_gens)]
        for g in graphs:
            for st in states:
                g.register_generator_state(st)
            task(g)
        during = stats()
        while graphs:
            del graphs[-1]
        gc.collect()
        torch.cuda.empty_cache()
        after = stats()
        out.append({"blocks": during[0] - base[0], "bytes": during[1] - base[1], "back": after == base,
                    "after_minus_base": [after[0] - base[0], after[1] - base[1]]})
    return out


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def child(case: str, alloc: str) -> int:
    return child_result(lambda: CASES[case](start(alloc, autoloaded=True)))


def run_child(case: str, alloc: str, config: str, timeout: float) -> dict:
    env = base_env()
    if CONFIGS[config]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = CONFIGS[config]
    if alloc == "symm":
        env = autoload_env(env)
    return run_side(__file__, case, alloc, env, timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--child", nargs=2, metavar=("CASE", "ALLOC"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(*a.child)
    out = out_dir()
    rows, failed = [], 0
    for config in a.configs.split(","):
        for case in a.cases.split(","):
            native = run_child(case, "native", config, a.timeout)
            mine = run_child(case, "symm", config, a.timeout)
            ok, why = judge(native, mine)
            rows.append({"case": case, "config": config, "ok": ok, "why": why, "native": native, "symm": mine})
            failed += not ok
            print(f"{case:<20} {config:<11} {'PASS' if ok else 'FAIL'}  {why[:300]}", flush=True)
    (out / "torch_parity.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':<20} " + " ".join(f"{c:<11}" for c in a.configs.split(",")))
    for case in a.cases.split(","):
        cells = [next(("PASS" if r["ok"] else "FAIL") for r in rows if r["case"] == case and r["config"] == c)
                 for c in a.configs.split(",")]
        print(f"{case:<20} " + " ".join(f"{x:<11}" for x in cells))
    print(f"{len(rows) - failed}/{len(rows)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
