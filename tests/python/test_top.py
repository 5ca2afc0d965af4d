"""symm top against real processes on the host backend: several processes
publish their statistics while others allocate, `symm top --json` sees each
with the figures the process reports itself, a killed process's page is
removed, bad pages are named, and the live view works in a real terminal
(tmux)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PUBLISH_DIR, MiB, ROOT, child_env

SYMM = ROOT / "build" / "symm"

# A worker allocates its blocks, reports its own statistics (device 0) and pid
# in DIR/ready-N.json, then either holds still or keeps allocating and freeing
# (churn) until DIR/stop appears.
WORKER = r"""
import json, os, sys, time
import symm
d, n, churn = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
held = [symm.alloc((n + 1) * (12 << 20) + k * 4096) for k in range(3)]
held.append(symm.alloc(2048 * (n + 1)))
symm.free(held.pop(0))
st = symm.memory_stats(0)
keys = ("allocated_bytes.all.current", "reserved_bytes.all.current", "reserved_bytes.all.peak", "segment.all.current")
with open(os.path.join(d, f"ready-{n}.tmp"), "w") as f:
    json.dump({"pid": os.getpid(), **{k: st[k] for k in keys}}, f)
os.rename(os.path.join(d, f"ready-{n}.tmp"), os.path.join(d, f"ready-{n}.json"))
while not os.path.exists(os.path.join(d, "stop")):
    if churn:
        for size in (1 << 20, 5 << 20, 300, 9 << 20):
            symm.free(symm.alloc(size))
    else:
        time.sleep(0.02)
"""


def top_json(pubdir: Path) -> dict:
    p = subprocess.run([str(SYMM), "top", "--json"], env=dict(os.environ, SYMM_PUBLISH_DIR=str(pubdir)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def workers(tmp_path):
    if not SYMM.exists():
        pytest.fail("build/symm is missing: make cli")
    pubdir, ctl = tmp_path / "pages", tmp_path / "ctl"
    pubdir.mkdir()
    ctl.mkdir()
    env = child_env({"SYMM_PUBLISH_DIR": str(pubdir), "SYMM_DEVICE": "host"})
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(ctl), str(n), "1" if n == 2 else "0"], env=env)
             for n in range(3)]
    try:
        deadline = time.time() + 60
        while not all((ctl / f"ready-{n}.json").exists() for n in range(3)):
            assert time.time() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), "a worker died"
            time.sleep(0.05)
        reports = [json.loads((ctl / f"ready-{n}.json").read_text()) for n in range(3)]
        yield pubdir, ctl, procs, reports
    finally:
        (ctl / "stop").touch()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def by_pid(snap: dict) -> dict:
    return {p["pid"]: p for p in snap["processes"]}


def page_of(pubdir: Path, pid: int) -> Path:
    """The page of process pid (libsymm-UID-PID-ID: ID is random)."""
    pages = list(pubdir.glob(f"libsymm-{os.getuid()}-{pid}-*"))
    assert len(pages) == 1, pages
    return pages[0]


def uid_name(uid: int) -> str:
    """What symm top says of a user: uid N (name)."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def test_top_json_sees_every_process(workers):
    pubdir, ctl, procs, reports = workers
    # The steady workers' pages converge to what they report (the page is
    # refreshed every 250 ms); the churning one is listed while it allocates
    # (once its first refresh after its allocations has come: its process
    # may have started later than the others').
    deadline = time.time() + 10
    while True:
        snap = by_pid(top_json(pubdir))
        ok = all(r["pid"] in snap for r in reports) and all(
            snap[r["pid"]]["devices"][0]["stats"][k] == r[k] for r in reports[:2] for k in r if k != "pid") and \
            snap[reports[2]["pid"]]["devices"][0]["stats"]["allocation.all.allocated"] > 4
        if ok or time.time() > deadline:
            break
        time.sleep(0.1)
    for r in reports[:2]:
        st = snap[r["pid"]]["devices"][0]["stats"]
        for k, v in r.items():
            if k != "pid":
                assert st[k] == v, (r["pid"], k, st[k], v)
        assert snap[r["pid"]]["backend"] == "host"
        assert "import symm" in snap[r["pid"]]["command"]
        assert snap[r["pid"]]["devices"][0]["streams"], "per-stream usage is listed"
    churner = snap[reports[2]["pid"]]["devices"][0]["stats"]
    assert churner["allocation.all.allocated"] > 4, "the churning worker's page follows its allocations"

    # A killed process leaves its page; the next listing removes it.
    page = page_of(pubdir, reports[2]["pid"])
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait(timeout=10)
    assert page.exists(), "SIGKILL runs no destructor"
    snap = top_json(pubdir)
    assert reports[2]["pid"] not in by_pid(snap)
    assert str(page) in snap["removed"]
    assert not page.exists()

    # Pages that cannot be trusted or read are named, never read.
    garbage = pubdir / f"libsymm-{os.getuid()}-1-{1:016x}"
    garbage.write_bytes(b"\x00" * 4096)
    garbage.chmod(0o600)
    problems = {p["path"]: p["error"] for p in top_json(pubdir)["problems"]}
    assert "not a libsymm statistics page" in problems[str(garbage)]
    if os.getuid() == 0:  # pages owned by another user: only root can make them here
        mine = page_of(pubdir, reports[0]["pid"])
        theirs = pubdir / mine.name.replace(f"libsymm-{os.getuid()}-", "libsymm-65534-")
        planted = pubdir / (mine.name[:-16] + f"{9:016x}")
        for p in (theirs, planted):
            shutil.copy(mine, p)
            os.chown(p, 65534, 65534)
        snap = top_json(pubdir)
        problems = {p["path"]: p["error"] for p in snap["problems"]}
        assert str(theirs) not in problems, "another user's pages are not looked at"
        assert f"owned by {uid_name(65534)}, not by {uid_name(0)}" in problems[str(planted)]
        assert len(snap["processes"]) == 2
        theirs.unlink()
        planted.unlink()
    garbage.unlink()

    # At exit a process removes its own page.
    (ctl / "stop").touch()
    for p in procs[:2]:
        assert p.wait(timeout=30) == 0
    assert not any(pubdir.iterdir()), list(pubdir.iterdir())


