"""`python -m symm ...` and the `symm` console script: the command-line tool
(`symm info`, `symm bench`, `symm version`), a Go program the wheel carries as
symm/bin/symm. In a source checkout the repository's build/symm is used."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def tool_path() -> Path:
    """The symm executable: the one in the package (wheel), else build/symm."""
    for p in (_HERE / "bin" / "symm", _HERE.parent.parent / "build" / "symm"):
        if p.is_file() and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError(
        f"the symm command-line tool is neither in {_HERE / 'bin'} (installed from a wheel) nor in the "
        "repository's build/ (run make there)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        path = tool_path()
    except FileNotFoundError as e:
        print(f"symm: {e}", file=sys.stderr)
        return 1
    # NCCL and NVSHMEM are looked for in this Python's site-packages too.
    os.environ.setdefault("SYMM_PYTHON", sys.executable)
    os.execv(str(path), [str(path), *args])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
