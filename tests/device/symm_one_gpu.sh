#!/usr/bin/env bash
# Symmetric memory's GPU checks where one GPU is all there is: two ranks share
# it (SYMM_ALLOW_OVERLAPPING_DEVICES=1, which the programs set themselves
# when there are more ranks than GPUs), then the host's cost per eager call
# (symm_bench.py --bench1, world 1) beside a baseline build, in alternation.
#
#   bash tests/device/symm_one_gpu.sh [check] [torch] [bench]   (default: check torch)
#
# check  gpu_symm and gpu_collectives (C, 2 ranks), symm_kernels.py 2 and
#        --push 2 (through PyTorch), the Go GPU tests of symmetric/
# torch  test_torch_replace.py's sharing and freeing checks, test_torch_pool.py
# bench  symm_bench.py --bench1 with this build and with the baseline at
#        $SYMM_BASELINE_LIB (its Python package at $SYMM_BASELINE_PYTHON),
#        ROUNDS (default 2) times each, in turn
#
# Build here first (make device), carry build/libsymm.so, build/tests and
# build/device/symmetric.test. A summary table comes last; logs go to $OUT
# (else build/device-logs) in one archive.
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
source tests/device/gpu_env.sh
export SYMM_LIB=${SYMM_LIB:-$ROOT/build/libsymm.so}
STEPS=${*:-check torch}
want() { [[ " $STEPS " == *" $1 "* ]]; }
start_summary "$ROOT/build/device-logs" "symmetric memory on one GPU"

if want check; then
  step gpu_symm_2 120 build/tests/gpu_symm 2
  step gpu_collectives_2 240 build/tests/gpu_collectives 2
  step symm_kernels_2 300 python3 tests/device/symm_kernels.py 2
  step symm_kernels_push_2 200 python3 tests/device/symm_kernels.py --push 2
  step go_symmetric 180 env SYMM_TEST_DEVICE=cuda build/device/symmetric.test -test.run 'GPU' -test.count=1 -test.v
fi
if want torch; then
  step torch_replace_sharing 300 python3 tests/device/test_torch_replace.py \
    --checks mpinterior,badfree,mp,mpexp,cloexec --allocs native,symm
  step torch_pool 300 python3 tests/device/test_torch_pool.py
fi
if want bench; then
  for r in $(seq "${ROUNDS:-2}"); do
    step "bench1_this_$r" 240 env OUT="$LOGS/this_$r" python3 tests/device/symm_bench.py --bench1
    if [[ -n ${SYMM_BASELINE_LIB:-} ]]; then
      step "bench1_baseline_$r" 240 env OUT="$LOGS/baseline_$r" SYMM_LIB="$SYMM_BASELINE_LIB" \
        PYTHONPATH="${SYMM_BASELINE_PYTHON:-$ROOT/python}" python3 tests/device/symm_bench.py --bench1
    fi
  done
fi

TGZ=$(mktemp /tmp/symm-logs.XXXXXX)
(cd "$LOGS" && tar czf "$TGZ" . && find . -mindepth 1 \( -type d -o -name '*.log' \) -prune -exec rm -rf {} + && mv "$TGZ" logs.tgz)
echo
cat "$SUMMARY"
exit $FAILED
