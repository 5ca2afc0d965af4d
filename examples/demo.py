"""What `make run` shows: libsymm serving memory, with PyTorch if it can.

- With a CUDA build of torch and a GPU: libsymm becomes PyTorch's allocator
  (symm.use_as_default()), a small model trains for a few steps, and the
  pool's statistics are printed.
- Otherwise, on the host backend (the Makefile sets SYMM_DEVICE=host; set
  here too, before the library loads, if missing): a few blocks are
  allocated, written, read back and freed through the pool, with the
  statistics after each stage.

Exits non-zero on any failure, so `make run` fails loudly.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

MiB = 1 << 20


def torch_with_cuda():
    """torch if it is installed with CUDA and a GPU is visible, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():  # does not initialize the allocator
        return None
    return torch


def print_stats(symm, title: str) -> None:
    s = symm.memory_stats(0)
    print(
        f"  {title:<28} allocated {s.get('allocated_bytes.all.current', 0) / MiB:9.2f} MiB"
        f" (peak {s.get('allocated_bytes.all.peak', 0) / MiB:9.2f})"
        f"  reserved {s.get('reserved_bytes.all.current', 0) / MiB:9.2f} MiB"
        f" (peak {s.get('reserved_bytes.all.peak', 0) / MiB:9.2f})"
    )


def torch_demo(torch) -> None:
    """Trains a small MLP with every CUDA tensor served by libsymm."""
    import symm

    symm.use_as_default()
    print(f"libsymm {symm.version()} from {symm.library_path()} is PyTorch's CUDA allocator")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 256, device="cuda")
    y = torch.randint(0, 10, (1024,), device="cuda")
    print(f"backend: {symm.backend()}, device: {torch.cuda.get_device_name(0)}")
    losses = []
    for step in range(10):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"  step {step:2d}  loss {losses[-1]:.4f}")
    if not all(map(math.isfinite, losses)) or losses[-1] >= losses[0]:
        raise SystemExit(f"training did not converge: {losses}")
    print_stats(symm, "after training")
    del model, opt, x, y, loss
    torch.cuda.empty_cache()  # reaches the pool through set_reset_fn
    print_stats(symm, "after torch.cuda.empty_cache")
    if symm.max_memory_allocated(0) == 0:
        raise SystemExit("libsymm served no allocation")


def host_demo() -> None:
    """Allocates, writes, verifies and frees through the pool on host memory."""
    if not os.environ.get("SYMM_DEVICE"):
        os.environ["SYMM_DEVICE"] = "host"  # read when the library loads
    import symm

    print(f"libsymm {symm.version()} from {symm.library_path()} (no CUDA torch: host backend)")
    print(f"backend {symm.backend() or '(not started)'} before the first call; "
          f"{symm.device_count()} device(s), backend {symm.backend()} after")
    print_stats(symm, "start")
    blocks = []
    for i, size in enumerate((512, 4096, MiB, 8 * MiB + 3, 64 * MiB)):
        ptr = symm.alloc(size)
        ctypes.memset(ptr, i + 1, size)
        blocks.append((ptr, size, i + 1))
        print(f"  alloc {size:>10} B -> {ptr:#x}")
    print_stats(symm, "5 blocks live")
    for ptr, size, value in blocks:
        if ctypes.string_at(ptr, size) != bytes([value]) * size:
            raise SystemExit(f"block {ptr:#x} of {size} B lost its data")
        symm.free(ptr, size)
    print_stats(symm, "all freed (cached)")
    again = symm.alloc(MiB)
    print_stats(symm, "1 MiB again (from cache)")  # while it is live
    symm.free(again, MiB)
    symm.empty_cache()
    print_stats(symm, "after empty_cache")
    try:
        symm.free(0xDEAD000, 16)
    except symm.SymmError as e:
        print(f"  freeing a bad pointer is an error, not a crash: {e}")
    else:
        raise SystemExit("freeing a bad pointer did not raise")
    if symm.memory_allocated(0) != 0:
        raise SystemExit("memory still allocated after freeing everything")


def main() -> int:
    torch = torch_with_cuda()
    if torch is not None:
        torch_demo(torch)
    else:
        host_demo()
    print("demo OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
