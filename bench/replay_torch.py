"""Recorded allocation traces replayed through PyTorch's allocator API on the GPU: time per allocator
call and peak memory, PyTorch's caching allocator vs libsymm, on real allocation sequences.

    make                                   # build/libsymm.so, and build/symm for the predictions
    python3 bench/replay_torch.py          # on the GPU machine; writes $OUT/replay_torch.md and .json
    python3 bench/replay_torch.py --traces gpt2_train --configs native,symm --rounds 1 --passes 3
    python3 bench/replay_torch.py --dry-run    # no torch, no GPU: compiles the traces, prints counts

Traces: bench/testdata/NAME_trace.csv.gz, or a path to a trace CSV (plain or gzip). Only alloc and
free_completed rows count, by bench/c/bench_trace.c's rules: rows of size 0 or address 0 are skipped;
an alloc of an address still live first frees the block there (a lost free); a free_completed of an
address not live is skipped. The parent compiles each trace once into dense slots (an int64 file), so
the timed loop indexes an array instead of hashing addresses, and children parse no CSV.

Timed: a C++ extension walks the ops with the GIL released, calling CUDACachingAllocator's
raw_alloc_with_stream (stream index 0: the current stream; each nonzero trace stream id: a
torch.cuda.Stream of its own) and raw_delete, std::chrono::steady_clock around the whole pass; ns per
call = pass time / calls. Blocks live at the end of a pass are freed, untimed, before the next. The
first pass (the pool grows from the driver) is shown apart; "ns per call" is the median over rounds of
each round's median over the other passes. A failed allocation (NULL or an exception, e.g. out of
memory) is counted, never fatal, and like a failed child makes the exit code 1.

Configurations, each in its own interpreter (the allocator can be swapped once per process), taken in
turn within each round: native, native_expandable, symm, symm_expandable (and on request
symm_front: symm with its front cache on, off by default), with the environment that bench/workloads.py's
child_env gives them. Peaks as the allocator in charge reports them
(torch.cuda.max_memory_* or symm.memory_stats(0)), after the first pass (a fresh pool) and after all.
Predicted: `SYMM_TOOL replay TRACE --json` (the pool alone, as the library runs by default): symm vs
its "default" row, symm_expandable vs "expandable"; with `--front-cache 1MiB` (the front cache with its
default largest block): symm_front vs "default"; native vs the trace's recorded peak reserved (the
traces were recorded on native PyTorch).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import gzip
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = Path(os.environ.get("SYMM_BENCH_BUILD", "/tmp/symm_replay_build"))
TRACES = ("gpt2_train", "cnn_train", "llm_infer")
CONFIGS = ("native", "native_expandable", "symm", "symm_expandable", "symm_front")
SYMM_CONFIGS = ("symm", "symm_expandable", "symm_front")
DEFAULT_CONFIGS = CONFIGS[:4]  # symm_front (the front cache on) on request
FRONT_CACHE = "1MiB"  # libsymm's default SYMM_POOL_FRONT_CACHE_MAX, modelled in the predictions
PREDICTED = {"native": "recorded", "symm": "default", "symm_expandable": "expandable", "symm_front": "default_front"}
COLUMNS = ("op", "slot", "size", "stream")
MAGIC, HEADER_WORDS = int.from_bytes(b"SYMRPLY1", "little"), 8  # MAGIC, nops, nslots, nstreams, zeros
MiB = 1 << 20

CPP_SOURCE = (Path(__file__).resolve().parent / "torch_ext" / "replay_torch.cpp").read_text()  # its loop, in C++ (not beside it: a .cpp file in a Go package needs cgo)


# ---- traces, compiled on the host without torch ------------------------------------------------


def trace_path(name: str) -> Path:
    """A name from TRACES, or a path to a trace file."""
    p = Path(name)
    return p if p.suffix in (".csv", ".gz") else ROOT / "bench" / "testdata" / f"{name}_trace.csv.gz"


def trace_name(name: str) -> str:
    return Path(name).name.split(".")[0].removesuffix("_trace")


def open_trace(path: Path):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"  # by content, as the Go reader decides, whatever the name
    return gzip.open(path, "rt", newline="") if gz else open(path, newline="")


def compile_trace(path) -> dict:
    """The alloc and free_completed rows of a trace as four int64 arrays: op (1 alloc, 0 free), slot
    (dense ids; a free names its alloc's slot; freed slots are reused, so nslots is the most blocks
    live at once), size and stream (index 0 for trace stream 0, then 1, 2, ... for the other ids in
    order of appearance, listed in stream_ids); a free carries its block's size and stream. Counts
    beside them: rows, allocs, frees (lost ones included), lost_frees, unmatched_frees, skipped,
    ops, nslots, streams, live_at_end and peak_live_bytes (requested bytes live at once)."""
    cols = {k: array("q") for k in COLUMNS}
    live: dict = {}  # trace address -> (slot, size, stream index) of the block live there
    free_slots: list = []
    stream_index = {0: 0}
    n = dict(rows=0, allocs=0, frees=0, lost_frees=0, unmatched_frees=0, skipped=0)
    cur = peak = 0

    def emit(*values):
        for k, x in zip(COLUMNS, values):
            cols[k].append(x)

    with open_trace(Path(path)) as f:
        rows = csv.reader(f)
        header = [h.strip().lstrip("\ufeff") for h in next(rows, [])]
        if header != ["action", "addr", "size", "stream"]:
            raise ValueError(f"{path}: missing header action,addr,size,stream (got {header[:4]})")
        for line, row in enumerate(rows, 2):
            if not row:
                continue
            n["rows"] += 1
            action = row[0].strip()
            if action not in ("alloc", "free_completed"):
                continue
            if len(row) != 4:
                raise ValueError(f"{path}: line {line}: {len(row)} columns, want 4")
            addr, size, stream = (int(x) for x in row[1:])
            if size == 0 or addr == 0:
                n["skipped"] += 1
                continue
            block = live.pop(addr, None)
            if block is not None:  # a free_completed, or an alloc of an address whose free was lost
                emit(0, *block)
                free_slots.append(block[0])
                cur -= block[1]
                n["frees"] += 1
                n["lost_frees"] += action == "alloc"
            elif action == "free_completed":
                n["unmatched_frees"] += 1
            if action == "alloc":
                slot = free_slots.pop() if free_slots else len(live)  # no free slot: all are live
                live[addr] = (slot, size, stream_index.setdefault(stream, len(stream_index)))
                emit(1, *live[addr])
                n["allocs"] += 1
                cur += size
                peak = max(peak, cur)
    n.update(ops=len(cols["op"]), nslots=max(cols["slot"], default=-1) + 1, streams=len(stream_index),
             live_at_end=len(live), peak_live_bytes=peak)
    return dict(n, **cols, stream_ids=[s for s in stream_index if s != 0])


def columns_bytes(comp: dict) -> bytes:
    """The four columns one after another: what the extension's replay() reads."""
    return b"".join(comp[k].tobytes() for k in COLUMNS)


