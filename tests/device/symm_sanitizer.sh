#!/usr/bin/env bash
# compute-sanitizer over libsymm's collectives on 2 GPUs: memcheck (out of
# bounds and misaligned device accesses, CUDA API errors) and
# racecheck (shared-memory hazards inside a kernel) over the C collectives
# test, build/tests/gpu_collectives 2, every rank (the program spawns one
# process per rank: --target-processes all). What that run covers: 200
# barriers on 24 channels, a put/wait ring, the one-shot and the two-shot
# all-reduce (float32 and bfloat16, 4 B .. 4 MiB, the 16-byte and 4-byte
# kernels, from a local input, in place), reduce-scatter and all-gather
# (4 B .. 256 KiB per rank, in place and not), the push all-reduce
# (float32, bfloat16, float16 up to its 1 MiB limit, flags wrapping past
# 2^32) and symm_all_reduce_algorithm, bad arguments refused, and kernels
# that give up on a rank that stays away (on purpose). The program has no
# size option: this is its smallest run, and it reaches every collective
# kernel. The two tools run at the same time, memcheck on GPUs 0,1 and
# racecheck on GPUs 2,3 (0,1 again with fewer than 4 GPUs), each limited
# to SYMM_SANITIZER_TIMEOUT seconds (170): under 3 minutes in all
# (SYMM_SANITIZER_SERIAL=1: one after the other, twice as long at most).
# SYMM_TIMEOUT_MS is 10000 (the sanitizer slows each rank's start; the
# program's own default, 3000, could time a slow peer out).
#
#   bash tests/device/symm_sanitizer.sh
#
# Build here first: make device; carry build/. Logs in $OUT (or
# build/device-logs): sanitizer-memcheck.log, sanitizer-racecheck.log.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
unset SYMM_DEVICE SYMM_BACKEND
LOGS=${OUT:-$ROOT/build/device-logs}
mkdir -p "$LOGS"
LIMIT=${SYMM_SANITIZER_TIMEOUT:-170}
PROG=build/tests/gpu_collectives

CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ -z $CS ]]; then
  echo "symm_sanitizer: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
  exit 2
fi
if [[ ! -x $PROG ]]; then
  echo "symm_sanitizer: $PROG is missing: make device here, and carry build/"
  exit 2
fi
# libsymm's kernels are compiled with NVRTC at run time: PyTorch's wheel brings it.
if [[ -z ${SYMM_NVRTC_LIB:-} ]]; then
  SYMM_NVRTC_LIB=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for rel in ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12"):
        if os.path.exists(os.path.join(p, rel)):
            print(os.path.join(p, rel)); raise SystemExit' 2>/dev/null)
fi
if [[ -n $SYMM_NVRTC_LIB ]]; then export SYMM_NVRTC_LIB; else unset SYMM_NVRTC_LIB; fi
N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
PAIR2="0,1"
((N >= 4)) && PAIR2="2,3"
echo "symm_sanitizer: $CS ($("$CS" --version 2>/dev/null | grep -m1 -i version)), $N GPU(s); logs in $LOGS"

# sanitize TOOL GPUS: the C test under compute-sanitizer TOOL on GPUS, in the background.
sanitize() {
  local tool=$1 gpus=$2
  (
    start=$(date +%s)
    CUDA_VISIBLE_DEVICES=$gpus SYMM_TIMEOUT_MS=${SYMM_TIMEOUT_MS:-10000} \
      timeout --kill-after=10 "$LIMIT" "$CS" --tool "$tool" --target-processes all --error-exitcode 99 \
      "$PROG" 2 > "$LOGS/sanitizer-$tool.log" 2>&1
    echo "$? $(($(date +%s) - start))" > "$LOGS/sanitizer-$tool.rc"
  ) &
  [[ ${SYMM_SANITIZER_SERIAL:-0} == 1 ]] && wait
  return 0
}
rm -f "$LOGS"/sanitizer-memcheck.rc "$LOGS"/sanitizer-racecheck.rc
sanitize memcheck 0,1
sanitize racecheck "$PAIR2"
wait

ROWS=()
FAILED=0
for tool in memcheck racecheck; do
  log="$LOGS/sanitizer-$tool.log"
  read -r rc secs 2>/dev/null < "$LOGS/sanitizer-$tool.rc" || { rc=none; secs=-; }
  # A summary per process (the launcher and each rank): memcheck's "ERROR SUMMARY: k errors",
  # racecheck's "RACECHECK SUMMARY: h hazards displayed (k errors, w warnings)" (or ERROR SUMMARY).
  read -r errors nsum < <(grep -oE '(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ error)' \
    "$log" 2>/dev/null | grep -oE '[0-9]+ error' | awk '{s += $1} END {print s + 0, NR}')
  prog=$(grep -E "(^|/)$(basename "$PROG"): " "$log" | tail -1) # argv[0] may be absolute
  if [[ $rc == 0 && $nsum -ge 1 && $errors -eq 0 && $prog == *": ok" ]]; then
    status=PASS
  elif [[ $rc == 124 || $rc == 137 ]]; then
    status=TIMEOUT
  else
    status="FAIL (rc=$rc)"
  fi
  [[ $status == PASS ]] || FAILED=$((FAILED + 1))
  echo
  echo "--- $tool: rc $rc, ${secs}s; $errors error(s) in $nsum summary line(s); ${prog:-no result line from $PROG}"
  grep -E 'SUMMARY' "$log" | sort | uniq -c
  grep -E '^=+ (Invalid|Error|Race|Warning|Leaked|Program hit|Saved host backtrace)' "$log" | head -15
  grep -E 'checks failed|checks passed' "$log" | head -4
  ROWS+=("$(printf '| %-9s | %-12s | %5ss | %-34s | %s |' "$tool" "$status" "$secs" \
    "$( ((nsum > 0)) && echo "$errors errors ($nsum summaries)" || echo "no SUMMARY line")" "$log")")
done

echo
echo "===== symm_sanitizer: $PROG 2 under compute-sanitizer, $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '| %-9s | %-12s | %6s | %-34s | %s |\n' tool status time "errors (every process)" log
printf '| %-9s | %-12s | %6s | %-34s | %s |\n' --- --- --- --- ---
printf '%s\n' "${ROWS[@]}"
if ((FAILED == 0)); then echo "symm_sanitizer: 0 errors from both tools"; else echo "symm_sanitizer: $FAILED tool(s) failed"; fi
exit $((FAILED > 0))
