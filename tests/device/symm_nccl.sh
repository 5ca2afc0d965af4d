#!/usr/bin/env bash
# The NCCL backend on every GPU of this machine: the C test and the torchrun
# suite under SYMM_BACKEND=nccl (the CUDA backend's checks), all_reduce
# correctness and speed on pool tensors (nccl_allreduce.py), then the
# rendezvous benchmark's PyTorch side with its NCCL backend
# (TORCH_SYMMMEM=NCCL). Build here first: make device; carry build/.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
unset SYMM_DEVICE
LOGS=${OUT:-build/device-logs}
mkdir -p "$LOGS"
N=$(nvidia-smi -L | wc -l)
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export SYMM_NCCL_LIB=${SYMM_NCCL_LIB:-$SITE/nvidia/nccl/lib/libnccl.so.2}
rc=0
SYMM_BACKEND=nccl timeout 180 build/tests/gpu_symm "$N" 2>&1 | tee "$LOGS/gpu_symm_nccl_$N.log" || rc=1
SYMM_BACKEND=nccl timeout 300 torchrun --nproc_per_node="$N" tests/device/nccl_allreduce.py > "$LOGS/nccl_allreduce.log" 2>&1 || rc=1
SYMM_BACKEND=nccl SYMM_BENCH_SIDES=ours SYMM_RUN_TAG=_nccl_ours \
  timeout 300 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py > "$LOGS/torchrun_nccl_ours.log" 2>&1 || rc=1
TORCH_SYMMMEM=NCCL SYMM_BENCH_SIDES=theirs SYMM_RUN_TAG=_nccl_torch \
  timeout 300 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py > "$LOGS/torchrun_nccl_torch.log" 2>&1 || rc=1
for f in nccl_allreduce torchrun_nccl_ours torchrun_nccl_torch; do
  echo "--- $f"
  grep -E "^(PASS|FAIL)|^\||Error|error|backend" "$LOGS/$f.log" | grep -v "^PASS" | head -40
  echo "PASS lines: $(grep -c '^PASS' "$LOGS/$f.log")"
done
exit $rc
