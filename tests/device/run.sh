#!/usr/bin/env bash
# Runs every GPU check of libsymm in one go on the GPU machine, keeps a log per
# step, and prints a summary table last. It builds nothing: build here (make,
# go test -c -o build/device/NAME.test ./NAME, C tests into build/tests/) and
# carry build/ along.
#
#   bash tests/device/run.sh                 # everything
#   bash tests/device/run.sh go torch        # only some steps: env go c torch replace graphs kernels recipes sanitizer bench
#   bash tests/device/run.sh sweep replay    # the longer benchmarks, not run by default
#   bash tests/device/run.sh unchanged       # 2 GPUs: an unedited torchrun script under symm run
#   bash tests/device/run.sh settings mempools trackers fsdp gpt2   # run-time settings, MemPools, NCCL registration (2 GPUs), FSDP, GPT-2 step
#   bash tests/device/run.sh segevents       # PyTorch's segment events for tests/data/torch_segment_events.json
#
# Logs go to $OUT (when set, e.g. by the device runner) or build/device-logs.
# Per-step time limits (seconds) can be changed with SYMM_GO_TIMEOUT,
# SYMM_C_TIMEOUT, SYMM_TORCH_TIMEOUT, SYMM_GRAPHS_TIMEOUT and SYMM_BENCH_TIMEOUT.
set -u -o pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)

# Multicast off, the GPU backend, NVRTC from PyTorch's wheel (gpu_env.sh).
source tests/device/gpu_env.sh
export SYMM_TEST_DEVICE=cuda  # Go test binaries of export/ run on the CUDA backend

LOGS=${OUT:-$ROOT/build/device-logs}
mkdir -p "$LOGS"
SUMMARY=()
FAILED=0

STEPS=${*:-env go c torch replace graphs kernels recipes sanitizer bench}
want() { [[ " $STEPS " == *" $1 "* ]]; }

# run_step NAME TIMEOUT CMD...: runs CMD with a time limit, tees its output to
# $LOGS/NAME.log, and records a summary row.
run_step() {
  local name=$1 limit=$2
  shift 2
  local log="$LOGS/$name.log" start end rc status
  echo
  echo "===== $name: $* (limit ${limit}s)"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  end=$(date +%s)
  case $rc in
    0) status=PASS ;;
    124 | 137) status="TIMEOUT" ;;
    *) status="FAIL (rc=$rc)" ;;
  esac
  [[ $rc -eq 0 ]] || FAILED=$((FAILED + 1))
  SUMMARY+=("$(printf '| %-34s | %-12s | %6ss | %s |' "$name" "$status" "$((end - start))" "$log")")
}

check_env() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(hostname)"
  nvidia-smi || { echo "nvidia-smi failed: no usable GPU"; return 1; }
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
  python3 - <<'EOF' || return 1
import sys
import torch
print(f"python {sys.version.split()[0]}  torch {torch.__version__}  CUDA {torch.version.cuda}")
print(f"cuda available: {torch.cuda.is_available()}  devices: {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  {i}: {p.name}  {p.total_memory / 2**30:.1f} GiB  sm_{p.major}{p.minor}")
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
  if [[ ! -f build/libsymm.so ]]; then
    echo "build/libsymm.so is missing: run make on the build machine and carry build/"
    return 1
  fi
  ls -la build/libsymm.so
  python3 -c "import symm; print('symm', symm.version(), 'from', symm.library_path())"
}

if want env; then
  run_step env 120 bash -c "$(declare -f check_env); check_env"
fi

