#!/usr/bin/env bash
# libsymm's collectives on the GPUs of this machine, checks then tables, in
# the steps named (default: check bench):
#
#   bash tests/device/collectives_gpu.sh [check] [bench] [bench23] [blocks] [nvbarrier] [launch] [symm] [fused] [compile] [backends] [sanitizer]
#
#   check     build/tests/gpu_collectives on every GPU and on 2 (one-shot,
#             two-shot, reduce-scatter, all-gather, push, float32/bfloat16/
#             float16, a second group on the same blocks, late peers), then
#             symm_kernels.py (its checks through PyTorch, push included) on
#             every GPU, and the Go GPU tests of symmetric/
#   bench     symm_bench.py on every GPU
#   bench23   symm_bench.py on 2 GPUs, and on 3 with 4 GPUs
#   blocks    symm_bench.py's all-reduce and reduce-scatter/all-gather
#             tables, graph-captured, with SYMM_COLLECTIVE_BLOCKS=$BLOCKS
#             (default 96) beside the default cap, on every GPU
#   nvbarrier symm_bench.py's barrier table on the NVSHMEM backend, beside
#             PyTorch's NVSHMEM backend (TORCH_SYMMMEM=NVSHMEM)
#   launch    the host's cost per call on one GPU: the Go benchmarks of the
#             kernel launches, and symm_bench.py --bench1 beside PyTorch
#   symm      symmetric memory itself: gpu_symm (C) on every GPU and with two
#             ranks per GPU, symm_torchrun.py's checks and its benchmark
#             beside PyTorch (rendezvous, bandwidth, barrier), then again
#             with SYMM_TRACE_RENDEZVOUS=1 (the time of each phase)
#   fused     symm_fused.py on every GPU
#   compile   symm_compile.py on 2 GPUs
#   backends  symm_backends.sh (the checks on NCCL and NVSHMEM)
#   sanitizer symm_sanitizer.sh (memcheck and racecheck over gpu_collectives 2)
#
# Build here first (make device), carry build/libsymm.so*, build/tests and
# build/device. Logs and tables go to $OUT (else build/device-logs): a
# summary.md, the tables as markdown, and every log in logs.tgz (the device
# runner brings back few files).
set -u -o pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
source tests/device/gpu_env.sh
export SYMM_LIB=${SYMM_LIB:-$ROOT/build/libsymm.so}
export SYMM_COMMIT=${SYMM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
N=$(nvidia-smi -L | wc -l)
STEPS=${*:-check bench}
want() { [[ " $STEPS " == *" $1 "* ]]; }
start_summary "$ROOT/build/device-logs" "collectives on $N GPUs, commit $SYMM_COMMIT"

if want check; then
  step gpu_collectives_$N 240 build/tests/gpu_collectives "$N"
  if [[ $N -gt 2 ]]; then step gpu_collectives_2 180 env CUDA_VISIBLE_DEVICES=0,1 build/tests/gpu_collectives 2; fi
  step symm_kernels_$N 300 python3 tests/device/symm_kernels.py "$N"
  if [[ -x build/device/symmetric.test ]]; then
    step go_symmetric 180 env SYMM_TEST_DEVICE=cuda build/device/symmetric.test -test.run 'GPU' -test.count=1 -test.v
  fi
fi
if want bench; then
  step bench_W$N 300 python3 tests/device/symm_bench.py "$N"
fi
if want bench23; then
  step bench_W2 240 env CUDA_VISIBLE_DEVICES=0,1 python3 tests/device/symm_bench.py 2
  if [[ $N -ge 4 ]]; then
    step bench_W3 240 env CUDA_VISIBLE_DEVICES=0,1,2 python3 tests/device/symm_bench.py 3
  fi
fi
if want blocks; then
  B=${BLOCKS:-96}
  step bench_W${N}_blocks$B 240 env SYMM_COLLECTIVE_BLOCKS="$B" OUT="$LOGS/blocks$B" \
    python3 tests/device/symm_bench.py "$N" --what allreduce,rsag --mode graph
  cp "$LOGS/blocks$B/symm_bench_W$N.md" "$LOGS/symm_bench_W${N}_blocks$B.md" 2>/dev/null
fi
if want nvbarrier; then
  step barrier_nvshmem_W$N 240 env SYMM_BACKEND=nvshmem TORCH_SYMMMEM=NVSHMEM NVSHMEM_SYMMETRIC_SIZE=4G \
    OUT="$LOGS/nvshmem" python3 tests/device/symm_bench.py "$N" --what barrier
  cp "$LOGS/nvshmem/symm_bench_W$N.md" "$LOGS/symm_bench_W${N}_nvshmem_barrier.md" 2>/dev/null
fi
if want launch; then
  step launch_go 120 env SYMM_TEST_DEVICE=cuda CUDA_VISIBLE_DEVICES=0 build/device/symmetric.test \
    -test.run '^$' -test.bench 'Kernel' -test.benchtime 20000x
  step launch_python 180 env CUDA_VISIBLE_DEVICES=0 python3 tests/device/symm_bench.py --bench1
fi
if want symm; then
  step gpu_symm_$N 120 build/tests/gpu_symm "$N"
  step gpu_symm_$((2 * N)) 120 build/tests/gpu_symm "$((2 * N))"
  step torchrun_$N 300 torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py
  step torchrun_${N}_trace 300 env SYMM_TRACE_RENDEZVOUS=1 SYMM_RUN_TAG=_trace \
    torchrun --nproc_per_node="$N" tests/device/symm_torchrun.py
fi
if want fused; then step symm_fused_$N 300 python3 tests/device/symm_fused.py "$N"; fi
if want compile; then step symm_compile_2 180 env CUDA_VISIBLE_DEVICES=0,1 python3 tests/device/symm_compile.py 2; fi
if want backends; then step backends 540 bash tests/device/symm_backends.sh; fi
if want sanitizer; then step sanitizer 200 bash tests/device/symm_sanitizer.sh; fi

# Few files come back from the device runner: the tables and summary stay
# loose, everything else goes into one archive.
TGZ=$(mktemp /tmp/symm-logs.XXXXXX)
(cd "$LOGS" && tar czf "$TGZ" . && find . -mindepth 1 \( -type d -o -name '*.log' \) -prune -exec rm -rf {} + && mv "$TGZ" logs.tgz)
echo
cat "$SUMMARY"
exit $FAILED
