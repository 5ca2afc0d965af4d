"""libsymm inside PyTorch on a real GPU, in both ways PyTorch can use it.

    python3 -m pytest tests/device/test_torch_pool.py -v -s
    python3 tests/device/test_torch_pool.py            # the same

Modes:
- replace: torch.cuda.memory.change_current_allocator(symm.pool_allocator()):
  every CUDA tensor comes from libsymm; hooks carry empty_cache, memory
  fraction and record_stream to the pool.
- mempool: torch.cuda.MemPool(symm.pool_allocator().allocator()) with
  torch.cuda.use_mem_pool: PyTorch's caching allocator asks libsymm for
  segments only.
- native: PyTorch's own allocator, the reference for bit-exact training.

The process-wide allocator can be swapped once, so every check runs in a
fresh interpreter: this file re-runs itself with ``--child CHECK MODE``; the
child prints ``RESULT {json}`` as its last line and the parent (pytest)
judges it and prints one PASS/FAIL line per check.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
MiB = 1 << 20
GiB = 1 << 30
CHILD_TIMEOUT_S = 300


# =============================================================================
# Child side: runs one check in one mode, in its own process.
# =============================================================================


class Mode:
    """Sets up one allocator mode and routes allocations made inside scope()."""

    def __init__(self, name: str):
        import torch

        import symm

        self.name = name
        self.pool = None
        self.thread_pools = []
        if name == "replace":
            symm.use_as_default()  # before anything touches CUDA
        torch.cuda.init()
        if name == "mempool":
            symm.init(torch.cuda.device_count())  # so stats work before the first segment
            self.pool = torch.cuda.MemPool(symm.pool_allocator().allocator())

    def scope(self):
        """Allocations inside go to libsymm (in native mode: to PyTorch)."""
        import contextlib

        import torch

        if self.pool is None:
            return contextlib.nullcontext()
        return torch.cuda.use_mem_pool(self.pool)

    def thread_scope(self):
        """Like scope(), with a pool of its own: one thread per pool at a time."""
        import contextlib

        import torch

        import symm

        if self.name != "mempool":
            return contextlib.nullcontext()
        # Kept alive past the thread's scope: PyTorch's ~MemPool asserts that no
        # thread anywhere is inside use_mem_pool (captures_underway.empty()), so
        # a pool may only die once every thread has left its scope.
        pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
        self.thread_pools.append(pool)
        return torch.cuda.use_mem_pool(pool)


def symm_peaks() -> dict:
    """What libsymm saw: proof that the allocations really went through it."""
    import symm

    return {
        "symm_peak_allocated": symm.max_memory_allocated(0),
        "symm_peak_reserved": symm.max_memory_reserved(0),
        "symm_reserved": symm.memory_reserved(0),
    }


def check_train(m: Mode) -> dict:
    """(a) 20 deterministic training steps; the parent compares losses bit for bit."""
    import torch
    from torch import nn

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.autograd.set_multithreading_enabled(False)  # backward allocates on this thread too

    g = torch.Generator().manual_seed(1234)
    x_cpu = torch.randn(128, 3, 32, 32, generator=g)
    y_cpu = torch.randn(128, 10, generator=g)
    losses = []
    with m.scope():
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 256), nn.ReLU(),
            nn.Linear(256, 10),
        ).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = x_cpu.cuda(), y_cpu.cuda()
        for _ in range(20):
            opt.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()).hex())
        torch.cuda.synchronize()
    out = {"losses": losses}
    if m.name != "native":
        out.update(symm_peaks())
    return out


def fill_pattern(t, seed: int) -> None:
    """Writes byte i = (7*i + seed) mod 256, in chunks to bound the temporaries."""
    import torch

    n, chunk = t.numel(), 64 * MiB
    for off in range(0, n, chunk):
        k = min(chunk, n - off)
        idx = torch.arange(off, off + k, device=t.device, dtype=torch.int32)
        t[off:off + k] = ((idx * 7 + seed) & 0xFF).to(torch.uint8)


def has_pattern(t, seed: int) -> bool:
    import torch

    n, chunk = t.numel(), 64 * MiB
    for off in range(0, n, chunk):
        k = min(chunk, n - off)
        idx = torch.arange(off, off + k, device=t.device, dtype=torch.int32)
        if not torch.equal(t[off:off + k], ((idx * 7 + seed) & 0xFF).to(torch.uint8)):
            return False
    return True


SIZES = [0, 1, 2, 3, 255, 511, 512, 513, 1000, 4095, 4096, 4097, 65535, 65536, 65537,
         MiB - 1, MiB, MiB + 1, 2 * MiB - 1, 2 * MiB, 2 * MiB + 1, 10 * MiB - 1, 10 * MiB,
         20 * MiB + 1, 64 * MiB, 100 * MiB + 7, 256 * MiB, 512 * MiB - 1, GiB]


def check_sizes(m: Mode) -> dict:
    """(b) 0 B .. 1 GiB held at once: aligned, disjoint, and holding their data."""
    import torch

    problems = []
    with m.scope():
        ts = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in SIZES]
        for i, t in enumerate(ts):
            fill_pattern(t, i)
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel()) for t in ts if t.numel())
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            if a1 > b0:
                problems.append(f"overlap: [{a0:#x},{a1:#x}) and {b0:#x}")
        problems += [f"{t.numel()} B at {t.data_ptr():#x} not 512-aligned" for t in ts if t.numel() and t.data_ptr() % 512]
        torch.cuda.empty_cache()  # must not touch live blocks
        problems += [f"{SIZES[i]} B lost its data" for i, t in enumerate(ts) if not has_pattern(t, i)]
        # free every other tensor, allocate again, and check nobody trampled anybody
        for i in range(1, len(ts), 2):
            ts[i] = None
        for i in range(1, len(ts), 2):
            ts[i] = torch.empty(SIZES[i], dtype=torch.uint8, device="cuda")
            fill_pattern(ts[i], 100 + i)
        for i, t in enumerate(ts):
            seed = 100 + i if i % 2 else i
            if not has_pattern(t, seed):
                problems.append(f"after reuse: {SIZES[i]} B lost its data")
        torch.cuda.synchronize()
    out = {"problems": problems, "count": len(SIZES)}
    out.update(symm_peaks())
    return out


SLEEP_CYCLES = 1_000_000_000  # about 0.5 s of GPU time on H100/H200 clocks


def stream_round(m: Mode, record: bool) -> dict:
    """Allocate on A, read on B behind a long kernel, free, reallocate and write on A."""
    import torch

    n = 4096
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    with m.scope():
        eye = torch.eye(n, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(sa):
            buf = torch.full((n, n), 3.0, device="cuda")
        sb.wait_stream(sa)
        with torch.cuda.stream(sb):
            torch.cuda._sleep(SLEEP_CYCLES)  # B is busy for a while before it reads buf
            out = buf @ eye
            for _ in range(20):
                out = out @ eye
        if record:
            buf.record_stream(sb)
        old_ptr = buf.data_ptr()
        del buf
        with torch.cuda.stream(sa):
            new = torch.empty((n, n), device="cuda")
            new.fill_(-7.0)
            reused = new.data_ptr() == old_ptr
            b_busy = not sb.query()
        torch.cuda.synchronize()
        ok = bool((out == 3.0).all())
    return {"ok": ok, "reused_at_once": reused, "b_busy_during_write": b_busy}


def check_streams(m: Mode) -> dict:
    """(c) record_stream keeps a block away from stream A while B still reads it."""
    with_record = stream_round(m, record=True)
    control = stream_round(m, record=False)  # shows the test can see the hazard
    return {"with_record_stream": with_record, "control_without_record_stream": control}


def check_threads(m: Mode) -> dict:
    """(d) eight threads allocating, writing, verifying and freeing at once."""
    import random
    import threading

    import torch

    errors: list[str] = []
    sizes = [512, 4096, 65536, MiB, 3 * MiB + 5, 16 * MiB, 40 * MiB]

    def worker(tid: int) -> None:
        try:
            torch.cuda.set_device(0)
            stream = torch.cuda.Stream()
            rng = random.Random(tid)
            with m.thread_scope(), torch.cuda.stream(stream):
                live = []
                for i in range(200):
                    v = (tid * 37 + i) % 256
                    t = torch.empty(rng.choice(sizes), dtype=torch.uint8, device="cuda")
                    t.fill_(v)
                    live.append((t, v))
                    if len(live) > 8:
                        t, v = live.pop(rng.randrange(len(live)))
                        if not bool((t == v).all()):
                            errors.append(f"thread {tid} step {i}: {t.numel()} B at {t.data_ptr():#x} overwritten")
                for t, v in live:
                    if not bool((t == v).all()):
                        errors.append(f"thread {tid}: final check of {t.numel()} B failed")
                del t
                live.clear()
                stream.synchronize()
        except Exception as e:  # reported to the parent with the thread's id
            errors.append(f"thread {tid}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    hung = sum(t.is_alive() for t in threads)
    out = {"errors": errors[:20], "n_errors": len(errors), "hung": hung, "seconds": round(time.time() - start, 2)}
    out.update(symm_peaks())
    return out


def verify_after(m: Mode) -> bool:
    """Allocate and check a 256 MiB tensor: the process still works."""
    import torch

    with m.scope():
        t = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        fill_pattern(t, 42)
        ok = has_pattern(t, 42)
        a = torch.randn(512, 512, device="cuda")
        ok = ok and bool(torch.isfinite(a @ a).all())
        torch.cuda.synchronize()
    return ok


def check_oom(m: Mode) -> dict:
    """(e) twice the GPU's memory: an exception, then business as usual."""
    import torch

    import symm

    total = torch.cuda.get_device_properties(0).total_memory
    n = 2 * total
    ooms_before = symm.memory_stats(0).get("num_ooms")
    out = {"requested": n}
    try:
        with m.scope():
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
        out.update(raised=False, data_ptr=t.data_ptr())
        del t
    except BaseException as e:  # judged by the parent
        out.update(
            raised=True,
            type=type(e).__name__,
            is_runtime_error=isinstance(e, RuntimeError),
            is_torch_oom=isinstance(e, torch.OutOfMemoryError),
            message=str(e)[:2000],
        )
    out["works_after"] = verify_after(m)
    ooms_after = symm.memory_stats(0).get("num_ooms")
    if ooms_before is not None and ooms_after is not None:
        out["symm_num_ooms_delta"] = ooms_after - ooms_before
    return out


