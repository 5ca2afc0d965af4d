"""Paired timing: configurations that must each run in a process of their own
(a process-wide allocator, a setting read once at start) served by long-lived
children that time one short slice per request, so that a parent can
alternate them every few tens of milliseconds and compare each pair of
slices under the same machine conditions. bench/bench_paired.py (PyTorch's
entry points) and bench/front_paired.py (the front cache on recorded traces)
use it.

Protocol, one line each way: the child prints READY once it is set up (or
SKIP and a reason, then exits), then answers every request line with
SLICE and a JSON object holding at least median_ns, or ERROR and a reason.
Other output lines are passed over. Stdin closing ends the child.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time

SLICE_TIMEOUT_S = 30


class ChildError(RuntimeError):
    """A configuration's process failed, skipped or stopped answering."""


class Child:
    """One configuration's serving process: a reader thread turns its stdout
    into lines, so that every wait has a timeout and a hung child cannot hang
    the parent."""

    def __init__(self, config: str, cmd: list, env: dict):
        self.config = config
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        self.tail: list = []  # the last lines it printed, for errors
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for ln in self.proc.stdout:
            self.tail = (self.tail + [ln.rstrip()])[-30:]
            self.lines.put(ln.rstrip("\n"))
        self.lines.put(None)  # EOF

    def expect(self, prefix: str, timeout: float) -> str:
        """The rest of the next line starting with prefix; other lines are logged output."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                ln = self.lines.get(timeout=max(left, 0.001))
            except queue.Empty:
                raise ChildError(f"{self.config}: no {prefix.strip()!r} line within {timeout:.0f} s; "
                                 f"last output: {self.tail[-5:]}") from None
            if ln is None:
                rc = self.proc.wait(timeout=10)
                raise ChildError(f"{self.config}: exited (rc={rc}) before {prefix.strip()!r}; "
                                 f"last output: {self.tail[-10:]}")
            if ln.startswith(prefix):
                return ln[len(prefix):]
            if ln.startswith("SKIP "):
                raise ChildError(ln)
            if ln.startswith("ERROR "):
                raise ChildError(f"{self.config}: {ln}")

    def slice(self, request: str) -> dict:
        """Sends one request line and returns the child's SLICE answer."""
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return json.loads(self.expect("SLICE ", SLICE_TIMEOUT_S))

    def finish(self, prefix: str, timeout: float) -> str:
        """Closes the child's stdin (its end) and returns the rest of its next
        line starting with prefix: what it reports on the way out."""
        self.proc.stdin.close()
        return self.expect(prefix, timeout)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


def quartiles(xs: list) -> tuple:
    """(lower quartile, median, upper quartile) of xs, by nearest rank."""
    s = sorted(xs)
    n = len(s)
    return s[n // 4], s[n // 2], s[min((3 * n) // 4, n - 1)]


def turn(kids, i: int):
    """kids in the order pair i asks them: reversed every other pair, so that
    none always goes first."""
    return kids if i % 2 == 0 else kids[::-1]


def in_turn(kids: list, pairs: int, request: str) -> list:
    """Asks each child in turn for a slice (request), pairs times. Returns
    each child's median_ns figures, in the children's order."""
    ns = [[] for _ in kids]
    for i in range(pairs):
        for j in turn(range(len(kids)), i):
            ns[j].append(kids[j].slice(request)["median_ns"])
    return ns


def run_served(specs: list, ready_timeout: float, pairs: int, request: str, end_prefix: str,
               end_timeout: float) -> tuple:
    """Starts a Child per (name, cmd, env) of specs, all alive together, waits
    for each one's READY, times pairs slices of request in turn (in_turn),
    then ends each and reads what it reports after end_prefix. Returns (the
    children's median_ns figures, their end reports); the children are
    closed whatever happens."""
    kids = []
    try:
        for name, cmd, env in specs:
            kids.append(Child(name, cmd, env))
        for k in kids:
            k.expect("READY", ready_timeout)
        ns = in_turn(kids, pairs, request)
        return ns, [k.finish(end_prefix, end_timeout) for k in kids]
    finally:
        for k in kids:
            k.close()