if want go; then
  shopt -s nullglob
  gotests=(build/device/*.test)
  [[ ${#gotests[@]} -gt 0 ]] || echo "no Go GPU test binaries in build/device/"
  for bin in "${gotests[@]}"; do
    name=$(basename "$bin" .test)
    [[ $name == symmetric ]] && continue  # only its GPU race test, below
    # A package's tests expect to run in its directory (testdata/ and friends).
    dir=$ROOT
    [[ -d "$ROOT/$name" ]] && dir="$ROOT/$name"
    run_step "go-$name" "${SYMM_GO_TIMEOUT:-300}" \
      bash -c 'cd "$1" && exec "$2" -test.v -test.timeout "$3s"' _ "$dir" "$ROOT/$bin" "$((${SYMM_GO_TIMEOUT:-300} - 20))"
  done
  # Free racing put/wait/barrier on the CUDA provider (memop and kernel
  # signals; the host one runs too), at the default ~10^5 calls; the signal
  # kernels' allocation and timeout tests (a timed call behind earlier work
  # and before later work on its stream must not time out:
  # TestKernelTimedCallBehindEarlierAndLaterWork, and as stream memory
  # operations TestMemopTimedCall*, untimed calls behind such work included).
  if [[ -x build/device/symmetric.test ]]; then
    run_step go-symmetric-race "${SYMM_GO_TIMEOUT:-300}" \
      env -u SYMM_SOAK_SCALE bash -c 'cd "$1" && exec "$2" -test.run "TestFreeRacesSignals|TestKernel|TestMemopTimedCall" -test.v -test.timeout "$3s"' \
      _ "$ROOT/symmetric" "$ROOT/build/device/symmetric.test" "$((${SYMM_GO_TIMEOUT:-300} - 20))"
  fi
fi

if want c; then
  # tests/c/*.c are host-backend tests (their headers say so): run them with
  # SYMM_DEVICE=host, which also proves the library runs on this host's libc.
  # A C program named gpu_* is meant for the GPU and runs without it.
  shopt -s nullglob
  for prog in build/tests/*; do
    [[ -f "$prog" && -x "$prog" ]] || continue
    name=$(basename "$prog")
    if [[ $name == gpu_* ]]; then
      run_step "c-$name" "${SYMM_C_TIMEOUT:-120}" "$prog"
      # Signals as stream memory operations too (the fallback without NVRTC).
      [[ $name == gpu_symm ]] && run_step "c-$name-memop" "${SYMM_C_TIMEOUT:-120}" env SYMM_SIGNALS=memop "$prog"
    else
      run_step "c-$name" "${SYMM_C_TIMEOUT:-120}" env SYMM_DEVICE=host "$prog"
    fi
  done
fi

if want replace; then
  # Replace mode through libsymm's PyTorch extension: every torch.cuda memory
  # call, OOM, history, multiprocessing, torch.compile; PyTorch's allocator
  # runs the same checks in the same run as the reference.
  run_step torch-replace "${SYMM_REPLACE_TIMEOUT:-580}" python3 tests/device/test_torch_replace.py
fi

if want torch; then
  run_step torch-pool "${SYMM_TORCH_TIMEOUT:-480}" python3 -m pytest tests/device/test_torch_pool.py -v -s -p no:cacheprovider
fi

if want graphs; then
  # CUDA graphs, make_graphed_callables, torch.compile, plain-recipe OOM,
  # MemPool release, memory snapshots; one child per check and mode.
  run_step torch-graphs "${SYMM_GRAPHS_TIMEOUT:-570}" python3 -m pytest tests/device/test_torch_graphs.py -v -s -p no:cacheprovider
fi

if want kernels; then
  # The collectives' checks from PyTorch (signals, the all-reduces,
  # reduce-scatter, all-gather): 2 and 4 ranks (sharing GPUs when there are
  # fewer), then the one-GPU comparison with PyTorch (symm_bench.py --bench1;
  # the multi-GPU tables: python3 tests/device/symm_bench.py WORLD).
  run_step kernels-2 "${SYMM_KERNELS_TIMEOUT:-300}" python3 tests/device/symm_kernels.py 2
  run_step kernels-4 "${SYMM_KERNELS_TIMEOUT:-300}" python3 tests/device/symm_kernels.py 4
  run_step kernels-bench1 "${SYMM_KERNELS_TIMEOUT:-300}" python3 tests/device/symm_bench.py --bench1
fi

if want recipes; then
  # The README's GPU recipes, each as printed (tests/python/test_recipes.py runs the host ones in CI).
  run_step recipes "${SYMM_RECIPES_TIMEOUT:-300}" python3 tests/device/recipes_gpu.py
fi

if want sanitizer; then
  # compute-sanitizer over every rank of the C collectives test: memcheck,
  # racecheck and synccheck must report nothing.
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ -z $CS ]]; then
    echo "compute-sanitizer not found"; FAILED=$((FAILED + 1))
  else
    for tool in memcheck racecheck synccheck; do
      run_step "sanitizer-$tool" "${SYMM_SANITIZER_TIMEOUT:-300}" env SYMM_TIMEOUT_MS=10000 \
        "$CS" --tool "$tool" --target-processes all --error-exitcode 99 build/tests/gpu_collectives 2
    done
  fi
fi

if want bench; then
  run_step bench-torch "${SYMM_BENCH_TIMEOUT:-300}" python3 bench/bench_torch.py
  # native against libsymm in alternating slices: the ratios to compare
  run_step bench-paired "${SYMM_BENCH_TIMEOUT:-300}" python3 bench/bench_paired.py
fi

# Multi-GPU training under libsymm with no edit to the script (symm run,
# SYMM_TORCH_ALLOCATOR=1), against PyTorch's allocator; needs 2 GPUs.
if want unchanged; then
  run_step unchanged "${SYMM_TORCH_TIMEOUT:-480}" python3 tests/device/test_unchanged_script.py
fi

# PyTorch's run-time allocator settings, on both allocators (one GPU).
if want settings; then
  run_step torch-settings "${SYMM_TORCH_TIMEOUT:-480}" python3 tests/device/test_torch_settings.py
  # graph_capture_record_stream_reuse: reuse in a capture after the join.
  run_step torch-graph-reuse "${SYMM_TORCH_TIMEOUT:-480}" python3 tests/device/test_torch_graph_reuse.py
fi

# PyTorch's memory history (test_cuda.py's memory_plots tests, the pickled
# C++ snapshot, compile regions), on both allocators (one GPU).
if want history; then
  run_step torch-history "${SYMM_TORCH_TIMEOUT:-1200}" python3 tests/device/test_torch_history.py
fi

# torch.cuda.MemPool with libsymm current: use_count, no_split, use_on_oom,
# snapshot, release, a MemPool over another allocator and PyTorch's
# symmetric-memory pool, on both allocators (one GPU).
if want mempools; then
  run_step torch-mempools "${SYMM_TORCH_TIMEOUT:-480}" python3 tests/device/test_torch_mempools.py
fi

# PyTorch's own segment events for the workload the host-backend test holds
# libsymm to (tests/data/torch_segment_events.json), recorded and compared.
if want segevents; then
  run_step segment-events "${SYMM_TORCH_TIMEOUT:-480}" python3 tests/device/record_segment_events.py
fi

# ProcessGroupNCCL's segment registration through the allocator trace
# trackers, on both allocators; needs 2 GPUs.
if want trackers; then
  run_step torch-trackers "${SYMM_TORCH_TIMEOUT:-480}" python3 tests/device/test_torch_trackers.py
fi

# FSDP2 GPT-2 small under torchrun, every allocator mode, interleaved runs
# (SYMM_FSDP_WORLDS GPUs, default 2; SYMM_FSDP_RUNS runs, default 3).
if want fsdp; then
  run_step fsdp "${SYMM_FSDP_TIMEOUT:-590}" python3 bench/fsdp.py --worlds "${SYMM_FSDP_WORLDS:-2}" \
    --runs "${SYMM_FSDP_RUNS:-3}"
fi

# GPT-2 training step time and peaks, PyTorch's allocator against libsymm's.
if want gpt2; then
  run_step gpt2 "${SYMM_BENCH_TIMEOUT:-580}" python3 bench/workloads.py --workloads gpt2 --modes native,symm --runs 3
fi

# The size sweep in both modes, interleaved rounds (about 4 minutes), and
# the recorded traces replayed through PyTorch's allocator API (about 5).
if want sweep; then
  run_step bench-sweep "${SYMM_BENCH_TIMEOUT:-580}" env SYMM_BENCH_SIZES=512,64K,1M,4M,16M,64M,256M,1G \
    python3 bench/bench_torch.py --configs native,symm,native_expandable,symm_expandable --rounds 3
fi
if want replay; then
  run_step bench-replay "${SYMM_BENCH_TIMEOUT:-580}" python3 bench/replay_torch.py --rounds 3
fi

echo
echo "===== summary ($(date -u '+%H:%M:%S UTC'), logs in $LOGS)"
for log in "$LOGS/torch-pool.log" "$LOGS/torch-graphs.log"; do
  if [[ -f "$log" ]]; then
    grep -E '^(PASS|FAIL|SKIP)  ' "$log" | sort -u -k2,3 || true
    echo
  fi
done
printf '| %-34s | %-12s | %7s | %s |\n' step status time log
printf '| %-34s | %-12s | %7s | %s |\n' "---" "---" "---" "---"
printf '%s\n' "${SUMMARY[@]}"
echo
if [[ $FAILED -eq 0 ]]; then
  echo "all ${#SUMMARY[@]} steps passed"
else
  echo "$FAILED of ${#SUMMARY[@]} steps failed"
fi
exit $((FAILED > 0))
