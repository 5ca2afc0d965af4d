#!/usr/bin/env bash
# make install into a temporary prefix, then build the README's C example
# (examples/c/pool_example.c) with nothing but pkg-config, run it, and check
# that make uninstall leaves the prefix empty.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=$(mktemp -d /tmp/symm-prefix-XXXXXX)
WORK=$(mktemp -d /tmp/symm-cexample-XXXXXX)
trap 'rm -rf "$PREFIX" "$WORK"' EXIT
make -s -C "$ROOT" install PREFIX="$PREFIX" > /dev/null
test -f "$PREFIX/lib/libsymm.so.0" -a -L "$PREFIX/lib/libsymm.so" -a -f "$PREFIX/include/symm.h" -a -x "$PREFIX/bin/symm"
soname=$(objdump -p "$PREFIX/lib/libsymm.so.0" | awk '/SONAME/ {print $2}')
[[ $soname == libsymm.so.0 ]] || { echo "SONAME is '$soname'"; exit 1; }
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
want=$(cat "$ROOT/internal/version/VERSION")
[[ $(pkg-config --modversion symm) == "$want" ]]
cp "$ROOT/examples/c/pool_example.c" "$WORK/"
cd "$WORK"
# shellcheck disable=SC2046 # word splitting of pkg-config's flags is the point
${CC:-cc} -Wall -Werror pool_example.c $(pkg-config --cflags --libs symm) -o pool_example
out=$(SYMM_DEVICE=host LD_LIBRARY_PATH="$PREFIX/lib" ./pool_example)
echo "$out"
grep -q "libsymm $want (header $want)" <<< "$out"
grep -q "allocation.all.allocated = 1" <<< "$out"
make -s -C "$ROOT" uninstall PREFIX="$PREFIX" > /dev/null
left=$(find "$PREFIX" -type f -o -type l)
[[ -z $left ]] || { echo "make uninstall left: $left"; exit 1; }
echo "install OK: make install, pkg-config $(pkg-config --version 2>/dev/null || true) built the C example, make uninstall cleaned up"
