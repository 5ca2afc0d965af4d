"""Helpers of tests/device/symm_bench.py (beside it): size lists, the
timing plan, the timers (CUDA graph, back to back), one rank's side of the
benchmark (Bench: cells that turn a failing call into an error string,
logs, the gather of every rank's rows) and markdown cells (Table)."""

import os
import subprocess
import time

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def parse_size(s):
    t = s.strip().upper()
    t = t[:-2] if t.endswith("IB") else t[:-1] if t.endswith("B") else t
    mult = {"K": KiB, "M": MiB, "G": GiB}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    return int(float(t) * mult)


def parse_sizes(spec):
    sizes = set()
    for item in spec.split(","):
        if ".." in item:
            lo, hi = (parse_size(x) for x in item.split("..", 1))
            if lo <= 0:
                raise ValueError(f"size range {item!r} starts at {lo}")
            n = lo
            while n <= hi:
                sizes.add(n)
                n = n * 2 if n < MiB else n * 4
        elif item.strip():
            sizes.add(parse_size(item))
    bad = [n for n in sizes if n <= 0 or n % 4]
    if bad or not sizes:
        raise ValueError(f"sizes {spec!r}: want positive multiples of 4 bytes (got {sorted(sizes)})")
    return sorted(sizes)


def parse_list(spec, allowed, what):
    items = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ValueError(f"--{what} {spec!r}: want a comma list of {', '.join(allowed)}")
    return items


