"""Allocator benchmark inside PyTorch: native caching allocator vs libsymm vs
RAPIDS RMM vs plain cudaMalloc, timed in C++ so that Python does not drown the signal.

    python3 bench/bench_torch.py            # on the GPU machine; writes $OUT/bench.md
    python3 bench/bench_torch.py --configs native,rmm   # a subset
    SYMM_BENCH_SIZES=512,64K,1M,4M,16M,64M,256M,1G python3 bench/bench_torch.py   # other sizes
    python3 bench/bench_torch.py --configs native,symm,native_expandable,symm_expandable --rounds 3
        # interleaved rounds (native, symm, ..., native, symm, ...): medians and their spread

Each child also records, before and after its timing, the CPU its timing
thread ran on, that thread's context switches and the process's thread count
("state" in $OUT/bench.json). SYMM_BENCH_PATHS=raw,allocate,empty,threads,direct
times a subset; SYMM_BENCH_PIN=CPU pins a child's whole process from its
start, SYMM_BENCH_PIN_MAIN=CPU only its timing thread once the allocator is
installed. The ratios of interleaved rounds mix the host's fast and slow
stretches (a child's figures can change twofold from one operation to the
next, pinned or not); bench/bench_paired.py alternates the configurations
every few tens of milliseconds instead.

The rmm configuration needs the rmm-cu13 wheels: on the GPU machine run
``eval "$(bash bench/rmm_setup.sh)"`` first (it installs .whl/ into /tmp/site and
prints the PYTHONPATH to export). Without them the rmm column says "skip" and a
SKIP line names why; the other configurations run as usual.

What is timed (std::chrono in C++ loops: 10 warm-up calls, then the median of
REPS runs of N calls, N sized so that one run takes about TARGET_MS):
  1. c10::cuda::CUDACachingAllocator::raw_alloc(size) + raw_delete(ptr)
  2. the allocator's allocate(size) and its DataPtr's deleter, what a
     tensor's storage calls, without the tensor;
  3. at::empty({size}, uint8, cuda) created and destroyed
     at 512 B, 1 MiB and 64 MiB;
  4. 1, 4 and 16 threads doing 1 MiB raw_alloc+raw_delete pairs for a fixed
     time: total pairs per second;
  5. (libsymm only) symm_pool_alloc+symm_pool_free called directly through
     dlsym, without PyTorch's CUDAPluggableAllocator wrapper, so the table
     separates our time from the wrapper's (a mutex and a hash map).

The process-wide allocator can be swapped only once, so each configuration
runs in its own interpreter (``--child CONFIG``): ``native`` (no swap),
``symm`` (symm.use_as_default()), ``native_expandable`` and
``symm_expandable`` (the same with expandable segments:
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, SYMM_POOL_EXPANDABLE=1), ``rmm`` (RMM's
``rmm.allocators.torch.rmm_torch_allocator`` over
``rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource())``, set as the current
device resource before torch touches CUDA) and ``cudamalloc`` (a pluggable
allocator of two extern "C" functions over cudaMalloc/cudaFree, compiled into
the same extension). The parent only builds the extension and writes the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = Path(os.environ.get("SYMM_BENCH_BUILD", "/tmp/symm_bench_build"))
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# The children time CPU loops: OpenBLAS's idle threads (numpy, loaded by
# torch) spin on the other cores otherwise, a quarter of the samples in one
# profile, and add to the noise between runs.
QUIET_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
CONFIGS = ("native", "symm", "rmm", "cudamalloc", "noop", "native_expandable", "symm_expandable")
TABLE_CONFIGS = ("native", "symm", "rmm", "cudamalloc", "noop")  # the columns of the one-round table
# What each configuration's child adds to the environment (after child_env
# removed any allocator setting the caller had).
CONFIG_ENV = {"native_expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
              "symm_expandable": {"SYMM_POOL_EXPANDABLE": "1"}}
RMM_INITIAL_POOL = 1 << 30  # bytes the RMM pool takes from the device up front (it grows on demand)


def _sizes(text: str) -> tuple:
    """SYMM_BENCH_SIZES: comma-separated sizes, each a number of bytes with an
    optional K, M or G (binary) suffix, e.g. "512,1M,64M,1G"."""
    out = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("IB").removesuffix("B")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(part[-1:], 1)
        out.append(int(part[:-1] if mult > 1 else part) * mult)
    return tuple(out)


SIZES = _sizes(os.environ.get("SYMM_BENCH_SIZES", "512,1M,64M"))  # the sizes each pair is timed at
ALL_PATHS = ("raw", "allocate", "empty", "threads", "direct")
# SYMM_BENCH_PATHS: the subset of ALL_PATHS each child times (all by default).
PATHS = tuple(p for p in os.environ.get("SYMM_BENCH_PATHS", ",".join(ALL_PATHS)).split(",") if p)
if set(PATHS) - set(ALL_PATHS):
    raise SystemExit(f"SYMM_BENCH_PATHS={','.join(PATHS)}: unknown {sorted(set(PATHS) - set(ALL_PATHS))}; known: {','.join(ALL_PATHS)}")
THREADS = (1, 4, 16)
THREAD_SIZE = 1 << 20
THREAD_SECONDS = 0.5
TARGET_MS = 20.0
REPS = 7
CHILD_TIMEOUT_S = 240

CPP_SOURCE = (Path(__file__).resolve().parent / "torch_ext" / "bench_torch.cpp").read_text()  # its timing loops, in C++ (not beside it: a .cpp file in a Go package needs cgo)


# ---- parent: build, run children, write the table ---------------------------


def build_extension(name: str = "symm_bench", source: str = CPP_SOURCE, build_dir: Path = BUILD_DIR,
                    ldflags: tuple = ("-ldl",)) -> Path:
    """Compiles a timing extension (about 20 s the first time) and returns its
    .so; bench/replay_torch.py builds its own through this too."""
    import torch
    from torch.utils.cpp_extension import load

    build_dir.mkdir(parents=True, exist_ok=True)
    src = build_dir / f"{name}.cpp"
    if not src.exists() or src.read_text() != source:
        src.write_text(source)
    if "TORCH_CUDA_ARCH_LIST" not in os.environ:
        major, minor = torch.cuda.get_device_capability(0)
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    module = load(
        name=name,
        sources=[str(src)],
        build_directory=str(build_dir),
        with_cuda=True,
        extra_cflags=["-O2"],
        extra_ldflags=list(ldflags),
        verbose=False,
    )
    return Path(module.__file__).resolve()


def child_env(config: str = "native") -> dict:
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env.update(QUIET_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    for k in ("SYMM_DEVICE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "SYMM_POOL_EXPANDABLE"):
        env.pop(k, None)
    env.update(CONFIG_ENV.get(config, {}))
    return env


def run_config(config: str, ext: Path) -> dict:
    """Runs one allocator configuration in a fresh interpreter."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--ext", str(ext)]
    start = time.time()
    try:
        proc = subprocess.run(cmd, env=child_env(config), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"config": config, "error": f"timed out after {CHILD_TIMEOUT_S} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    for ln in proc.stdout.splitlines():
        if ln.startswith("SKIP "):
            print(ln, flush=True)
    if not lines:
        return {"config": config, "error": f"rc={proc.returncode}: {(proc.stdout + proc.stderr)[-3000:]}"}
    result = json.loads(lines[-1][len("RESULT "):])
    if proc.returncode != 0:
        # The figures were printed; the process failed afterwards (e.g. at exit).
        result["exit_error"] = f"rc={proc.returncode} after its results: {(proc.stdout + proc.stderr)[-1500:]}"
    result["seconds"] = round(time.time() - start, 1)
    return result


def fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def fmt_ns(d) -> str:
    if isinstance(d, str):  # "skip" or "error" of a whole configuration
        return d
    if not d:
        return "–"
    ns = d["median_ns"]
    return f"{ns / 1000:,.1f} µs" if ns >= 10_000 else f"{ns:,.0f}"


def ratio(a, b) -> str:
    if isinstance(a, str):
        return a
    if isinstance(b, str):
        return "–"
    return f"{a / b:.2f}×" if a and b else "–"


def med(d):
    """median_ns of a measurement, or the "skip"/"error" marker as it is."""
    return d if isinstance(d, str) else (d and d["median_ns"])


def get(results: dict, config: str, *keys):
    """results[config][keys...]; "skip" / "error" when the whole configuration was."""
    cur = results.get(config) or {}
    if "skip" in cur:
        return "skip"
    if "error" in cur:
        return "error"
    for k in keys:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(k)
    return cur


def render(results: dict, meta: dict) -> str:
    """The markdown report: ns per pair, ratios, thread throughput."""
    out = [
        "# libsymm in PyTorch: allocator benchmark (bench/bench_torch.py)",
        "",
        f"- date: {meta['date']}",
        f"- device: {meta['device']}; torch {meta['torch']} (CUDA {meta['cuda']}); libsymm {meta['symm']}",
        f"- method: C++ loops, 10 warm-up calls, median of {REPS} runs of N calls (N sized to ~{TARGET_MS:.0f} ms); "
        f"threads: {THREAD_SECONDS} s fixed time, total pairs/s",
        f"- rmm: {meta.get('rmm', '?')}; rmm_torch_allocator over PoolMemoryResource(CudaMemoryResource(), "
        f"initial_pool_size={fmt_size(RMM_INITIAL_POOL)})",
        "",
        "## alloc + free, ns per pair (median; cached path for native, symm and rmm)",
        "",
        "| operation | size | native | symm | symm/native | rmm | rmm/native | symm/rmm | cudaMalloc | no-op pluggable |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for op, label in (("raw", "raw_alloc + raw_delete"), ("allocate", "allocate() + deleter"), ("empty", "at::empty + destroy")):
        for size in SIZES:
            k = str(size)
            n, s, r, c, z = (get(results, cfg, op, k) for cfg in TABLE_CONFIGS)
            out.append(
                f"| {label} | {fmt_size(size)} | {fmt_ns(n)} | {fmt_ns(s)} | {ratio(med(s), med(n))} | "
                f"{fmt_ns(r)} | {ratio(med(r), med(n))} | {ratio(med(s), med(r))} | {fmt_ns(c)} | {fmt_ns(z)} |"
            )
    dash4 = "| – | – | – | – | – |"
    for size in SIZES:
        k = str(size)
        d, s = get(results, "symm", "direct", k), get(results, "symm", "raw", k)
        wrapper = f"{s['median_ns'] - d['median_ns']:,.0f}" if isinstance(d, dict) and isinstance(s, dict) else "–"
        out.append(
            f"| symm_pool_alloc + symm_pool_free, direct C call | {fmt_size(size)} | – | {fmt_ns(d)} | – {dash4}"
        )
        out.append(f"| PyTorch wrapper share of symm raw pair (raw − direct) | {fmt_size(size)} | – | {wrapper} | – {dash4}")
    for name in ("symm_pool_device_count", "symm_last_error_code"):
        out.append(f"| one direct call of {name}() | – | – | {fmt_ns(get(results, 'symm', 'calls', name))} | – {dash4}")

    out += [
        "",
        f"## {fmt_size(THREAD_SIZE)} raw_alloc + raw_delete from several threads, M pairs/s (total)",
        "",
        "| threads | native | symm | symm/native | rmm | rmm/native | symm/rmm | cudaMalloc | no-op pluggable | symm direct (no PyTorch) | current_device + getCurrentCUDAStream only (M calls/s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in THREADS:
        k = str(t)
        n, s, r, c, z, d, c10 = (get(results, cfg, key, k) for cfg, key in
                                 (("native", "threads"), ("symm", "threads"), ("rmm", "threads"),
                                  ("cudamalloc", "threads"), ("noop", "threads"),
                                  ("symm", "direct_threads"), ("noop", "c10_threads")))

        def mp(x):
            if isinstance(x, str):
                return x
            return f"{x / 1e6:.3f}" if x else "–"

        out.append(f"| {t} | {mp(n)} | {mp(s)} | {ratio(s, n)} | {mp(r)} | {ratio(r, n)} | {ratio(s, r)} | "
                   f"{mp(c)} | {mp(z)} | {mp(d)} | {mp(c10)} |")

    skipped = {cfg: r["skip"] for cfg, r in results.items() if "skip" in r}
    if skipped:
        out += ["", "## skipped", ""]
        out += [f"- SKIP {cfg}: {why}" for cfg, why in skipped.items()]
    errors = {cfg: r["error"] for cfg, r in results.items() if "error" in r}
    errors.update({f"{cfg} (after its results)": r["exit_error"] for cfg, r in results.items() if "exit_error" in r})
    if errors:
        out += ["", "## errors", ""]
        for cfg, err in errors.items():
            out += [f"- {cfg}:", "", "```", err.strip()[-1500:], "```"]
    out += ["", "Lower ns is better (x/native < 1 means x is faster); for throughput, higher is better "
            "(x/native > 1 means x is faster)."]
    return "\n".join(out) + "\n"


def render_rounds(rounds: list, configs) -> str:
    """The interleaved rounds: per operation and size, each configuration's
    median over the rounds of its ns per pair, and the median and range of
    the per-round ratios to native (each round's ratio compares runs made
    minutes apart at most)."""
    others = [c for c in configs if c != "native"]
    head = "| operation | size | native | " + " | ".join(f"{c} | {c}/native (median, range)" for c in others) + " |"
    out = [
        "",
        f"## {len(rounds)} interleaved rounds ({', '.join(configs)}, then again): median of the rounds",
        "",
        head,
        "| --- | --- | ---: |" + " ---: | --- |" * len(others),
    ]

    def series(cfg, *keys):
        vals = [get(r, cfg, *keys) for r in rounds]
        return [v["median_ns"] if isinstance(v, dict) else v for v in vals]

    def mid(xs):
        xs = sorted(x for x in xs if isinstance(x, (int, float)))
        return xs[len(xs) // 2] if xs else None

    for op, label in (("raw", "raw_alloc + raw_delete"), ("allocate", "allocate() + deleter"), ("empty", "at::empty + destroy")):
        for size in SIZES:
            k = str(size)
            nat = series("native", op, k)
            row = f"| {label} | {fmt_size(size)} | {fmt_ns({'median_ns': mid(nat)}) if mid(nat) else '–'} |"
            for c in others:
                xs = series(c, op, k)
                rs = sorted(x / n for x, n in zip(xs, nat) if isinstance(x, (int, float)) and isinstance(n, (int, float)) and n)
                cell = fmt_ns({"median_ns": mid(xs)}) if mid(xs) else "–"
                rr = f"{rs[len(rs) // 2]:.2f}× ({rs[0]:.2f}–{rs[-1]:.2f})" if rs else "–"
                row += f" {cell} | {rr} |"
            out.append(row)
    nat = [get(r, "native", "threads", "16") for r in rounds]
    for c in others:
        xs = [get(r, c, "threads", "16") for r in rounds]
        rs = sorted(x / n for x, n in zip(xs, nat) if isinstance(x, (int, float)) and isinstance(n, (int, float)) and n)
        if rs:
            out.append(f"\n16 threads, {fmt_size(THREAD_SIZE)} pairs: {c} is {rs[len(rs) // 2]:.2f}× native's "
                       f"pairs per second (range {rs[0]:.2f}–{rs[-1]:.2f}).")
    return "\n".join(out) + "\n"


def metadata() -> dict:
    import torch

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        sys.path.insert(0, str(ROOT / "python"))
        import symm

        meta["symm"] = symm.version()
    except Exception as e:  # the table still says which library was missing
        meta["symm"] = f"unavailable ({e})"
    try:
        from importlib.metadata import version

        meta["rmm"] = f"rmm-cu13 {version('rmm-cu13')}, librmm-cu13 {version('librmm-cu13')}"
    except Exception as e:
        meta["rmm"] = f"not installed ({type(e).__name__}: {e})"
    return meta


def parent_main(configs, rounds: int = 1) -> int:
    t0 = time.time()
    ext = build_extension()
    print(f"extension built: {ext} ({time.time() - t0:.0f} s)", flush=True)
    all_rounds = []
    for rnd in range(rounds):
        results = {}
        for config in configs:
            results[config] = run_config(config, ext)
            r = results[config]
            status = ("error" if "error" in r else f"SKIP ({r['skip']})" if "skip" in r
                      else f"{r['seconds']} s" + (", then failed" if "exit_error" in r else ""))
            print(f"  round {rnd + 1}: {config}: {status}", flush=True)
        all_rounds.append(results)
    # The one-round table shows the last round; the rounds table all of them.
    report = render(results, metadata())
    if rounds > 1:
        report += render_rounds(all_rounds, configs)
        results = {"rounds": all_rounds}
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "bench.md").write_text(report)
        (Path(out_dir) / "bench.json").write_text(json.dumps(results, indent=1))
    print(report, flush=True)
    print(f"total {time.time() - t0:.0f} s", flush=True)
    return 1 if any("error" in r or "exit_error" in r for rs in all_rounds for r in rs.values()) else 0


# ---- child: one allocator configuration -------------------------------------


def load_extension(path: Path):
    """Imports the already built extension from its .so, without rebuilding."""
    import importlib.util

    # load() names the module symm_bench_vN after a source change; the file says which.
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Skip(Exception):
    """The configuration cannot run on this machine (e.g. rmm not installed)."""


_rmm_pool = None  # the RMM pool resource, kept alive for the process's lifetime


def install_rmm(torch) -> None:
    """RMM's pool as the device resource, then its torch allocator as torch's."""
    global _rmm_pool
    try:
        import rmm
        import rmm.mr
        from rmm.allocators.torch import rmm_torch_allocator
    except Exception as e:
        raise Skip(f"cannot import rmm: {type(e).__name__}: {e} (on the GPU machine run "
                   f'eval "$(bash bench/rmm_setup.sh)" first)') from e
    if rmm_torch_allocator is None:
        raise Skip(f"rmm {rmm.__version__}: rmm.allocators.torch.rmm_torch_allocator is None "
                   "(torch.cuda.is_available() was False when rmm looked)")
    _rmm_pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=RMM_INITIAL_POOL)
    rmm.mr.set_current_device_resource(_rmm_pool)
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)


def install(config: str, ext: Path) -> None:
    """Swaps the process's allocator; must precede CUDA initialization."""
    import torch

    if config == "rmm":
        install_rmm(torch)
    elif config in ("symm", "symm_expandable"):
        import symm

        symm.use_as_default()
    elif config in ("cudamalloc", "noop"):
        alloc = torch.cuda.memory.CUDAPluggableAllocator(str(ext), f"bench_{config}_alloc", f"bench_{config}_free")
        torch.cuda.memory.change_current_allocator(alloc)
    torch.cuda.init()
    torch.cuda.set_device(0)


def _pin_env(name: str):
    """SYMM_BENCH_PIN / SYMM_BENCH_PIN_MAIN: a CPU number, or None when unset."""
    v = os.environ.get(name, "")
    if not v:
        return None
    if not v.isdigit() or int(v) not in os.sched_getaffinity(0):
        raise SystemExit(f"{name}={v!r}: want one of the CPUs this process may run on: {sorted(os.sched_getaffinity(0))}")
    return int(v)


def thread_state() -> dict:
    """Where the calling thread runs and how often it was switched out, from
    /proc: the CPU it last ran on, its voluntary and involuntary context
    switches, and the process's thread count."""
    fields = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()
    st = dict(ln.split(":", 1) for ln in Path("/proc/thread-self/status").read_text().splitlines() if ":" in ln)
    proc = dict(ln.split(":", 1) for ln in Path("/proc/self/status").read_text().splitlines() if ":" in ln)
    return {"cpu": int(fields[36]), "voluntary": int(st["voluntary_ctxt_switches"]),
            "involuntary": int(st["nonvoluntary_ctxt_switches"]), "threads": int(proc["Threads"])}


def child_main(config: str, ext: Path) -> None:
    # Pinning: the whole process (every thread it will start inherits the CPU),
    # or only this, the timing thread, once the allocator and CUDA are up.
    pin_all, pin_main = _pin_env("SYMM_BENCH_PIN"), _pin_env("SYMM_BENCH_PIN_MAIN")
    if pin_all is not None:
        os.sched_setaffinity(0, {pin_all})
    import torch  # noqa: F401  (loads libtorch before the extension)

    bench = load_extension(ext)
    try:
        install(config, ext)
    except Skip as e:
        print(f"SKIP {config}: {e}", flush=True)
        print("RESULT " + json.dumps({"config": config, "skip": str(e)}), flush=True)
        return
    if pin_main is not None:
        os.sched_setaffinity(0, {pin_main})
    res = {"config": config, "raw": {}, "allocate": {}, "empty": {}, "threads": {}, "state": [thread_state()]}
    for size in SIZES:
        if "raw" in PATHS:
            res["raw"][str(size)] = bench.raw_pair(size, TARGET_MS, REPS)
        if "allocate" in PATHS:
            res["allocate"][str(size)] = bench.allocate_pair(size, TARGET_MS, REPS)
        if "empty" in PATHS:
            res["empty"][str(size)] = bench.empty_pair(size, TARGET_MS, REPS)
    res["state"].append(thread_state())
    for t in THREADS if "threads" in PATHS else ():
        res["threads"][str(t)] = bench.raw_threads(t, THREAD_SIZE, THREAD_SECONDS)
    if config == "noop" and "threads" in PATHS:
        res["c10_threads"] = {str(t): bench.c10_threads(t, THREAD_SECONDS) for t in THREADS}
    if config == "symm" and "direct" in PATHS:
        import symm

        lib = symm.library_path()
        res["direct"] = {str(s): bench.direct_pair(lib, s, TARGET_MS, REPS) for s in SIZES}
        res["direct_threads"] = {str(t): bench.direct_threads(lib, t, THREAD_SIZE, THREAD_SECONDS) for t in THREADS}
        res["calls"] = {n: bench.direct_int_call(lib, n, TARGET_MS, REPS)
                        for n in ("symm_pool_device_count", "symm_last_error_code")}
        res["symm_stats"] = {k: v for k, v in symm.memory_stats(0).items() if k.endswith(".current") or k.startswith("num_")}
    if config == "rmm":
        import rmm

        res["rmm_version"] = rmm.__version__
        res["rmm_pool_size"] = _rmm_pool.pool_size()
    print("RESULT " + json.dumps(res), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=CONFIGS)
    ap.add_argument("--ext", type=Path)
    ap.add_argument("--configs", default=",".join(TABLE_CONFIGS),
                    help=f"comma-separated subset of {','.join(CONFIGS)} (default: {','.join(TABLE_CONFIGS)})")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the configurations this many times, interleaved, and add a table of medians and ranges")
    args = ap.parse_args()
    if args.child:
        child_main(args.child, args.ext)
        return 0
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {args.rounds}")
    return parent_main(configs, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