def write_compiled(comp: dict, path: Path) -> None:
    with open(path, "wb") as f:
        array("q", [MAGIC, comp["ops"], comp["nslots"], comp["streams"]] + [0] * (HEADER_WORDS - 4)).tofile(f)
        f.write(columns_bytes(comp))


def read_compiled(path: Path) -> dict:
    with open(path, "rb") as f:
        head = array("q")
        head.fromfile(f, HEADER_WORDS)
        if head[0] != MAGIC:
            raise ValueError(f"{path}: not a compiled trace")
        out = dict(ops=head[1], nslots=head[2], streams=head[3])
        for k in COLUMNS:
            out[k] = array("q")
            out[k].fromfile(f, head[1])
    return out


def counts_table(comps: dict) -> str:
    keys = ("rows", "allocs", "frees", "lost_frees", "unmatched_frees", "skipped", "nslots", "streams",
            "live_at_end")
    out = ["| trace | " + " | ".join(keys) + " | peak live MiB |", "| --- |" + " ---: |" * (len(keys) + 1)]
    for name, c in comps.items():
        out.append(f"| {name} | " + " | ".join(f"{c[k]:,}" for k in keys) + f" | {c['peak_live_bytes'] / MiB:,.1f} |")
    return "\n".join(out)


# ---- parent: predictions, extension, children, report ------------------------------------------


def predict(tool: Path, trace: Path) -> dict:
    """Peak reserved bytes that `symm replay` predicts, per configuration: pool alone (default,
    expandable) and with the front cache (default_front, expandable_front); recorded: the trace's."""
    out = {}
    for suffix, extra in (("", []), ("_front", ["--front-cache", FRONT_CACHE])):
        cmd = [str(tool), "replay", str(trace), *extra, "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)}: rc={proc.returncode}: {proc.stderr.strip()[-500:]}")
        doc = json.loads(proc.stdout)
        out.update({c["name"] + suffix: c["peak_reserved_bytes"] for c in doc["configurations"]})
        out.update(rows_replayed=doc["configurations"][0]["rows_replayed"],
                   recorded=doc["recorded"]["peak_reserved_bytes"])
    return out


