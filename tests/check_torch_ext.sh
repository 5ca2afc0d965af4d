#!/usr/bin/env bash
# Compiles libsymm's PyTorch extension (python/symm/_torch_ext.cpp) against a
# real torch's C++ headers, with the flags the package uses at first use
# (symm._torch_ext.compile_flags), warnings as errors: CI has no GPU and no
# torch, so the headers come from pip's wheels (torch, and the CUDA runtime's
# headers torch's CUDA build includes), unpacked into build/torch-headers
# once. Compile only: linking needs torch's CUDA libraries (the GPU machine's
# tests/device/test_torch_replace.py builds, loads and runs it).
#
#   bash tests/check_torch_ext.sh [TORCH_VERSION]     # default 2.11.0
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${1:-${SYMM_TORCH_VERSION:-2.11.0}}
dir=build/torch-headers/$ver
py=${PYTHON:-python3}
if [[ ! -f $dir/.done ]]; then
  rm -rf "$dir" && mkdir -p "$dir/wheels"
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dir/wheels" \
    "torch==$ver" 'nvidia-cuda-runtime>=13,<14' 'nvidia-cuda-crt>=13,<14'
  # Headers only: the wheel's 2 GB of libraries stay zipped.
  "$py" - "$dir" <<'PY'
import sys, zipfile, pathlib
d = pathlib.Path(sys.argv[1])
for w in sorted((d / "wheels").glob("*.whl")):
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            if n.startswith("torch/include/") or "/include/" in n and n.startswith("nvidia/"):
                z.extract(n, d)
PY
  rm -rf "$dir/wheels"
  touch "$dir/.done"
fi
flags=$(PYTHONPATH=python "$py" - "$dir" <<'PY'
import sys, shlex
from pathlib import Path
from symm import _torch_ext as e
d = Path(sys.argv[1]).resolve()
f = e.compile_flags(d / "torch", [d / "nvidia" / "cu13" / "include"], e.symm_header_dir(), "symm_torch_ext_check")
print(shlex.join(f))
PY
)
out=build/torch-headers/_torch_ext_check.o
echo "compiling python/symm/_torch_ext.cpp against torch $ver's headers"
# shellcheck disable=SC2086
eval "${CXX:-g++} -c python/symm/_torch_ext.cpp -o $out -Wall -Wextra -Werror $flags"
# Every torch and c10 symbol it needs must be one torch exports (a name
# declared in a header but hidden in the library fails only at load time,
# on the GPU machine): the same check against the wheel's libraries would
# need them unpacked, so the known-hidden ones are listed instead.
if nm -C -u "$out" | grep -q '_AllocationMetadata'; then
  echo "check_torch_ext: uses torch's _AllocationMetadata, which libtorch_cuda does not export" >&2
  exit 1
fi
echo "check_torch_ext: ok ($(du -h $out | cut -f1) object)"
