#!/usr/bin/env bash
# The front cache on vs off on the recorded traces, side by side in one run:
# build/bench/bench_trace replays each trace through symm_pool_alloc and
# symm_pool_free with SYMM_POOL_FRONT_CACHE=1 and =0 alternately, ROUNDS
# times each, and the best pass of each setting is compared (the machine's
# noise only ever adds time). Prints ns per call and the ratio on/off, and
# the peak reserved bytes of each setting, which must be equal: what the
# front cache parks never makes the pool grow.
#   bash bench/front_cache.sh [ROUNDS=5] [REPS=8]
# Runs on the host backend unless SYMM_DEVICE is set. Needs make
# build/bench/bench_trace.
set -euo pipefail
rounds=${1:-5}
reps=${2:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bench/bench_trace
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export SYMM_DEVICE=${SYMM_DEVICE:-host} SYMM_PUBLISH=0
printf '| trace | rows | front cache off, ns per call | on | on / off | median of the rounds'"'"' on / off | peak reserved MiB, off / on |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for t in cnn_train gpt2_train llm_infer; do
  zcat "$root/bench/testdata/${t}_trace.csv.gz" >"$tmp/$t.csv"
  declare -A best=([0]=1e30 [1]=1e30) peak=()
  ratios=()
  rows=0
  for ((r = 0; r < rounds; r++)); do
    declare -A this=()
    for e in 1 0; do
      out=$(SYMM_POOL_FRONT_CACHE=$e "$bin" "$tmp/$t.csv" "$reps")
      rows=$(head -1 <<<"$out" | sed -E 's/.*: ([0-9]+) rows.*/\1/')
      ns=$(head -1 <<<"$out" | sed -E 's/.*best pass ([0-9]+) ns.*/\1/')
      peak[$e]=$(sed -nE 's/.*peak reserved ([0-9]+) bytes.*/\1/p' <<<"$out")
      this[$e]=$ns
      best[$e]=$(awk -v a="${best[$e]}" -v b="$ns" 'BEGIN { print (b < a) ? b : a }')
    done
    ratios+=("$(awk -v on="${this[1]}" -v off="${this[0]}" 'BEGIN { print on / off }')")
  done
  med=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  awk -v t="$t" -v n="$rows" -v off="${best[0]}" -v on="${best[1]}" -v med="$med" -v poff="${peak[0]}" -v pon="${peak[1]}" \
    'BEGIN { printf "| %s | %d | %d | %d | %.2f× | %.2f× | %d / %d%s |\n", t, n, off, on, on / off, med,
             poff / 1048576, pon / 1048576, (poff == pon) ? "" : " (differ)" }'
  rm -f "$tmp/$t.csv"
done
