"""A distributed training script as users write them, with no mention of
libsymm: set_device first, NCCL, DDP, a DataLoader with fork and spawn
workers. tests/device/test_unchanged_script.py runs it under torchrun on
PyTorch's allocator and under `symm run`, and compares.

Prints one line per step on rank 0 ("step N loss X") and, last, one line
"RESULT {json}" per rank with the allocator PyTorch used.
"""

import json
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # the script's first CUDA line

from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Numbers(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, generator=g)
        return x, x.sum().unsqueeze(0)


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for context in ("fork", "spawn"):
        loader = DataLoader(Numbers(), batch_size=32, num_workers=2, multiprocessing_context=context)
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if rank == 0:
                print(f"step {len(losses)} loss {losses[-1]:.6f}", flush=True)
    t = torch.ones(1 << 20, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    world = dist.get_world_size()
    stats = torch.cuda.memory_stats()
    result = {
        "rank": rank,
        "backend": torch.cuda.get_allocator_backend(),
        "losses": losses,
        "all_reduce_ok": bool(torch.all(t == world * (world + 1) / 2).item()),
        "allocated_peak": stats.get("allocated_bytes.all.peak", 0),
        "reserved_peak": stats.get("reserved_bytes.all.peak", 0),
    }
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
