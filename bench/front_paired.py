"""The front cache on against off on the recorded traces, timed in pairs of
short slices, with each setting's peaks.

    make build/bench/bench_trace && python3 bench/front_paired.py
    python3 bench/front_paired.py --pairs 60 --passes 3 --traces cnn_train,llm_infer
    python3 bench/front_paired.py --bin OTHER/build/bench/bench_trace   # another build, e.g. a variant
    python3 bench/front_paired.py --against OLD/build/bench/bench_trace # a change, against the build before it

Two long-lived build/bench/bench_trace processes per trace (--serve), one with
SYMM_POOL_FRONT_CACHE=0 (the default) and one with =1 (read once, at start),
replay the trace through symm_pool_alloc and symm_pool_free on request (with
--against, a third: another build's, front cache on); the parent asks each
in turn for a slice of --passes passes, reversing the order every other pair
(bench/pairing.py). A pair's ratio compares two slices timed tens
of milliseconds apart, so the machine's changes of speed, twofold from one
second to the next on shared hosts, fall on both sides. The table gives per
trace the median ns per call of each setting's slices (a slice's figure is its
median pass), the median and quartiles of the pairs' on/off ratios, and the
peaks each process reached, which the front cache must leave as they are.

Runs on the host backend unless SYMM_DEVICE is set. Writes $OUT/front_paired.md
when OUT is set.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pairing import ChildError, quartiles, run_served  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("cnn_train", "gpt2_train", "llm_infer")
NAMES = {"cnn_train": "ResNet-50 training", "gpt2_train": "GPT-2 training", "llm_infer": "LLM inference"}
READY_TIMEOUT_S = 300  # reading the trace and one pass, on a slow machine
# bench_trace's last line; builds before it counted hits print no hits part.
PEAKS = re.compile(r"peak allocated (-?\d+) bytes, peak reserved (-?\d+) bytes(?:, front cache hits (\d+) of (\d+))?")


def serve_env(front_cache: int) -> dict:
    env = dict(os.environ)
    env.setdefault("SYMM_DEVICE", "host")
    env["SYMM_PUBLISH"] = "0"
    env["SYMM_POOL_FRONT_CACHE"] = str(front_cache)
    return env


def sides_of(binary: Path, against) -> list:
    """(name, binary, SYMM_POOL_FRONT_CACHE) of each process a trace runs in:
    this build off (the anchor) and on, and another build on (--against)."""
    sides = [("off", binary, 0), ("on", binary, 1)]
    return sides + ([("on, --against build", against, 1)] if against else [])


def time_trace(sides: list, csv: Path, pairs: int, passes: int) -> dict:
    """One trace: each side's slices, taken in turn (the order reversed every
    other pair), and the peaks and front-cache hits each process reached."""
    specs = [(f"{name} ({csv.stem})", [str(binary), str(csv), "--serve"], serve_env(fc)) for name, binary, fc in sides]
    ns, reports = run_served(specs, READY_TIMEOUT_S, pairs, str(passes), "PEAKS ", 60)
    ends = []
    for report in reports:
        m = PEAKS.search(report)
        ends.append(tuple(-1 if g is None else int(g) for g in m.groups()) if m else (-1, -1, -1, -1))
    return {"ns": ns, "ends": ends}


def rows_of(csv: Path) -> int:
    """The rows bench_trace replays: alloc and free_completed."""
    with open(csv) as f:
        return sum(1 for ln in f if ln.startswith(("alloc,", "free_completed,")))


def render(results: dict, sides: list, pairs: int, passes: int) -> str:
    mib = 1 << 20
    out = [
        f"{pairs} pairs per trace; a slice is the median of {passes} passes; "
        f"backend {os.environ.get('SYMM_DEVICE', 'host')}.",
        "",
        "| trace | rows | process | ns per call | / off: median pair (quartiles) | / on | peak allocated MiB "
        "| peak reserved MiB | allocations the front cache served |",
        "| --- | ---: | --- | ---: | --- | --- | ---: | ---: | ---: |",
    ]

    def ratio(xs, ys):
        lo, mid, hi = quartiles([x / y for x, y in zip(xs, ys)])
        return f"{mid:.2f}× ({lo:.2f}–{hi:.2f})"

    for t, r in results.items():
        ns, ends = r["ns"], r["ends"]
        for j, (name, _, fc) in enumerate(sides):
            alloc, reserved, hits, allocs = ends[j]

            def peak(v, anchor):
                return "?" if v < 0 else f"{v // mib:,}{'' if v == anchor else ' (differs)'}"

            out.append(
                f"| {NAMES.get(t, t)} | {r['rows']:,} | {name} | {quartiles(ns[j])[1]:,.0f} "
                f"| {'–' if j == 0 else ratio(ns[j], ns[0])} | {ratio(ns[j], ns[1]) if j > 1 else '–'} "
                f"| {peak(alloc, ends[0][0])} | {peak(reserved, ends[0][1])} "
                f"| {f'{100 * hits / max(allocs, 1):.1f} %' if fc and allocs >= 0 else '–'} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=ROOT / "build" / "bench" / "bench_trace")
    ap.add_argument("--against", type=Path, help="another build's bench_trace, timed with the front cache on "
                    "in the same pairs (a change to the front cache against the tree before it)")
    ap.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, of {', '.join(TRACES)}")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--passes", type=int, default=3, help="passes of the trace per slice (1 to 1000)")
    args = ap.parse_args()
    traces = [t for t in args.traces.split(",") if t]
    if not traces or set(traces) - set(TRACES):
        ap.error(f"--traces {args.traces!r}: want some of {', '.join(TRACES)}")
    if args.pairs < 1 or not 1 <= args.passes <= 1000:
        ap.error(f"--pairs {args.pairs} --passes {args.passes}: want pairs >= 1 and passes from 1 to 1000")
    for opt, path in (("--bin", args.bin), ("--against", args.against)):
        if path is not None and not os.access(path, os.X_OK):
            ap.error(f"{opt} {path}: not an executable (make build/bench/bench_trace builds it)")
    sides = sides_of(args.bin, args.against)
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="front_paired."))
    results = {}
    try:
        for t in traces:
            csv = tmp / f"{t}.csv"
            with gzip.open(ROOT / "bench" / "testdata" / f"{t}_trace.csv.gz", "rb") as src, open(csv, "wb") as dst:
                shutil.copyfileobj(src, dst)
            results[t] = time_trace(sides, csv, args.pairs, args.passes)
            results[t]["rows"] = rows_of(csv)
            csv.unlink()
            print(f"{t}: done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    except ChildError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = render(results, sides, args.pairs, args.passes)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "front_paired.md").write_text(report)
    print(report, end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
