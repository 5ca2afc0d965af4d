#!/usr/bin/env bash
# The collectives' GPU checks on libsymm's NCCL and NVSHMEM backends, on every
# GPU of this machine (one rank per GPU, at least 2): for each backend,
# SYMM_BACKEND=<backend> python3 tests/device/symm_kernels.py <GPUs> (signals,
# barriers, the one-shot, two-shot and push all-reduces, symm.all_reduce,
# reduce-scatter and all-gather, CUDA graphs, timeouts naming the absent
# rank), each backend in processes of its own; then the C test
# build/tests/gpu_collectives on the same backend (every rank joins the
# backend's world with symm_backend_init first). Add cuda to SYMM_BACKENDS
# to run both on the CUDA backend too.
#
#   bash tests/device/symm_backends.sh                            # nccl nvshmem
#   SYMM_BACKENDS="cuda nccl nvshmem" bash tests/device/symm_backends.sh
#
# Build here first: make device; carry build/. Logs in $OUT (or
# build/device-logs): backends-<run>.log and kernels-<backend>/symm_kernels_<N>.md;
# a PASS/FAIL table last. Time limit per run: SYMM_BACKENDS_TIMEOUT seconds (240: both
# backends stay under 9 minutes, one device command).
# SYMM_NCCL_LIB and SYMM_NVSHMEM_LIB default to PyTorch's nvidia-* wheels;
# NVSHMEM_SYMMETRIC_SIZE to 4G for the NVSHMEM run.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset SYMM_DEVICE SYMM_BACKEND
LOGS=${OUT:-$ROOT/build/device-logs}
mkdir -p "$LOGS"
LIMIT=${SYMM_BACKENDS_TIMEOUT:-240}
BACKENDS=${SYMM_BACKENDS:-nccl nvshmem}

# The first site-packages path holding $1 (PyTorch's nvidia-* wheels), or nothing.
site_lib() {
  python3 - "$1" <<'EOF' 2>/dev/null
import os, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    p = os.path.join(d, sys.argv[1])
    if os.path.exists(p):
        print(p)
        break
EOF
}
[[ -n ${SYMM_NCCL_LIB:-} ]] || SYMM_NCCL_LIB=$(site_lib nvidia/nccl/lib/libnccl.so.2)
[[ -n ${SYMM_NVSHMEM_LIB:-} ]] || SYMM_NVSHMEM_LIB=$(site_lib nvidia/nvshmem/lib/libnvshmem_host.so.3)
# libsymm's kernels are compiled with NVRTC at run time: PyTorch's wheel brings it.
[[ -n ${SYMM_NVRTC_LIB:-} ]] || SYMM_NVRTC_LIB=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for rel in ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12"):
        if os.path.exists(os.path.join(p, rel)):
            print(os.path.join(p, rel)); raise SystemExit' 2>/dev/null)
# shellcheck disable=SC2163 # export the variable that v names
for v in SYMM_NCCL_LIB SYMM_NVSHMEM_LIB SYMM_NVRTC_LIB; do
  if [[ -n ${!v:-} ]]; then export "$v"; else unset "$v"; fi  # unset: libsymm tries the loader path
done

N=$(timeout 120 python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
echo "symm_backends: $N GPU(s), backends: $BACKENDS; NCCL ${SYMM_NCCL_LIB:-from the loader path}," \
  "NVSHMEM ${SYMM_NVSHMEM_LIB:-from the loader path}; logs in $LOGS"
if [[ ! $N =~ ^[0-9]+$ ]] || ((N < 2)); then
  echo "symm_backends: needs 2 or more GPUs (one rank per GPU: NCCL and NVSHMEM refuse two ranks on one GPU)"
  exit 2
fi

ROWS=()
FAILED=0
# run NAME LIMIT CMD...: CMD with a time limit, output in $LOGS/backends-NAME.log, one table row.
run() {
  local name=$1 limit=$2 start rc status log="$LOGS/backends-$1.log"
  shift 2
  echo
  echo "===== $name: $* (limit ${limit}s)"
  start=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" > "$log" 2>&1
  rc=$?
  case $rc in
    0) status=PASS ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL (rc=$rc)" ;;
  esac
  [[ $rc -eq 0 ]] || FAILED=$((FAILED + 1))
  grep -E '^FAIL|raised|Traceback|checks failed|FAILED|^symm_kernels:|: [0-9]+ ranks on ' "$log" | head -25
  echo "PASS lines: $(grep -c '^PASS' "$log")"
  ROWS+=("$(printf '| %-26s | %-12s | %5ss | %s |' "$name" "$status" "$(($(date +%s) - start))" "$log")")
}

for b in $BACKENDS; do
  case $b in
    cuda | nccl | nvshmem) ;;
    *)
      echo "symm_backends: unknown backend $b (want cuda, nccl or nvshmem)"
      FAILED=$((FAILED + 1))
      ROWS+=("$(printf '| %-26s | %-12s | %6s | %s |' "kernels-$b" "FAIL" "-" "unknown backend")")
      continue
      ;;
  esac
  mkdir -p "$LOGS/kernels-$b"
  extra=()
  [[ $b == nvshmem ]] && extra=(NVSHMEM_SYMMETRIC_SIZE="${NVSHMEM_SYMMETRIC_SIZE:-4G}")
  run "kernels-$b" "$LIMIT" env SYMM_BACKEND="$b" OUT="$LOGS/kernels-$b" ${extra[@]+"${extra[@]}"} \
    python3 tests/device/symm_kernels.py "$N"
  if [[ -x build/tests/gpu_collectives ]]; then
    run "gpu_collectives-$b" 180 env SYMM_BACKEND="$b" ${extra[@]+"${extra[@]}"} build/tests/gpu_collectives "$N"
  else
    FAILED=$((FAILED + 1))
    ROWS+=("$(printf '| %-26s | %-12s | %6s | %s |' "gpu_collectives-$b" "FAIL" "-" "build/tests/gpu_collectives missing: make device")")
  fi
done

echo
echo "===== symm_backends: $N GPU(s), $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '| %-26s | %-12s | %6s | %s |\n' run status time log
printf '| %-26s | %-12s | %6s | %s |\n' --- --- --- ---
printf '%s\n' "${ROWS[@]}"
if ((FAILED == 0)); then echo "symm_backends: all passed"; else echo "symm_backends: $FAILED failed"; fi
exit $((FAILED > 0))
