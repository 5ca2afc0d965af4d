"""libsymm's collectives beside PyTorch's symmetric memory and NCCL on GPUs:
markdown tables of µs per op (the checks are tests/device/symm_kernels.py).

    python3 tests/device/symm_bench.py WORLD [--sizes 4K..256M] [--what allreduce,rsag,barrier]
                                             [--mode graph,eager] [--dtypes bfloat16,float32] [--timeout 540]
    python3 tests/device/symm_bench.py --bench1    # one GPU, world 1: launch costs beside PyTorch's

One process per GPU (spawned; WORLD GPUs, default every GPU here), an NCCL
process group, NVLS and multicast off in every library. --sizes: a comma
list of sizes (4K, 1M, 256M, or bytes) or ranges A..B (×2 steps up to 1 MiB,
then ×4): the default 4K..256M is 4 KiB .. 1 MiB, 4, 16, 64 and 256 MiB.

- allreduce: µs per all-reduce of each message; graph = N calls captured in
  one CUDA graph and replayed R times (N = 20 up to 16 MiB, fewer above, so
  that every cell times about 25 ms of work); eager = N × R back-to-back
  calls on the current stream; CUDA events either way. Columns: libsymm's
  push (symm.push_all_reduce, up to the push workspace's limit), two-shot
  (symm.two_shot_all_reduce in place on a symmetric tensor), one-shot,
  symm.all_reduce (the algorithm it chooses, named in the cell), PyTorch's
  one_shot_all_reduce_out and two_shot_all_reduce_ (CUDA backend), NCCL's
  all_reduce; best other = the fastest of the last three; from 2 MiB the bus
  bandwidth 2(w-1)/w × bytes / time of symm.all_reduce and NCCL.
- rsag: symm.reduce_scatter (symmetric input, out of place) and
  symm.all_gather (from the symmetric tensor) beside NCCL's
  reduce_scatter_tensor and all_gather_into_tensor; message = each rank's
  share.
- barrier: Handle.barrier beside PyTorch's symm_mem barrier (channel 0),
  200 back to back (CUDA events and host time per call) and 20 captured in
  a CUDA graph, replayed 50 times. With --shared (and --what barrier),
  WORLD ranks share fewer GPUs over a gloo group: the host's costs where
  one GPU is all there is.
Symmetric tensors are allocated once at the largest size; each size views
their start. A call that fails puts its error in the cell (notes under the
table give it in full). Rank 0's figures are shown; an error on any rank
shows. Rank 0 prints each table when its section ends and writes them to
$OUT/symm_bench_W<WORLD>.md; every rank logs each cell to
$OUT/symm_bench_W<WORLD>_rank<r>.log. Exit status: 0 every cell measured,
1 some cells failed, 2 usage, 3 a rank crashed or the run passed --timeout
(the ranks are then stopped). The commit shown is $SYMM_COMMIT, else
`git rev-parse`. With the defaults under 20 s of timed GPU work in about
560 cells, a minute per WORLD with start-up on H100/H200 (estimated from
the time per cell each size is given; a bound of 4 minutes holds with
room). Helpers (timers, cells, tables): symm_bench_cells.py beside this file.
"""

import argparse
import os
import sys
import time

# Never multicast: on the shared hosts a multicast object can take the GPUs out of service.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

from symm_bench_cells import (  # noqa: E402 - beside this file
    Bench, KiB, MiB, Table, _graph_time, _host_time, _queue_time, parse_list, parse_sizes, plan_text, size_name, git_commit)

WHAT, MODES, DTYPES = ("allreduce", "rsag", "barrier"), ("graph", "eager"), ("bfloat16", "float32")
BENCH1_SIZES = [4 * KiB << k for k in range(11)]  # 4 KiB .. 4 MiB


