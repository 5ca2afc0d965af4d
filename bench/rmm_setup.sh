#!/usr/bin/env bash
# Installs RAPIDS RMM (rmm-cu13, librmm-cu13, rapids-logger) from the wheels in
# .whl/ into a private directory on the GPU machine (no network there), and
# prints the line to export so that Python finds it:
#
#   eval "$(bash bench/rmm_setup.sh)"      # then: python3 bench/bench_torch.py
#
# Only these three wheels are installed (--no-deps): the machine's own torch,
# numpy, cuda-bindings and nvidia-* wheels stay the ones Python uses.
# Diagnostics go to standard error; standard output is the export line only.
#
# Fetching the wheels (on a machine with network, in the repository root; .whl/
# is git-ignored and travels with `carry: [".whl"]`, about 6 MiB):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl rmm-cu13 librmm-cu13 'rapids-logger==0.3.*'
# rmm-cu13 also requires cuda-bindings>=13.0.1,<14 and numpy>=2,<3, which the
# GPU machine already has (checked below).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHL=${RMM_WHL_DIR:-$ROOT/.whl}
SITE=${RMM_SITE:-/tmp/site}
PY=${PYTHON:-python3}

shopt -s nullglob
wheels=("$WHL"/rmm_cu13-*.whl "$WHL"/librmm_cu13-*.whl "$WHL"/rapids_logger-*.whl)
shopt -u nullglob
if [ "${#wheels[@]}" -ne 3 ]; then
  echo "rmm_setup: want exactly one each of rmm_cu13, librmm_cu13, rapids_logger wheels in $WHL; found: ${wheels[*]:-none}" >&2
  exit 1
fi

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "${wheels[@]}" >&2

# What the wheels need from the machine, and whether it imports.
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" - >&2 <<'EOF' || true
from importlib.metadata import version, PackageNotFoundError
for name, want in (("cuda-bindings", ">=13.0.1,<14"), ("numpy", ">=2,<3"), ("torch", "")):
    try:
        print(f"rmm_setup: {name} {version(name)} {('(rmm wants ' + want + ')') if want else ''}")
    except PackageNotFoundError:
        print(f"rmm_setup: {name} NOT INSTALLED {('(rmm wants ' + want + ')') if want else ''}")
try:
    import rmm, rmm.mr
    print(f"rmm_setup: import rmm OK: rmm {rmm.__version__} from {rmm.__file__}")
except Exception as e:
    print(f"rmm_setup: import rmm FAILED: {type(e).__name__}: {e}")
EOF

echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