def plan(nbytes):
    """(calls per graph, replays) for a message of nbytes: about 25 ms of
    timed work at a pessimistic 8 µs + 100 GB/s, 10 to 1,000 ops."""
    est_us = 8.0 + nbytes / 100e3
    ops = int(min(1000, max(10, 25e3 / est_us)))
    calls = min(20, max(2, ops // 5))
    return calls, max(2, ops // calls)


def size_name(n):
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n // KiB} KiB" if n % KiB == 0 else f"{n} B"


def git_commit():
    c = os.environ.get("SYMM_COMMIT", "").strip()
    if c:
        return c
    try:
        r = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _graph_time(dev, fn, replays=50, calls=20):
    """fn() `calls` times captured in one CUDA graph, replayed: µs per fn (CUDA events)."""
    import torch
    import torch.distributed as dist

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    for _ in range(max(1, min(5, replays // 2))):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (replays * calls)


def _host_time(fn, reps, warm=10):
    """reps back-to-back fn() on the current stream: (GPU µs per call from
    CUDA events, host µs per call until the GPU is done)."""
    import torch
    import torch.distributed as dist

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / reps
    return a.elapsed_time(b) * 1e3 / reps, host * 1e6


def _queue_time(fn, reps, warm=10):
    """Host µs per call to queue reps back-to-back fn() on the current
    stream, the GPU not waited for (then it is): the host's part alone,
    which ranks sharing a GPU can measure (their kernels take turns on it)."""
    import torch
    import torch.distributed as dist

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    return host * 1e6


class Bench:
    """One rank's side: cells timed in the same order on every rank."""

    def __init__(self, rank, world, dev, group, opts, info):
        import torch

        self.rank, self.world, self.dev, self.group, self.opts, self.info = rank, world, dev, group, opts, info
        self.gname = group.group_name
        self.errors = 0
        out = os.environ.get("OUT")
        self.logf = None
        tag = "bench1" if opts.bench1 else f"W{world}"
        self.md = os.path.join(out, f"symm_bench_{tag}.md") if out else None
        if out:
            os.makedirs(out, exist_ok=True)
            self.logf = open(os.path.join(out, f"symm_bench_{tag}_rank{rank}.log"), "w", buffering=1)
        self.dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}
        self.tsm, self.tsm_err = None, ""
        try:
            import torch.distributed._symmetric_memory as tsm

            try:
                tsm.set_backend("CUDA")
            except Exception:  # noqa: BLE001 - older torch: CUDA is the only one
                pass
            self.tsm = tsm
        except Exception as e:  # noqa: BLE001 - reported in the torch cells
            self.tsm_err = f"torch symmetric memory unavailable: {type(e).__name__}: {e}"

    def buffers(self, nbytes):
        """libsymm's symmetric byte tensor of nbytes (rendezvoused, and to be
        kept alive: views of it share its handle) and its Handle; PyTorch's,
        its handle, or (None, None) and the error for the torch cells."""
        import torch

        import symm

        x = symm.empty(nbytes, dtype=torch.uint8, device=self.dev)
        h = symm.rendezvous(x, self.group)
        if self.tsm is None:
            return x, h, None, None, "error: " + self.tsm_err
        try:
            t = self.tsm.empty(nbytes, dtype=torch.uint8, device=self.dev)
            return x, h, t, self.tsm.rendezvous(t, self.gname), ""
        except Exception as e:  # noqa: BLE001 - reported in the torch cells
            return x, h, None, None, f"error: torch symm_mem: {type(e).__name__}: {e}"

    def log(self, msg, echo=False):
        line = f"{time.strftime('%H:%M:%S')} rank {self.rank}: {msg}"
        if self.logf:
            self.logf.write(line + "\n")
        if echo and self.rank == 0:
            print(line, flush=True)

    def cell(self, where, fn, timer):
        """timer(fn) in µs, or the error as a string "error: ..."."""
        import torch

        self.log(where)
        t0 = time.monotonic()
        try:
            v = timer(fn)
            self.log(f"  {v} µs ({time.monotonic() - t0:.2f} s)")
            return v
        except Exception as e:  # noqa: BLE001 - a failing call is a finding: into the cell
            import traceback

            self.errors += 1
            self.log("  ERROR " + traceback.format_exc())
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # noqa: BLE001
                self.log(f"  synchronize after the error: {type(e2).__name__}: {e2}")
            return "error: " + f"{type(e).__name__}: {e}".replace("\n", " ")[:400]

    def timer(self, mode, nbytes):
        calls, replays = plan(nbytes)
        if mode == "graph":
            return lambda fn: _graph_time(self.dev, fn, replays=replays, calls=calls)
        return lambda fn: _host_time(fn, calls * replays, warm=3)[0]

    def gather(self, rows):
        """Every rank's rows; on rank 0 rank 0's cells with any rank's errors put in."""
        import torch.distributed as dist

        every = [None] * self.world
        dist.all_gather_object(every, rows, group=self.group)
        if self.rank != 0:
            return None
        merged = []
        for i, (label, cells, extra) in enumerate(rows):
            cells = list(cells)
            for r in range(1, self.world):
                for k, c in enumerate(every[r][i][1]):
                    if isinstance(c, str) and c.startswith("error") and not (isinstance(cells[k], str)
                                                                            and cells[k].startswith("error")):
                        cells[k] = f"error on rank {r}: " + c[len("error: "):]
            merged.append((label, cells, extra))
        return merged

    def emit(self, lines):
        if self.rank != 0:
            return
        text = "\n".join(lines)
        print("\n" + text, flush=True)
        if self.md:
            with open(self.md, "a") as f:
                f.write(text + "\n\n")


class Table:
    """Markdown cells: µs with 2 decimals, errors as ERR(k) + a note."""

    def __init__(self):
        self.notes = []

    def us(self, v):
        if isinstance(v, float):
            return f"{v:.2f}"
        if isinstance(v, str) and v.startswith("error"):
            note = v.replace("|", "/")
            if note not in self.notes:
                self.notes.append(note)
            return f"ERR({self.notes.index(note) + 1}): " + v.split(":", 1)[-1].strip()[:40].replace("|", "/")
        return "-" if v is None else str(v)

    @staticmethod
    def ratio(a, b):
        return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "–"

    def note_lines(self):
        return [""] + [f"{k}. {n}" for k, n in enumerate(self.notes, 1)] if self.notes else []


def plan_text(sizes, scale=1):
    parts = []
    for n in sizes:
        calls, replays = plan(n * scale)
        if not parts or parts[-1][1] != (calls, replays):
            parts.append([[n], (calls, replays)])
        else:
            parts[-1][0].append(n)
    return ", ".join(f"{size_name(ns[0])}" + (f"..{size_name(ns[-1])}" if len(ns) > 1 else "") + f" {c}×{r}"
                     for ns, (c, r) in parts)
