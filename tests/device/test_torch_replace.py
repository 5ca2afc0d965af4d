"""Replace mode loses nothing: every torch.cuda memory call a training script
makes works under symm.use_as_default() as it does on PyTorch's own allocator.

Each check runs twice, each time in a fresh interpreter (the allocator can be
swapped once per process): on PyTorch's allocator (native, the reference) and
under symm.use_as_default() (symm), in the same run:

    python3 tests/device/test_torch_replace.py               # every check, table last
    python3 tests/device/test_torch_replace.py --checks oom,mp --allocs symm

Checks: stats (memory_allocated/max/reserved/stats/summary, both resets),
cudnn (cudnn.benchmark conv training), oom (torch.cuda.OutOfMemoryError caught
and retried smaller, observers called, and the same under
set_per_process_memory_fraction), history (_record_memory_history ->
_snapshot with this file's frames -> _dump_snapshot -> memory_viz's
trace_plot and segment_plot render), mp (a CUDA tensor through a
torch.multiprocessing queue to a spawned child on each allocator and back),
mpexp (the same with expandable segments everywhere), mpmixed (libsymm
only: a 50 MiB tensor over chunks of both sizes an expandable segment maps,
2 MiB ones and a 20 MiB one, crosses to a libsymm child in libsymm's handle
of mixed chunk sizes, and a 4 MiB one over 2 MiB chunks alone still goes in
PyTorch's format), cloexec (the
descriptors a shared expandable segment's handle names are close-on-exec: a
child started with exec does not inherit them and keep the memory alive;
asserted under libsymm, reported for PyTorch's allocator), mpinterior (a
storage that starts inside a block, from DLPack, crosses to a child with
expandable segments; once it and its block are freed, the chunk descriptors
its handle named are closed; libsymm only), compile
(torch.compile(mode="reduce-overhead") training and inference equal
eager; an eager tensor made between replays is never overwritten), tree
(cudagraph trees whose path diverges: a private pool's checkpoint is restored,
with PyTorch's slow-path asserts on), graphs
(a captured graph that frees intermediates; tensors made after it survive
replays), mempool (torch.cuda.MemPool() and use_mem_pool: the pool's tensors
come from a segment of that pool, others do not; MemPools over another
allocator are test_torch_mempools.py's), expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True gives
libsymm's expandable segments), plain (PyTorch's plain recipe: a capture is
refused with a clear error, never silent corruption), noabort (a failed
ctypes call of symm_pool_alloc after PyTorch's init returns NULL), badfree
(torch.cuda.caching_allocator_delete of a pointer inside a block, and of
one freed already, raises as PyTorch's allocator does, and frees nothing). Results go
to $OUT/torch_replace.json (or build/) with each child's output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CHECKS = ("stats", "cudnn", "oom", "history", "mp", "mpexp", "mpmixed", "cloexec", "mpinterior", "compile", "tree", "graphs",
          "mempool", "expandable", "plain", "noabort", "badfree")
ALLOCS = ("native", "symm")
MiB = 1 << 20


def install(alloc: str):
    """Makes alloc the process's CUDA allocator (before any CUDA call)."""
    import torch

    if alloc == "symm":
        import symm

        symm.use_as_default()
        st = symm.extension_status()
        assert st["extension"], f"libsymm's PyTorch extension is not in use: {st['reason']}"
    return torch


# ---- checks: each returns a dict of facts, raises on failure ----------------------