def bench_allreduce(b):
    import torch
    import torch.distributed as dist

    import symm

    w, dev, group, gname, sizes = b.world, b.dev, b.group, b.gname, b.opts.sizes
    maxb = max(sizes)
    limit, push_err = 0, ""
    try:
        limit = symm.push_workspace(group, dev).push_max_bytes
    except Exception as e:  # noqa: BLE001 - the push cells say it
        push_err = f"error: push workspace: {type(e).__name__}: {e}"
    sym, _, t, _, t_err = b.buffers(maxb)
    a, o, c = (torch.empty(maxb, dtype=torch.uint8, device=dev) for _ in range(3))
    a.view(torch.float32).normal_()
    try:  # symm.all_reduce's scratch buffer at its largest now, not in the middle of the table
        symm.all_reduce(a.view(torch.float32), group=group, out=o.view(torch.float32), algorithm="two_shot")
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        b.log(f"symm.all_reduce warm-up at {maxb} bytes: {type(e).__name__}: {e}", echo=True)
    choice = {}
    for n in sizes:
        try:  # what symm.all_reduce runs (NCCL's own for large messages on an NCCL group)
            choice[n] = symm._collectives._all_reduce_plan(a[:n].view(torch.float32), group, n, None)
        except Exception as e:  # noqa: BLE001
            choice[n] = f"? ({type(e).__name__})"
    factor = 2 * (w - 1) / w
    for mode in b.opts.mode:
        tab, rows = Table(), []
        for dname in b.opts.dtypes:
            dt = b.dt[dname]
            t0 = time.monotonic()
            for nbytes in sizes:
                n = nbytes // dt.itemsize
                av, ov, sv, cv = (x.view(dt)[:n] for x in (a, o, sym, c))
                tv = t.view(dt)[:n] if t is not None else None
                for x in (av, sv, cv) + ((tv,) if tv is not None else ()):
                    x.normal_()
                timer = b.timer(mode, nbytes)
                where = f"allreduce {mode} {dname} {size_name(nbytes)}"
                push = (push_err or (b.cell(f"{where} push", lambda: symm.push_all_reduce(av, group=group, out=ov), timer)
                                     if nbytes <= limit else "-"))
                one = b.cell(f"{where} one-shot", lambda: symm.one_shot_all_reduce(sv, group=group, out=ov), timer)
                chosen = b.cell(f"{where} all_reduce", lambda: symm.all_reduce(av, group=group, out=ov), timer)
                if tv is not None:
                    t1 = b.cell(f"{where} torch one_shot",
                                lambda: torch.ops.symm_mem.one_shot_all_reduce_out(tv, "sum", gname, ov), timer)
                    t2 = b.cell(f"{where} torch two_shot",
                                lambda: torch.ops.symm_mem.two_shot_all_reduce_(tv, "sum", gname), timer)
                else:
                    t1 = t2 = t_err
                nccl = b.cell(f"{where} NCCL", lambda: dist.all_reduce(cv, group=group), timer)
                # last: in place, it leaves sums in the symmetric tensor
                two = b.cell(f"{where} two-shot", lambda: symm.two_shot_all_reduce(sv, group=group), timer)
                rows.append((f"{dname} {size_name(nbytes)}", [push, two, one, chosen, t1, t2, nccl], nbytes))
            b.log(f"allreduce {mode} {dname}: {len(sizes)} sizes in {time.monotonic() - t0:.1f} s", echo=True)
        merged = b.gather(rows)
        if merged is None:
            continue
        lines = [f"## all-reduce, {w} GPUs, {'CUDA graph' if mode == 'graph' else 'eager'}: µs per op",
                 "",
                 ("N calls captured in one CUDA graph, replayed R times" if mode == "graph" else
                  "N × R back-to-back calls on the current stream") + f", CUDA events; N×R by size: {plan_text(sizes)}. "
                 "best = the fastest of torch one_shot, torch two_shot and NCCL; ratios below 1: libsymm faster; "
                 "bus GB/s = 2(w-1)/w × bytes / time (from 2 MiB), ratio above 1: libsymm faster.",
                 "",
                 "| message | libsymm push | libsymm two-shot | libsymm one-shot | symm.all_reduce (chosen) | torch one_shot "
                 "| torch two_shot | NCCL | best other | push / best | two-shot / best | chosen / best "
                 "| chosen bus GB/s | NCCL bus GB/s | chosen / NCCL bus |",
                 "| --- " * 15 + "|"]
        for label, (push, two, one, chosen, t1, t2, nccl), nbytes in merged:
            others = [x for x in (t1, t2, nccl) if isinstance(x, float)]
            best = min(others) if others else None
            ch = tab.us(chosen) + (f" ({choice[nbytes]})" if isinstance(chosen, float) else "")
            bw = ["", "", ""]
            if nbytes >= 2 * MiB:
                cb = factor * nbytes / (chosen * 1e3) if isinstance(chosen, float) and chosen > 0 else None
                nb = factor * nbytes / (nccl * 1e3) if isinstance(nccl, float) and nccl > 0 else None
                bw = [f"{cb:.1f}" if cb else "–", f"{nb:.1f}" if nb else "–", Table.ratio(cb, nb)]
            lines.append(f"| {label} | {tab.us(push)} | {tab.us(two)} | {tab.us(one)} | {ch} | {tab.us(t1)} "
                         f"| {tab.us(t2)} | {tab.us(nccl)} | {tab.us(best)} | {Table.ratio(push, best)} "
                         f"| {Table.ratio(two, best)} | {Table.ratio(chosen, best)} | {bw[0]} | {bw[1]} | {bw[2]} |")
        b.emit(lines + tab.note_lines())
    del sym, t