# Allocates three 8 MiB blocks, frees one (the front cache parks it) and,
# without asking for its own statistics (which would hand the parked block
# back), says it is ready; on DIR/stats it writes memory_stats() there.
PARKED = r"""
import json, os, sys, time
import symm
d = sys.argv[1]
held = [symm.alloc(8 << 20) for _ in range(3)]
symm.free(held.pop())
open(os.path.join(d, "ready"), "w").close()
while not os.path.exists(os.path.join(d, "stats")):
    time.sleep(0.01)
with open(os.path.join(d, "stats.tmp"), "w") as f:
    json.dump(symm.memory_stats(0), f)
os.rename(os.path.join(d, "stats.tmp"), os.path.join(d, "stats.json"))
while not os.path.exists(os.path.join(d, "stop")):
    time.sleep(0.01)
"""


def test_top_counts_front_cached_blocks_as_freed(tmp_path):
    """A block freed into the front cache is freed on the page within a
    refresh, and the page equals the process's own memory_stats()."""
    pubdir, ctl = tmp_path / "pages", tmp_path / "ctl"
    pubdir.mkdir()
    ctl.mkdir()
    env = child_env({"SYMM_PUBLISH_DIR": str(pubdir), "SYMM_DEVICE": "host", "SYMM_POOL_FRONT_CACHE": "1"})
    proc = subprocess.Popen([sys.executable, "-c", PARKED, str(ctl)], env=env)
    try:
        deadline = time.time() + 60
        while not (ctl / "ready").exists():
            assert time.time() < deadline and proc.poll() is None, "the worker did not start"
            time.sleep(0.01)
        # The page is refreshed every 250 ms: a few refreshes are allowed for
        # a loaded machine, far less than the minute a parked block can sit.
        deadline = time.time() + 2
        while True:
            st = by_pid(top_json(pubdir))[proc.pid]["devices"][0]["stats"]
            if st["allocated_bytes.all.current"] == 16 * MiB or time.time() > deadline:
                break
            time.sleep(0.05)
        assert st["allocated_bytes.all.current"] == 16 * MiB, st
        assert st["allocated_bytes.all.freed"] == 8 * MiB, st
        assert st["active.all.current"] == 2 and st["active.all.freed"] == 1, st
        (ctl / "stats").touch()
        while not (ctl / "stats.json").exists():
            assert time.time() < deadline + 60 and proc.poll() is None, "the worker did not report"
            time.sleep(0.01)
        own = json.loads((ctl / "stats.json").read_text())
        assert by_pid(top_json(pubdir))[proc.pid]["devices"][0]["stats"] == own
    finally:
        (ctl / "stop").touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
    assert not any(pubdir.iterdir()), "the worker removed its page at exit"


