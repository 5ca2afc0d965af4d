#!/usr/bin/env bash
# The port test (tests/device/symm_port.py) on every GPU of this machine: a
# script written against torch.distributed._symmetric_memory, run on
# PyTorch's module and on libsymm (only the import differs), for each
# backend. Prints one summary line per run; logs in $OUT or build/device-logs.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
unset SYMM_DEVICE
LOGS=${OUT:-build/device-logs}
mkdir -p "$LOGS"
N=$(nvidia-smi -L | wc -l)
RUNS=${SYMM_PORT_RUNS:-"symm:CUDA symm:NVSHMEM symm:NCCL torch:CUDA torch:NVSHMEM"}
rc=0
for run in $RUNS; do
  impl=${run%%:*} backend=${run##*:}
  log="$LOGS/port_${impl}_${backend}.log"
  SYMM_PORT_IMPL=$impl SYMM_PORT_BACKEND=$backend timeout 180 \
    torchrun --nproc_per_node="$N" tests/device/symm_port.py > "$log" 2>&1
  r=$?
  # PyTorch's own module is the reference, not under test: its failures are reported, not counted.
  [[ $r -ne 0 && $impl == symm ]] && rc=1
  echo "== $impl $backend: rc=$r"
  grep -E "^FAIL|passed, " "$log" | sort | uniq | head -20
done
# Nothing hangs for ever: signals nobody answers (libsymm only).
for backend in ${SYMM_TIMEOUT_BACKENDS:-CUDA NVSHMEM NCCL}; do
  log="$LOGS/timeout_${backend}.log"
  SYMM_TIMEOUT_MS=3000 SYMM_PORT_BACKEND=$backend timeout 120 \
    torchrun --nproc_per_node=2 tests/device/symm_timeout.py > "$log" 2>&1 || rc=1
  echo "== timeout $backend"
  grep -E "^(PASS|FAIL)|passed, " "$log" | sort | uniq | head -12
done
exit $rc
