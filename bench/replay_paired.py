"""The recorded traces replayed through PyTorch's allocator API on the GPU, native against libsymm, in
pairs of short slices: ns per allocator call where both sides see the same machine.

    make                                    # build/libsymm.so
    python3 bench/replay_paired.py          # on the GPU machine; writes $OUT/replay_paired.md
    python3 bench/replay_paired.py --traces cnn_train --configs native,symm,symm_expandable --pairs 40

What bench/replay_torch.py replays (its trace compiler, its C++ loop, its configurations' environment),
timed the way bench/bench_paired.py times PyTorch's entry points: one long-lived process per
configuration and trace, all alive together (the allocator can be swapped once per process), each
replaying one pass to fill its pool and then, on request, --passes passes; the parent takes the
configurations in turn, reversing the order every other pair (bench/pairing.py). A slice's figure is its
median pass's ns per call; the table gives each configuration's median over its slices, the median and
quartiles of the pairs' ratios to the first configuration, its peaks after all the passes (the allocator
in charge's own figures) and the allocations that failed. The shared hosts' CPU changes speed about
twofold from one second to the next; a pair's slices are a fraction of a second apart.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_torch as rt  # noqa: E402  (its trace compiler, extension and environments)
from pairing import ChildError, quartiles, run_served  # noqa: E402

READY_TIMEOUT_S = 300  # torch, CUDA, the pool's first pass of the trace


def serve(config: str, ext: Path, data: Path) -> None:
    """The child: one configuration, one compiled trace; a pass to fill the pool, then READY, then
    one slice per request line (a number of passes) until stdin closes, then its PEAKS."""
    import torch

    symm = None
    if config in rt.SYMM_CONFIGS:
        import symm

        symm.use_as_default()  # before anything initializes CUDA
    torch.cuda.init()
    torch.cuda.set_device(0)
    ext_mod = rt.load_extension(ext)
    comp = rt.read_compiled(data)
    cols = rt.columns_bytes(comp)
    streams = [torch.cuda.Stream() for _ in range(comp["streams"] - 1)]  # made once, kept alive
    handles = [0] + [s.cuda_stream for s in streams]

    def replay(passes: int) -> list:
        return ext_mod.replay(cols, comp["ops"], comp["nslots"], handles, passes, "")["passes"]

    errors = sum(p[2] for p in replay(1))
    print("READY", flush=True)
    for line in sys.stdin:
        passes = replay(int(line))
        errors += sum(p[2] for p in passes)
        print("SLICE " + json.dumps({"median_ns": statistics.median(p[0] for p in passes), "errors": errors}),
              flush=True)
    torch.cuda.synchronize()
    print("PEAKS " + json.dumps(dict(rt.read_peaks(torch, symm), errors=errors), default=str), flush=True)


def time_trace(name: str, configs: list, ext: Path, data: Path, pairs: int, passes: int) -> dict:
    specs = [(f"{c} ({name})", [sys.executable, str(Path(__file__).resolve()), "--serve", c, "--ext", str(ext),
                                "--data", str(data)], rt.child_env(c)) for c in configs]
    ns, reports = run_served(specs, READY_TIMEOUT_S, pairs, str(passes), "PEAKS ", 120)
    return {"ns": ns, "ends": [json.loads(r) for r in reports]}


def render(results: dict, configs: list, meta: dict, pairs: int, passes: int) -> str:
    gib = 1 << 30
    anchor = configs[0]
    out = [
        "# Recorded traces through PyTorch's allocator API, paired slices (bench/replay_paired.py)",
        "",
        f"- date: {meta['date']}; device: {meta['device']}; torch {meta['torch']}",
        f"- method: {pairs} pairs per trace; a slice is the median of {passes} passes' ns per call",
        "",
        f"| trace | calls per pass | configuration | ns per call | / {anchor}: median pair (quartiles) "
        "| peak reserved GiB | peak allocated GiB | failed allocations |",
        "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for t, r in results.items():
        for j, c in enumerate(configs):
            end = r["ends"][j]
            if j:
                lo, mid, hi = quartiles([x / y for x, y in zip(r["ns"][j], r["ns"][0])])
                rel = f"{mid:.2f}× ({lo:.2f}–{hi:.2f})"
            else:
                rel = "–"

            def gb(v):
                return f"{v / gib:.2f}" if isinstance(v, int) else str(v)

            out.append(f"| {t} | {r['ops']:,} | {c} | {quartiles(r['ns'][j])[1]:,.0f} | {rel} "
                       f"| {gb(end.get('reserved'))} | {gb(end.get('allocated'))} | {end.get('errors')} |")
    return "\n".join(out) + "\n"


def parent(a) -> int:
    comps = {rt.trace_name(t): rt.compile_trace(rt.trace_path(t)) for t in a.traces}
    if importlib.util.find_spec("torch") is None:
        print("error: torch is not importable; this benchmark runs on the GPU machine", file=sys.stderr)
        return 2
    import torch

    t0 = time.time()
    ext = rt.build_extension()
    print(f"extension built: {ext} ({time.time() - t0:.0f} s)", flush=True)
    tmp, results = Path(tempfile.mkdtemp(prefix="symm_replay_paired_")), {}
    try:
        for name, comp in comps.items():
            rt.write_compiled(comp, tmp / f"{name}.bin")
            results[name] = time_trace(name, a.configs, ext, tmp / f"{name}.bin", a.pairs, a.passes)
            results[name]["ops"] = comp["ops"]
            print(f"{name}: done ({time.time() - t0:.0f} s)", flush=True)
    except ChildError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}
    report = render(results, a.configs, meta, a.pairs, a.passes)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "replay_paired.md").write_text(report)
        (Path(os.environ["OUT"]) / "replay_paired.json").write_text(json.dumps(results, default=str))
    print(report, flush=True)
    return 1 if any(e.get("errors") for r in results.values() for e in r["ends"]) else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=",".join(rt.TRACES), help="names in bench/testdata, or paths")
    ap.add_argument("--configs", default="native,symm", help=f"of {','.join(rt.CONFIGS)}; the first is the anchor")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--passes", type=int, default=1, help="passes per slice")
    for hidden in ("--serve", "--ext", "--data"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        if a.serve not in rt.CONFIGS:
            ap.error(f"--serve {a.serve!r}: want one of {','.join(rt.CONFIGS)}")
        serve(a.serve, Path(a.ext), Path(a.data))
        return 0
    a.traces = [t for t in a.traces.split(",") if t]
    a.configs = [c for c in a.configs.split(",") if c]
    bad = [c for c in a.configs if c not in rt.CONFIGS] + [t for t in a.traces if not rt.trace_path(t).exists()]
    if bad or len(a.configs) < 2 or len(set(a.configs)) != len(a.configs) or not a.traces:
        ap.error(f"want two or more distinct configurations of {','.join(rt.CONFIGS)} and existing traces; "
                 f"got --configs {','.join(a.configs)} --traces {','.join(a.traces)}")
    if a.pairs < 1 or a.passes < 1:
        ap.error(f"--pairs {a.pairs} --passes {a.passes}: want both at least 1")
    return parent(a)


if __name__ == "__main__":
    sys.exit(main())