def check_stats(alloc):
    torch = install(alloc)
    torch.cuda.init()
    base = torch.cuda.memory_allocated()
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    a1 = torch.cuda.memory_allocated()
    assert a1 - base >= 64 * MiB, (base, a1)
    assert torch.cuda.memory_reserved() >= a1
    st = torch.cuda.memory_stats()
    for k in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active.all.current", "num_ooms",
              "requested_bytes.all.current", "segment.all.current", "num_alloc_retries", "allocation.all.allocated"):
        assert k in st, k
    assert st["allocated_bytes.all.current"] == a1
    assert st["requested_bytes.all.current"] >= 64 * MiB
    del x
    a2 = torch.cuda.memory_allocated()
    assert a2 == base, (a2, base)
    assert torch.cuda.max_memory_allocated() >= 64 * MiB + base
    summary = torch.cuda.memory_summary()
    assert "Allocated memory" in summary and "GPU reserved memory" in summary, summary[:400]
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == a2
    torch.cuda.reset_accumulated_memory_stats()
    st2 = torch.cuda.memory_stats()
    assert st2["allocation.all.allocated"] == 0 and st2["allocation.all.freed"] == 0, st2
    assert st2["allocated_bytes.all.current"] == a2
    y = torch.empty(MiB, device="cuda")
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 1
    del y
    torch.cuda.empty_cache()
    return {"peak_after_reset": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def check_cudnn(alloc):
    torch = install(alloc)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 16, 5),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    losses = []
    for step in range(6):
        x = torch.randn(8 + 4 * step, 3, 64, 64, device="cuda")
        loss = net(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(map(lambda v: v == v and abs(v) < 1e6, losses)), losses
    return {"losses": [round(v, 5) for v in losses]}


def check_oom(alloc):
    torch = install(alloc)
    free, total = torch.cuda.mem_get_info()
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
    n = 2 * total
    got = None
    # The recipe training libraries ship: halve the batch until it fits.
    while got is None:
        try:
            got = torch.empty(n, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            msg = str(e)
            assert msg.startswith("CUDA out of memory. Tried to allocate"), msg
            n //= 2
    assert n <= total and got.numel() == n
    del got
    assert seen, "no out-of-memory observer was called"
    assert torch.cuda.memory_stats()["num_ooms"] >= 1
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.1)
    try:
        torch.empty(int(0.2 * total), dtype=torch.uint8, device="cuda")
        raise AssertionError("an allocation over the memory fraction succeeded")
    except torch.cuda.OutOfMemoryError as e:
        frac_msg = str(e)
    small = torch.empty(int(0.05 * total), dtype=torch.uint8, device="cuda")
    del small
    torch.cuda.set_per_process_memory_fraction(1.0)
    return {"fitted_gib": round(n / 2**30, 1), "observer_calls": len(seen), "fraction_msg": frac_msg[:160]}


def make_tensor_for_snapshot(torch):
    return torch.empty(3 * MiB + 512, dtype=torch.uint8, device="cuda")


def check_history(alloc):
    torch = install(alloc)
    out = Path(os.environ.get("OUT") or ROOT / "build")
    torch.cuda.memory._record_memory_history(max_entries=100000)
    assert torch._C._cuda_isHistoryEnabled()
    keep = make_tensor_for_snapshot(torch)
    tmp = [torch.empty(k * 4096, device="cuda") for k in range(1, 20)]
    del tmp
    snap = torch.cuda.memory._snapshot()
    addr = keep.data_ptr()
    frames_of_keep = None
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and seg["address"] <= addr < seg["address"] + seg["total_size"]:
                if b.get("frames"):
                    frames_of_keep = frames_of_keep or [f["name"] for f in b["frames"]]
    assert frames_of_keep and "make_tensor_for_snapshot" in frames_of_keep, frames_of_keep
    traces = snap["device_traces"][torch.cuda.current_device()]
    allocs = [t for t in traces if t["action"] == "alloc"]
    assert len(allocs) >= 20, len(allocs)
    assert any(t["addr"] == addr and any(f["name"] == "make_tensor_for_snapshot" for f in t.get("frames", []))
               for t in allocs), "the trace has no frames for the allocation"
    path = out / f"snapshot_{alloc}.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    from torch.cuda import _memory_viz

    html = _memory_viz.trace_plot(snap)
    seg_html = _memory_viz.segment_plot(snap)
    assert "<html" in html.lower() or len(html) > 1000, html[:200]
    assert len(seg_html) > 1000
    torch.cuda.memory._record_memory_history(enabled=None)
    assert not torch._C._cuda_isHistoryEnabled()
    return {"frames": frames_of_keep[:3], "trace_allocs": len(allocs), "pickle_bytes": path.stat().st_size,
            "html_bytes": len(html)}


def _mp_child(q_in, q_out, alloc):
    try:
        install(alloc)
        t = q_in.get(timeout=60)
        s = float(t.sum().item())
        t.mul_(2)  # visible to the parent: the same memory
        import torch

        torch.cuda.synchronize()
        q_out.put(("ok", s))
        q_in.get(timeout=60)  # keep t until the parent has looked
    except Exception as e:  # noqa: BLE001
        q_out.put(("error", f"{type(e).__name__}: {e}"))


def check_mp(alloc):
    torch = install(alloc)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = {}
    for child_alloc in ALLOCS:
        q_in, q_out = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=_mp_child, args=(q_in, q_out, child_alloc))
        p.start()
        # Two 4 MiB tensors share one segment: the second is not at its
        # segment's start, so the offset that travels with the handle matters.
        pad = torch.zeros(1 << 20, device="cuda")
        t = torch.arange(1 << 20, dtype=torch.float32, device="cuda") + 0.5
        want = float(t.sum().item())
        q_in.put(t)
        status, val = q_out.get(timeout=120)
        assert status == "ok", f"{alloc} -> {child_alloc}: {val}"
        assert abs(val - want) < 1e-3 * abs(want), (val, want)
        torch.cuda.synchronize()
        assert float(t.sum().item()) == 2 * want, "the child's write is not visible"
        q_in.put("done")
        p.join(60)
        assert p.exitcode == 0, p.exitcode
        results[f"{alloc}->{child_alloc}"] = "ok"
        del pad
    return results


