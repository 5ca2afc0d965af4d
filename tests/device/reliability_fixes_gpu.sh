#!/usr/bin/env bash
# GPU checks of the reliability fixes, in one go on a one-GPU machine (about
# 8 minutes): two lanes run side by side, each step logged under $OUT (or
# build/device-logs), a table printed last.
#   lane A: the Go GPU tests of cuda/ (expandable segments, spare chunks),
#           symmetric/ (timed signal calls behind other work, kernels and
#           memops), export/; the C collectives (overlap refusals); the
#           one-shot all-reduce from PyTorch on 2 ranks sharing the GPU.
#   lane B: replace mode (stats, OOM, history, IPC incl. close-on-exec,
#           graphs, MemPool, expandable) and the CUDA-graph suite (capture
#           begins while the pool works: the capture gate).
# Build here first: make device; carry build/libsymm.so build/tests build/device.
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset SYMM_DEVICE
export SYMM_TEST_DEVICE=cuda
SYMM_NVRTC_LIB=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    f = os.path.join(p, "cu13/lib/libnvrtc.so.13")
    if os.path.exists(f): print(f); break' 2>/dev/null)
[[ -n $SYMM_NVRTC_LIB ]] && export SYMM_NVRTC_LIB
LOGS=${OUT:-$ROOT/build/device-logs}
mkdir -p "$LOGS"
step() { # lane name limit cmd...
  local lane=$1 name=$2 limit=$3 start rc
  shift 3
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  printf '| %s | %-22s | rc %-3s | %4ss | %s |\n' "$lane" "$name" "$rc" "$(($(date +%s) - start))" \
    "$(grep -hE '^(ok|PASS|FAIL|--- FAIL)|passed|failed' "$LOGS/$name.log" | tail -1)" >> "$LOGS/table.$lane"
}
laneA() {
  step A go-cuda 200 bash -c 'cd cuda && ../build/device/cuda.test -test.run GPU -test.v -test.timeout 190s'
  step A go-symmetric 200 bash -c 'cd symmetric && ../build/device/symmetric.test -test.run "TestFreeRacesSignals|TestKernel|TestMemopTimedCall" -test.v -test.timeout 190s'
  step A go-export 150 bash -c 'cd export && ../build/device/export.test -test.v -test.timeout 140s'
  step A c-gpu_collectives 90 build/tests/gpu_collectives
  step A c-gpu_symm-memop 90 env SYMM_SIGNALS=memop build/tests/gpu_symm
  step A kernels-2 150 python3 tests/device/symm_kernels.py 2
}
laneB() {
  step B torch-replace 330 python3 tests/device/test_torch_replace.py --checks stats,oom,history,mp,mpexp,cloexec,graphs,mempool,expandable
  step B torch-graphs 240 python3 -m pytest tests/device/test_torch_graphs.py -q -p no:cacheprovider -k "capture_free or persist or shared or side_stream or graphed or release or snapshot"
}
rm -f "$LOGS"/table.*
laneA & laneB & wait
cat "$LOGS"/table.A "$LOGS"/table.B