def test_top_live_view_in_tmux(workers):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed for the live view test (Debian package tmux)")
    pubdir, _, _, reports = workers
    sock = f"symmtop{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    cmd = f"env SYMM_PUBLISH_DIR={pubdir} TERM=xterm-256color {SYMM} top --interval 200ms"
    subprocess.run(tmux + ["new-session", "-d", "-s", "top", "-x", "200", "-y", "50", cmd], check=True, timeout=30)

    def screen() -> str:
        return subprocess.run(tmux + ["capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=30).stdout

    def wait_for(want: str) -> str:
        deadline = time.time() + 15
        while time.time() < deadline:
            s = screen()
            if want in s:
                return s
            time.sleep(0.1)
        raise AssertionError(f"the screen lacks {want!r}:\n{screen()}")

    try:
        wait_for("sorted by reserved")
        # Sorted by reserved, largest first: worker n holds about (n+1)*36 MiB
        # once its page has been refreshed after its allocations.
        want = [str(r["pid"]) for r in reversed(reports)]
        deadline = time.time() + 15
        while True:
            s = screen()
            order = [ln.split()[0] for ln in s.splitlines() if ln.split() and ln.split()[0].isdigit()]
            if order[:3] == want or time.time() > deadline:
                break
            time.sleep(0.1)
        assert order[:3] == want, s
        assert "PID DEV  ALLOCATED   RESERVED" in s and "q quit  s sort" in s
        subprocess.run(tmux + ["send-keys", "-t", "top", "s"], check=True)
        wait_for("sorted by allocated")
        subprocess.run(tmux + ["send-keys", "-t", "top", "Down", "Enter"], check=True)
        wait_for("large blocks")
        # The detail view is drawn line by line: a capture may come between
        # its first lines and its last.
        s = wait_for("symmetric memory: 0 blocks")
        assert f"process {reports[1]['pid']}:" in s, s
        subprocess.run(tmux + ["send-keys", "-t", "top", "Escape"], check=True)
        wait_for("PID DEV  ALLOCATED")
        subprocess.run(tmux + ["send-keys", "-t", "top", "q"], check=True)
        deadline = time.time() + 10
        while subprocess.run(tmux + ["has-session", "-t", "top"], capture_output=True).returncode == 0:
            assert time.time() < deadline, "q did not end symm top"
            time.sleep(0.1)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def test_the_sessions_pages_are_not_in_dev_shm(symm):
    """The test processes publish in the session's own directory (conftest),
    so that none is left in /dev/shm, whatever a test kills."""
    symm.free(symm.alloc(4096))
    mine = f"libsymm-{os.getuid()}-{os.getpid()}-"
    assert any(n.startswith(mine) for n in os.listdir(PUBLISH_DIR)), os.listdir(PUBLISH_DIR)
    assert not any(n.startswith(mine) for n in os.listdir("/dev/shm"))


def test_make_test_fails_on_a_page_left_by_a_dead_process(tmp_path):
    """make test runs its steps under tests/check_pages.sh, which names and
    removes the pages that processes gone since it started left behind."""
    assert "bash tests/check_pages.sh $(MAKE)" in (ROOT / "Makefile").read_text()
    env = child_env({"SYMM_PUBLISH_DIR": str(tmp_path)})
    check = ["bash", str(ROOT / "tests" / "check_pages.sh"), sys.executable, "-c"]
    got = subprocess.run([*check, "import os, symm; symm.free(symm.alloc(4096)); os._exit(0)"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 1, got.stdout + got.stderr
    assert "left 1 statistics page(s) of processes that are gone" in got.stdout and "os._exit" in got.stdout
    assert not list(tmp_path.iterdir())
    got = subprocess.run([*check, "import symm; symm.free(symm.alloc(4096))"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    assert not list(tmp_path.iterdir())
