"""libsymm's collectives inside torch.compile graphs (torch.ops.symm.*,
registered by symm.register_torch_ops / `import symm` after torch): W ranks
(one per GPU, or sharing GPUs), each compiles a function that calls
torch.ops.symm.push_all_reduce between other ops, with fullgraph=True and
with mode="reduce-overhead" (CUDA graphs), and checks that the compiled
results equal eager ones bit for bit on every call, inputs changed each
time. Prints PASS/FAIL lines and exits non-zero on a failure.

    python3 tests/device/symm_compile.py [WORLD]
"""

import os
import socket
import sys
import traceback

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def run_rank(rank, world, port):
    import torch
    import torch.distributed as dist

    import symm

    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    own = ngpu >= world
    dist.init_process_group("nccl" if own else "gloo", rank=rank, world_size=world, device_id=dev if own else None)
    gname = dist.group.WORLD.group_name
    results = []
    symm.register_torch_ops()

    def f(x, w):
        y = torch.ops.symm.push_all_reduce(torch.relu(x @ w), gname)
        return (y * 2 + 1).sum(0)

    for mode in ("default", "reduce-overhead"):
        try:
            torch._dynamo.reset()
            cf = torch.compile(f, fullgraph=True, mode=None if mode == "default" else mode)
            bad = []
            for i in range(6):
                # Small integers in float32: every op around the all-reduce
                # is exact in any order, so compiled and eager must agree
                # bit for bit (with random bfloat16 they differ in the last
                # bits of the sum, which inductor orders differently).
                g = torch.Generator(device=dev).manual_seed(1000 * i + rank)
                x = torch.randint(-3, 4, (64, 128), device=dev, generator=g).float()
                w = torch.randint(-3, 4, (128, 256), device=dev, generator=g).float()
                want = f(x, w)
                got = cf(x, w).clone()
                torch.cuda.synchronize()
                if not torch.equal(want, got):
                    bad.append(f"call {i}: max diff {(want.float() - got.float()).abs().max().item()}")
            results.append((f"torch.compile(fullgraph=True, mode={mode}) with torch.ops.symm.push_all_reduce, "
                            "6 calls equal eager bit for bit", not bad, "; ".join(bad[:3])))
        except Exception as e:  # noqa: BLE001 - reported as a failure
            results.append((f"torch.compile mode={mode}", False, f"{type(e).__name__}: {str(e)[:400]}"))
    dist.barrier()
    dist.destroy_process_group()
    return results


def worker(rank, world, port, q):
    try:
        q.put((rank, run_rank(rank, world, port), ""))
    except Exception:  # noqa: BLE001
        q.put((rank, [], traceback.format_exc()))


def main():
    import multiprocessing as mp

    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    import torch

    if torch.cuda.device_count() < world:
        os.environ["SYMM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    ok = True
    for _ in procs:
        rank, res, tb = q.get(timeout=600)
        if tb:
            print(f"rank {rank} raised:\n{tb}", flush=True)
            ok = False
        for name, good, detail in res:
            print(f"{'PASS' if good else 'FAIL'}  rank {rank}: {name}" + (f" ({detail})" if detail else ""), flush=True)
            ok &= good
    for p in procs:
        p.join(timeout=60)
        ok &= p.exitcode == 0
    print("symm_compile:", "ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
