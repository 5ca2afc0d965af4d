#!/usr/bin/env bash
# tests/fuzz_all.sh TIME: fuzzes every fuzz target of the module for TIME
# each (tests/fuzz.sh runs one). The targets are found, not listed: every
# `func FuzzX(` in a _test.go file of a package (build/ and testdata
# skipped), so a new target is fuzzed without anyone adding it here. Each
# target is named before it runs; the last line says how many passed, or
# which failed (the first failure stops the run, its input written to the
# package's testdata/fuzz).
set -u -o pipefail
cd "$(dirname "$0")/.."
time=${1:?usage: tests/fuzz_all.sh TIME (e.g. 20s)}
mapfile -t targets < <(grep -rHo --include='*_test.go' --exclude-dir=build --exclude-dir=testdata \
  '^func Fuzz[A-Za-z0-9_]*(' . | sed -E 's#^\./(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($#\1 \2#' | sort -u)
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "fuzz_all: no fuzz targets found" >&2
  exit 1
fi
n=0
for t in "${targets[@]}"; do
  read -r pkg name <<< "$t"
  echo "== fuzz ./$pkg $name ($time)"
  if ! bash tests/fuzz.sh "./$pkg" "$name" "$time"; then
    echo "fuzz_all: ./$pkg $name FAILED after $n of ${#targets[@]} targets passed"
    exit 1
  fi
  n=$((n + 1))
done
echo "fuzz_all: all $n fuzz targets passed ($time each): ${targets[*]// /.}"
