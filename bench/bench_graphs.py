"""CUDA-graph replays of a captured training step: PyTorch's allocator vs libsymm.

    python3 bench/bench_graphs.py                       # on the GPU machine; writes $OUT/bench_graphs.md
    python3 bench/bench_graphs.py --configs native      # a subset

One training step of a small MLP (Linear+ReLU layers, batch 64, MSE loss,
AdamW with capturable=True) is captured with torch.cuda.graph, the way
PyTorch's documentation does it: static input and target tensors, three
warm-up steps on a side stream, then the capture of zero_grad-free forward,
backward and optimizer step. The graph is replayed WARM times, then ROUNDS
rounds of REPLAYS replays are timed, each with CUDA events around the round
(GPU time) and with the wall clock up to a synchronize (host time); the table
gives the median round, per replay.

Each configuration runs in a fresh interpreter (``--child CONFIG``), since the
process-wide allocator can be swapped only once:

- ``native``: PyTorch's own caching allocator;
- ``symm``: replace mode, ``import symm; symm.use_as_default()`` before any CUDA work;
- ``symm-mempool``: PyTorch's allocator stays, the graph's private pool is
  ``torch.cuda.MemPool(symm.pool_allocator().allocator())``
  (``torch.cuda.graph(g, pool=mempool.id)``), so the graph's segments come from libsymm.

A configuration that fails (capture invalidated, a crash, a time-out) gets a
FAIL row naming the exception; the others still run. The parent exits 1 if any
configuration failed. libsymm is found through PYTHONPATH=python and
SYMM_LIB=build/libsymm.so (set here unless already set).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CONFIGS = ("native", "symm", "symm-mempool")
BATCH = 64
LAYERS = (1024, 2048, 2048, 2048, 1024)  # Linear sizes: in, hidden..., out
SIDE_WARMUP_STEPS = 3
WARM = 20
REPLAYS = 1000
ROUNDS = 3
CHILD_TIMEOUT_S = 180
MiB = 1 << 20


# ---- child: one configuration -----------------------------------------------


def child_main(config: str) -> None:
    res: dict = {"config": config, "capture_ok": False}
    try:
        run_child(config, res)
    except Exception as e:  # reported in the table, not a crash
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-3000:]
        print(res["traceback"], file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(res), flush=True)


def peaks(torch, config: str, res: dict) -> None:
    """Peak reserved bytes as torch and (for symm) libsymm see them."""
    if config != "symm":  # torch's own allocator is current: its stats are real
        try:
            res["torch_peak_reserved"] = torch.cuda.max_memory_reserved()
            res["torch_peak_allocated"] = torch.cuda.max_memory_allocated()
        except Exception as e:
            res["torch_stats_error"] = f"{type(e).__name__}: {e}"
    if config.startswith("symm"):
        try:
            import symm

            res["symm_peak_reserved"] = symm.max_memory_reserved(0)
            res["symm_reserved_now"] = symm.memory_reserved(0)
        except Exception as e:
            res["symm_stats_error"] = f"{type(e).__name__}: {e}"


def run_child(config: str, res: dict) -> None:
    torch, mempool = start_allocator(config, res)
    model, loss_fn, opt, static_input, static_target = make_step(torch, res)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    static_loss = None
    stage = "capture"
    try:
        kwargs = {"pool": mempool.id} if mempool is not None else {}
        t0 = time.perf_counter()
        with torch.cuda.graph(g, **kwargs):
            static_loss = loss_fn(model(static_input), static_target)
            static_loss.backward()
            opt.step()
        res["capture_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        res["capture_ok"] = True
        stage = "replay"
        time_replays(torch, g, static_loss, res)
    except Exception as e:
        res["error"] = f"{stage}: {type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-3000:]
        print(res["traceback"], file=sys.stderr, flush=True)
    peaks(torch, config, res)

    # Orderly teardown (graph before its pool), so that an exit-time problem shows
    # up here, named, rather than as a crash after the results.
    try:
        import gc

        del g
        opt.zero_grad(set_to_none=True)  # the grads live in the graph's pool
        static_loss = None  # noqa: F841
        gc.collect()
        torch.cuda.synchronize()
        del mempool
        torch.cuda.empty_cache()
    except Exception as e:
        res["teardown_error"] = f"{type(e).__name__}: {e}"


def start_allocator(config: str, res: dict):
    """Imports torch with config's allocator in place; returns torch and,
    for symm-mempool, the MemPool the graph captures into (else None)."""
    import torch

    mempool = None
    if config == "symm":
        import symm

        symm.use_as_default()  # before any CUDA work
        res["symm"] = f"{symm.version()} ({symm.library_path()})"
    elif config == "symm-mempool":
        import symm

        res["symm"] = f"{symm.version()} ({symm.library_path()})"
    torch.cuda.init()
    torch.cuda.set_device(0)
    if config == "symm-mempool":
        import symm

        mempool = torch.cuda.MemPool(symm.pool_allocator().allocator())
    res["device"] = torch.cuda.get_device_name(0)
    res["torch"] = torch.__version__
    return torch, mempool


def make_step(torch, res: dict):
    """The model, loss, optimizer and static tensors of the captured step,
    warmed up on a side stream (PyTorch's "whole network capture" recipe)."""
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(LAYERS[:-1], LAYERS[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(LAYERS) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).cuda()
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    static_input = torch.randn(BATCH, LAYERS[0], device="cuda")
    static_target = torch.randn(BATCH, LAYERS[-1], device="cuda")
    res["params"] = sum(p.numel() for p in model.parameters())

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(SIDE_WARMUP_STEPS):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(static_input), static_target)
            loss.backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return model, loss_fn, opt, static_input, static_target


def time_replays(torch, g, static_loss, res: dict) -> None:
    """WARM replays, then ROUNDS timed rounds of REPLAYS: GPU time (events)
    and host time (wall clock to a synchronize) per replay, and the loss
    before and after, which must go down."""
    for _ in range(WARM):
        g.replay()
    torch.cuda.synchronize()
    res["loss_first"] = float(static_loss.item())
    gpu_us, wall_us = [], []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(REPLAYS):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        wall_us.append((time.perf_counter() - t0) * 1e6 / REPLAYS)
        gpu_us.append(start.elapsed_time(end) * 1e3 / REPLAYS)
    res["loss_last"] = float(static_loss.item())
    res["gpu_us_rounds"] = [round(x, 3) for x in gpu_us]
    res["wall_us_rounds"] = [round(x, 3) for x in wall_us]
    res["gpu_us"] = statistics.median(gpu_us)
    res["wall_us"] = statistics.median(wall_us)
    if not (res["loss_last"] == res["loss_last"]) or res["loss_last"] >= res["loss_first"]:
        res["warning"] = f"loss did not go down over the replays: {res['loss_first']:.6g} -> {res['loss_last']:.6g}"


# ---- parent: run children, write the table ----------------------------------


def child_env() -> dict:
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    lib = ROOT / "build" / "libsymm.so"
    if "SYMM_LIB" not in env and lib.exists():
        env["SYMM_LIB"] = str(lib)
    env.pop("SYMM_DEVICE", None)
    return env


def run_config(config: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config]
    start = time.time()
    try:
        proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        tail = ((e.stdout or b"") + (e.stderr or b""))[-1500:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"config": config, "capture_ok": False, "error": f"timed out after {CHILD_TIMEOUT_S} s", "log": tail}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"config": config, "capture_ok": False,
                "error": f"process died, rc={proc.returncode} (no result printed)",
                "log": (proc.stdout + proc.stderr)[-3000:]}
    res = json.loads(lines[-1][len("RESULT "):])
    if proc.returncode != 0:
        res["exit_error"] = f"rc={proc.returncode} after its results"
        res["log"] = (proc.stdout + proc.stderr)[-3000:]
    res["seconds"] = round(time.time() - start, 1)
    return res