def check_mpexp(alloc):
    """mp with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in every
    process: tensors of expandable segments (PyTorch's and libsymm's) cross."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    res = check_mp(alloc)
    import torch

    snap = torch.cuda.memory._snapshot()
    assert snap["segments"] and all(seg["is_expandable"] for seg in snap["segments"]), "not expandable"
    return res


def check_mpmixed(alloc):
    if alloc != "symm":
        return "libsymm only"
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    torch = install(alloc)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    # 1 MiB at the segment's start, then 50 MiB: [2, 20) MiB in 2 MiB
    # chunks, [20, 40) one 20 MiB chunk, [40, 52) 2 MiB chunks again.
    pad = torch.zeros(1 << 18, device="cuda")
    t = torch.arange(50 * MiB // 4, dtype=torch.float32, device="cuda") * 1e-6
    small = torch.ones(1 << 20, device="cuda")  # 4 MiB after them: 2 MiB chunks only
    kinds = {"mixed": t.untyped_storage()._share_cuda_()[1][:2], "uniform": small.untyped_storage()._share_cuda_()[1][:2]}
    assert kinds == {"mixed": b"\x02m", "uniform": b"\x02e"}, kinds
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_mp_child, args=(q_in, q_out, "symm"))
    p.start()
    want = float(t.double().sum().item())
    q_in.put(t)
    status, val = q_out.get(timeout=120)
    assert status == "ok", f"symm -> symm: {val}"
    assert abs(val - want) < 1e-3 * abs(want), (val, want)
    torch.cuda.synchronize()
    assert abs(float(t.double().sum().item()) - 2 * want) < 1e-3 * abs(want), "the child's write is not visible"
    q_in.put("done")
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    del pad, small
    return {"handles": {k: v.decode("latin-1") for k, v in kinds.items()}, "symm->symm": "ok"}


def check_cloexec(alloc):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    torch = install(alloc)
    import fcntl
    import struct

    t = torch.ones(8 * MiB, dtype=torch.uint8, device="cuda")
    h = t.untyped_storage()._share_cuda_()[1]  # what torch.multiprocessing sends
    assert h[:2] == b"\x02e", f"not an expandable-segment handle: {h[:2]!r}"
    # PyTorch's ShareHeader {pid_t pid; size_t segment_size; size_t num_handles;}, then one int per chunk.
    pid, seg, n = struct.unpack_from("@iQQ", h, 2)
    head = 2 + struct.calcsize("@iQQ")
    assert pid == os.getpid() and seg > 0 and len(h) == head + 4 * n and n >= 1, (pid, seg, n, len(h))
    fds = list(struct.unpack_from(f"@{n}i", h, head))
    inheritable = [fd for fd in fds if not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC]
    # End to end: a child started with exec, asked to keep what it can
    # (close_fds=False), sees none of them.
    mine = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds}
    probe = ("import json, os, sys\n"
             "print(json.dumps({a: os.readlink('/proc/self/fd/' + a) if os.path.exists('/proc/self/fd/' + a) "
             "else None for a in sys.argv[1:]}))")
    r = subprocess.run([sys.executable, "-c", probe, *map(str, fds)], close_fds=False, capture_output=True,
                       text=True, check=True, timeout=60)
    theirs = json.loads(r.stdout)
    leaked = [fd for fd in fds if theirs[str(fd)] == mine[fd]]
    facts = {"chunks": n, "inheritable": inheritable, "kept_by_exec_child": leaked, "link": mine[fds[0]]}
    if alloc == "symm":
        assert not inheritable and not leaked, f"descriptors not close-on-exec: {facts}"
    del t
    return facts


def _handle_fds(h: bytes) -> list:
    """The chunk descriptors an expandable-segment handle names (PyTorch's
    ShareHeader {pid_t pid; size_t segment_size; size_t num_handles;}, then
    one int per chunk)."""
    import struct

    assert h[:2] == b"\x02e", f"not an expandable-segment handle: {h[:2]!r}"
    _, _, n = struct.unpack_from("@iQQ", h, 2)
    return list(struct.unpack_from(f"@{n}i", h, 2 + struct.calcsize("@iQQ")))


def check_mpinterior(alloc):
    """A storage whose pointer is inside a block (torch.from_dlpack of a
    view) goes to a child through a torch.multiprocessing queue: PyTorch
    shares the storage's pointer, not the block's start. Once the child let
    go and the block is freed, every chunk descriptor its handle named is
    closed (libsymm keys them by the block's start: an interior key was
    never found at the free, and a later share at that address sent the old
    chunk's descriptor)."""
    if alloc == "native":  # PyTorch refuses a pointer inside a block ("invalid device pointer")
        return {"skipped": "libsymm only"}
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    torch = install(alloc)
    import gc

    import torch.multiprocessing as mp

    sent = []
    orig = torch.UntypedStorage._share_cuda_

    def share(self, *a, **k):  # what the queue's reducer sends, seen here
        r = orig(self, *a, **k)
        sent.append(bytes(r[1]))
        return r

    torch.UntypedStorage._share_cuda_ = share
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_mp_child, args=(q_in, q_out, alloc))
    p.start()
    t = torch.arange(2 * MiB, dtype=torch.float32, device="cuda")
    u = torch.from_dlpack(t[4096:])
    interior = u.untyped_storage().data_ptr() - t.untyped_storage().data_ptr()
    assert interior == 4096 * 4, f"the DLPack storage starts at offset {interior} of the block, not inside it"
    want = float(u.sum().item())
    q_in.put(u)
    status, val = q_out.get(timeout=120)
    assert status == "ok", val
    assert abs(val - want) < 1e-3 * abs(want), (val, want)
    q_in.put("done")
    p.join(60)
    assert p.exitcode == 0, p.exitcode
    torch.UntypedStorage._share_cuda_ = orig
    assert sent, "the queue sent no CUDA handle"
    fds = _handle_fds(sent[0])
    links = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")}
    del t, u
    open_fds = []
    for _ in range(50):  # the sent storage waits in PyTorch's limbo until the child's counter drops
        gc.collect()
        torch.cuda.ipc_collect()
        torch.cuda.synchronize()
        open_fds = [fd for fd, ln in links.items()
                    if os.path.exists(f"/proc/self/fd/{fd}") and os.readlink(f"/proc/self/fd/{fd}") == ln]
        if not open_fds:
            break
        time.sleep(0.1)
    facts = {"chunks": len(fds), "open_after_free": open_fds}
    assert links, f"the handle's descriptors were not open while shared: {fds}"
    assert not open_fds, f"chunk descriptors left open after the block was freed: {facts}"
    return facts


