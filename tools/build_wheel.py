#!/usr/bin/env python3
"""Builds the platform wheel of the `symm` Python package with libsymm.so and
the `symm` command-line tool inside (`make wheel`).

No wheel-building package is needed: a wheel is a zip with a .dist-info
directory (PEP 427), written here with the standard library, so the build
works offline on any machine that built libsymm. The platform tag is honest:
manylinux_2_<N>_<arch>, N the newest glibc symbol version libsymm.so and the
tool need (objdump -T), so pip refuses the wheel where glibc is older.

    python3 tools/build_wheel.py --lib build/libsymm.so --tool build/symm --out build/dist
    python3 tools/build_wheel.py --print-tag     # the tag alone: py3-none-manylinux_2_34_x86_64
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "python" / "symm"


def glibc_needed(paths: list[Path]) -> tuple[int, int]:
    """The newest GLIBC_x.y symbol version any of paths imports."""
    best = (2, 17)
    for p in paths:
        out = subprocess.run(["objdump", "-T", str(p)], check=True, capture_output=True, text=True).stdout
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", out):
            best = max(best, (int(major), int(minor)))
    return best


def platform_tag(paths: list[Path]) -> str:
    """The wheel's platform tag for the binaries at paths: manylinux_2_<N>_<arch>,
    N the newest glibc symbol version they import (python/setup.py tags
    `pip install ./python`'s wheel with it too)."""
    g = glibc_needed(paths)
    return f"manylinux_{g[0]}_{g[1]}_{platform.machine()}"


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def metadata(version: str) -> str:
    readme = (ROOT / "python" / "README.md").read_text()
    return "\n".join([
        "Metadata-Version: 2.1",
        "Name: symm",
        f"Version: {version}",
        "Summary: Python bindings for libsymm: a Go caching GPU allocator that serves PyTorch's CUDA tensors",
        "Requires-Python: >=3.9",
        "Provides-Extra: torch",
        'Requires-Dist: torch; extra == "torch"',
        "Description-Content-Type: text/markdown",
        "",
        readme,
    ])


def strip_copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", str(dst)], check=True)


def build(lib: Path, tool: Path, out: Path) -> Path:
    version = (ROOT / "internal" / "version" / "VERSION").read_text().strip()
    tag = f"py3-none-{platform_tag([lib, tool])}"
    name = f"symm-{version}-{tag}.whl"
    dist_info = f"symm-{version}.dist-info"
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        strip_copy(lib, tmpd / "libsymm.so")
        strip_copy(tool, tmpd / "symm")
        files: list[tuple[str, bytes, bool]] = []  # (archive name, data, executable)
        for f in sorted(PKG.glob("*.py")) + [PKG / "py.typed"]:
            files.append((f"symm/{f.name}", f.read_bytes(), False))
        # The PyTorch extension is compiled where it runs, against that torch:
        # its source and libsymm's header travel (python/symm/_torch_ext.py).
        for src in ("_torch_ext.cpp", "_torch_ext_api.h", "_torch_ext_stats.h", "_torch_ext_graphs.h", "_torch_ext_cuda_ipc.h", "_torch_ext_ipc.h", "_torch_ext_snapshot.h", "_torch_ext_ops.h"):
            files.append((f"symm/{src}", (PKG / src).read_bytes(), False))
        # SYMM_TORCH_ALLOCATOR=1: the .pth line at site-packages' top runs at
        # Python's start-up (symm/_autoload.py); _boot is what `symm run` uses.
        # symm_autoload.py (the variable's words) is beside both.
        for boot in ("sitecustomize.py", "symm_autoload.py"):
            files.append((f"symm/_boot/{boot}", (PKG / "_boot" / boot).read_bytes(), False))
        for top in ("symm_autoload.pth", "symm_autoload.py"):
            files.append((top, (PKG / "_boot" / top).read_bytes(), False))
        files.append(("symm/include/symm.h", (ROOT / "include" / "symm.h").read_bytes(), False))
        files.append(("symm/VERSION", (version + "\n").encode(), False))
        files.append(("symm/libsymm.so", (tmpd / "libsymm.so").read_bytes(), True))
        files.append(("symm/bin/symm", (tmpd / "symm").read_bytes(), True))
        files.append((f"{dist_info}/METADATA", metadata(version).encode(), False))
        files.append((f"{dist_info}/WHEEL", "\n".join([
            "Wheel-Version: 1.0", "Generator: libsymm tools/build_wheel.py", "Root-Is-Purelib: false",
            f"Tag: {tag}", ""]).encode(), False))
        files.append((f"{dist_info}/entry_points.txt", b"[console_scripts]\nsymm = symm.__main__:main\n", False))
        record = [record_line(n, d) for n, d, _ in files] + [f"{dist_info}/RECORD,,"]
        files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), False))
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("symm-*.whl"):
            old.unlink()
        path = out / name
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for n, d, exe in files:
                info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                mode = 0o755 if exe else 0o644
                info.external_attr = (stat.S_IFREG | mode) << 16
                z.writestr(info, d)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=ROOT / "build" / "libsymm.so")
    ap.add_argument("--tool", type=Path, default=ROOT / "build" / "symm")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "dist")
    ap.add_argument("--print-tag", action="store_true", help="print the wheel's tag (py3-none-PLATFORM) and build nothing")
    a = ap.parse_args()
    for p in (a.lib, a.tool):
        if not p.is_file():
            print(f"build_wheel: {p} is missing: run make first", file=sys.stderr)
            return 1
    if a.print_tag:
        print(f"py3-none-{platform_tag([a.lib, a.tool])}")
        return 0
    path = build(a.lib, a.tool, a.out)
    print(f"{path} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
