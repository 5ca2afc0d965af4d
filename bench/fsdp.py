"""FSDP2 training of GPT-2 small on several GPUs, PyTorch's allocator vs libsymm: peak bytes and step time.

    make                                   # here (build/libsymm.so, build/symm); on the GPU machine, build/ carried:
    python3 bench/fsdp.py --worlds 2,4     # writes $OUT/fsdp.md and .jsonl (no OUT: build/)
    python3 bench/fsdp.py --worlds 2 --modes native --runs 1 --record-trace bench/testdata

The workload: GPT2LMHeadModel (random weights from GPT2Config(), fp32), every block and the root wrapped
by torch.distributed.fsdp.fully_shard, AdamW, batch 8 per rank, 36 steps whose sequence length varies
(the same list as bench/workloads.py's gpt2), NCCL. FSDP2 all-gathers and reduce-scatters on streams of
its own and frees across streams, which a one-GPU run never does.

Modes, each in its own torchrun (the allocator is chosen once per process): native, native_expandable
(expandable_segments:True), symm and symm_expandable (SYMM_POOL_EXPANDABLE=1). The libsymm modes run
the script unedited through SYMM_TORCH_ALLOCATOR=1 with symm/_boot on PYTHONPATH: what `symm run` does.
Runs are interleaved: run 1 of every mode, then run 2 of every mode, ...

Per rank: peak reserved and allocated as torch.cuda.max_memory_* report them (libsymm's extension
answers them in its modes), median step time after 3 warm-up steps (synchronize before each clock read),
and the losses (FSDP's reductions are not bitwise deterministic from run to run, PyTorch's allocator
alike: the table shows the largest difference from native's, about 1e-6 on a loss near 11). The table takes the largest rank's peaks and the
slowest rank's step time, then the median over runs.

--record-trace DIR: one extra native run per world with PyTorch's memory history on; every rank's device
trace goes to DIR/fsdp_gpt2_w<W>_rank<R>_trace.csv.gz (action,addr,size,stream: what `symm replay` reads).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from workloads import GPT2_SEQS, SAFE_ENV, write_trace_csv  # noqa: E402

MODES = ("native", "native_expandable", "symm", "symm_expandable")
STEPS, BATCH, WARMUP, MiB = 36, 8, 3, 1 << 20


# ---- the torchrun worker -------------------------------------------------------


def worker(a) -> None:
    import torch

    rank_local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank_local)  # first, as scripts do: libsymm must already be installed
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import GPT2Config, GPT2LMHeadModel

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda().train()
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if a.trace_dir:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=3_000_000)
    gen = torch.Generator(device="cuda").manual_seed(1000 + rank)
    times, losses = [], []
    torch.cuda.synchronize()
    for i in range(a.steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, cfg.vocab_size, (BATCH, GPT2_SEQS[i % len(GPT2_SEQS)]), device="cuda", generator=gen)
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        del ids, loss
    res = {
        "rank": rank,
        "world": dist.get_world_size(),
        "backend": torch.cuda.get_allocator_backend(),
        "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / MiB, 1),
        "peak_alloc_mib": round(torch.cuda.max_memory_allocated() / MiB, 1),
        "median_step_ms": round(statistics.median(times[WARMUP:]), 3),
        "losses": losses,
    }
    if a.trace_dir:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        path = Path(a.trace_dir) / f"fsdp_gpt2_w{res['world']}_rank{rank}_trace.csv.gz"
        res["trace_rows"] = write_trace_csv(snap, torch.cuda.current_device(), path)
    # One file per rank: the ranks' stdout lines interleave under torchrun.
    Path(a.result_dir, f"rank{rank}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


# ---- the parent: one torchrun per (world, mode, run) ---------------------------


def env_for(mode: str) -> dict:
    env = dict(os.environ, **SAFE_ENV)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "SYMM_POOL_EXPANDABLE", "SYMM_TORCH_ALLOCATOR"):
        env.pop(k, None)
    if mode == "native_expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if mode.startswith("symm"):
        env["SYMM_TORCH_ALLOCATOR"] = "1"
        env["SYMM_TORCH_EXT"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python" / "symm" / "_boot"), env.get("PYTHONPATH")]))
        if mode == "symm_expandable":
            env["SYMM_POOL_EXPANDABLE"] = "1"
    return env


def launch(world: int, mode: str, a, trace_dir=None) -> dict:
    results = Path(tempfile.mkdtemp(prefix="symm-fsdp-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(Path(__file__).resolve()), "--worker", "--steps", str(a.steps), "--result-dir", str(results)]
    if trace_dir:
        cmd += ["--trace-dir", str(trace_dir)]
    start = time.time()
    p = subprocess.run(cmd, env=env_for(mode), capture_output=True, text=True, timeout=a.timeout)
    ranks = sorted((json.loads(f.read_text()) for f in results.glob("rank*.json")), key=lambda r: r["rank"])
    shutil.rmtree(results, ignore_errors=True)
    row = {"world": world, "mode": mode, "seconds": round(time.time() - start, 1), "ranks": ranks,
           "error": "" if p.returncode == 0 and len(ranks) == world else f"rc={p.returncode}: " + p.stderr[-1500:]}
    if ranks:
        row["peak_reserved_mib"] = max(r["peak_reserved_mib"] for r in ranks)
        row["peak_alloc_mib"] = max(r["peak_alloc_mib"] for r in ranks)
        row["step_ms"] = max(r["median_step_ms"] for r in ranks)
        row["backend"] = sorted({r["backend"] for r in ranks})
    return row


def render(rows: list, worlds, modes) -> str:
    out = [f"FSDP2 GPT-2 small, {STEPS} steps, batch {BATCH} per rank; max over ranks, median over runs",
           "", "| world | mode | peak reserved MiB | peak allocated MiB | reserved / allocated | vs PyTorch's same mode | "
           "step ms | step vs PyTorch | max loss difference from native | runs |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w in worlds:
        med = {}
        for m in modes:
            ok = [r for r in rows if r["world"] == w and r["mode"] == m and not r["error"]]
            if ok:
                med[m] = {k: statistics.median(r[k] for r in ok) for k in ("peak_reserved_mib", "peak_alloc_mib", "step_ms")}
                med[m]["runs"] = len(ok)
        ref_losses = next((r["ranks"][0]["losses"] for r in rows if r["world"] == w and r["mode"] == "native"
                           and not r["error"]), None)
        for m in modes:
            if m not in med:
                out.append(f"| {w} | {m} | failed | | | | | | | 0 |")
                continue
            x, ref = med[m], med.get(m.replace("symm", "native"))
            diffs = [max(abs(a - b) for a, b in zip(r["ranks"][0]["losses"], ref_losses))
                     for r in rows if r["world"] == w and r["mode"] == m and not r["error"]] if ref_losses else []
            same = f"{max(diffs):.1e}" if diffs else "?"
            vs = f"{x['peak_reserved_mib'] / ref['peak_reserved_mib']:.3f}×" if ref and m.startswith("symm") else ""
            vt = f"{x['step_ms'] / ref['step_ms']:.3f}×" if ref and m.startswith("symm") else ""
            out.append(f"| {w} | {m} | {x['peak_reserved_mib']:,.0f} | {x['peak_alloc_mib']:,.0f} | "
                       f"{x['peak_reserved_mib'] / x['peak_alloc_mib']:.3f} | {vs} | {x['step_ms']:.1f} | {vt} | "
                       f"{same} | {x['runs']} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", help=argparse.SUPPRESS)
    ap.add_argument("--result-dir", help=argparse.SUPPRESS)
    ap.add_argument("--worlds", default="2")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per torchrun")
    ap.add_argument("--record-trace", metavar="DIR", help="one more native run per world with memory history on")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    worlds = [int(w) for w in a.worlds.split(",")]
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; known: {', '.join(MODES)}")
    out = Path(os.environ.get("OUT", ROOT / "build"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "fsdp.jsonl", "a") as log:
        for w in worlds:
            if a.record_trace:
                row = launch(w, "native", a, trace_dir=Path(a.record_trace).resolve())
                print(f"trace w={w}: {[r.get('trace_rows') for r in row['ranks']]} rows {row['error'][:300]}", flush=True)
            for run in range(a.runs):
                for m in modes:
                    row = launch(w, m, a)
                    row["run"] = run
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    print(f"w={w} {m} run {run}: reserved {row.get('peak_reserved_mib')} alloc {row.get('peak_alloc_mib')} "
                          f"step {row.get('step_ms')} ms {row['error'][:500]}", flush=True)
    table = render(rows, worlds, modes)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (out / "fsdp.md").write_text(f"{stamp}, commit {os.environ.get('SYMM_COMMIT', '?')}\n\n{table}\n")
    print(table)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
