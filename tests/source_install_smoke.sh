#!/usr/bin/env bash
# `pip install ./python` from the checkout, as the README prints it: a plain
# (not editable) install into a fresh virtual environment bundles
# build/libsymm.so and build/symm, so the package works from anywhere, in a
# wheel tagged as `make wheel` tags it (py3-none-manylinux_2_N_ARCH, not
# py3-none-any). A copy of python/ with no build/ beside it is refused with
# what to run.
# Needs `make lib cli` first (make test-packaging does). pip's isolated
# build wants setuptools and wheel: the first run downloads them into
# build/pip-wheels, later runs install from there with no network.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
TMP=$(mktemp -d /tmp/symm-srcinstall-XXXXXX)
trap 'rm -rf "$TMP" "$ROOT/python/build"' EXIT
"$PY" -m venv "$TMP/venv"
WHEELS="$ROOT/build/pip-wheels"
if ! compgen -G "$WHEELS/setuptools-*.whl" > /dev/null || ! compgen -G "$WHEELS/wheel-*.whl" > /dev/null; then
  "$TMP/venv/bin/pip" download --quiet --dest "$WHEELS" "setuptools>=61" wheel
fi
PIP=("$TMP/venv/bin/pip" install --quiet --no-index --find-links "$WHEELS")
(cd "$ROOT" && "${PIP[@]}" ./python)
cd "$TMP"  # away from the repository
want=$(cat "$ROOT/internal/version/VERSION")
tag=$("$PY" "$ROOT/tools/build_wheel.py" --lib "$ROOT/build/libsymm.so" --tool "$ROOT/build/symm" --print-tag)
wheel_file=$(ls "$TMP"/venv/lib/python3*/site-packages/symm-"$want".dist-info/WHEEL)
grep -qx "Tag: $tag" "$wheel_file" && grep -qx "Root-Is-Purelib: false" "$wheel_file" || {
  echo "pip install ./python built a wheel tagged otherwise than make wheel's $tag:"; cat "$wheel_file"; exit 1; }
SYMM_DEVICE=host "$TMP/venv/bin/python" - "$want" <<'PYEOF'
import sys
import symm
path = symm.library_path()
assert "site-packages" in path and path.endswith("symm/libsymm.so"), f"not the bundled library: {path}"
assert symm.version() == sys.argv[1], symm.version()
p = symm.alloc(1 << 20)
symm.free(p, 1 << 20)
from symm import _torch_ext as ext  # its source and headers travel, to be compiled where it runs
missing = [f.name for f in (ext.SOURCE, *ext.HEADERS) if not f.is_file()]
assert "site-packages" in str(ext.SOURCE) and not missing, f"the PyTorch extension's files are not installed: {missing}"
assert (ext.symm_header_dir() / "symm.h").is_file()
print(f"source install OK: symm {symm.version()} from {path}")
PYEOF
out=$("$TMP/venv/bin/symm" version)
[[ $out == "symm $want" ]] || { echo "symm version printed: $out"; exit 1; }
# The SYMM_TORCH_ALLOCATOR start-up line is installed at site-packages' top.
(cd "$TMP" && SYMM_TORCH_ALLOCATOR=1 "$TMP/venv/bin/python" -c 'import sys; assert "symm._autoload" in sys.modules, "symm_autoload.pth was not installed"')
# Without a build/ beside python/: refused, saying what to run.
mkdir -p "$TMP/copy" && cp -rL "$ROOT/python" "$TMP/copy/python"
rm -rf "$TMP/copy/python/build" "$TMP/copy/python/symm/libsymm.so" "$TMP/copy/python/symm/bin"
if "${PIP[@]}" "$TMP/copy/python" > "$TMP/refused.txt" 2>&1; then
  echo "pip install of python/ without build/ succeeded"; exit 1
fi
grep -q 'Run `make lib cli` in the repository first' "$TMP/refused.txt" || { cat "$TMP/refused.txt"; exit 1; }
grep -q 'Go 1.24 or newer' "$TMP/refused.txt" || { echo "the refusal names another Go than go.mod's:"; cat "$TMP/refused.txt"; exit 1; }
echo "source install OK: wheel tag $tag, symm version from the console script; without build/ the install is refused with what to run"