def bench_rsag(b):
    import torch
    import torch.distributed as dist

    import symm

    w, dev, group, sizes = b.world, b.dev, b.group, b.opts.sizes
    maxs = max(sizes)
    x = symm.empty(w * maxs, dtype=torch.uint8, device=dev)
    symm.rendezvous(x, group)
    full, gathered = (torch.empty(w * maxs, dtype=torch.uint8, device=dev) for _ in range(2))
    part = torch.empty(maxs, dtype=torch.uint8, device=dev)
    for mode in b.opts.mode:
        tab, rows = Table(), []
        for dname in b.opts.dtypes:
            dt = b.dt[dname]
            t0 = time.monotonic()
            for share in sizes:
                n = share // dt.itemsize
                xv, fv, gv = (y.view(dt)[:w * n] for y in (x, full, gathered))
                pv = part.view(dt)[:n]
                xv.normal_()
                fv.normal_()
                timer = b.timer(mode, w * share)
                where = f"rsag {mode} {dname} {size_name(share)}"
                rs = b.cell(f"{where} reduce_scatter", lambda: symm.reduce_scatter(xv, group=group, out=pv), timer)
                nrs = b.cell(f"{where} NCCL reduce_scatter_tensor",
                             lambda: dist.reduce_scatter_tensor(pv, fv, group=group), timer)
                ag = b.cell(f"{where} all_gather", lambda: symm.all_gather(xv, group=group, out=gv), timer)
                nag = b.cell(f"{where} NCCL all_gather_into_tensor",
                             lambda: dist.all_gather_into_tensor(gv, pv, group=group), timer)
                rows.append((f"{dname} {size_name(share)}", [rs, nrs, ag, nag], share))
            b.log(f"rsag {mode} {dname}: {len(sizes)} sizes in {time.monotonic() - t0:.1f} s", echo=True)
        merged = b.gather(rows)
        if merged is None:
            continue
        lines = [f"## reduce-scatter and all-gather, {w} GPUs, {'CUDA graph' if mode == 'graph' else 'eager'}: "
                 "µs per op", "",
                 f"message = each rank's share (reduce-scatter output, all-gather input); "
                 f"N×R by share: {plan_text(sizes, w)}; ratio = libsymm / NCCL, below 1: libsymm faster.", "",
                 "| message | libsymm reduce_scatter | NCCL reduce_scatter_tensor | ratio "
                 "| libsymm all_gather | NCCL all_gather_into_tensor | ratio |",
                 "| --- " * 7 + "|"]
        for label, (rs, nrs, ag, nag), _ in merged:
            lines.append(f"| {label} | {tab.us(rs)} | {tab.us(nrs)} | {Table.ratio(rs, nrs)} | {tab.us(ag)} "
                         f"| {tab.us(nag)} | {Table.ratio(ag, nag)} |")
        b.emit(lines + tab.note_lines())
    del x


