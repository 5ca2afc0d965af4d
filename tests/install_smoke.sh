#!/usr/bin/env bash
# The README's C recipe, run exactly as printed (the fenced block after
# "**C**:"), with HOME set to a fresh directory so that its
# PREFIX=$HOME/.local is a temporary prefix: make install, pkg-config with
# the exported PKG_CONFIG_PATH, the example built and run without
# LD_LIBRARY_PATH (the .pc's rpath). Then the install is checked (soname,
# version) and make uninstall must leave the prefix empty.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FAKEHOME=$(mktemp -d /tmp/symm-home-XXXXXX)
trap 'rm -rf "$FAKEHOME"' EXIT
recipe=$(awk '/^\*\*C\*\*:/ {c=1; next} c && /^```sh/ {b=1; next} b && /^```/ {exit} b' "$ROOT/README.md")
[[ -n $recipe ]] || { echo "install_smoke: no C recipe found in README.md after **C**:"; exit 1; }
echo "README's C recipe:"
echo "$recipe" | sed 's/^/  /'
# Go keeps its caches under the real HOME: a build inside the recipe must not
# download or compile everything again.
gocache=$(go env GOCACHE) gomodcache=$(go env GOMODCACHE) gopath=$(go env GOPATH)
out=$(cd "$ROOT" && env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH HOME="$FAKEHOME" MAKEFLAGS=-s \
  GOCACHE="$gocache" GOMODCACHE="$gomodcache" GOPATH="$gopath" bash -euo pipefail -c "$recipe")
echo "$out"
PREFIX="$FAKEHOME/.local"
want=$(cat "$ROOT/internal/version/VERSION")
grep -q "libsymm $want (header $want)" <<< "$out"
grep -q "allocation.all.allocated = 1" <<< "$out"
test -f "$PREFIX/lib/libsymm.so.0" -a -L "$PREFIX/lib/libsymm.so" -a -f "$PREFIX/include/symm.h" -a -x "$PREFIX/bin/symm"
soname=$(objdump -p "$PREFIX/lib/libsymm.so.0" | awk '/SONAME/ {print $2}')
[[ $soname == libsymm.so.0 ]] || { echo "SONAME is '$soname'"; exit 1; }
[[ $(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --modversion symm) == "$want" ]]
make -s -C "$ROOT" uninstall PREFIX="$PREFIX" > /dev/null
left=$(find "$PREFIX" -type f -o -type l)
[[ -z $left ]] || { echo "make uninstall left: $left"; exit 1; }
echo "install OK: the README's C recipe ran as printed (make install, pkg-config $(pkg-config --version 2>/dev/null || true), no LD_LIBRARY_PATH); make uninstall cleaned up"