def failed(r: dict) -> bool:
    return "error" in r or "exit_error" in r


def render(results: dict) -> str:
    any_r = next((r for r in results.values() if "device" in r), {})
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    symm_v = next((r["symm"] for r in results.values() if "symm" in r), "not loaded")
    out = [
        "# CUDA-graph replays of a training step (bench/bench_graphs.py)",
        "",
        f"- date: {date}; device: {any_r.get('device', '?')}; torch {any_r.get('torch', '?')}; libsymm {symm_v}",
        f"- step: MLP {'-'.join(map(str, LAYERS))} (Linear+ReLU, {any_r.get('params', 0) / 1e6:.1f} M parameters), "
        f"batch {BATCH}, MSE, AdamW(capturable=True); forward + backward + step captured in one graph",
        f"- timing: {WARM} warm replays, then {ROUNDS} rounds of {REPLAYS} replays; median round per replay, "
        "GPU time from CUDA events around the round, wall time up to a synchronize",
        "",
        "| config | capture ok | µs per replay (CUDA events) | µs per replay (wall) | ratio to native | "
        "peak reserved, torch (MiB) | peak reserved, libsymm (MiB) | loss first → last | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    native = results.get("native", {}).get("gpu_us")

    def mib(x):
        return f"{x / MiB:,.0f}" if isinstance(x, (int, float)) else "–"

    for cfg, r in results.items():
        gpu, wall = r.get("gpu_us"), r.get("wall_us")
        rt = f"{gpu / native:.3f}×" if gpu and native else "–"
        loss = (f"{r['loss_first']:.5g} → {r['loss_last']:.5g}" if "loss_last" in r else "–")
        if "error" in r:
            status = "FAIL: " + r["error"].replace("|", "/").replace("\n", " ")[:160]
        elif "exit_error" in r:
            status = "FAIL at exit: " + r["exit_error"]
        else:
            status = "ok" + (f" ({r['warning']})" if "warning" in r else "")
        if "teardown_error" in r:
            status += f"; teardown: {r['teardown_error'][:120]}"
        out.append(
            f"| {cfg} | {'yes' if r.get('capture_ok') else 'no'} | "
            f"{f'{gpu:.2f}' if gpu else '–'} | {f'{wall:.2f}' if wall else '–'} | {rt} | "
            f"{mib(r.get('torch_peak_reserved'))} | {mib(r.get('symm_peak_reserved'))} | {loss} | {status} |"
        )
    out += [
        "",
        "Ratio < 1 means faster than native. Peak reserved, torch: torch.cuda.max_memory_reserved() "
        "(not available in replace mode, where torch's allocator is not current); libsymm: "
        "symm.max_memory_reserved(0). Same seed everywhere: the losses should match across configs.",
    ]
    errs = [(c, r) for c, r in results.items() if failed(r)]
    if errs:
        out += ["", "## failures", ""]
        for cfg, r in errs:
            detail = r.get("traceback") or r.get("log") or r.get("error") or r.get("exit_error")
            out += [f"- {cfg}: {r.get('error') or r.get('exit_error')}", "", "```", str(detail).strip()[-2500:], "```"]
    return "\n".join(out) + "\n"


def parent_main(configs) -> int:
    t0 = time.time()
    results = {}
    for cfg in configs:
        r = run_config(cfg)
        results[cfg] = r
        msg = ("FAIL " + (r.get("error") or r.get("exit_error", ""))) if failed(r) else \
            f"ok, {r['gpu_us']:.2f} µs/replay (GPU), {r['wall_us']:.2f} µs/replay (wall)"
        print(f"  {cfg}: {msg} [{r.get('seconds', '?')} s]", flush=True)
    report = render(results)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "bench_graphs.md").write_text(report)
        (Path(out_dir) / "bench_graphs.json").write_text(json.dumps(results, indent=1))
    print(report, flush=True)
    print(f"total {time.time() - t0:.0f} s", flush=True)
    return 1 if any(failed(r) for r in results.values()) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=CONFIGS)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"comma-separated subset of {','.join(CONFIGS)} (default: all)")
    args = ap.parse_args()
    if args.child:
        child_main(args.child)
        return 0
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    return parent_main(configs)


if __name__ == "__main__":
    sys.exit(main())
