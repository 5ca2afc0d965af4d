"""Where libsymm finds pip's NCCL, NVSHMEM and NVRTC: the package tells the
library its site-packages once, right after loading it
(symm_add_library_dirs), and the wheels' sub-paths are the library's alone
(topology/libs.go); nothing is written into the environment, and a
SYMM_*_LIB variable still wins."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import child_env, run_python

CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])  # a site-packages of this Python's
    import symm
    from symm import _loader
    out = {"told": sys.argv[1] in _loader.site_dirs(), "available": symm.is_nccl_available()}
    symm.set_backend("nccl")
    try:
        symm.symm_alloc(1 << 20)
        out["alloc"] = "succeeded"
    except symm.SymmError as e:
        out["alloc"] = [int(e.code), str(e)]
    out["seeded"] = sorted(v for v in ("SYMM_NCCL_LIB", "SYMM_NVSHMEM_LIB", "SYMM_NVRTC_LIB") if v in os.environ)
    print(json.dumps(out))
    """
)


def fake_nccl(path: Path, code: int) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("a C compiler is needed to build the fake library")
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "fake.c"
    src.write_text("int ncclGetVersion(int *v) { *v = %d; return 0; }\n" % code)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    return path


def child(site: Path, **env_vars: str) -> dict:
    env = child_env(env_vars, unset=("SYMM_NCCL_LIB", "SYMM_NVSHMEM_LIB", "SYMM_NVRTC_LIB", "SYMM_DEVICE"))
    env.update(env_vars)
    p = run_python(CHILD, str(site), env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_pips_nccl_is_found_in_a_told_site_packages(tmp_path):
    site = tmp_path / "site-packages"
    lib = fake_nccl(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2", 22600)
    r = child(site)
    assert r["told"] and r["seeded"] == [], r
    assert r["available"] is False
    code, msg = r["alloc"]
    # Found there (and refused for its version): the library looked in the wheel's path.
    assert code == 3 and f"NCCL 2.26.0 at {lib}" in msg, msg


def test_the_variable_still_wins(tmp_path):
    site = tmp_path / "site-packages"
    fake_nccl(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2", 22600)
    mine = fake_nccl(tmp_path / "mine" / "libnccl.so.2", 2708)
    r = child(site, SYMM_NCCL_LIB=str(mine))
    code, msg = r["alloc"]
    assert code == 3 and f"NCCL 2.7.8 at {mine}" in msg, msg
    assert r["seeded"] == ["SYMM_NCCL_LIB"]


@pytest.mark.parametrize("dirs,word", [
    (b"relative/site-packages", "relative/site-packages"),
    (b"/abs:rel", '"rel"'),
    (None, "dirs is NULL"),
])
def test_bad_directories_are_refused_by_name(dirs, word):
    from symm._loader import load

    lib = load()
    assert lib.symm_add_library_dirs(dirs) == 1  # SYMM_ERR_INVALID
    msg = lib.symm_last_error().decode()
    assert msg.startswith("symm_add_library_dirs: ") and word in msg, msg


def test_site_dirs_are_absolute_and_told_without_error():
    from symm._loader import load, site_dirs

    dirs = site_dirs()
    assert dirs and all(Path(d).is_absolute() for d in dirs) and len(set(dirs)) == len(dirs)
    assert load().symm_add_library_dirs(":".join(dirs).encode()) == 0  # told again: no error, nothing twice
