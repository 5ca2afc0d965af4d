"""PyTorch's allocator entry points, native against libsymm, timed in pairs of
short slices on one CPU, so that both sides of every ratio see the same machine.

    python3 bench/bench_paired.py                       # on the GPU machine; writes $OUT/paired.md
    SYMM_BENCH_SIZES=512,1M,64M python3 bench/bench_paired.py --pairs 100 --configs native,symm

Why not rounds of whole processes (bench/bench_torch.py --rounds): on the
shared GPU hosts the CPU's speed changes about twofold from one second to the
next, for every process alike and on every CPU, pinned or not. A round times
each configuration for seconds in a process of its own, so whether its
process met a fast or a slow stretch decides a round's ratio more than the
allocator does (bench/RESULTS.md shows both kinds of run).

Here each configuration runs in one long-lived process (the process-wide
allocator can be swapped only once), its timing thread pinned to the same
CPU as the others', and waits. The parent asks them in turn to time one slice
(bench_torch's C++ loops: 10 warm-up calls, then the median of SLICE_REPS runs
of about SLICE_MS each) of one operation at one size, alternating which goes
first. A pair is one slice of each, tens of milliseconds apart; its ratio
compares the two under the same conditions. The table gives, per operation and
size, each configuration's median ns per call over its slices and the median
(and quartiles) of the pairs' ratios to the first configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_torch as bt  # noqa: E402  (its extension, installers and formatting)
from pairing import Child, ChildError, quartiles, turn  # noqa: E402

OPS = (("raw", "raw_alloc + raw_delete"), ("allocate", "allocate() + deleter"), ("empty", "at::empty + destroy"))
SLICE_MS = 10.0
SLICE_REPS = 3
READY_TIMEOUT_S = 180  # import torch, build nothing, install the allocator, initialize CUDA


def serve(config: str, ext: Path) -> None:
    """The child: install the allocator, pin the timing thread, then time one
    slice per request line ("OP SIZE") until stdin closes."""
    import torch  # noqa: F401  (libtorch before the extension)

    bench = bt.load_extension(ext)
    try:
        bt.install(config, ext)
    except bt.Skip as e:
        print(f"SKIP {config}: {e}", flush=True)
        return
    cpu = os.environ.get("SYMM_PAIRED_CPU", "")
    if cpu:
        os.sched_setaffinity(0, {int(cpu)})  # this thread only: CUDA's and Go's threads stay where they are
    fns = {"raw": bench.raw_pair, "allocate": bench.allocate_pair, "empty": bench.empty_pair}
    print("READY", flush=True)
    for line in sys.stdin:
        op, size = line.split()
        print("SLICE " + json.dumps(fns[op](int(size), SLICE_MS, SLICE_REPS)), flush=True)


def run_pairs(children: list, sizes, pairs: int, ops=tuple(op for op, _ in OPS)) -> dict:
    """Times every (op, size) cell `pairs` times in each child. The cells take
    turns (pair i of every cell, then pair i + 1), so that a slow stretch of
    the machine falls on all of them; within a pair the order alternates.
    Returns {op: {size: {config: [ns per call of each slice]}}}."""
    out = {op: {str(s): {c.config: [] for c in children} for s in sizes} for op in ops}
    for i in range(pairs):
        for op in ops:
            for size in sizes:
                for c in turn(children, i):
                    out[op][str(size)][c.config].append(c.slice(f"{op} {size}")["median_ns"])
    return out


def render(slices: dict, configs: list, sizes, meta: dict, pairs: int, cpu) -> str:
    anchor, others = configs[0], configs[1:]
    out = [
        "# libsymm in PyTorch: paired slices (bench/bench_paired.py)",
        "",
        f"- date: {meta['date']}",
        f"- device: {meta['device']}; torch {meta['torch']} (CUDA {meta['cuda']}); libsymm {meta['symm']}",
        f"- method: {pairs} pairs per row; a slice is 10 warm-up calls then the median of {SLICE_REPS} runs of "
        f"about {SLICE_MS:.0f} ms; timing threads pinned to CPU {cpu}",
        "",
        f"| operation | size | {anchor} ns | "
        + " | ".join(f"{c} ns | {c}/{anchor}: median pair (quartiles)" for c in others) + " |",
        "| --- | --- | ---: |" + " ---: | --- |" * len(others),
    ]
    for op, label in OPS:
        if op not in slices:
            continue
        for size in sizes:
            cell = slices[op][str(size)]
            row = f"| {label} | {bt.fmt_size(size)} | {quartiles(cell[anchor])[1]:,.0f} |"
            for c in others:
                ratios = [x / a for x, a in zip(cell[c], cell[anchor])]
                lo, mid, hi = quartiles(ratios)
                row += f" {quartiles(cell[c])[1]:,.0f} | {mid:.2f}× ({lo:.2f}–{hi:.2f}) |"
            out.append(row)
    out += ["", f"Lower is better: {'/'.join(others)}/{anchor} < 1 means faster than {anchor}."]
    return "\n".join(out) + "\n"


def parent(configs: list, pairs: int, cpu) -> int:
    t0 = time.time()
    ext = bt.build_extension()
    print(f"extension built: {ext} ({time.time() - t0:.0f} s)", flush=True)
    children = []
    try:
        for c in configs:
            env = bt.child_env(c)
            if cpu is not None:
                env["SYMM_PAIRED_CPU"] = str(cpu)
            children.append(Child(c, [sys.executable, str(Path(__file__).resolve()), "--serve", c, "--ext", str(ext)], env))
        for c in children:
            c.expect("READY", READY_TIMEOUT_S)
        slices = run_pairs(children, bt.SIZES, pairs)
    except ChildError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for c in children:
            c.close()
    report = render(slices, configs, bt.SIZES, bt.metadata(), pairs, cpu)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "paired.md").write_text(report)
        (Path(out_dir) / "paired.json").write_text(json.dumps(slices))
    print(report, flush=True)
    print(f"total {time.time() - t0:.0f} s", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", choices=bt.CONFIGS)
    ap.add_argument("--ext", type=Path)
    ap.add_argument("--configs", default="native,symm", help="comma-separated; the first is the anchor of the ratios")
    ap.add_argument("--pairs", type=int, default=60, help="slices of each configuration per operation and size")
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the CPU every timing thread is pinned to (-1: not pinned); default the last one allowed")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.ext)
        return 0
    configs = [c for c in args.configs.split(",") if c]
    if len(configs) < 2 or len(set(configs)) != len(configs) or set(configs) - set(bt.CONFIGS):
        ap.error(f"--configs {args.configs!r}: want two or more distinct of {', '.join(bt.CONFIGS)}")
    if args.pairs < 1:
        ap.error(f"--pairs must be at least 1, not {args.pairs}")
    if args.cpu != -1 and args.cpu not in os.sched_getaffinity(0):
        ap.error(f"--cpu {args.cpu}: not one of the CPUs this process may use: {sorted(os.sched_getaffinity(0))}")
    return parent(configs, args.pairs, None if args.cpu == -1 else args.cpu)


if __name__ == "__main__":
    sys.exit(main())
