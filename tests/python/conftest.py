"""Shared setup for the host-backend Python tests.

libsymm reads SYMM_* variables once, when it is loaded, and one process loads
it once: so SYMM_DEVICE=host is set here, before any test imports symm, and
tests that need another environment run a fresh interpreter (run_python).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
HEADER = ROOT / "include" / "symm.h"

os.environ["SYMM_DEVICE"] = "host"
# This process and every child publish their statistics pages (symm top's)
# here rather than in /dev/shm: a child killed by a test cannot remove its
# page, and the directory goes at the end of the session with what is left.
PUBLISH_DIR = tempfile.mkdtemp(prefix="symm-pytest-pages-")
os.environ["SYMM_PUBLISH_DIR"] = PUBLISH_DIR
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))

MiB = 1 << 20


def child_env(set_vars: dict | None = None, unset: tuple = ()) -> dict:
    """This process's environment for a child, with symm importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    for name in unset:
        env.pop(name, None)
    env.update(set_vars or {})
    return env


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter and returns the finished process."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env if env is not None else child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )


def run_json(code: str, *args: str, env: dict | None = None, timeout: float = 60):
    """Runs code that prints one JSON document on its last stdout line; returns it."""
    proc = run_python(code, *args, env=env, timeout=timeout)
    assert proc.returncode == 0, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"child printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])


def write_bytes(ptr: int, data: bytes) -> None:
    """Writes data at a host-backend address (real host memory)."""
    ctypes.memmove(ptr, data, len(data))


def read_bytes(ptr: int, n: int) -> bytes:
    return ctypes.string_at(ptr, n)


def pattern(n: int, seed: int) -> bytes:
    """n bytes that differ from block to block and from offset to offset."""
    base = bytes((seed * 131 + i * 7) & 0xFF for i in range(min(n, 4096)))
    reps, rest = divmod(n, len(base)) if base else (0, 0)
    return base * reps + base[:rest]


_backend_checked = False


def require_host_backend(module) -> None:
    """Fails with a diagnosis (not 40 puzzling errors) if the host backend is not active."""
    global _backend_checked
    if _backend_checked:
        return
    try:
        module.device_count()
    except module.SymmError as e:
        pytest.fail(
            "libsymm did not start its host backend although conftest set SYMM_DEVICE=host in "
            "os.environ before loading it. The library must read SYMM_* with libc getenv at first "
            "use (Go's os.Getenv in a c-shared library only sees the environment the process "
            f"started with). Workaround: export SYMM_DEVICE=host. Library said: {e}",
            pytrace=False,
        )
    assert module.backend() == "host", f"backend is {module.backend()!r}, not host"
    _backend_checked = True


@pytest.fixture(scope="session", autouse=True)
def _publish_dir():
    yield PUBLISH_DIR
    shutil.rmtree(PUBLISH_DIR, ignore_errors=True)


@pytest.fixture
def symm():
    """The package, loaded on the host backend, with limits reset afterwards."""
    import symm as module

    require_host_backend(module)
    yield module
    module.set_limit(0)
    module.set_memory_fraction(1.0)
