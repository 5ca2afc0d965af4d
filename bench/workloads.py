"""Real training and inference runs, PyTorch's allocator vs libsymm: peak bytes and step time.

    make                                  # here (build/libsymm.so); then on the GPU machine, build/ carried:
    python3 bench/workloads.py            # all; writes $OUT/workloads.md and .jsonl (no OUT: build/)
    python3 bench/workloads.py --workloads gpt2 --modes native,symm --runs 1 [--record-trace DIR]

Workloads (fixed seeds, random weights from configs, no downloads): gpt2 (GPT-2 small training, fp32,
AdamW, batch 8, 48 steps of varying sequence length), cnn (resnet50 training, fp32, SGD, 48 steps,
batch 8..128 at random, 224x224), llm_infer (12-layer 1024-wide GPT-2, fp16: 12 requests of batch
1-16, prompt 64-1024, 16-64 new tokens decoded greedily with a growing DynamicCache; step = request),
generate (a GPT-2-medium-sized model, 24 layers 1024 wide, fp16, serving 12 generate requests of batch
1-8, prompt 32-512, 32-128 new tokens, each followed by a ResNet-18 inference of batch 16-64 in the same
process: two models' working sets taking turns; step = request).
Modes, each in a fresh interpreter (the allocator can be swapped once per process): native,
native_expandable (expandable_segments:True), symm (symm.use_as_default()), symm_expandable (with
SYMM_POOL_EXPANDABLE=1), symm_hooks and symm_hooks_expandable (the same without libsymm's PyTorch
extension: torch's plain CUDAPluggableAllocator with libsymm's hooks, SYMM_TORCH_EXT=0),
symm_expandable_keep (symm_expandable with SYMM_POOL_UNMAP_FREE_PAGES=0: free chunks inside a segment
stay mapped, where by default they are unmapped and their memory mapped where the pool grows; with the
chunk statistics table, what unmapping them costs; SYMM_POOL_EXPANDABLE_CHUNK passes through to every mode),
symm_front (symm with its front cache on, SYMM_POOL_FRONT_CACHE=1; off by default),
symm_mempool (MemPool(symm.pool_allocator().allocator()) around the whole
workload; use_mem_pool routes only this thread's allocations, so backward's, made on autograd's
device thread, come from PyTorch's default pool).

Per run: peak device = a poller *process* reading NVML's used bytes every 1 ms while the child runs,
minus those read just before it starts (CUDA context included); without pynvml, the child's
mem_get_info() at step boundaries minus its value after CUDA init (column src). Peak reserved and
allocated as the allocator in charge sees them (torch.cuda.max_memory_* or symm.memory_stats(0)).
Median step time after 3 warm-up steps, synchronize() before each clock read. --record-trace DIR
adds one untimed native run per workload with PyTorch's memory history on and writes
DIR/<workload>_trace.csv.gz (action,addr,size,stream: what `symm replay` reads).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
WORKLOADS = ("gpt2", "cnn", "llm_infer", "generate")
MODES = ("native", "native_expandable", "symm", "symm_expandable", "symm_mempool", "symm_hooks",
         "symm_hooks_expandable", "symm_expandable_keep", "symm_front")
REPLACE_MODES = ("symm", "symm_expandable", "symm_hooks", "symm_hooks_expandable", "symm_expandable_keep", "symm_front")
# libsymm's statistics of what mapping and unmapping chunks cost, per run.
CHUNK_STATS = ("num_chunk_maps", "num_chunk_unmaps", "chunk_map_us", "chunk_unmap_us", "num_spare_chunks_reused",
               "num_release_failures")
DEFAULT_MODES = MODES[:5]  # the hooks-only modes compare libsymm with and without its extension: opt in
SEED, WARMUP, POLL_S, MiB = 0, 3, 0.001, 1 << 20
GPT2_SEQS = (128, 1024, 256, 768, 512, 1000, 64, 900, 333, 1024, 200, 640)
CNN_BATCHES = (8, 16, 24, 32, 48, 64, 96, 128)
STEPS = {"gpt2": 48, "cnn": 48, "llm_infer": 12, "generate": 12}
TRACE_COLUMNS = ("action", "addr", "size", "stream")


# ---- workloads: generators that yield once after setup, then once per step ----


def train_step(loss, opt) -> None:
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def wl_gpt2(torch, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(SEED)
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).to("cuda").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    yield
    for i in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (8, GPT2_SEQS[i % len(GPT2_SEQS)]), device="cuda")
        train_step(model(ids, labels=ids).loss, opt)
        del ids
        yield


def wl_cnn(torch, steps):
    import random

    import torchvision
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    model = torchvision.models.resnet50(weights=None).to("cuda").train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    yield
    for _ in range(steps):
        bs = rng.choice(CNN_BATCHES)
        x = torch.randn(bs, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (bs,), device="cuda")
        train_step(torch.nn.functional.cross_entropy(model(x), y), opt)
        del x, y
        yield


def llm_requests(n=STEPS["llm_infer"]):
    """(batch, prompt length, new tokens) of each request, from a fixed seed."""
    import random
    rng = random.Random(SEED)
    return [(rng.choice((1, 4, 8, 16)), rng.randint(64, 1024), rng.randint(16, 64)) for _ in range(n)]


def wl_llm_infer(torch, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(SEED)
    cfg = GPT2Config(n_layer=12, n_embd=1024, n_head=16, n_positions=4096)
    model = GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.float16).eval()
    reqs = llm_requests(max(steps, 1))
    yield
    with torch.no_grad():
        for bs, plen, new in reqs[:steps]:
            decode(torch, model, cfg, bs, plen, new)
            yield


def decode(torch, model, cfg, bs, plen, new):
    """One request: a prompt of bs x plen random tokens, then new tokens
    decoded greedily, one at a time, with a growing DynamicCache."""
    ids = torch.randint(0, cfg.vocab_size, (bs, plen), device="cuda")
    out = model(input_ids=ids, use_cache=True)
    past, nxt = out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)
    for _ in range(new - 1):
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)
    del out, past, nxt, ids


def wl_generate(torch, steps):
    import random
    import torchvision
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(SEED)
    cfg = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024)
    lm = GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.float16).eval()
    cnn = torchvision.models.resnet18(weights=None).to(device="cuda", dtype=torch.float16).eval()
    rng = random.Random(SEED + 1)
    reqs = [(rng.choice((1, 2, 4, 8)), rng.randint(32, 512), rng.randint(32, 128), rng.choice((16, 32, 64)))
            for _ in range(max(steps, 1))]
    yield
    with torch.no_grad():
        for bs, plen, new, images in reqs[:steps]:
            decode(torch, lm, cfg, bs, plen, new)
            x = torch.randn(images, 3, 224, 224, device="cuda", dtype=torch.float16)
            cnn(x).argmax(-1)
            del x
            yield


WORKLOAD_FNS = {"gpt2": wl_gpt2, "cnn": wl_cnn, "llm_infer": wl_llm_infer, "generate": wl_generate}


# ---- child: one workload in one mode ------------------------------------------


def write_trace_csv(snapshot: dict, device: int, path) -> int:
    """Writes snapshot["device_traces"][device] as action,addr,size,stream (gzip); returns rows."""
    traces = snapshot.get("device_traces") or []
    entries = traces[device] if device < len(traces) else []
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(TRACE_COLUMNS)
        for e in entries:
            w.writerow([e.get("action", "")] + [int(e.get(k) or 0) for k in TRACE_COLUMNS[1:]])
    return len(entries)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def blank_row(workload: str, mode: str, run: int) -> dict:
    return dict(workload=workload, mode=mode, run=run, peak_device_mib=None, peak_device_src="mem_get_info",
                peak_alloc_mib=None, peak_reserved_mib=None, median_step_ms=None, steps=0, error=None,
                date=utc_now(), device=None)


def child_main(a) -> None:
    res = blank_row(a.child, a.mode, a.run)
    try:
        run_child(a, res)
    except Exception as e:  # reported as a row, never a crash
        res["error"] = res["error"] or f"{type(e).__name__}: {e}"[:2000]
        traceback.print_exc()
    print("RESULT " + json.dumps(res), flush=True)


def run_child(a, res: dict) -> None:
    import torch

    mode, symm = a.mode, None
    if mode in REPLACE_MODES:
        import symm
        symm.use_as_default()  # before anything initializes CUDA
    torch.cuda.init()
    torch.cuda.set_device(0)
    dev, pool = torch.cuda.current_device(), None
    res["device"], res["torch"] = torch.cuda.get_device_name(dev), torch.__version__
    if mode == "symm_mempool":
        import symm
        pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
    if symm is not None:
        res["symm"] = symm.version()
    free, total = torch.cuda.mem_get_info(dev)
    base = peak_used = total - free

    def sample():
        nonlocal peak_used
        f, t = torch.cuda.mem_get_info(dev)
        peak_used = max(peak_used, t - f)

    steps = a.steps if a.steps is not None else STEPS[a.child]
    times: list[float] = []
    gen, tracing = None, bool(a.trace_dir)
    try:
        with (torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()):
            if tracing:
                torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                         max_entries=2_000_000)
            gen = WORKLOAD_FNS[a.child](torch, steps)
            next(gen)  # builds the model: not timed
            torch.cuda.synchronize()
            sample()
            t0 = time.perf_counter()
            for _ in gen:
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
                sample()
                t0 = time.perf_counter()
    except Exception as e:  # e.g. out of memory: the peaks so far still count
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        traceback.print_exc()
    finally:
        if tracing:
            try:
                snap = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                path = Path(a.trace_dir) / f"{a.child}_trace.csv.gz"
                res["trace_rows"] = write_trace_csv(snap, dev, path)
                res["trace"] = str(path)
            except Exception as e:
                res["trace_error"] = f"{type(e).__name__}: {e}"
    res["steps"], res["step_ms"], timed = len(times), [round(t, 3) for t in times], times[WARMUP:]
    res["median_step_ms"] = round(statistics.median(timed), 3) if timed else None
    res["peak_device_mib"] = round((peak_used - base) / MiB, 1)
    if mode in REPLACE_MODES:
        st = symm.memory_stats(0)
        alloc, reserved = st.get("allocated_bytes.all.peak"), st.get("reserved_bytes.all.peak")
        res["chunk_stats"] = {k: st.get(k) for k in CHUNK_STATS}
    else:
        alloc, reserved = torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)
        if mode == "symm_mempool":
            res["symm_peak_reserved_mib"] = round(symm.memory_stats(0).get("reserved_bytes.all.peak", 0) / MiB, 1)
    res["peak_alloc_mib"] = round(alloc / MiB, 1) if alloc is not None else None
    res["peak_reserved_mib"] = round(reserved / MiB, 1) if reserved is not None else None
    try:  # orderly teardown, so an exit-time problem is named here
        import gc
        if gen is not None:
            gen.close()
        gen = None
        gc.collect()
        torch.cuda.synchronize()
        del pool
        torch.cuda.empty_cache()
    except Exception as e:
        res["teardown_error"] = f"{type(e).__name__}: {e}"


# ---- the NVML poller: a process of its own, so the child's GIL never delays it ----


def nvml_index() -> int:
    """NVML index of CUDA device 0 when CUDA_VISIBLE_DEVICES names it by number, else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def _poll(index: int, interval: float, stop, conn) -> None:
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)

        def read():
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

        baseline = read()
        for _ in range(4):  # memory of a child that just exited may still be going back
            time.sleep(0.002)
            baseline = min(baseline, read())
    except Exception as e:
        return conn.send({"error": f"{type(e).__name__}: {e}"})
    conn.send({"baseline": baseline})
    peak, n, errors = baseline, 0, 0
    while not stop.is_set():
        try:
            peak, n = max(peak, read()), n + 1
        except Exception:
            errors += 1
        time.sleep(interval)
    conn.send({"baseline": baseline, "peak": peak, "samples": n, "read_errors": errors})
    with contextlib.suppress(Exception):
        pynvml.nvmlShutdown()


