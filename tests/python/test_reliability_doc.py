"""docs/RELIABILITY.md stays true: every case of the reliability issue has a
row, every row names at least one test, and every test it names exists.

References in the "test" column (backquoted, several per row allowed):
  go:PKG.TestName            a Go test or fuzz target (func TestName / FuzzName in PKG/*_test.go)
  go:PKG.TestName/Sub        the same, with a subtest name that must appear in the file
  c:tests/c/FILE.c:WORD      a C test program containing WORD (a scenario name or a check)
  py:FILE::test_name         a pytest function
  gpu:FILE:WORD              a GPU script (tests/device/) containing WORD
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "RELIABILITY.md"

# The cases the reliability issue lists; each must be the start of a row's
# first cell (case-insensitive).
REQUIRED = [
    "NULL pointers", "negative and out-of-range devices", "unknown pointers", "interior pointers", "double free",
    "size 0", "SIZE_MAX and sizes over the device", "unknown or stale handles", "wrong group sizes",
    "calls before init and after shutdown", "calls from a forked child", "random arguments at every C entry point",
    "peer killed before the rendezvous", "peer killed before publishing anything",
    "peer killed after the group's link was made", "peer killed after sending its block's note",
    "peer killed after mapping", "store server gone mid-rendezvous",
    "socket name already taken", "descriptor exhaustion", "backend allocation failures injected (pool)",
    "backend allocation failures injected (symmetric)", "descriptor sockets accept only the expected peer",
    "a link's connections refuse other processes", "store binds loopback by default", "store token required",
    "store bounds key and value sizes", "store protocol parser fuzzed", "10^6 random pool operations from 16 threads",
    "8 processes × 1000 alloc/rendezvous/free cycles", "memcheck", "1000 symmetric cycles on 2 GPUs",
    "DataLoader with forked workers",
    # A local attacker of another uid, and peers that misbehave.
    "a rank's published name taken by another uid", "a rank's link metadata forged in the store",
    "a rank's pid reused", "ranks in another pid namespace", "a peer that sends without end",
    "notes of a failed handshake", "a failure cause longer than a message", "two threads of one rank",
    "a meeting of one kind against another",
]


def rows():
    out = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("|") or line.startswith("| ---") or line.startswith("| case"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3:
            out.append(cells)
    return out


def exists(ref: str) -> bool:
    kind, _, rest = ref.partition(":")
    if kind == "go":
        pkg, _, name = rest.rpartition(".")
        name, _, sub = name.partition("/")
        for f in (ROOT / pkg).glob("*_test.go"):
            text = f.read_text()
            if re.search(rf"^func {re.escape(name)}\(", text, re.M) and (not sub or sub in text):
                return True
        return False
    if kind in ("c", "gpu"):
        path, _, word = rest.partition(":")
        f = ROOT / path
        return f.is_file() and (not word or word in f.read_text())
    if kind == "py":
        path, _, name = rest.partition("::")
        f = ROOT / path
        return f.is_file() and re.search(rf"^def {re.escape(name)}\(", f.read_text(), re.M) is not None
    return False


def test_every_case_has_a_row():
    firsts = [r[0].lower() for r in rows()]
    missing = [c for c in REQUIRED if not any(f.startswith(c.lower()) for f in firsts)]
    assert not missing, f"docs/RELIABILITY.md has no row for: {missing}"


def test_every_row_names_existing_tests():
    bad = []
    for r in rows():
        refs = re.findall(r"`((?:go|c|py|gpu):[^`]+)`", r[1])
        if not refs:
            bad.append(f"{r[0]}: no test named")
        for ref in refs:
            if not exists(ref):
                bad.append(f"{r[0]}: {ref} does not exist")
        if not r[2]:
            bad.append(f"{r[0]}: no result")
    assert not bad, "\n".join(bad)


def test_checker_catches_a_missing_test():
    assert not exists("go:symmetric.TestThatDoesNotExist")
    assert not exists("py:tests/python/test_symmetric.py::test_nope")
    assert exists("go:symmetric.TestStrangerIsRefused")