def build_extension() -> Path:
    """Compiles the replay extension (about 20 s the first time) and returns its .so."""
    return _sibling("bench_torch").build_extension("symm_replay", CPP_SOURCE, BUILD_DIR, ())


@functools.lru_cache(maxsize=None)
def _sibling(name: str):
    """bench/NAME.py as a module (those used here import only the standard library at load: no torch)."""
    spec = importlib.util.spec_from_file_location(f"symm_bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod



def child_env(config: str) -> dict:
    """bench/workloads.py's child_env (both benchmarks set each configuration up alike), with
    bench/bench_torch.py's QUIET_ENV: the children time CPU loops."""
    return dict(_sibling("workloads").child_env(config), **_sibling("bench_torch").QUIET_ENV)


def run_child(config: str, name: str, rnd: int, ext: Path, data: Path, a) -> dict:
    row = dict(config=config, trace=name, round=rnd)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--trace-name", name,
           "--ext", str(ext), "--data", str(data), "--passes", str(a.passes)]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=child_env(config), capture_output=True, text=True, timeout=a.timeout,
                              cwd=str(ROOT))
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            row["error"] = f"rc={proc.returncode}, no result: {(proc.stdout + proc.stderr)[-2000:]}"
        else:
            row.update(json.loads(lines[-1][len("RESULT "):]))
            if proc.returncode != 0:
                row["exit_error"] = f"rc={proc.returncode} after its result: {proc.stderr[-1500:]}"
            elif row.get("error"):
                row["log"] = proc.stderr[-2000:]
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {a.timeout:.0f} s"
    except Exception as e:  # the child could not even start
        row["error"] = f"{type(e).__name__}: {e}"
    row["seconds"] = round(time.time() - t0, 1)
    return row


def round_ns(row):
    """A child's figure: the median ns per call of its passes after the first (none where calls
    failed: a pass that skipped work is not comparable)."""
    ns = row.get("ns_per_call") or []
    return statistics.median(ns[1:]) if len(ns) > 1 and not (row.get("error") or row.get("alloc_errors")) else None


def failed(row):
    """Why a child's figures do not count (a falsy value when they do)."""
    return row.get("error") or row.get("exit_error") or (row.get("alloc_errors") and
                                                         f"{row['alloc_errors']} failed calls")


def _span(xs, fmt="{:,.0f}") -> str:
    """One value, or min–max, of the numbers in xs."""
    xs = [x for x in xs if isinstance(x, (int, float))]
    lo, hi = (fmt.format(min(xs)), fmt.format(max(xs))) if xs else ("–", "–")
    return lo if lo == hi else f"{lo}–{hi}"


