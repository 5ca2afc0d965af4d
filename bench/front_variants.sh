#!/usr/bin/env bash
# What the front cache's rules cost and buy: the recorded traces replayed
# (build/bench/bench_trace, host backend) through this tree and through
# variants of it that relax the rules keeping every peak the pool's own,
# side by side, with each variant's time as a ratio to the front cache off
# in the same round and its peak allocated and reserved bytes.
#
#   bash bench/front_variants.sh build DIR        # worktrees of HEAD, patched and built, binaries into DIR
#   bash bench/front_variants.sh run DIR [ROUNDS=12]  # anywhere DIR was copied (no Go needed)
#
# Variants (each a patch of export/front.cpp, and of allocator/cache.go where
# "no peak rule" says so; they fail to apply, loudly, once that code moves):
#   base      this tree (the front cache off, then on)
#   nomiss    a miss hands back only the deferred frees; no peak rule
#   nomiss64  nomiss with SYMM_POOL_FRONT_CACHE_MAX=64MiB (large blocks parked too)
#   small     small-pool blocks survive small-pool misses; no peak rule
#   fitpeak   a miss hands back only its stream's parked blocks of at least its size
#   fit       fitpeak with no peak rule
# "No peak rule": a request that could raise a peak no longer takes every
# parked block back first, so the pool's peaks count parked blocks
# (allocated_bytes.all.peak above the true one).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:?build DIR or run DIR [ROUNDS]}
dir=${2:?DIR}

patch_variant() { # patch_variant TREE VARIANT
  python3 - "$1" "$2" <<'PY'
import sys
d, v = sys.argv[1], sys.argv[2]
def sub(path, old, new):
    p = d + '/' + path
    s = open(p).read()
    assert old in s, f"{path}: the code this variant patches has changed"
    open(p, 'w').write(s.replace(old, new))
def no_peak_rule():
    sub('allocator/cache.go', "if parked != nil && !s.belowPeaks(r, n, k) && s.dev.holdsParked(parked) {",
        "if false && parked != nil && !s.belowPeaks(r, n, k) && s.dev.holdsParked(parked) {")
take = "out, max,\n                 1u << t | 4u);"
if v == 'nomiss':
    no_peak_rule()
    sub('export/front.cpp', take, "out, max,\n                 4u);")
elif v == 'small':
    no_peak_rule()
    sub('export/front.cpp', take, "out, max,\n                 (t == 1 ? 2u : 0u) | 4u);")
elif v in ('fitpeak', 'fit'):
    if v == 'fit':
        no_peak_rule()
    sub('export/front.cpp',
        "int take_for_miss(int dev, uintptr_t stream, int t, Entry *out, int max) {\n"
        "  return take_if([=](int which, const Entry &e) { return e.dev == dev && (which == 2 || e.stream == stream); }, out, max,",
        "int take_for_miss(int dev, uintptr_t stream, int t, uint64_t size, Entry *out, int max) {\n"
        "  return take_if([=](int which, const Entry &e) { return e.dev == dev && (which == 2 || (e.stream == stream && (which == 1 || e.bsize >= size))); }, out, max,")
    sub('export/front.cpp', "take_for_miss(dev, stream, t, back, kBatch)", "take_for_miss(dev, stream, t, size, back, kBatch)")
PY
}

if [[ $cmd == build ]]; then
  mkdir -p "$dir"
  tree=
  trap '[[ -n $tree ]] && git -C "$root" worktree remove --force "$tree"' EXIT
  for v in base nomiss small fitpeak fit; do
    tree=$(mktemp -d)
    git -C "$root" worktree add -q --detach "$tree" HEAD
    patch_variant "$tree" "$v"
    make -s -C "$tree" build/bench/bench_trace >/dev/null
    mkdir -p "$dir/$v/bench"
    cp "$tree/build/bench/bench_trace" "$dir/$v/bench/"   # RUNPATH $ORIGIN/..
    cp -L "$tree/build/libsymm.so.0" "$dir/$v/"
    git -C "$root" worktree remove --force "$tree"
    tree=
  done
  cp -r "$root/bench/testdata" "$dir/testdata"
  echo "built into $dir"
  exit 0
fi

[[ $cmd == run ]] || { echo "usage: $0 build DIR | run DIR [ROUNDS]" >&2; exit 2; }
rounds=${3:-12}
export SYMM_DEVICE=host SYMM_PUBLISH=0
specs=("off|base|SYMM_POOL_FRONT_CACHE=0" "on|base|SYMM_POOL_FRONT_CACHE=1" "nomiss|nomiss|SYMM_POOL_FRONT_CACHE=1"
  "nomiss64|nomiss|SYMM_POOL_FRONT_CACHE=1 SYMM_POOL_FRONT_CACHE_MAX=64MiB" "small|small|SYMM_POOL_FRONT_CACHE=1"
  "fitpeak|fitpeak|SYMM_POOL_FRONT_CACHE=1" "fit|fit|SYMM_POOL_FRONT_CACHE=1")
printf '| trace | variant | best pass, ns per call | / off, median of rounds | range | peak allocated MiB | peak reserved MiB |\n'
printf '| --- | --- | ---: | ---: | --- | --- | --- |\n'
for t in cnn_train gpt2_train llm_infer; do
  csv=$(mktemp)
  zcat "$dir/testdata/${t}_trace.csv.gz" >"$csv"
  declare -A ratios=() mins=() pr=() pa=()
  for ((r = 0; r < rounds; r++)); do
    declare -A this=()
    for spec in "${specs[@]}"; do
      IFS='|' read -r label v envs <<<"$spec"
      out=$(env $envs "$dir/$v/bench/bench_trace" "$csv" 4)
      ns=$(head -1 <<<"$out" | sed -E 's/.*best pass ([0-9]+) ns.*/\1/')
      this[$label]=$ns
      [[ -z ${mins[$label]:-} || $ns -lt ${mins[$label]} ]] && mins[$label]=$ns
      read -r a b <<<"$(sed -nE 's/peak allocated ([0-9]+) bytes, peak reserved ([0-9]+) bytes/\1 \2/p' <<<"$out")"
      pa[$label]="${pa[$label]:-} $((a >> 20))"
      pr[$label]="${pr[$label]:-} $((b >> 20))"
    done
    for spec in "${specs[@]}"; do
      IFS='|' read -r label _ _ <<<"$spec"
      ratios[$label]="${ratios[$label]:-} $(awk -v a="${this[$label]}" -v b="${this[off]}" 'BEGIN { printf "%.3f", a / b }')"
    done
  done
  for spec in "${specs[@]}"; do
    IFS='|' read -r label _ _ <<<"$spec"
    s=$(tr ' ' '\n' <<<"${ratios[$label]}" | grep . | sort -g)
    med=$(awk '{ v[NR] = $1 } END { printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }' <<<"$s")
    # A variant's peaks may differ between runs: a thread that moves to
    # another CPU leaves its parked blocks behind. Every value seen is listed.
    echo "| $t | $label | ${mins[$label]} | ${med}× | $(head -1 <<<"$s")–$(tail -1 <<<"$s") |" \
      "$(tr ' ' '\n' <<<"${pa[$label]}" | grep . | sort -un | paste -sd/) |" \
      "$(tr ' ' '\n' <<<"${pr[$label]}" | grep . | sort -un | paste -sd/) |"
  done
  rm -f "$csv"
done