def check_compile(alloc):
    torch = install(alloc)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()

    def step(x):
        return model(x).relu().sum(dim=1)

    compiled = torch.compile(step, mode="reduce-overhead")
    sentinels = []
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(64, 256, device="cuda")
            want = step(x)
            got = compiled(x).clone()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            s = torch.full((4096,), float(i), device="cuda")  # eager, between replays
            sentinels.append(s)
        for i, s in enumerate(sentinels):
            assert bool((s == i).all()), f"eager tensor {i} overwritten by a replay"
    # Training: forward and backward graphs of one tree; two shapes re-record.
    net = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1)).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1)).cuda()
    ref.load_state_dict(net.state_dict())
    fwd = torch.compile(lambda x: net(x).square().mean(), mode="reduce-overhead")
    for i in range(8):
        x = torch.randn(32 if i % 3 else 48, 128, device="cuda")
        loss = fwd(x)
        loss.backward()
        ref(x).square().mean().backward()
        for a, b in zip(net.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
            a.grad = None
            b.grad = None
    return {"inference_calls": 6, "training_steps": 8}


def check_tree(alloc):
    """cudagraph trees whose recorded path diverges: the allocator's checkpoint
    of a private pool is restored (setCheckpointPoolState), with PyTorch's
    slow-path asserts on (checkPoolLiveAllocations and a snapshot of the pool
    after every restore)."""
    torch = install(alloc)
    import torch._inductor.config as icfg

    icfg.triton.slow_path_cudagraph_asserts = True
    torch.manual_seed(0)
    w = torch.randn(512, 512, device="cuda")

    def a(x):
        return (x @ w).relu()

    def b(y):
        return (y * 2 + 1).sum(dim=0)

    def c(y):
        return (y.sin() @ w).sum(dim=1)

    ca, cb, cc = (torch.compile(f, mode="reduce-overhead") for f in (a, b, c))
    with torch.no_grad():
        for i in range(12):
            torch.compiler.cudagraph_mark_step_begin()  # last step's outputs are dead
            x = torch.randn(256, 512, device="cuda")
            y = ca(x)
            # b on even steps, c on odd ones: two children of a's node, each
            # recorded after the other ran, from a's checkpointed state.
            got = (cb if i % 2 == 0 else cc)(y).clone()
            want = (b if i % 2 == 0 else c)(a(x))
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    checkpoints = None
    try:
        from torch._inductor import cudagraph_trees

        mgr = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
        checkpoints = getattr(mgr, "debug_checkpointing_counter", None)
    except Exception:  # noqa: BLE001 - the counter is only reported
        pass
    return {"steps": 12, "checkpoints_restored": checkpoints}


def check_graphs(alloc):
    torch = install(alloc)
    s = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up on the side stream, as PyTorch asks
            y = (x * 2 + 1).sum()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        a = x * 3        # intermediates freed inside the capture
        b = a + 1
        del a
        out = b.sum()
        del b
    after = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(4)]
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    assert float(out.item()) == 4.0 * (1 << 20)
    for t in after:
        assert bool((t == 7.0).all()), "a tensor made after the capture was overwritten by a replay"
    del g
    torch.cuda.empty_cache()
    return {"replays": 5, "y": float(y.item())}