class Poller:
    """Peak NVML used bytes while a child runs: start() before it, stop() after it."""

    def __init__(self, index: int = 0, interval: float = POLL_S):
        self.index, self.interval, self.proc, self.error = index, interval, None, None

    def start(self) -> bool:
        import multiprocessing as mp
        ctx = mp.get_context("fork")  # the parent holds no CUDA state and imports no torch
        sys.stdout.flush(), sys.stderr.flush()  # the fork must not print buffered output again
        self.conn, w = ctx.Pipe(duplex=False)
        self.stop_ev = ctx.Event()
        self.proc = ctx.Process(target=_poll, args=(self.index, self.interval, self.stop_ev, w), daemon=True)
        self.proc.start()
        w.close()  # the poller holds its own copy
        msg = self.conn.recv() if self.conn.poll(30) else {"error": "poller did not start in 30 s"}
        self.error = msg.get("error")
        if self.error:
            self.stop()
        return not self.error

    def stop(self) -> dict | None:
        if self.proc is None:
            return None
        self.stop_ev.set()
        msg = self.conn.recv() if not self.error and self.conn.poll(10) else None
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        self.proc = None
        self.conn.close()
        return msg


# ---- parent: run children, write the tables -------------------------------------


def child_env(mode: str) -> dict:
    env = dict(os.environ, **SAFE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    lib = ROOT / "build" / "libsymm.so"
    if "SYMM_LIB" not in env and lib.exists():
        env["SYMM_LIB"] = str(lib)
    for k in ("SYMM_DEVICE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "SYMM_POOL_EXPANDABLE", "SYMM_TORCH_EXT",
              "SYMM_POOL_UNMAP_FREE_PAGES", "SYMM_POOL_FRONT_CACHE"):
        env.pop(k, None)
    env.update({"native_expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                "symm": {"SYMM_TORCH_EXT": "1"},
                "symm_expandable": {"SYMM_POOL_EXPANDABLE": "1", "SYMM_TORCH_EXT": "1"},
                "symm_front": {"SYMM_POOL_FRONT_CACHE": "1", "SYMM_TORCH_EXT": "1"},
                "symm_hooks": {"SYMM_TORCH_EXT": "0"},
                "symm_hooks_expandable": {"SYMM_POOL_EXPANDABLE": "1", "SYMM_TORCH_EXT": "0"},
                "symm_expandable_keep": {"SYMM_POOL_EXPANDABLE": "1", "SYMM_POOL_UNMAP_FREE_PAGES": "0",
                                          "SYMM_TORCH_EXT": "1"}}.get(mode, {}))
    return env


def child_command(workload: str, mode: str, run: int, trace_dir, steps) -> list:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", workload, "--mode", mode, "--run", str(run)]
    return cmd + (["--trace-dir", str(trace_dir)] if trace_dir else []) + (["--steps", str(steps)] if steps else [])


def parse_result(stdout: str):
    lines = [ln for ln in (stdout or "").splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def run_one(workload: str, mode: str, run: int, args, poller) -> dict:
    base = blank_row(workload, mode, run)
    started = poller is not None and poller.start()
    t0 = time.time()
    try:
        proc = subprocess.run(child_command(workload, mode, run, args.trace_dir, args.steps), env=child_env(mode),
                              capture_output=True, text=True, timeout=args.timeout, cwd=str(ROOT))
        row = parse_result(proc.stdout)
        if row is None:
            row = dict(base, error=f"rc={proc.returncode}, no result", log=(proc.stdout + proc.stderr)[-3000:])
        elif proc.returncode != 0:
            row["exit_error"] = f"rc={proc.returncode} after its result"
            row["log"] = (proc.stdout + proc.stderr)[-3000:]
        elif row.get("error"):
            row["log"] = proc.stderr[-3000:]
    except subprocess.TimeoutExpired as e:
        text = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        row = dict(base, error="timeout", log="".join(text)[-3000:])
    except Exception as e:  # could not even start the child
        row = dict(base, error=f"{type(e).__name__}: {e}")
    row["seconds"] = round(time.time() - t0, 1)
    nv = poller.stop() if started else None
    row["peak_device_steps_mib"] = row.get("peak_device_mib")
    if nv and "peak" in nv:
        row.update(peak_device_mib=round((nv["peak"] - nv["baseline"]) / MiB, 1), peak_device_src="nvml", nvml=nv)
    else:
        row["peak_device_src"] = "mem_get_info"
        row["nvml_error"] = (poller.error if poller is not None else "disabled") or "poller gave no result"
    return row


def _f(x, fmt="{:.0f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "–"


def _nums(rows: list, key: str) -> list:
    return [r[key] for r in rows if isinstance(r.get(key), (int, float))]


def render(rows: list, workloads, modes) -> str:
    out = ["# Workloads: PyTorch's allocator vs libsymm (bench/workloads.py)", ""]
    for w in workloads:
        wr = [r for r in rows if r.get("workload") == w and r.get("run", 0) >= 1]
        if not wr:
            continue
        dev = next((r["device"] for r in wr if r.get("device")), "?")
        date = next((r["date"] for r in wr if r.get("date")), utc_now())
        srcs = "/".join(sorted({r.get("peak_device_src", "?") for r in wr}))
        out += [f"## {w} · {dev} · {date} · peak device from {srcs}", "",
                "| mode | peak device MiB (runs) | max | peak reserved | peak alloc | res/alloc | step ms | vs native | errors |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        by_mode = {m: sorted((r for r in wr if r.get("mode") == m), key=lambda r: r["run"]) for m in modes}
        meds = {m: statistics.median(v) if (v := _nums(mr, "median_step_ms")) else None for m, mr in by_mode.items()}
        for m, mr in by_mode.items():
            if not mr:
                continue
            dv, num = [r.get("peak_device_mib") for r in mr], _nums(mr, "peak_device_mib")
            res_, al = max(_nums(mr, "peak_reserved_mib"), default=None), max(_nums(mr, "peak_alloc_mib"), default=None)
            ratio = res_ / al if res_ and al else None
            vs = meds[m] / meds["native"] if meds[m] and meds.get("native") else None
            by_err: dict = {}
            for r in mr:
                if r.get("error") or r.get("exit_error"):
                    by_err.setdefault(str(r.get("error") or r.get("exit_error"))[:100], []).append(str(r["run"]))
            errs = "; ".join(f"run {','.join(v)}: {k}" for k, v in by_err.items()).replace("|", "/").replace("\n", " ")
            out.append(f"| {m} | {' / '.join(_f(x) for x in dv)} | {_f(max(num) if num else None)} | {_f(res_)} | "
                       f"{_f(al)} | {_f(ratio, '{:.3f}')} | {_f(meds[m], '{:.1f}')} | {_f(vs, '{:.2f}×')} | {errs} |")
        out.append("")
        out += chunk_cost_table(by_mode)
    traces = [r for r in rows if r.get("run") == 0]
    if traces:
        out += ["Traces (extra untimed native runs): " + ", ".join(
            f"{r['workload']}: {r.get('trace') or r.get('trace_error') or r.get('error')} ({r.get('trace_rows', 0)} rows)"
            for r in traces), ""]
    out += ["MiB = 2^20 B. peak device: nvml = 1 ms poller process, used minus used before the child (CUDA context "
            "included); mem_get_info = child's used at step boundaries minus after CUDA init. reserved/alloc: torch "
            f"(native*, symm_mempool) or symm.memory_stats (symm*). step ms: median over runs of each run's median "
            f"after {WARMUP} warm-up steps; vs native < 1 is faster. Rows with every field: the .jsonl beside this file."]
    return "\n".join(out) + "\n"


def chunk_cost_table(by_mode: dict) -> list:
    """What mapping and unmapping chunks of expandable segments cost, per step (whole run, setup included,
    over its steps): libsymm's modes with expandable segments only."""
    rows = []
    for m, mr in by_mode.items():
        per = [r for r in mr if isinstance(r.get("chunk_stats"), dict) and r.get("steps")]
        if not per or "expandable" not in m:
            continue

        def med(key):
            v = [r["chunk_stats"][key] / r["steps"] for r in per if isinstance(r["chunk_stats"].get(key), int)]
            return statistics.median(v) if v else None
        rows.append(f"| {m} | {_f(med('num_chunk_maps'), '{:.1f}')} | {_f(med('chunk_map_us'), '{:.0f}')} | "
                    f"{_f(med('num_chunk_unmaps'), '{:.1f}')} | {_f(med('chunk_unmap_us'), '{:.0f}')} | "
                    f"{_f(med('num_spare_chunks_reused'), '{:.1f}')} | {_f(med('num_release_failures'), '{:.2f}')} |")
    if not rows:
        return []
    return ["Chunk maps and unmaps per step (median over runs; the whole run, setup included, over its steps):", "",
            "| mode | maps | µs mapping | unmaps | µs unmapping | spare chunks reused | failed releases |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"] + rows + [""]


def default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "workloads.md" if out else ROOT / "build" / "workloads.md"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--record-trace", dest="record_trace", metavar="DIR", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--steps", type=int, help="override every workload's step count (quick checks)")
    ap.add_argument("--no-nvml", action="store_true", help="skip the NVML poller")
    ap.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, default="native", help=argparse.SUPPRESS)
    ap.add_argument("--run", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", dest="trace_dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.workloads = [w for w in a.workloads.split(",") if w]
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [x for x in a.workloads if x not in WORKLOADS] + [x for x in a.modes if x not in MODES]
    if bad:
        ap.error(f"unknown {bad}; workloads: {','.join(WORKLOADS)}; modes: {','.join(MODES)}")
    if a.runs < 1 or a.timeout <= 0 or (a.steps is not None and a.steps < 1):
        ap.error("--runs, --timeout and --steps must be positive")
    a.out = a.out or default_out()
    return a


def parent_main(a) -> int:
    out_md, out_jsonl = Path(a.out), Path(a.out).with_suffix(".jsonl")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_jsonl.write_text("")
    poller = None if a.no_nvml else Poller(nvml_index())
    plan = []
    if a.record_trace:
        plan += [(w, "native", 0) for w in a.workloads]
    plan += [(w, m, r) for w in a.workloads for r in range(1, a.runs + 1) for m in a.modes]
    rows, t_all = [], time.time()
    for i, (w, m, r) in enumerate(plan, 1):
        a.trace_dir = str(Path(a.record_trace).resolve()) if r == 0 else None
        row = run_one(w, m, r, a, poller)
        if poller is not None and poller.error and row.get("peak_device_src") != "nvml":
            print(f"NVML poller unavailable ({poller.error}): peak device from mem_get_info", flush=True)
            poller = None
        rows.append(row)
        with out_jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        out_md.write_text(render(rows, a.workloads, a.modes))
        status = f"ERROR {row['error'][:200]}" if row.get("error") else "ok"
        print(f"[{i}/{len(plan)}] {w} {m} run {r}: peak device {_f(row.get('peak_device_mib'))} MiB "
              f"({row.get('peak_device_src')}), step {_f(row.get('median_step_ms'), '{:.1f}')} ms, "
              f"{row['seconds']} s, {status}", flush=True)
    print(f"total {time.time() - t_all:.0f} s; wrote {out_md} and {out_jsonl}\n", flush=True)
    print(render(rows, a.workloads, a.modes), flush=True)
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        child_main(a)
        return 0
    return parent_main(a)


if __name__ == "__main__":
    sys.exit(main())
