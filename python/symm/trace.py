"""Turn a PyTorch memory snapshot into an allocation trace for `symm replay`.

    python -m symm.trace SNAPSHOT.pickle -o OUT.csv[.gz] [--device N]
    symm replay OUT.csv.gz

SNAPSHOT.pickle is what ``torch.cuda.memory._dump_snapshot()`` writes after
``torch.cuda.memory._record_memory_history(max_entries=...)`` (or
``symm.dump_snapshot()``): a dict whose ``device_traces`` holds one list of
events per device, each a dict with ``action``, ``addr``, ``size``, ``stream``
and more. The output is the CSV that ``symm replay`` reads (docs/REPLAY.md):
the header ``action,addr,size,stream``, then one row per event of one device,
in order; gzip-compressed when OUT ends with ``.gz``.

Why it is written this way:
- It never imports torch, nor loads libsymm: a snapshot is a pickle of plain
  dicts, lists, strings and ints, so the conversion runs anywhere (a laptop
  without a GPU). Importing this module imports only the standard library.
- Unpickling runs whatever code the pickle names: convert only snapshots you
  trust, as with torch's own viewer.
- Events of actions this converter does not know (a later PyTorch may add
  some) are skipped and counted, rather than written for replay to refuse.
- Numbers are checked here (non-negative integers), so a bad snapshot fails
  naming the event instead of writing a trace that replay refuses later.
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import sys
from collections import Counter
from typing import Any, Optional, Tuple

HEADER = "action,addr,size,stream"

# PyTorch's TraceEntry actions as torch.cuda.memory._snapshot() spells them;
# the same list as internal/trace's.
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
)

Row = Tuple[str, int, int, int]  # action, addr, size, stream


def from_snapshot(snapshot: dict, device: Optional[int] = None) -> list[Row]:
    """The rows (action, addr, size, stream) of one device's events.

    device: which entry of ``device_traces``; None picks the device with the
    most events. Raises ValueError when snapshot is not a memory snapshot,
    the device does not exist, or an event is malformed. Events of unknown
    actions are left out.
    """
    rows, _, _ = convert(snapshot, device)
    return rows


def convert(snapshot: Any, device: Optional[int] = None) -> tuple[list[Row], int, Counter]:
    """from_snapshot, also returning the device chosen and a Counter of the
    unknown actions skipped."""
    traces = _device_traces(snapshot)
    dev = _pick_device(traces, device)
    rows: list[Row] = []
    skipped: Counter = Counter()
    for i, entry in enumerate(traces[dev]):
        row = _row(entry, dev, i)
        if row is None:
            skipped[str(entry.get("action"))] += 1
        else:
            rows.append(row)
    return rows, dev, skipped


def _device_traces(snapshot: Any) -> list:
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError(
            "not a memory snapshot with events: no 'device_traces' (write one with "
            "torch.cuda.memory._record_memory_history(max_entries=...) then _dump_snapshot(path))")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise ValueError("'device_traces' is not a list of one list of events per device")
    if not traces:
        raise ValueError("'device_traces' is empty: the snapshot has no device")
    return traces


def _pick_device(traces: list, device: Optional[int]) -> int:
    if device is None:
        # The busiest device; the lowest index among equals.
        return max(range(len(traces)), key=lambda d: (len(traces[d]), -d))
    if not 0 <= device < len(traces):
        raise ValueError(f"device {device} is not in the snapshot (devices 0 to {len(traces) - 1})")
    return device


def _row(entry: Any, dev: int, i: int) -> Optional[Row]:
    """One event as a row; None for an unknown action."""
    if not isinstance(entry, dict):
        raise ValueError(f"device {dev} event {i}: not a dict but {type(entry).__name__}")
    action = entry.get("action")
    if action not in ACTIONS:
        return None
    # An oom event has no 'addr' (PyTorch stores the free memory as 'device_free').
    values = [entry.get(key, 0) for key in ("addr", "size", "stream")]
    for key, v in zip(("addr", "size", "stream"), values):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
            raise ValueError(f"device {dev} event {i} ({action}): {key} {v!r} is not a non-negative 64-bit integer")
    return (action, values[0], values[1], values[2])


def write_csv(rows: list[Row], path: str) -> None:
    """Writes rows with the header to path, gzip-compressed if it ends in .gz."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        f.write(HEADER + "\n")
        for action, addr, size, stream in rows:
            f.write(f"{action},{addr},{size},{stream}\n")


def load(path: str) -> Any:
    """The unpickled snapshot at path (pickle errors become ValueError)."""
    with open(path, "rb") as f:
        try:
            return pickle.load(f)
        except Exception as e:  # noqa: BLE001 - a bad pickle can raise almost anything
            raise ValueError(f"{path}: not a readable pickle: {type(e).__name__}: {e}") from None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m symm.trace",
        description="Convert a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) into the CSV "
        "trace that `symm replay` reads.")
    parser.add_argument("snapshot", help="the snapshot pickle")
    parser.add_argument("-o", "--output", required=True, help="the CSV to write (gzip when it ends in .gz)")
    parser.add_argument("--device", type=int, default=None, help="the device whose events to take "
                        "(default: the one with the most events)")
    args = parser.parse_args(argv)
    try:
        rows, dev, skipped = convert(load(args.snapshot), args.device)
        write_csv(rows, args.output)
    except (OSError, ValueError) as e:
        print(f"symm.trace: {e}", file=sys.stderr)
        return 1
    print(f"symm.trace: wrote {len(rows)} events of device {dev} to {args.output}; replay them with: "
          f"symm replay {args.output}")
    if skipped:
        what = ", ".join(f"{n} {a!r}" for a, n in sorted(skipped.items()))
        print(f"symm.trace: skipped events of unknown actions: {what}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
