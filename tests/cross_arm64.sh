#!/usr/bin/env bash
# libsymm must build for arm64 (GH200/GB200 hosts): cross-compiles the
# library (Go and the C/C++ shim) and the symm tool with GOARCH=arm64 and an
# aarch64 cross compiler, and checks the result is an aarch64 ELF. The cross
# compiler is installed with apt-get when it is missing and this runs as
# root; where it can be neither found nor installed, the check says SKIP
# loudly (it is then not a pass).
set -euo pipefail
cd "$(dirname "$0")/.."
CC_ARM=${CC_ARM64:-aarch64-linux-gnu-gcc}
CXX_ARM=${CXX_ARM64:-aarch64-linux-gnu-g++}
if ! command -v "$CC_ARM" > /dev/null || ! command -v "$CXX_ARM" > /dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
    echo "cross_arm64: installing gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
    { apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu g++-aarch64-linux-gnu ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu g++-aarch64-linux-gnu; }; } > /tmp/cross_arm64_apt.log 2>&1 ||
      { echo "SKIP cross_arm64: no aarch64 cross compiler and apt-get could not install one (/tmp/cross_arm64_apt.log)"; tail -3 /tmp/cross_arm64_apt.log; exit 0; }
  else
    echo "SKIP cross_arm64: no aarch64 cross compiler ($CC_ARM) and not root with apt-get to install one"
    exit 0
  fi
fi
OUT=build/arm64
mkdir -p "$OUT"
export CGO_ENABLED=1 GOOS=linux GOARCH=arm64 CC=$CC_ARM CXX=$CXX_ARM
# The link flags (version script, soname) are the Makefile's, asked for here.
ldflags=$(make -s --no-print-directory print-ldflags)
go build -buildmode=c-shared -trimpath -ldflags "$ldflags" -o "$OUT/libsymm.so" ./export
go build -trimpath -o "$OUT/symm" ./cmd/symm
go vet ./...
for f in "$OUT/libsymm.so" "$OUT/symm"; do
  machine=$(od -An -t u2 -j 18 -N 2 "$f" | tr -d ' ')
  [[ $machine == 183 ]] || { echo "$f: ELF machine $machine, not aarch64 (183)"; exit 1; }
done
echo "cross_arm64: libsymm.so and symm built for linux/arm64 (C/C++ shim included), go vet clean"
