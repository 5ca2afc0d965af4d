#!/usr/bin/env bash
# The wheel on the GPU machine: a fresh venv that sees the machine's PyTorch
# (a .pth line to its site-packages), no repository on the path; then
# PyTorch's replace mode and MemPool mode on the bundled libsymm.so, and the
# console script. Build here first: make wheel; carry build/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset SYMM_LIB SYMM_DEVICE PYTHONPATH
WHEEL=$(ls "$PWD"/build/dist/symm-*.whl)
VENV=$(mktemp -d /tmp/symm-wheel-gpu-XXXXXX)
python3 -m venv "$VENV"
torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine-torch.pth"
"$VENV/bin/pip" install --quiet --no-index --no-deps "$WHEEL"
cd "$VENV"
"$VENV/bin/symm" info | head -12
"$VENV/bin/python" - <<'PYEOF'
import symm, torch
path = symm.library_path()
assert "site-packages/symm/libsymm.so" in path, path
symm.use_as_default()
x = torch.randn(1024, 1024, device="cuda")
y = (x @ x).sum().item()
try:
    torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
    raise SystemExit("replace mode: no exception on OOM")
except RuntimeError as e:
    assert "35184372088832" in str(e), e
print(f"PASS wheel replace mode: {path}, torch {torch.__version__}, reserved {symm.memory_reserved(0) >> 20} MiB")
PYEOF
"$VENV/bin/python" - <<'PYEOF'
import symm, torch
torch.cuda.init()
pool = torch.cuda.MemPool(symm.pool_allocator().allocator())
with torch.cuda.use_mem_pool(pool):
    t = torch.ones(64 << 20, device="cuda")
assert symm.memory_reserved(0) >= 256 << 20, symm.memory_reserved(0)
s = float(t.sum())
del t, pool
import gc; gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
assert symm.memory_reserved(0) == 0, symm.memory_reserved(0)
print(f"PASS wheel MemPool mode: sum {s:.0f}, segments back to the device after the pool")
PYEOF
rm -rf "$VENV"
