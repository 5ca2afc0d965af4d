#!/usr/bin/env bash
# The NVSHMEM backend on every GPU of this machine: the C test and the torchrun
# suite under SYMM_BACKEND=nvshmem (the same checks as the CUDA backend), then
# the benchmark's PyTorch side with PyTorch's own NVSHMEM backend
# (TORCH_SYMMMEM=NVSHMEM) in a second torchrun of the job: both in one process
# would initialize NVSHMEM twice. Build here first: make device; carry build/.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4G}  # the 1 GiB benchmark block, on both sides
unset SYMM_DEVICE
LOGS=${OUT:-build/device-logs}
mkdir -p "$LOGS"
N=$(nvidia-smi -L | wc -l)
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export SYMM_NVSHMEM_LIB=${SYMM_NVSHMEM_LIB:-$SITE/nvidia/nvshmem/lib/libnvshmem_host.so.3}
rc=0
SYMM_BACKEND=nvshmem timeout 180 build/tests/gpu_symm "$N" 2>&1 | tee "$LOGS/gpu_symm_nvshmem_$N.log" || rc=1
SYMM_BACKEND=nvshmem SYMM_BENCH_SIDES=ours SYMM_RUN_TAG=_nvshmem_ours \
  timeout 300 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py > "$LOGS/torchrun_nvshmem_ours.log" 2>&1 || rc=1
TORCH_SYMMMEM=NVSHMEM SYMM_BENCH_SIDES=theirs SYMM_RUN_TAG=_nvshmem_torch \
  timeout 300 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py > "$LOGS/torchrun_nvshmem_torch.log" 2>&1 || rc=1
for f in torchrun_nvshmem_ours torchrun_nvshmem_torch; do
  echo "--- $f"
  grep -E "^(PASS|FAIL)|^\||Error|error" "$LOGS/$f.log" | grep -v "^PASS" | head -40
  echo "PASS lines: $(grep -c '^PASS' "$LOGS/$f.log")"
done
exit $rc