def check_mempool(alloc):
    torch = install(alloc)
    facts = {}
    for round_ in range(2):  # a second MemPool after the first is gone
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            x = torch.full((4 * MiB,), 3, dtype=torch.uint8, device="cuda")
        y = torch.full((4 * MiB,), 5, dtype=torch.uint8, device="cuda")
        owner = {}
        for seg in torch.cuda.memory._snapshot()["segments"]:
            for blk in seg["blocks"]:
                if blk["state"] == "active_allocated":
                    owner[blk["address"]] = tuple(seg["segment_pool_id"])
        assert owner.get(x.data_ptr()) == tuple(pool.id), (owner.get(x.data_ptr()), pool.id)
        assert owner.get(y.data_ptr()) != tuple(pool.id), "a tensor made outside use_mem_pool came from the pool"
        torch.cuda.synchronize()
        assert int(x.sum()) == 3 * 4 * MiB and int(y.sum()) == 5 * 4 * MiB
        facts[f"pool{round_}"] = list(pool.id)
        del x, y, pool
        torch.cuda.empty_cache()
    # MemPools over another allocator (ProcessGroupNCCL's, PyTorch's
    # symmetric memory, any pluggable one): tests/device/test_torch_mempools.py.
    return facts


def check_expandable(alloc):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    torch = install(alloc)
    x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
    y = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
    snap = torch.cuda.memory._snapshot()
    exp = [seg["is_expandable"] for seg in snap["segments"]]
    assert exp and all(exp), exp
    facts = {"segments": len(exp)}
    if alloc == "symm":
        import symm

        ssnap = symm.memory_snapshot()
        assert all(seg["is_expandable"] for seg in ssnap["segments"]), "libsymm's own snapshot disagrees"
    del x, y
    return facts


