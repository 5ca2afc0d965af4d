"""tests/check_pages.sh, which make test wraps around each suite: a page
left by a process that is gone is reported and removed, even when its pid
now belongs to another process (pids are reused over a test run), and a
live process's own page is left alone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "check_pages.sh"

MAKE_PAGE = """
import os, struct, sys
d, pid, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = bytearray(400)
b[0:8] = b"SYMMSTAT"
struct.pack_into("<IIQ", b, 16, pid, os.getuid(), start)  # pid, uid, start ticks (publish/page.go)
open(os.path.join(d, f"libsymm-{os.getuid()}-{pid}-00000000deadbeef"), "wb").write(b)
"""


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def check(tmp_path, pid: int, start: int) -> tuple[int, list[str]]:
    env = dict(os.environ, SYMM_PUBLISH_DIR=str(tmp_path))
    p = subprocess.run(["bash", str(SCRIPT), sys.executable, "-c", MAKE_PAGE, str(tmp_path), str(pid), str(start)],
                       env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, sorted(os.listdir(tmp_path))


def test_a_live_process_keeps_its_page(tmp_path):
    me = os.getpid()
    rc, left = check(tmp_path, me, start_ticks(me))
    assert rc == 0 and len(left) == 1


def test_a_reused_pid_does_not_hide_a_page_left_behind(tmp_path):
    me = os.getpid()
    rc, left = check(tmp_path, me, start_ticks(me) + 1)  # this pid, another process's start
    assert rc == 1 and left == []


def test_a_gone_process_page_is_reported(tmp_path):
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rc, left = check(tmp_path, int(p.stdout), 0)
    assert rc == 1 and left == []
