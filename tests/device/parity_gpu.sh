#!/usr/bin/env bash
# libsymm against PyTorch's allocator, on one GPU: the ported behaviours of
# PyTorch's allocator tests (test_torch_parity.py, test_torch_history.py,
# test_torch_graph_reuse.py) and, given PyTorch's own test/test_cuda.py, the
# tests of it that failed under libsymm before (pytorch_test_cuda.py), each
# on both allocators, default settings and expandable segments.
#
#   bash tests/device/parity_gpu.sh [PATH/TO/test_cuda.py]
#
# History and graph reuse need no GPU memory to speak of and run beside the
# rest. Build here first (make lib); torch.testing._internal needs the
# expecttest package (carry its wheel). Logs and JSON go to $OUT (else
# build/parity-logs) in one archive; the table comes last.
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
source tests/device/gpu_env.sh
export SYMM_LIB=${SYMM_LIB:-$ROOT/build/libsymm.so}
start_summary "$ROOT/build/parity-logs" "libsymm against PyTorch's allocator"
PYTORCH_FILE=${1:-}
# The tests of PyTorch's file that differed under libsymm.
SELECT="test_allocator_settings or test_max_split_expandable or test_garbage_collect_expandable or test_raises_oom \
or test_mempool_expandable or test_get_per_process_memory_fraction or test_allocator_memory_fraction_setting \
or test_allocator_backend or test_memory_stats or (test_out_of_memory and not retry) or test_cachingAllocator_raw_alloc \
or test_memory_plots or test_cpp_memory_snapshot_pickle or test_memory_compile_regions or test_graph_capture_reclaim"

# libsymm's PyTorch extension is compiled on first use: once, here, not
# inside a case's time limit (the history cases would race the parity ones).
step extension 300 python3 -c "import symm, torch; symm.use_as_default(); torch.empty(1, device='cuda'); \
st = symm.extension_status(); print(st); assert st['extension'], st['reason']; print('ok')"
step history 300 env OUT="$LOGS/history" python3 tests/device/test_torch_history.py --timeout 140 &
HIST=$!
step graph_reuse 240 env OUT="$LOGS/reuse" python3 tests/device/test_torch_graph_reuse.py --timeout 60 &
REUSE=$!
step parity 360 env OUT="$LOGS" python3 tests/device/test_torch_parity.py --timeout 45
if [[ -n $PYTORCH_FILE ]]; then
  step pytorch_file 290 env OUT="$LOGS/pytorch" python3 tests/device/pytorch_test_cuda.py "$PYTORCH_FILE" \
    -k "$SELECT" --timeout 70
fi
wait $HIST $REUSE
# The background steps' rows are in the summary (their FAILED is their own).
grep -qE "\| (FAIL|TIMEOUT)" "$SUMMARY" && FAILED=1
for f in "$LOGS"/logs/*.log; do echo "== $f"; tail -20 "$f"; done > "$LOGS/tails.txt"
TGZ=$(mktemp /tmp/parity-logs.XXXXXX)
(cd "$LOGS" && tar czf "$TGZ" . && find . -mindepth 1 -not -name summary.md -not -name tails.txt -prune -exec rm -rf {} + && mv "$TGZ" logs.tgz)
cat "$LOGS/summary.md"
exit $FAILED
