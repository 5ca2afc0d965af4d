# Sourced by the GPU scripts (run.sh, collectives_gpu.sh, symm_one_gpu.sh)
# from the repository root, with ROOT set: the environment every GPU run
# needs, and step, which runs one check into a log and adds a row to the
# summary (run.sh keeps run_step, which also tees the output).

# Never let NCCL, NVSHMEM or torch symmetric memory create multicast objects:
# on the shared hosts that can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
unset SYMM_DEVICE # the GPU backend, never the host one
# libsymm's kernels are compiled with NVRTC at run time: PyTorch's wheel
# brings it (the Python package finds it the same way).
if [[ -z ${SYMM_NVRTC_LIB:-} ]]; then
  SYMM_NVRTC_LIB=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for rel in ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12"):
        if os.path.exists(os.path.join(p, rel)):
            print(os.path.join(p, rel)); raise SystemExit' 2>/dev/null)
  [[ -n $SYMM_NVRTC_LIB ]] && export SYMM_NVRTC_LIB || unset SYMM_NVRTC_LIB
fi

# step NAME LIMIT CMD...: runs CMD with a time limit into $LOGS/logs/NAME.log
# and adds a row to $SUMMARY with the log's last meaningful lines; a step
# that fails or runs out of time sets FAILED=1.
step() {
  local name=$1 limit=$2 start rc status tail
  shift 2
  start=$(date +%s)
  echo "===== $name: $*"
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/logs/$name.log" 2>&1
  rc=$?
  case $rc in 0) status=PASS ;; 124 | 137) status=TIMEOUT ;; *) status="FAIL ($rc)" ;; esac
  [[ $rc != 0 ]] && FAILED=1
  tail=$(grep -E "passed|failed|FAIL|MISMATCH|SKIP|ok$|Error|error:|ERROR SUMMARY|Traceback" "$LOGS/logs/$name.log" | tail -3 | tr '|\n' '/ ' | cut -c1-300)
  echo "| $name | $status | $(($(date +%s) - start)) | $tail |" | tee -a "$SUMMARY"
}

# start_summary DIR TITLE: logs go to $OUT (else DIR), steps' rows to the
# table $SUMMARY ($LOGS/summary.md), headed by TITLE, the GPU and the time;
# FAILED starts at 0.
start_summary() {
  LOGS=${OUT:-$1}
  mkdir -p "$LOGS/logs"
  SUMMARY="$LOGS/summary.md"
  FAILED=0
  {
    echo "# $2, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| step | result | seconds | last lines |"
    echo "| --- | --- | --- | --- |"
  } > "$SUMMARY"
}
