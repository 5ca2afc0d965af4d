"""torch.cuda.MemPool with libsymm as PyTorch's current allocator (replace
mode), against PyTorch's own allocator as the reference.

Each check runs in a child process twice: "native" (PyTorch's allocator) and
"replace" (symm.use_as_default()); the child prints one JSON line of facts,
and the parent compares the two and prints one PASS/FAIL line per check.

Checks: use_count through use_mem_pool and a graph; no_split; use_on_oom;
pool.snapshot(); release when the pool dies (its segments go back); a MemPool
over another allocator (a CUDAPluggableAllocator over cudaMalloc/cudaFree
through ctypes' libcudart, counted) while libsymm is current; PyTorch's
symmetric-memory pool (torch.distributed._symmetric_memory.get_mem_pool),
one rank, with the CUDA backend; a MemPool over a CUDAPluggableAllocator of
libsymm's own functions (PyTorch serves it; libsymm refuses it with an error,
since it would call back into libsymm under its own locks).

    python tests/device/test_torch_mempools.py [check ...]

Multicast is never used: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
and NVSHMEM_DISABLE_NVLS=1 are set for every child.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MiB = 1 << 20


# ---- child side -----------------------------------------------------------------


def setup(mode):
    import torch

    if mode == "replace":
        import symm

        symm.use_as_default()
    torch.cuda.init()
    return torch


def pool_segments(torch, pool):
    return sorted((s["total_size"], s["segment_type"]) for s in pool.snapshot())


def check_use_count(torch):
    pool = torch.cuda.MemPool()
    counts = [pool.use_count()]
    with torch.cuda.use_mem_pool(pool):
        counts.append(pool.use_count())
        x = torch.empty(1000, device="cuda")
    counts.append(pool.use_count())
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, pool=pool.id):
            y = x * 2
    counts.append(pool.use_count())
    g.reset()
    counts.append(pool.use_count())
    del x, y
    return {"counts": counts}


def check_no_split(torch):
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(256, device="cuda")
        b = torch.empty(256, device="cuda")
    segs = pool_segments(torch, pool)
    blocks = [len(s["blocks"]) for s in pool.snapshot()]
    del a, b
    return {"segments": segs, "blocks_per_segment": sorted(blocks)}


def check_use_on_oom(torch):
    free, _ = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(0.0 + (torch.cuda.memory_reserved() + 64 * MiB) /
                                               torch.cuda.get_device_properties(0).total_memory)
    pool = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(40 * MiB // 4, device="cuda")
    ptr = t.data_ptr()
    del t
    got = None
    try:
        u = torch.empty(40 * MiB // 4, device="cuda")  # the default pool has ~24 MiB left
        got = u.data_ptr() == ptr
    except torch.OutOfMemoryError:
        got = "oom"
    return {"served_from_pool": got}


def check_snapshot(torch):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(1000, device="cuda")
        b = torch.empty(3 * MiB, device="cuda")
    snap = pool.snapshot()
    ids = {tuple(s["segment_pool_id"]) for s in snap}
    out = {"segments": pool_segments(torch, pool), "one_pool": ids == {tuple(pool.id)},
           "allocated": sorted(s["allocated_size"] for s in snap)}
    del a, b
    return out


def check_release(torch):
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(8 * MiB, device="cuda")
    during = torch.cuda.memory_reserved() - before
    del a
    del pool  # release, then emptyCache(its id)
    return {"during": during, "after": torch.cuda.memory_reserved() - before}


def counting_allocator(torch):
    """A CUDAPluggableAllocator over cudaMalloc/cudaFree, counting calls."""
    from torch.utils.cpp_extension import load_inline

    src = r"""
    #include <cuda_runtime_api.h>
    #include <atomic>
    #include <cstdint>
    static std::atomic<int64_t> n_alloc{0}, n_free{0};
    extern "C" {
    void *count_alloc(size_t size, int dev, cudaStream_t) {
      void *p = nullptr; int old; cudaGetDevice(&old); cudaSetDevice(dev);
      if (cudaMalloc(&p, size) != cudaSuccess) p = nullptr; cudaSetDevice(old);
      if (p) n_alloc++; return p; }
    void count_free(void *p, size_t, int, cudaStream_t) { cudaFree(p); n_free++; }
    }
    int64_t allocs() { return n_alloc.load(); }
    int64_t frees() { return n_free.load(); }
    """
    mod = load_inline("symm_count_alloc", cpp_sources=[src], functions=["allocs", "frees"], with_cuda=True,
                      extra_ldflags=["-lcudart"], verbose=False)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(mod.__file__, "count_alloc", "count_free")
    return alloc, mod


def check_other_allocator(torch):
    alloc, mod = counting_allocator(torch)
    pool = torch.cuda.MemPool(alloc.allocator())
    with torch.cuda.use_mem_pool(pool):
        a = torch.ones(1000, device="cuda")
        b = torch.ones(3 * MiB // 4, device="cuda")
        c = torch.ones(1000, device="cuda")
    ok = bool((a.sum() == 1000).item() and (b.sum() == 3 * MiB // 4).item())
    during = {"allocs": mod.allocs(), "frees": mod.frees(), "segments": pool_segments(torch, pool)}
    del a, b, c
    torch.cuda.synchronize()
    del pool
    return {"values": ok, "during": during, "after": {"allocs": mod.allocs(), "frees": mod.frees()}}


def check_symm_mem_pool(torch):
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        symm_mem.set_backend("CUDA")
    except Exception:
        pass
    pool = symm_mem.get_mem_pool(torch.device("cuda", 0))
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(4096, device="cuda")
    hdl = symm_mem.rendezvous(t, dist.group.WORLD.group_name)
    buf = hdl.get_buffer(0, (4096,), torch.float32)
    out = {"rendezvous": True, "same_data": bool((buf == 1).all().item()), "world": hdl.world_size,
           "segments": len(pool.snapshot())}
    del buf, t
    dist.destroy_process_group()
    return out


def check_own_allocator(torch):
    """A MemPool over a CUDAPluggableAllocator of libsymm's own pool functions:
    with PyTorch's allocator current it is an ordinary pluggable pool; with
    libsymm current it would call back into libsymm under libsymm's pool
    locks, so it is refused with an error naming the way out, and libsymm
    keeps serving afterwards."""
    from symm._loader import library_path

    alloc = torch.cuda.memory.CUDAPluggableAllocator(str(library_path()), "symm_pool_alloc", "symm_pool_free")
    try:
        pool = torch.cuda.MemPool(alloc.allocator())
        with torch.cuda.use_mem_pool(pool):
            a = torch.ones(1000, device="cuda")
        out = {"pool": "made", "values": bool((a.sum() == 1000).item())}
        del a
    except RuntimeError as e:
        out = {"pool": "refused", "names_way_out": "torch.cuda.MemPool()" in str(e)}
    b = torch.ones(4096, device="cuda")  # the process's allocator still serves
    out["after"] = bool((b.sum() == 4096).item())
    return out


CHECKS = {
    "use_count": check_use_count,
    "no_split": check_no_split,
    "use_on_oom": check_use_on_oom,
    "snapshot": check_snapshot,
    "release": check_release,
    "other_alloc": check_other_allocator,
    "symm_mem_pool": check_symm_mem_pool,
    "own_alloc": check_own_allocator,
}


def child(check, mode):
    torch = setup(mode)
    try:
        facts = CHECKS[check](torch)
    except Exception as e:  # the parent shows it
        facts = {"error": f"{type(e).__name__}: {e}"[:600]}
    print("FACTS " + json.dumps(facts, sort_keys=True), flush=True)


# ---- parent side ----------------------------------------------------------------


def run(check, mode):
    env = dict(os.environ, **SAFE_ENV)
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, __file__, "--child", check, mode], env=env, capture_output=True, text=True,
                       timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("FACTS "):
            return json.loads(line[6:])
    return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-600:]}"}


def main(argv):
    checks = argv or list(CHECKS)
    failed = 0
    for check in checks:
        ref, got = run(check, "native"), run(check, "replace")
        ok = "error" not in got and got == ref
        if check == "release":  # libsymm's segment sizes may differ; both must give everything back
            ok = "error" not in got and got["after"] <= 0 and got["during"] > 0
        if check == "own_alloc":  # PyTorch serves such a pool; libsymm refuses it, clearly, and goes on
            ok = ref == {"pool": "made", "values": True, "after": True} and \
                got == {"pool": "refused", "names_way_out": True, "after": True}
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {check:<14} pytorch={json.dumps(ref)}  libsymm={json.dumps(got)}", flush=True)
    print(f"test_torch_mempools: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main(sys.argv[1:]))
