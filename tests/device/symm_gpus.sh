#!/usr/bin/env bash
# Symmetric memory on every GPU of this machine, in one go: the C test
# (build/tests/gpu_symm, one process per GPU, then twice as many ranks as
# GPUs sharing devices), then the torchrun checks and benchmark, then the
# same benchmark with SYMM_TRACE_RENDEZVOUS=1 (per-phase times in the log).
# Build here first: make device; carry build/. Logs go to $OUT or build/device-logs.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
unset SYMM_DEVICE
LOGS=${OUT:-build/device-logs}
mkdir -p "$LOGS"
N=$(nvidia-smi -L | wc -l)
rc=0
nvidia-smi topo -m > "$LOGS/topo.txt" 2>&1
build/symm info > "$LOGS/symm_info.txt" 2>&1 || rc=1
build/symm info --json > "$LOGS/symm_info.json" 2>&1 || rc=1
build/symm bench > "$LOGS/symm_bench.txt" 2>&1 || rc=1
SYMM_TEST_DEVICE=cuda build/device/topology.test -test.v -test.run GPU > "$LOGS/topology_test.log" 2>&1 || rc=1
timeout 120 build/tests/gpu_symm "$N" 2>&1 | tee "$LOGS/gpu_symm_$N.log" || rc=1
timeout 120 build/tests/gpu_symm "$((2 * N))" 2>&1 | tee "$LOGS/gpu_symm_$((2 * N)).log" || rc=1
timeout 400 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py > "$LOGS/torchrun_$N.log" 2>&1 || rc=1
if [[ ${SYMM_GPUS_TRACE:-1} == 1 ]]; then
  SYMM_TRACE_RENDEZVOUS=1 timeout 400 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py > "$LOGS/torchrun_${N}_trace.log" 2>&1 || rc=1
fi
echo "--- nvidia-smi topo -m"; cat "$LOGS/topo.txt"
echo "--- symm info"; cat "$LOGS/symm_info.txt"
echo "--- symm bench"; cat "$LOGS/symm_bench.txt"
echo "--- topology GPU test"; grep -E "^(---|ok|FAIL|PASS)|topology_test|links from" "$LOGS/topology_test.log"
tail -n 48 "$LOGS/torchrun_$N.log"
[[ -f "$LOGS/torchrun_${N}_trace.log" ]] && { echo "--- trace run"; grep -E '^\|' "$LOGS/torchrun_${N}_trace.log"; grep 'symm: rendezvous "bench1048576"' "$LOGS/torchrun_${N}_trace.log" | tail -4; }
exit $rc