def render(rows: list, comps: dict, preds: dict, meta: dict, configs) -> str:
    out = ["# Trace replay through PyTorch's allocator API (bench/replay_torch.py)", "",
           f"- date: {meta['date']}", f"- GPU: {meta['gpu']}; torch {meta['torch']}; libsymm {meta['symm']}",
           f"- command: `{meta['command']}`",
           f"- method: raw_alloc_with_stream/raw_delete in C++, {meta['passes']} passes per child, "
           f"{meta['rounds']} rounds of {', '.join(configs)} in turn; ns per call: median over rounds of each "
           "round's median pass after the first; ratio: median (range) of per-round ratios to native; direct C call: "
           "the same passes through symm_pool_alloc/symm_pool_free called directly (no PyTorch, no extension)",
           f"- predicted: {meta['predictions']}", ""]
    for name, comp in comps.items():
        pred = preds.get(name) or {}
        out += [f"## {name}: {comp['ops']:,} calls per pass ({comp['allocs']:,} allocs, {comp['frees']:,} "
                f"frees), at most {comp['nslots']:,} blocks live, {comp['streams']} stream(s)", "",
                "| config | ns per call | range over rounds | ratio to native | direct C call ns | first pass ns | "
                "peak reserved MiB (pass 1) | predicted MiB | peak reserved MiB (all passes) | peak allocated MiB "
                "(pass 1) | errors |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        mine = [r for r in rows if r["trace"] == name]
        native = {r["round"]: round_ns(r) for r in mine if r["config"] == "native"}
        for config in configs:
            cr = sorted((r for r in mine if r["config"] == config), key=lambda r: r["round"])
            ns = [x for x in map(round_ns, cr) if x is not None]
            ratios = [x / native[r["round"]] for r in cr if (x := round_ns(r)) and native.get(r["round"])]
            ratio = f"{statistics.median(ratios):.2f}× ({_span(ratios, '{:.2f}')})" if ratios else "–"
            errs = "; ".join(f"round {r['round']}: {failed(r)[:80]}" for r in cr if failed(r))

            def mib(key, cr=cr):  # a byte count over rounds, in MiB
                return _span([r[key] / MiB for r in cr if isinstance(r.get(key), (int, float))])

            predicted = pred.get(PREDICTED.get(config, ""))
            direct = [statistics.median(r["direct_ns_per_call"]) for r in cr
                      if r.get("direct_ns_per_call") and not r.get("direct_errors")]
            out.append(f"| {config} | {f'{statistics.median(ns):,.0f}' if ns else '–'} | {_span(ns)} | {ratio} | "
                       f"{f'{statistics.median(direct):,.0f}' if direct else '–'} | "
                       f"{_span([r['ns_per_call'][0] for r in cr if r.get('ns_per_call')])} | "
                       f"{mib('peak_reserved_pass1')} | {_span([predicted / MiB] if predicted else [])} | "
                       f"{mib('peak_reserved')} | {mib('peak_allocated_pass1')} | {errs.replace('|', '/')} |")
        if pred:
            out += ["", "`symm replay`, peak reserved MiB: " + ", ".join(
                f"{k} {_span([pred[k] / MiB] if pred.get(k) else [])}" for k in
                ("default", "default_front", "expandable", "expandable_front", "recorded")) +
                f" (*_front: front cache {FRONT_CACHE}); {pred['rows_replayed']:,} rows replayed."]
        out.append("")
    out += ["## traces", "", counts_table(comps), "", "MiB = 2^20 B. Lower ns is better; a ratio < 1 is "
            "faster than native. Every field of every child: the .json beside this file."]
    return "\n".join(out) + "\n"


def metadata(a, rows) -> dict:
    import torch

    symm_v = next((r["symm"] for r in rows if r.get("symm")), None)
    if symm_v is None:  # no symm child got that far: ask the library here
        try:
            sys.path.insert(0, str(ROOT / "python"))
            import symm

            symm_v = symm.version()
        except Exception as e:
            symm_v = f"unavailable ({type(e).__name__}: {e})"
    return dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                gpu=next((r["device"] for r in rows if r.get("device")), "?"),
                torch=f"{torch.__version__} (CUDA {torch.version.cuda})", symm=symm_v,
                command=shlex.join(["python3"] + sys.argv), passes=a.passes, rounds=a.rounds)


