"""Quick GPU smoke of issue 11 (one process per mode): replace-mode graph
capture with freed intermediates, plain-recipe OOM, MemPool empty_cache,
snapshot. The full suite is tests/device/test_torch_graphs.py."""
import gc, os, sys, subprocess, json
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20

def replace():
    import symm, torch
    symm.use_as_default()
    x = torch.randn(256, 256, device="cuda"); w = torch.randn(256, 256, device="cuda")
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            t1 = torch.relu(x @ w); t2 = t1 + 1; del t1; out = (t2 * 2).sum(1); del t2
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        t1 = torch.relu(x @ w); t2 = t1 + 1; del t1; out = (t2 * 2).sum(1); del t2
    x.copy_(torch.randn_like(x)); g.replay(); torch.cuda.synchronize()
    ref = (torch.relu(x @ w) + 1).mul(2).sum(1)
    print("replace capture ok", torch.allclose(out, ref), symm.memory_reserved(0))
    symm.record_memory_history()
    y = torch.randn(1000, device="cuda"); del y
    snap = symm.memory_snapshot()
    print("snapshot segs", len(snap["segments"]), "traces", len(snap["device_traces"][0]),
          "pool ids", sorted({s["segment_pool_id"] for s in snap["segments"]}))
    del g, out; gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    print("after release reserved", symm.memory_reserved(0))
    try:
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda"); print("NO OOM RAISED")
    except Exception as e:
        print("oom raised", type(e).__name__, str(e)[:300])

def plain():
    import torch
    a = torch.cuda.memory.CUDAPluggableAllocator(os.path.join(ROOT, "build/libsymm.so"), "symm_pool_alloc", "symm_pool_free")
    torch.cuda.memory.change_current_allocator(a)
    try:
        t = torch.empty(1 << 45, dtype=torch.uint8, device="cuda"); print("NO OOM RAISED", t.data_ptr())
    except Exception as e:
        print("plain oom raised", type(e).__name__, str(e)[:300])
    z = torch.ones(10, device="cuda"); print("after", (z @ z).item(), torch.empty(0, device="cuda").shape)

def mempool():
    import symm, torch
    torch.cuda.init(); torch.ones(1, device="cuda"); torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.ones(256 * MiB // 4, device="cuda") for _ in range(8)]
    print("mode", symm._pool.load().symm_torch_mode(), "used", (free0 - torch.cuda.mem_get_info()[0]) / MiB)
    print("symm reserved", symm.memory_reserved(0) / MiB, "segs", len(symm.memory_snapshot()["segments"]))
    del ts; torch.cuda.synchronize()
    print("after del: symm reserved", symm.memory_reserved(0) / MiB, "torch reserved", torch.cuda.memory_reserved() / MiB)
    torch.cuda.empty_cache()
    print("mempool back within MiB:", (free0 - torch.cuda.mem_get_info()[0]) / MiB, "symm reserved", symm.memory_reserved(0) / MiB,
          "torch reserved", torch.cuda.memory_reserved() / MiB)
    with torch.cuda.use_mem_pool(pool):
        try:
            torch.empty(1 << 45, dtype=torch.uint8, device="cuda"); print("NO OOM")
        except torch.OutOfMemoryError as e:
            print("mempool OOM is torch.OutOfMemoryError")
    g = torch.cuda.CUDAGraph()
    x = torch.randn(64, 64, device="cuda")
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (x @ x).relu().sum()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    with torch.cuda.graph(g, pool=pool.id):
        y = (x @ x).relu().sum()
    g.replay(); torch.cuda.synchronize(); print("mempool graph ok", torch.allclose(y, (x @ x).relu().sum()))
    del g, y, pool; gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    print("after del pool: back within MiB:", (free0 - torch.cuda.mem_get_info()[0]) / MiB, "symm reserved", symm.memory_reserved(0) / MiB)

if __name__ == "__main__":
    if len(sys.argv) > 1:
        globals()[sys.argv[1]](); sys.exit(0)
    for m in ("replace", "plain", "mempool"):
        r = subprocess.run([sys.executable, __file__, m], capture_output=True, text=True, timeout=200)
        print(f"== {m} rc={r.returncode}\n{r.stdout}{r.stderr[-3000:]}")