def check_empty_cache(m: Mode) -> dict:
    """(f) empty_cache gives a freed 1 GiB back to the driver."""
    import gc

    import torch

    import symm

    torch.cuda.synchronize()
    if m.name == "replace":
        x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        free0, r0 = torch.cuda.mem_get_info()[0], symm.memory_reserved(0)
        del x
        torch.cuda.synchronize()
        free1 = torch.cuda.mem_get_info()[0]
        torch.cuda.empty_cache()  # reaches symm_pool_empty_cache through set_reset_fn
    else:
        # torch.cuda.empty_cache() is PyTorch's own here; deleting the MemPool hands
        # its segments back to libsymm (raw_delete), and symm.empty_cache() releases them.
        pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
            x.fill_(1)
        torch.cuda.synchronize()
        free0, r0 = torch.cuda.mem_get_info()[0], symm.memory_reserved(0)
        del x, pool
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free1 = torch.cuda.mem_get_info()[0]
        symm.empty_cache()
    free2, r2 = torch.cuda.mem_get_info()[0], symm.memory_reserved(0)
    return {"free_before": free0, "free_after_del": free1, "free_after_empty": free2,
            "symm_reserved_before": r0, "symm_reserved_after": r2}


def check_fraction(m: Mode) -> dict:
    """(g) set_per_process_memory_fraction(0.01) reaches the pool."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    n = int(0.10 * total)
    torch.cuda.set_per_process_memory_fraction(0.01)
    out = {"requested": n}
    try:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        out.update(raised=False, data_ptr=t.data_ptr())
        del t
    except RuntimeError as e:
        out.update(raised=True, type=type(e).__name__, message=str(e)[:2000])
    torch.cuda.set_per_process_memory_fraction(1.0)
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    fill_pattern(t, 9)
    out["works_after_reset"] = has_pattern(t, 9)
    return out


CHECKS = {
    "a-train": check_train,
    "b-sizes": check_sizes,
    "c-streams": check_streams,
    "d-threads": check_threads,
    "e-oom": check_oom,
    "f-empty": check_empty_cache,
    "g-fraction": check_fraction,
}


def child_main(check: str, mode: str) -> None:
    m = Mode(mode)
    result = CHECKS[check](m)
    print("RESULT " + json.dumps(result), flush=True)


# =============================================================================
# Parent side: pytest.
# =============================================================================

if __name__ == "__main__" and len(sys.argv) >= 4 and sys.argv[1] == "--child":
    child_main(sys.argv[2], sys.argv[3])
    sys.exit(0)

import pytest  # noqa: E402  (children do not need pytest)

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

LINES: list[str] = []


def child_env() -> dict:
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS, before CUDA init
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    env.pop("SYMM_DEVICE", None)
    return env


def run_child(check: str, mode: str) -> dict:
    """Runs one check in a fresh interpreter and returns its RESULT (or raises)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", check, mode]
    start = time.time()
    proc = subprocess.run(cmd, env=child_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise AssertionError(f"child {check}/{mode} failed (rc={proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["_seconds"] = round(time.time() - start, 1)
    return result


def report(check: str, mode: str, ok: bool, detail: str) -> None:
    """One compact line per check, printed now and again in the final table."""
    line = f"{'PASS' if ok else 'FAIL'}  {check:<12} {mode:<8} {detail}"
    LINES.append(line)
    print("\n" + line, flush=True)


def judge(check: str, mode: str, fn) -> None:
    """Runs a check's child, lets fn assert on its result, and reports either way."""
    try:
        result = run_child(check, mode)
        detail = fn(result)
    except BaseException as e:
        report(check, mode, False, str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        raise
    report(check, mode, True, f"{detail} ({result['_seconds']} s)")


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield
    if LINES:
        print("\n==== libsymm torch checks ====\n" + "\n".join(LINES), flush=True)


@pytest.fixture(scope="module")
def native_losses():
    return run_child("a-train", "native")["losses"]


MODES = ["replace", "mempool"]

SIZE_UNITS = (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("kB", 10**3), ("MB", 10**6), ("GB", 10**9))


def names_size(message: str, n: int) -> bool:
    forms = {str(n), f"{n:,}", f"{n:_}", hex(n)}
    for unit, scale in SIZE_UNITS:
        for digits in range(0, 3):
            forms.add(f"{n / scale:.{digits}f} {unit}")
            forms.add(f"{n / scale:.{digits}f}{unit}")
    return any(f in message for f in forms)


def names_device(message: str, device: int) -> bool:
    return re.search(rf"(\bdev(ice)?\b\s*[=:#]?\s*|\b(cuda|gpu):){device}\b", message, re.I) is not None


def assert_used_symm(r: dict) -> None:
    assert r.get("symm_peak_allocated", 0) > 0, f"libsymm saw no allocation: {r}"


@pytest.mark.parametrize("mode", MODES)
def test_a_train_bitwise(mode, native_losses):
    def fn(r):
        assert_used_symm(r)
        assert len(r["losses"]) == 20
        diff = [i for i, (a, b) in enumerate(zip(r["losses"], native_losses)) if a != b]
        assert not diff, f"losses differ from native at steps {diff}: {r['losses'][diff[0]]} vs {native_losses[diff[0]]}"
        return f"20 losses bit-identical to native (last {float.fromhex(r['losses'][-1]):.6g})"

    judge("a-train", mode, fn)


@pytest.mark.parametrize("mode", MODES)
def test_b_sizes(mode):
    def fn(r):
        assert not r["problems"], "; ".join(r["problems"][:5])
        assert_used_symm(r)
        return f"{r['count']} sizes 0 B..1 GiB aligned, disjoint, intact"

    judge("b-sizes", mode, fn)


@pytest.mark.parametrize("mode", MODES)
def test_c_streams_record_stream(mode):
    def fn(r):
        w, c = r["with_record_stream"], r["control_without_record_stream"]
        assert w["ok"], f"B's result corrupted despite record_stream: {w}"
        control = "control corrupted as expected" if not c["ok"] else "control NOT corrupted (hazard not shown)"
        return f"B's result intact; {control}; B busy during A's write: {w['b_busy_during_write']}"

    judge("c-streams", mode, fn)


@pytest.mark.parametrize("mode", MODES)
def test_d_threads(mode):
    def fn(r):
        assert r["hung"] == 0, f"{r['hung']} threads hung"
        assert r["n_errors"] == 0, "; ".join(r["errors"][:5])
        assert_used_symm(r)
        return f"8 threads x 200 alloc/verify/free clean in {r['seconds']} s"

    judge("d-threads", mode, fn)


@pytest.mark.parametrize("mode", MODES)
def test_e_oom(mode):
    def fn(r):
        assert r["raised"], f"allocating {r['requested']} B did not raise (data_ptr={r.get('data_ptr')})"
        msg = r["message"]
        if mode == "replace":
            assert r["is_runtime_error"], f"{r['type']} is not a RuntimeError"
            assert names_size(msg, r["requested"]), f"message lacks the size {r['requested']}: {msg[:300]}"
            assert names_device(msg, 0), f"message lacks the device: {msg[:300]}"
        else:
            assert r["is_torch_oom"], f"expected torch.OutOfMemoryError, got {r['type']}: {msg[:300]}"
        assert r["works_after"], "allocate+verify after the OOM failed"
        return f"{r['type']}: {msg.splitlines()[0][:120]!r}; works after"

    judge("e-oom", mode, fn)


@pytest.mark.parametrize("mode", MODES)
def test_f_empty_cache(mode):
    def fn(r):
        gained = r["free_after_empty"] - r["free_before"]
        dropped = r["symm_reserved_before"] - r["symm_reserved_after"]
        assert r["symm_reserved_before"] >= GiB, f"the 1 GiB did not come from libsymm: {r}"
        assert gained >= GiB, f"device free memory rose by {gained / MiB:.1f} MiB only: {r}"
        assert dropped >= GiB, f"symm.memory_reserved dropped by {dropped / MiB:.1f} MiB only: {r}"
        return f"free +{gained / GiB:.2f} GiB, symm reserved -{dropped / GiB:.2f} GiB"

    judge("f-empty", mode, fn)


def test_g_memory_fraction_replace():
    def fn(r):
        assert r["raised"], "allocating 10% of memory under fraction 0.01 succeeded"
        assert r["works_after_reset"], "allocation after fraction 1.0 failed"
        return f"{r['type']} under 0.01; works at 1.0"

    judge("g-fraction", "replace", fn)


if __name__ == "__main__":
    sys.exit(pytest.main([str(Path(__file__).resolve()), "-v", "-s"]))