def parent_main(a) -> int:
    comps = {trace_name(t): compile_trace(trace_path(t)) for t in a.traces}
    print(counts_table(comps), flush=True)
    if a.dry_run:
        return 0
    if importlib.util.find_spec("torch") is None:
        print("torch is not importable: only compiled the traces (what --dry-run does)", flush=True)
        return 2
    tool, preds, notes = Path(a.symm_tool), {}, []
    if not tool.exists():
        notes.append(f"{tool} not found (run make): predicted columns say –")
    for t in a.traces if tool.exists() else ():
        try:
            preds[trace_name(t)] = predict(tool, trace_path(t))
        except Exception as e:
            notes.append(f"{trace_name(t)}: {type(e).__name__}: {e}")
    for note in notes:
        print("PREDICTION " + note, flush=True)
    t0 = time.time()
    ext = build_extension()
    print(f"extension built: {ext} ({time.time() - t0:.0f} s)", flush=True)
    tmp, rows = Path(tempfile.mkdtemp(prefix="symm_replay_")), []
    try:
        for name, comp in comps.items():
            write_compiled(comp, tmp / f"{name}.bin")
        plan = [(r, name, c) for r in range(1, a.rounds + 1) for name in comps for c in a.configs]
        for i, (rnd, name, config) in enumerate(plan, 1):
            row = run_child(config, name, rnd, ext, tmp / f"{name}.bin", a)
            rows.append(row)
            ns = round_ns(row)
            print(f"[{i}/{len(plan)}] round {rnd} {name} {config}: {f'{ns:,.0f} ns per call' if ns else '–'}, "
                  f"{row['seconds']} s, {f'ERROR {failed(row)[:200]}' if failed(row) else 'ok'}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = metadata(a, rows)
    meta["predictions"] = (f"`{tool} replay TRACE [--front-cache {FRONT_CACHE}] --json`: symm ↔ default, "
                           "symm_expandable ↔ expandable, symm_front ↔ default with the front cache, "
                           "native ↔ the trace's recorded peak reserved"
                           + "".join(f"; {note}" for note in notes))
    report = render(rows, comps, preds, meta, a.configs)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay_torch.md").write_text(report)
        counts = {k: {f: x for f, x in c.items() if f not in COLUMNS} for k, c in comps.items()}
        (out / "replay_torch.json").write_text(
            json.dumps(dict(meta=meta, predictions=preds, traces=counts, rows=rows), indent=1, default=str))
    print(report, flush=True)
    return 1 if any(failed(r) for r in rows) else 0


# ---- child: one configuration, one trace ---------------------------------------------------------


def load_extension(path: Path):
    """Imports the already built extension from its .so, without rebuilding."""
    return _sibling("bench_torch").load_extension(path)


def read_peaks(torch, symm) -> dict:
    if symm is None:
        return dict(reserved=torch.cuda.max_memory_reserved(0), allocated=torch.cuda.max_memory_allocated(0))
    st = symm.memory_stats(0)
    out = dict(reserved=st.get("reserved_bytes.all.peak"), allocated=st.get("allocated_bytes.all.peak"))
    try:  # the same through libsymm's extension's getDeviceStats: a cross-check, where it works
        out["torch_reserved"] = torch.cuda.max_memory_reserved(0)
    except Exception as e:
        out["torch_reserved"] = f"{type(e).__name__}: {e}"[:300]
    return out


def child_main(a) -> None:
    res = dict(config=a.child, trace=a.trace_name)
    try:
        import torch

        symm = None
        if a.child in SYMM_CONFIGS:
            import symm

            symm.use_as_default()  # before anything initializes CUDA
        torch.cuda.init()
        torch.cuda.set_device(0)
        res.update(device=torch.cuda.get_device_name(0), torch=torch.__version__)
        if symm is not None:
            res.update(symm=symm.version(), extension=symm.extension_status())
        ext = load_extension(Path(a.ext))
        comp = read_compiled(Path(a.data))
        cols = columns_bytes(comp)
        streams = [torch.cuda.Stream() for _ in range(comp["streams"] - 1)]  # made once, kept alive
        handles = [0] + [s.cuda_stream for s in streams]  # 0: the extension takes the current stream
        # Pass 1 alone first: its peaks are a fresh pool's, what `symm replay` predicts.
        results = [ext.replay(cols, comp["ops"], comp["nslots"], handles, 1, "")]
        p1 = read_peaks(torch, symm)
        res.update(peak_reserved_pass1=p1["reserved"], peak_allocated_pass1=p1["allocated"])
        results.append(ext.replay(cols, comp["ops"], comp["nslots"], handles, a.passes - 1, ""))
        if symm is not None:  # the same passes again, calling libsymm's C functions directly
            direct = ext.replay(cols, comp["ops"], comp["nslots"], handles, a.passes - 1, symm.library_path())
            res["direct_ns_per_call"] = [p[0] for p in direct["passes"]]
            res["direct_errors"] = sum(p[2] for p in direct["passes"])
        torch.cuda.synchronize()
        pall = read_peaks(torch, symm)
        res.update(peak_reserved=pall["reserved"], peak_allocated=pall["allocated"],
                   torch_peak_reserved=pall.get("torch_reserved"))
        for i, key in enumerate(("ns_per_call", "calls", "errors", "end_frees")):
            res[key] = [p[i] for r in results for p in r["passes"]]
        res["alloc_errors"] = sum(res["errors"])
        res["first_error"] = next((r["first_error"] for r in results if r["first_error"]), "")
    except Exception as e:  # reported as a row, never a crash
        import traceback

        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    print("RESULT " + json.dumps(res, default=str), flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=",".join(TRACES), help="names in bench/testdata, or paths")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=5, help="passes per child; the first is shown apart")
    ap.add_argument("--symm-tool", default=str(ROOT / "build" / "symm"), help="for the predictions")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per child")
    ap.add_argument("--dry-run", "--compile-only", dest="dry_run", action="store_true",
                    help="only compile the traces and print their counts (needs no torch)")
    for hidden in ("--child", "--trace-name", "--ext", "--data"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.traces = [t for t in a.traces.split(",") if t]
    a.configs = [c for c in a.configs.split(",") if c]
    bad = [c for c in a.configs + [a.child or "native"] if c not in CONFIGS]
    bad += [t for t in a.traces if not a.child and not trace_path(t).exists()]
    if bad:
        ap.error(f"unknown configuration or missing trace: {bad}; configurations: {','.join(CONFIGS)}")
    if a.rounds < 1 or a.passes < 2 or a.timeout <= 0:
        ap.error("--rounds must be at least 1, --passes at least 2 (the first is not counted), --timeout > 0")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        child_main(a)
        return 0
    return parent_main(a)


if __name__ == "__main__":
    sys.exit(main())
