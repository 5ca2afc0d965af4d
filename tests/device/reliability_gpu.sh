#!/usr/bin/env bash
# The GPU part of the reliability checks (docs/RELIABILITY.md), in one go:
# compute-sanitizer memcheck over the C symmetric-memory test (every rank),
# the Go GPU tests of cuda/ and export/, and the PyTorch pool checks; 1000
# symmetric alloc/rendezvous/free cycles per rank on every GPU with device
# free memory checked; a DataLoader with forked workers next to the pool.
# Build here first: make device; carry build/. Logs go to $OUT or build/device-logs.
#   bash tests/device/reliability_gpu.sh [STEP...]   (default: every step)
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
unset SYMM_DEVICE
LOGS=${OUT:-build/device-logs}
mkdir -p "$LOGS"
N=$(nvidia-smi -L | wc -l)
W=$((N < 2 ? 2 : N))
# API errors that the tests provoke on purpose (out of memory, bad arguments)
# are not memory errors: only those count.
SAN="compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 97"
declare -a rows
STEPS=${*:-memcheck-gpu_symm memcheck-cuda.test memcheck-export.test memcheck-torch-pool soak-1000-cycles dataloader-fork}
step() { # name limit cmd...
  local name=$1 limit=$2; shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  local start=$(date +%s) rc
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  local errs=$(grep -h "ERROR SUMMARY" "$LOGS/$name.log" | sort | uniq -c | tr '\n' ';')
  rows+=("$(printf '| %-26s | rc %-3s | %4ss | %s |' "$name" "$rc" "$(( $(date +%s) - start ))" "${errs:-}")")
}
step memcheck-gpu_symm 300 $SAN --target-processes all build/tests/gpu_symm "$W"
step memcheck-cuda.test 300 bash -c "cd cuda && $SAN ../build/device/cuda.test -test.run GPU -test.timeout 280s"
step memcheck-export.test 300 bash -c "cd export && SYMM_TEST_DEVICE=cuda $SAN ../build/device/export.test -test.timeout 280s"
step memcheck-torch-pool 540 $SAN python3 -m pytest tests/device/test_torch_pool.py -x -q -p no:cacheprovider
step soak-1000-cycles 400 env SYMM_GPU_CYCLES=1000 build/tests/gpu_symm "$W"
step dataloader-fork 300 python3 -m pytest tests/device/test_dataloader_fork.py -q -s -p no:cacheprovider
grep -hs "cycles; device free" "$LOGS/soak-1000-cycles.log"
grep -hs "passed\|failed" "$LOGS/dataloader-fork.log" | tail -1
printf '%s\n' "${rows[@]}"
