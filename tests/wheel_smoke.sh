#!/usr/bin/env bash
# The wheel, installed as a user would: a fresh virtual environment, no
# repository on the path, no Go. Checks that `import symm` finds the bundled
# libsymm.so, that the pool works (host backend: no GPU here), that the
# versions agree, and that `symm` (console script) and `python -m symm` run.
#   bash tests/wheel_smoke.sh [WHEEL]     (default: build/dist/symm-*.whl)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEEL=${1:-$(ls "$ROOT"/build/dist/symm-*.whl)}
PY=${PYTHON:-python3}
VENV=$(mktemp -d /tmp/symm-wheel-XXXXXX)
trap 'rm -rf "$VENV"' EXIT
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --no-index --no-deps "$WHEEL"
cd "$VENV"  # away from the repository: nothing of it may be used
want=$(cat "$ROOT/internal/version/VERSION")
SYMM_DEVICE=host "$VENV/bin/python" - "$want" <<'PYEOF'
import os, sys
import symm
want = sys.argv[1]
path = symm.library_path()
assert "site-packages" in path and path.endswith("symm/libsymm.so"), f"not the bundled library: {path}"
assert symm.__version__ == want == symm.version(), (symm.__version__, symm.version(), want)
p = symm.alloc(1 << 20)
symm.free(p, 1 << 20)
st = symm.memory_stats()
assert st["allocation.all.allocated"] == 1, st
from symm import _torch_ext as ext  # its source and headers travel, to be compiled where it runs
missing = [f.name for f in (ext.SOURCE, *ext.HEADERS) if not f.is_file()]
assert "site-packages" in str(ext.SOURCE) and not missing, f"the PyTorch extension's files are not installed: {missing}"
assert (ext.symm_header_dir() / "symm.h").is_file()
print(f"wheel OK: symm {symm.__version__} from {path}, backend {symm.backend()}")
PYEOF
# SYMM_TORCH_ALLOCATOR=1: the wheel's .pth line arms libsymm at Python's
# start-up (it becomes torch's allocator when torch is imported); unset, the
# line imports nothing.
SYMM_TORCH_ALLOCATOR=1 "$VENV/bin/python" -c 'import sys; assert "symm._autoload" in sys.modules, "symm_autoload.pth did not run"'
"$VENV/bin/python" -c 'import sys; assert "symm" not in sys.modules, "symm imported at start-up without SYMM_TORCH_ALLOCATOR"'
out=$("$VENV/bin/symm" version)
[[ $out == "symm $want" ]] || { echo "symm version printed: $out"; exit 1; }
out=$("$VENV/bin/python" -m symm version)
[[ $out == "symm $want" ]] || { echo "python -m symm version printed: $out"; exit 1; }
# No driver here: symm info says so and exits 3; on a GPU machine it exits 0.
set +e
"$VENV/bin/symm" info > "$VENV/info.txt" 2>&1
rc=$?
set -e
[[ $rc == 0 || $rc == 3 ]] || { cat "$VENV/info.txt"; echo "symm info exited $rc"; exit 1; }
echo "wheel OK: symm version, python -m symm version, symm info (exit $rc) from the console script"
