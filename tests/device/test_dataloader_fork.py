"""A PyTorch DataLoader with forked workers next to libsymm's pool (replace
mode): the workers are forked children of a process that runs Go; they never
call into libsymm (a call there fails with SYMM_ERR_FORKED instead of
crashing), and the job runs to the end.

    python3 -m pytest tests/device/test_dataloader_fork.py -v -s
"""

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, sys
    import torch, symm
    symm.use_as_default()
    from torch.utils.data import DataLoader, Dataset

    class Data(Dataset):
        def __len__(self):
            return 512
        def __getitem__(self, i):
            return torch.full((1024,), float(i))  # CPU tensors, made in the forked workers

    dev = torch.device("cuda", 0)
    model = torch.nn.Linear(1024, 1024).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    total = 0.0
    for epoch in range(2):
        dl = DataLoader(Data(), batch_size=32, num_workers=4, multiprocessing_context="fork", persistent_workers=False)
        for x in dl:
            x = x.to(dev, non_blocking=True)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(x.sum())
    torch.cuda.synchronize()
    # A forked child that does call into libsymm gets an error, not a crash.
    pid = os.fork()
    if pid == 0:
        try:
            symm.memory_stats()
            os._exit(3)
        except symm.SymmError as e:
            os._exit(0 if e.code == symm.ErrorCode.FORKED else 4)
        except BaseException:
            os._exit(5)
    _, status = os.waitpid(pid, 0)
    print("forked child exit", os.waitstatus_to_exitcode(status))
    print("done", total, symm.memory_allocated(0) > 0)
    """
)


def test_dataloader_with_forked_workers():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(os.path.dirname(__file__), "..", "..", "python"), env.get("PYTHONPATH")]))
    env.pop("SYMM_DEVICE", None)
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    print(p.stdout[-2000:], p.stderr[-2000:])
    assert p.returncode == 0, p.stderr[-4000:]
    assert "forked child exit 0" in p.stdout
    want = 2 * sum(float(i) * 1024 for i in range(512))
    done = [line for line in p.stdout.splitlines() if line.startswith("done")][0].split()
    assert float(done[1]) == want and done[2] == "True", done
