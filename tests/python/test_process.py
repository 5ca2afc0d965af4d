"""Behaviour that needs a fresh process: the environment read at first use, fork, and
finding the library. Each test runs its own interpreter."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from conftest import PYTHON_DIR, ROOT, child_env, run_json, run_python

TRY_ALLOC = textwrap.dedent(
    """
    import json, symm
    try:
        p = symm.alloc(4096)
        print(json.dumps({"raised": False, "ptr": p}))
    except symm.SymmError as e:
        print(json.dumps({"raised": True, "code": int(e.code), "msg": str(e)}))
    """
)


def gpu_present() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


@pytest.mark.skipif(gpu_present(), reason="this machine has a GPU: the cuda backend would start")
def test_without_symm_device_host_alloc_names_the_variable():
    out = run_json(TRY_ALLOC, env=child_env(unset=("SYMM_DEVICE",)))
    assert out["raised"], f"alloc succeeded without a GPU and without SYMM_DEVICE=host: {out}"
    assert out["code"] == 3, out  # SYMM_ERR_NO_DEVICE
    assert "SYMM_DEVICE=host" in out["msg"], out["msg"]


def test_symm_device_set_from_python_before_first_call_is_honored():
    """The documented way to pick the backend from Python: os.environ, then the first call."""
    code = "import os; os.environ['SYMM_DEVICE'] = 'host'\n" + TRY_ALLOC + (
        "print(json.dumps({'backend': symm.backend()}))\n"
    )
    proc = run_python(code, env=child_env(unset=("SYMM_DEVICE",)))
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(ln) for ln in proc.stdout.strip().splitlines()[-2:])
    assert not first["raised"], f"SYMM_DEVICE=host set in os.environ was not seen by libsymm: {first['msg']}"
    assert second["backend"] == "host"


FORK_CHILD = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")  # fork() in a multi-threaded process warns on 3.12+
    import symm

    if sys.argv[1] == "after_alloc":
        p = symm.alloc(4096); symm.free(p, 4096)
    else:
        symm.library_path()  # only loaded: the Go runtime has started, nothing called

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            q = symm.alloc(4096)
            res = {"raised": False, "ptr": q}
        except symm.SymmError as e:
            res = {"raised": True, "code": int(e.code), "msg": str(e)}
        except BaseException as e:
            res = {"raised": True, "code": None, "msg": repr(e)}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    _, status = os.waitpid(pid, 0)
    p = symm.alloc(8192); symm.free(p, 8192)  # the parent still works
    data = b"".join(chunks)
    print(json.dumps({"child": json.loads(data) if data else None, "status": status}))
    """
)


@pytest.mark.parametrize("when", ["after_alloc", "after_load"])
def test_fork_child_gets_forked_error_and_parent_goes_on(when):
    out = run_json(FORK_CHILD, when, timeout=60)
    assert out["status"] == 0, f"child died (wait status {out['status']})"
    child = out["child"]
    assert child is not None, "child wrote nothing"
    assert child["raised"], f"alloc in a forked child succeeded: {child}"
    assert child["code"] == 5, child  # SYMM_ERR_FORKED
    assert "fork" in child["msg"].lower(), child["msg"]


LOAD = textwrap.dedent(
    """
    import json, symm
    try:
        path = symm.library_path()
        print(json.dumps({"ok": True, "path": path, "version": symm.version()}))
    except OSError as e:
        print(json.dumps({"ok": False, "type": type(e).__name__, "msg": str(e)}))
    """
)


def test_symm_lib_pointing_nowhere():
    missing = "/nonexistent/dir/libsymm.so"
    out = run_json(LOAD, env=child_env({"SYMM_LIB": missing}))
    assert not out["ok"]
    assert out["type"] == "LibraryNotFoundError"
    assert missing in out["msg"] and "SYMM_LIB" in out["msg"], out["msg"]


def test_symm_lib_pointing_at_a_non_library(tmp_path):
    bogus = tmp_path / "libsymm.so"
    bogus.write_text("not an ELF file\n")
    out = run_json(LOAD, env=child_env({"SYMM_LIB": str(bogus)}))
    assert not out["ok"]
    assert str(bogus) in out["msg"], out["msg"]