def bench_barrier(b):
    xs, hs, xt, ht, t_err = b.buffers(64 * KiB)

    def ours():
        hs.barrier(channel=0)

    def theirs():
        ht.barrier(channel=0)

    rows = []
    if "eager" in b.opts.mode:
        pair = [b.cell("barrier eager libsymm", ours, lambda fn: _host_time(fn, 200))]
        pair.append(b.cell("barrier eager torch", theirs, lambda fn: _host_time(fn, 200)) if ht is not None else t_err)
        rows.append(("200 back to back: GPU µs per barrier (CUDA events)",
                     [p[0] if isinstance(p, tuple) else p for p in pair], None))
        rows.append(("200 back to back: host µs per call, until the GPU is done",
                     [p[1] if isinstance(p, tuple) else p for p in pair], None))
        rows.append(("200 back to back: host µs per call to queue it (the GPU not waited for)",
                     [b.cell("barrier queue libsymm", ours, lambda fn: _queue_time(fn, 200)),
                      b.cell("barrier queue torch", theirs, lambda fn: _queue_time(fn, 200)) if ht is not None else t_err],
                     None))
    if "graph" in b.opts.mode:
        g = [b.cell("barrier graph libsymm", ours, lambda fn: _graph_time(b.dev, fn, replays=50, calls=20))]
        g.append(b.cell("barrier graph torch", theirs, lambda fn: _graph_time(b.dev, fn, replays=50, calls=20))
                 if ht is not None else t_err)
        rows.append(("20 captured in a CUDA graph, replayed 50 times: µs per barrier", g, None))
    merged = b.gather(rows)
    if merged is None:
        return
    tab = Table()
    import torch

    ngpu = min(torch.cuda.device_count(), b.world)
    where = f"{b.world} GPUs" if ngpu == b.world else f"{b.world} ranks sharing {ngpu} GPU(s)"
    lines = [f"## barrier, {where}", "", "libsymm: Handle.barrier(channel=0); PyTorch: "
             "symm_mem.rendezvous(t, group).barrier(channel=0), CUDA backend; ratio below 1: libsymm faster.", "",
             "| how | libsymm | torch symm_mem | libsymm / torch |", "| --- | --- | --- | --- |"]
    for label, (x, y), _ in merged:
        lines.append(f"| {label} | {tab.us(x)} | {tab.us(y)} | {Table.ratio(x, y)} |")
    b.emit(lines + tab.note_lines())