def check_plain(alloc):
    import torch

    if alloc == "symm":
        import symm

        a = torch.cuda.memory.CUDAPluggableAllocator(str(symm.library_path()), "symm_pool_alloc", "symm_pool_free")
        torch.cuda.memory.change_current_allocator(a)
    x = torch.ones(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        (x * 2).sum()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            a = x * 3
            out = (a + 1).sum()
            del a
    except Exception as e:  # noqa: BLE001
        if alloc == "native":
            raise
        msg = str(e)
        assert "capturing a CUDA graph" in msg and "symm.use_as_default()" in msg, msg
        return {"refused": msg[:200]}
    assert alloc == "native", "the plain recipe captured a graph without libsymm's hooks"
    g.replay()
    torch.cuda.synchronize()
    return {"out": float(out.item())}


def check_noabort(alloc):
    torch = install(alloc)
    torch.empty(1, device="cuda")  # PyTorch's init has run
    if alloc == "native":
        return {"skipped": "libsymm only"}
    from symm._loader import load

    lib = load()
    p = lib.symm_pool_alloc(1 << 50, 0, None)
    assert p is None, p
    code = lib.symm_last_error_code()
    assert code == 2, (code, lib.symm_last_error())
    torch.empty(MiB, device="cuda")  # and PyTorch goes on
    return {"code": code, "msg": lib.symm_last_error().decode()[:120]}


def check_badfree(alloc):
    torch = install(alloc)
    x = torch.full((MiB,), 7.0, device="cuda")
    p = torch.cuda.caching_allocator_alloc(4 * MiB)
    errors = {}
    for what, ptr in (("interior", p + 512), ("twice", None)):
        if ptr is None:
            torch.cuda.caching_allocator_delete(p)
            ptr = p
        try:
            torch.cuda.caching_allocator_delete(ptr)
            errors[what] = None
        except RuntimeError as e:
            errors[what] = str(e)[:160]
    assert all(errors.values()), f"a bad free was accepted: {errors}"
    if alloc == "symm":
        assert all("libsymm: raw_delete" in m for m in errors.values()), errors
    assert float(x.sum().item()) == 7.0 * MiB, "a refused free changed another tensor"
    return errors


# ---- driver -------------------------------------------------------------------------


def child(check: str, alloc: str) -> int:
    t0 = time.monotonic()
    try:
        facts = globals()[f"check_{check}"](alloc)
        res = {"ok": True, "facts": facts}
    except Exception as e:  # noqa: BLE001
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:]}
    res["seconds"] = round(time.monotonic() - t0, 2)
    if alloc == "symm":
        try:
            import symm

            res["extension"] = symm.extension_status()
        except Exception:  # noqa: BLE001
            pass
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--allocs", default=",".join(ALLOCS))
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--child", nargs=2, metavar=("CHECK", "ALLOC"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(*a.child)
    out = Path(os.environ.get("OUT") or ROOT / "build")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **SAFE_ENV, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT / "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    rows, failed = [], 0
    for check in a.checks.split(","):
        for alloc in a.allocs.split(","):
            t0 = time.monotonic()
            try:
                r = subprocess.run([sys.executable, __file__, "--child", check, alloc], env=env, capture_output=True,
                                   text=True, timeout=a.timeout)
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
                res = json.loads(lines[-1][7:]) if lines else {"ok": False, "error": f"exit {r.returncode}"}
                res["log"] = (r.stdout + r.stderr)[-6000:]
            except subprocess.TimeoutExpired as e:
                res = {"ok": False, "error": f"timed out after {a.timeout:.0f} s", "log": str(e.stdout)[-3000:]}
            res.update(check=check, alloc=alloc, wall=round(time.monotonic() - t0, 1))
            rows.append(res)
            failed += not res["ok"]
            print(f"{check:<11} {alloc:<7} {'PASS' if res['ok'] else 'FAIL'} {res['wall']:6.1f}s  "
                  + (json.dumps(res.get("facts"))[:150] if res["ok"] else res["error"][:300]), flush=True)
    (out / "torch_replace.json").write_text(json.dumps(rows, indent=1))
    ext = next((r.get("extension") for r in rows if r.get("extension")), None)
    print(f"\nlibsymm extension: {ext}")
    print(f"{'check':<11} " + " ".join(f"{al:<7}" for al in a.allocs.split(",")))
    for check in a.checks.split(","):
        cells = [next(("PASS" if r["ok"] else "FAIL") for r in rows if r["check"] == check and r["alloc"] == al)
                 for al in a.allocs.split(",")]
        print(f"{check:<11} " + " ".join(f"{c:<7}" for c in cells))
    print(f"{len(rows) - failed}/{len(rows)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