def copy_package(dest: Path) -> Path:
    """A copy of python/symm where ../../build does not exist."""
    pkg = dest / "site" / "symm"
    shutil.copytree(PYTHON_DIR / "symm", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return pkg


def test_not_found_lists_every_place_searched(tmp_path):
    pkg = copy_package(tmp_path)
    env = child_env(unset=("SYMM_LIB",))
    env["PYTHONPATH"] = str(pkg.parent)
    out = run_json(LOAD, env=env)
    assert not out["ok"]
    assert str(pkg / "libsymm.so") in out["msg"], out["msg"]
    assert str((pkg / ".." / ".." / "build" / "libsymm.so").resolve()) in out["msg"], out["msg"]
    assert "SYMM_LIB" in out["msg"]


def real_library() -> Path:
    """The library the main test process loaded."""
    import symm

    return Path(symm.library_path())


def test_package_directory_is_searched_and_symm_lib_wins(tmp_path):
    pkg = copy_package(tmp_path)
    shutil.copy2(real_library(), pkg / "libsymm.so")
    env = child_env(unset=("SYMM_LIB",))
    env["PYTHONPATH"] = str(pkg.parent)
    out = run_json(LOAD, env=env)
    assert out["ok"], out
    assert out["path"] == str((pkg / "libsymm.so").resolve())

    env["SYMM_LIB"] = str(real_library())
    out = run_json(LOAD, env=env)
    assert out["ok"], out
    assert out["path"] == str(real_library())


def test_default_search_finds_repository_build():
    out = run_json(LOAD, env=child_env(unset=("SYMM_LIB",)))
    assert out["ok"], out
    if not (PYTHON_DIR / "symm" / "libsymm.so").exists():
        assert out["path"] == str((ROOT / "build" / "libsymm.so").resolve())


def test_import_does_not_load_the_library():
    code = "import json, symm, symm._loader as l; print(json.dumps({'loaded': l._lib is not None}))"
    out = run_json(code, env=child_env({"SYMM_LIB": "/nonexistent/libsymm.so"}))
    assert out == {"loaded": False}


def test_pool_allocator_without_torch(monkeypatch):
    import sys

    import symm

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(ImportError) as info:
        symm.pool_allocator()
    msg = str(info.value)
    assert "torch" in msg.lower() and "pool_allocator" in msg, msg
    with pytest.raises(ImportError):
        symm.use_as_default()


def test_child_process_exits_cleanly():
    """Loading, using and exiting: Go c-shared libraries must not hang at exit."""
    proc = run_python("import symm; p = symm.alloc(1 << 20); symm.free(p, 1 << 20)", timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name,value", [
    ("SYMM_POOL_FRONT_CACHE", "maybe"),
    ("SYMM_POOL_FRONT_CACHE_MAX", "1 GiB"),
    ("SYMM_POOL_LIMIT", "lots"),
    ("SYMM_POOL_LIMIT", "1.5"),  # not a 1-byte cap: bytes are whole
    ("SYMM_POOL_LIMIT", "0.5"),  # not "no cap"
    ("SYMM_POOL_MAX_SPLIT", "12 parsecs"),
    ("SYMM_DEVICE", "tpu"),
    ("SYMM_HOST_DEVICES", "0"),
    ("SYMM_PUBLISH", "banana"),  # refused as every other 0/1 setting is
])
def test_bad_environment_values_are_named(name, value):
    out = run_json(TRY_ALLOC, env=child_env({name: value}))
    assert out["raised"], f"{name}={value!r} was accepted: {out}"
    assert out["code"] == 1, out  # SYMM_ERR_INVALID
    assert name in out["msg"] and value in out["msg"], out["msg"]


@pytest.mark.parametrize("front", ["0", "1"])
def test_front_cache_setting_keeps_stats_exact(front):
    code = textwrap.dedent(
        """
        import json, symm
        ptrs = [symm.alloc(n) for n in (512, 4096, 3 << 20)]
        symm.free(ptrs[1], 4096)
        again = symm.alloc(4096)
        same = again == ptrs[1]
        for p, n in zip([ptrs[0], again, ptrs[2]], (512, 4096, 3 << 20)):
            symm.free(p, n)
        s = symm.memory_stats()
        print(json.dumps({"same": same, "alloc": s["allocation.all.current"],
                          "bytes": s["allocated_bytes.all.current"],
                          "active": s["active_bytes.all.current"]}))
        """
    )
    out = run_json(code, env=child_env({"SYMM_POOL_FRONT_CACHE": front}))
    assert out["same"], "a freed block is reused for the same size and stream"
    assert out["alloc"] == 0 and out["bytes"] == 0 and out["active"] == 0, out