def bench_one_gpu(b):
    """World 1: a put/wait pair to oneself and the one-shot all-reduce beside
    PyTorch's and NCCL's, 500 / 200 back-to-back calls (launch costs)."""
    import torch
    import torch.distributed as dist

    import symm

    dev, gname, sizes, rank = b.dev, b.gname, b.opts.sizes, b.rank
    maxb = max(sizes)
    xs, hs, xt, ht, t_err = b.buffers(maxb)
    out, c = (torch.empty(maxb, dtype=torch.uint8, device=dev) for _ in range(2))
    rows = [("put_signal + wait_signal to oneself (µs per pair)",
             [b.cell("put/wait libsymm", lambda: (hs.put_signal(rank, channel=1), hs.wait_signal(rank, channel=1)),
                     lambda fn: _host_time(fn, 500)),
              b.cell("put/wait torch", lambda: (ht.put_signal(rank, channel=1), ht.wait_signal(rank, channel=1)),
                     lambda fn: _host_time(fn, 500)) if ht is not None else t_err, None], None)]
    for dname in b.opts.dtypes:
        dt = b.dt[dname]
        for nbytes in sizes:
            n = nbytes // dt.itemsize
            av, ov, cv = xs.view(dt)[:n], out.view(dt)[:n], c.view(dt)[:n]
            tv = xt.view(dt)[:n] if xt is not None else None
            for x in (av, cv) + ((tv,) if tv is not None else ()):
                x.normal_()
            where = f"one-shot {dname} {size_name(nbytes)}"
            rows.append((f"all-reduce {dname} {size_name(nbytes)}, 1 GPU (µs)", [
                b.cell(f"{where} libsymm", lambda: symm.one_shot_all_reduce(av, group=b.group, out=ov),
                       lambda fn: _host_time(fn, 200)),
                b.cell(f"{where} torch", lambda: torch.ops.symm_mem.one_shot_all_reduce_out(tv, "sum", gname, ov),
                       lambda fn: _host_time(fn, 200)) if tv is not None else t_err,
                b.cell(f"{where} NCCL", lambda: dist.all_reduce(cv, group=b.group), lambda fn: _host_time(fn, 200))],
                None))
    tab = Table()

    def pair(v):
        return f"{v[0]:.2f} [{v[1]:.2f}]" if isinstance(v, tuple) else tab.us(v)

    def q(x, y):
        return Table.ratio(x[0] if isinstance(x, tuple) else x, y[0] if isinstance(y, tuple) else y)

    lines = ["## one GPU, world 1: GPU µs per op from CUDA events over back-to-back ops, host µs per call in brackets",
             "", "| op | libsymm | PyTorch symm_mem | libsymm / PyTorch | NCCL all_reduce | libsymm / NCCL |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label, (x, y, z), _ in rows:
        lines.append(f"| {label} | {pair(x)} | {pair(y)} | {q(x, y)} | {pair(z)} | {q(x, z)} |")
    b.emit(lines + tab.note_lines())


def run_rank(rank, world, port, opts, info):
    import torch
    import torch.distributed as dist

    import symm

    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if world <= ngpu:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    else:  # --shared: NCCL refuses two ranks on one GPU
        dist.init_process_group("gloo", rank=rank, world_size=world)
    b = Bench(rank, world, dev, dist.group.WORLD, opts, info)
    ready = symm.kernels_ready(dev.index)
    try:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(str(v) for v in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001 - only for the header
        nccl = "?"
    header = [f"# libsymm collectives: {world} × {torch.cuda.get_device_name(dev)}",
              "",
              f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {info['commit']}, torch {torch.__version__} "
              f"(CUDA {torch.version.cuda}, NCCL {nccl}), libsymm {symm.version()} on its {symm.get_backend()} backend, "
              f"kernels {'ready' if ready else 'NOT ready: ' + symm.kernels_status(dev.index)}",
              f"- NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1; "
              f"sizes {', '.join(size_name(n) for n in opts.sizes)}; dtypes {', '.join(opts.dtypes)}; "
              f"modes {', '.join(opts.mode)}; command: {info['argv']}", ""]
    if rank == 0 and b.md:
        with open(b.md, "w") as f:
            f.write("\n".join(header) + "\n")
    if rank == 0:
        print("\n".join(header), flush=True)
    t0 = time.monotonic()
    if opts.bench1:
        bench_one_gpu(b)
    else:
        for what, fn in (("allreduce", bench_allreduce), ("rsag", bench_rsag), ("barrier", bench_barrier)):
            if what in opts.what:
                fn(b)
                torch.cuda.synchronize()
                b.log(f"{what} done at {time.monotonic() - t0:.1f} s", echo=True)
    errors = [None] * world
    dist.all_gather_object(errors, b.errors)
    if rank == 0:
        summary = f"symm_bench: {world} GPUs, {time.monotonic() - t0:.1f} s of tables, {max(errors)} failed cells"
        b.emit([summary])
    dist.destroy_process_group()
    return max(errors)


def worker(rank, world, port, opts, info, q):
    try:
        q.put((rank, run_rank(rank, world, port, opts, info), ""))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        import traceback

        tb = traceback.format_exc()
        q.put((rank, -1, tb))
        out = os.environ.get("OUT")
        if out:
            try:
                with open(os.path.join(out, f"symm_bench_{'bench1' if opts.bench1 else f'W{world}'}_rank{rank}.log"),
                          "a") as f:
                    f.write(tb)
            except OSError:
                pass
        raise SystemExit(1) from e


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("world", nargs="?", type=int, help="ranks, one per GPU (default: every GPU)")
    p.add_argument("--sizes", default=None, help="e.g. 4K..256M (default), 4K,64K,1M,16M")
    p.add_argument("--what", default=",".join(WHAT), help="allreduce,rsag,barrier")
    p.add_argument("--mode", default=",".join(MODES), help="graph,eager")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="bfloat16,float32")
    p.add_argument("--timeout", type=float, default=540, help="seconds before the ranks are stopped (540)")
    p.add_argument("--bench1", action="store_true", help="one GPU, world 1: launch costs beside PyTorch's")
    p.add_argument("--shared", action="store_true",
                   help="with --what barrier: WORLD ranks on fewer GPUs, sharing them (gloo group; host costs)")
    opts = p.parse_args(argv)
    if opts.shared and (opts.bench1 or opts.what != "barrier"):
        p.error("--shared measures the barrier alone: use it with --what barrier")
    try:
        opts.sizes = parse_sizes(opts.sizes) if opts.sizes else (BENCH1_SIZES if opts.bench1 else parse_sizes("4K..256M"))
        opts.what = parse_list(opts.what, WHAT, "what")
        opts.mode = parse_list(opts.mode, MODES, "mode")
        opts.dtypes = parse_list(opts.dtypes, DTYPES, "dtypes")
    except ValueError as e:
        p.error(str(e))
    return opts


def main():
    import multiprocessing as mp
    import queue
    import socket

    opts = parse_args(sys.argv[1:])
    import torch

    ngpu = torch.cuda.device_count()
    world = 1 if opts.bench1 else opts.world if opts.world is not None else ngpu
    if (world > ngpu and not (opts.shared and ngpu >= 1)) or (world < 2 and not opts.bench1):
        print(f"symm_bench: {world} ranks need 2 or more GPUs, one per rank ({ngpu} here; "
              f"--shared --what barrier lets ranks share them)", file=sys.stderr)
        return 2
    if world > ngpu:
        os.environ["SYMM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
    info = {"commit": git_commit(), "argv": " ".join(["symm_bench.py"] + sys.argv[1:])}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, opts, info, q)) for r in range(world)]
    for p in procs:
        p.start()
    deadline, done, failed, crashed = time.monotonic() + opts.timeout, {}, 0, False
    gone_since = None
    while len(done) < world:
        left = deadline - time.monotonic()
        if left <= 0:
            print(f"symm_bench: rank(s) {[r for r in range(world) if r not in done]} not done by the deadline "
                  f"({opts.timeout:.0f} s, or 30 s after a rank failed); stopping them", flush=True)
            crashed = True
            break
        try:
            rank, errs, tb = q.get(timeout=min(left, 5))
        except queue.Empty:
            # A rank that died without a word (a signal, an abort) leaves the others waiting for it.
            dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in done]
            if dead:
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 20:
                    print(f"symm_bench: rank(s) {dead} exited without a result; stopping the others", flush=True)
                    crashed = True
                    break
            continue
        done[rank] = errs
        if tb:
            print(f"rank {rank} raised:\n{tb}", flush=True)
            crashed = True
            deadline = min(deadline, time.monotonic() + 30)  # the others may wait for it in a collective
        elif rank == 0:
            failed = errs
    for p in procs:
        p.join(timeout=5 if crashed else 60)
        if p.is_alive():  # stuck (in a collective, or tearing down): stopped, this script's own child
            p.kill()
            p.join(timeout=10)
        crashed |= p.exitcode != 0
    rc = 3 if crashed else 1 if failed else 0
    print(f"symm_bench: {'ok' if rc == 0 else 'FAILED'} (exit {rc}; {failed} failed cells)", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
