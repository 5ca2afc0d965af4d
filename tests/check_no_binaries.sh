#!/usr/bin/env bash
# No build output is tracked: fails when git (in the repository given, default
# this one) tracks an ELF file (an executable, a shared library, an object),
# a static archive or a wheel. Reads each file's first bytes, so it needs no
# `file` command.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
git ls-files -z | python3 -c '
import sys
bad = []
for name in sys.stdin.buffer.read().split(b"\0"):
    if not name:
        continue
    path = name.decode()
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        continue
    if head[:4] == b"\x7fELF" or head.startswith(b"!<arch>\n") or path.endswith((".whl", ".so")) or ".so." in path:
        bad.append(path)
if bad:
    print("build outputs tracked by git (remove them and .gitignore them):")
    print("\n".join(bad))
    sys.exit(1)
print("check_no_binaries: no ELF file, archive, shared library or wheel is tracked")
'
