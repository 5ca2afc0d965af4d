"""How symm finds what its PyTorch extension needs and what it does when it
cannot build it: no torch needed (a stand-in module names torch's folder).
Building, loading and running it against a real torch is the GPU machine's
tests/device/test_torch_replace.py; compiling it against a real torch's
headers is tests/check_torch_ext.sh (make test-torch-ext)."""

from __future__ import annotations

import os
import platform
import re
import stat
import time
import types
from pathlib import Path

import pytest

from symm import _torch_ext as ext


def fake_torch(tmp_path: Path, headers: bool = True):
    root = tmp_path / "site" / "torch"
    (root / "lib").mkdir(parents=True)
    if headers:
        h = root / "include" / "torch" / "csrc" / "cuda"
        h.mkdir(parents=True)
        (h / "CUDAPluggableAllocator.h").write_text("// stand-in\n")
    (root / "__init__.py").write_text("")
    return types.SimpleNamespace(__file__=str(root / "__init__.py"), __version__="2.11.0+test",
                                 version=types.SimpleNamespace(git_version="abc"),
                                 _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True))


def cuda_home(tmp_path: Path, crt: bool = True) -> Path:
    inc = tmp_path / "cuda" / "include"
    (inc / "crt").mkdir(parents=True)
    (inc / "cuda_runtime_api.h").write_text("")
    if crt:
        (inc / "crt" / "host_defines.h").write_text("")
    return tmp_path / "cuda"


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv(ext.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_HOME", str(cuda_home(tmp_path)))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv(ext.ENV_MODE, raising=False)
    return tmp_path


@pytest.mark.parametrize("value,want", [("", "auto"), ("auto", "auto"), ("0", "off"), ("1", "require")])
def test_mode(monkeypatch, value, want):
    monkeypatch.setenv(ext.ENV_MODE, value)
    assert ext.mode() == want


def test_bad_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv(ext.ENV_MODE, "yes")
    with pytest.raises(ValueError, match="SYMM_TORCH_EXT='yes'"):
        ext.mode()


def test_symm_header_is_found():
    assert (ext.symm_header_dir() / "symm.h").is_file()
    assert ext.SOURCE.is_file()


def test_cuda_headers_from_cuda_home(env):
    dirs, looked = ext.cuda_include_dirs()
    assert dirs == [env / "cuda" / "include"], looked


def test_cuda_headers_need_crt(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(cuda_home(tmp_path, crt=False)))
    dirs, looked = ext.cuda_include_dirs()
    # Another copy (e.g. pip's wheels on this machine) may be found later;
    # never the incomplete one.
    assert str(tmp_path / "cuda" / "include") not in map(str, dirs)
    assert any("without crt/host_defines.h" in s for s in looked), looked


def test_no_cuda_headers_names_every_place(env, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(env / "nowhere"))
    monkeypatch.setattr(ext, "cuda_include_dirs", lambda: ([], [str(env / "nowhere" / "include"), "/usr/local/cuda/include"]))
    with pytest.raises(ext.ExtensionUnavailable, match="no CUDA runtime headers.*nowhere/include.*nvidia-cuda-runtime"):
        ext._build(fake_torch(env))


def test_no_torch_headers(env):
    with pytest.raises(ext.ExtensionUnavailable, match="has no C\\+\\+ headers"):
        ext._build(fake_torch(env, headers=False))


def test_no_compiler(env, monkeypatch):
    empty = env / "emptybin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(ext.ExtensionUnavailable, match="no C\\+\\+ compiler"):
        ext._build(fake_torch(env))


def test_failed_build_is_remembered(env, monkeypatch):
    """A failed build is not retried by every process of a job: the second
    call fails at once, naming the log and how to retry."""
    calls = env / "calls"
    cxx = script(env / "cxx", f'echo run >> "{calls}"\necho "fatal error: boom" >&2\nexit 1\n')
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    with pytest.raises(ext.ExtensionUnavailable, match="fatal error: boom") as e1:
        ext._build(torch)
    assert "full log:" in str(e1.value)
    logs = list((env / "cache").glob("*.log"))
    assert len(logs) == 1 and "boom" in logs[0].read_text()
    with pytest.raises(ext.ExtensionUnavailable, match="failed before: delete .*\\.failed to retry"):
        ext._build(torch)
    assert calls.read_text().count("run") == 1
    # Other inputs (another torch) are another build.
    torch.__version__ = "2.12.0"
    with pytest.raises(ext.ExtensionUnavailable, match="boom"):
        ext._build(torch)
    assert calls.read_text().count("run") == 2


def test_build_lands_once_in_the_cache(env, monkeypatch):
    """The compiler's output is moved into place whole; later calls reuse it."""
    calls = env / "calls"
    # A stand-in compiler: writes the -o file and records its arguments.
    cxx = script(env / "cxx", f'echo "$@" >> "{calls}"\nwhile [ $# -gt 0 ]; do '
                 'if [ "$1" = -o ]; then echo so > "$2"; fi; shift; done\n')
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    p1 = ext._build(torch)
    assert p1.is_file() and p1.parent == env / "cache" and p1.name.startswith("symm_torch_ext_")
    assert ext.build_seconds() is not None
    p2 = ext._build(torch)
    assert p2 == p1
    args = calls.read_text().splitlines()
    assert len(args) == 1
    a = args[0]
    for flag in ("-shared", "-ltorch_cuda", "-lc10_cuda", "-std=c++17", f"-I{ext.symm_header_dir()}",
                 f"-isystem{env / 'cuda' / 'include'}", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DTORCH_EXTENSION_NAME=symm_torch_ext_"):
        assert flag in a, flag
    assert not list((env / "cache").glob("*.tmp")), "a temporary file was left"


def fake_cxx(env: Path, name: str = "cxx", before: str = "") -> tuple[Path, Path]:
    """A stand-in compiler that writes its -o file and records its arguments;
    `before` runs first (and may exit)."""
    calls = env / f"{name}.calls"
    return script(env / name, f'echo "$@" >> "{calls}"\n{before}while [ $# -gt 0 ]; do '
                  'if [ "$1" = -o ]; then echo so > "$2"; fi; shift; done\n'), calls


def ncalls(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


@pytest.mark.parametrize("body,why", [
    ('kill -9 $$\n', "killed by SIGKILL"),
    ('echo "cc1plus: fatal error: error writing to /tmp/ccX.s: No space left on device" >&2\nexit 1\n',
     "No space left on device"),
    ('echo "c++: fatal error: Killed signal terminated program cc1plus" >&2\nexit 1\n', "Killed signal"),
    ('exit 1\n', "exited with code 1 and printed nothing"),
])
def test_passing_failure_is_not_remembered(env, monkeypatch, body, why):
    """A compiler stopped by a signal or short of disk or memory says nothing
    about the source: the next call builds again, and nothing is left that
    would make every later process fail."""
    cxx, calls = fake_cxx(env, before=body)
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    for n in (1, 2):
        with pytest.raises(ext.ExtensionUnavailable, match=why) as e:
            ext._build(torch)
        assert "not remembered" in str(e.value) and "failed before" not in str(e.value)
        assert ncalls(calls) == n
    assert not list((env / "cache").glob("*.failed"))


def test_compile_error_is_remembered_with_its_tail(env, monkeypatch):
    cxx, calls = fake_cxx(env, before='echo "a.cpp:1:1: error: expected unqualified-id" >&2\n'
                                      'echo "1 error generated." >&2\nexit 1\n')
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(ext.ExtensionUnavailable, match="expected unqualified-id"):
        ext._build(fake_torch(env))
    (marker,) = (env / "cache").glob("*.failed")
    assert "expected unqualified-id" in marker.read_text() and "1 error generated." in marker.read_text()
    assert marker.stat().st_mode & 0o022 == 0


def test_compiler_that_cannot_start(env, monkeypatch):
    """An OSError starting the compiler (here: an interpreter that is not
    there) is an ExtensionUnavailable that is not remembered."""
    cxx = env / "cxx"
    cxx.write_text("#!/nonexistent/interpreter\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(ext.ExtensionUnavailable, match="running the compiler .*cxx failed"):
        ext._build(fake_torch(env))
    assert not list((env / "cache").glob("*.failed"))


def test_build_time_limit(env, monkeypatch):
    """A compiler that hangs is stopped at SYMM_TORCH_EXT_TIMEOUT, with its
    children; the failure is not remembered and the lock is free again."""
    pidfile = env / "child.pid"
    cxx, calls = fake_cxx(env, before=f'if [ ! -e "{env}/fast" ]; then sleep 8 & echo $! > "{pidfile}"; wait; fi\n')
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("SYMM_TORCH_EXT_TIMEOUT", "1s")
    torch = fake_torch(env)
    t0 = time.monotonic()
    with pytest.raises(ext.ExtensionUnavailable, match="took more than 1 s and was stopped.*SYMM_TORCH_EXT_TIMEOUT"):
        ext._build(torch)
    assert time.monotonic() - t0 < 5
    child = int(pidfile.read_text())
    for _ in range(50):  # the compiler's own child is stopped too
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the compiler's child {child} is still running")
    assert not list((env / "cache").glob("*.failed"))
    (env / "fast").touch()
    assert ext._build(torch).is_file() and ncalls(calls) == 2


@pytest.mark.parametrize("value,want", [("", 600.0), ("90", 90.0), ("2.5", 2.5), ("30s", 30.0), ("10m", 600.0),
                                        ("1h", 3600.0), ("500ms", 0.5)])
def test_build_timeout_values(monkeypatch, value, want):
    monkeypatch.setenv(ext.ENV_TIMEOUT, value)
    assert ext.build_timeout() == want


@pytest.mark.parametrize("value", ["0", "-3", "ten", "5 minutes", "0s"])
def test_bad_build_timeout_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(ext.ENV_TIMEOUT, value)
    with pytest.raises(ValueError, match=f"SYMM_TORCH_EXT_TIMEOUT='{value}'"):
        ext.build_timeout()


def test_cache_writable_by_others_is_refused(env, monkeypatch):
    cxx, calls = fake_cxx(env)
    monkeypatch.setenv("CXX", str(cxx))
    cache = env / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    with pytest.raises(ext.ExtensionUnavailable, match=f"cache directory {cache} .*owner .*drwxrwxrwx.*can be "
                                                      "written by other users"):
        ext._build(fake_torch(env))
    assert ncalls(calls) == 0


def test_cache_of_another_user_is_refused(env, monkeypatch):
    cxx, calls = fake_cxx(env)
    monkeypatch.setenv("CXX", str(cxx))
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    with pytest.raises(ext.ExtensionUnavailable, match=f"cache directory {env / 'cache'} belongs to .*uid {real}.*"
                                                      f"not to this user .*uid {real + 4242}"):
        ext._build(fake_torch(env))
    assert ncalls(calls) == 0


def test_cached_library_must_be_ours(env, monkeypatch):
    """A library in the cache that another user can write, or a link, is
    never loaded."""
    cxx, calls = fake_cxx(env)
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    so = ext._build(torch)
    so.chmod(0o666)
    with pytest.raises(ext.ExtensionUnavailable, match=f"library {so} .*can be written by other users"):
        ext._build(torch)
    other = env / "elsewhere.so"
    other.write_text("so")
    so.unlink()
    so.symlink_to(other)
    with pytest.raises(ext.ExtensionUnavailable, match=f"library {so} is not a regular file"):
        ext._build(torch)
    assert ncalls(calls) == 1


def test_library_mode_ignores_the_umask(env, monkeypatch):
    """The linker creates its output with the umask's mode: the library is
    made not writable by others, so the next process accepts it."""
    cxx, calls = fake_cxx(env, before='for a; do :; done\n')
    cxx.write_text(cxx.read_text().replace('echo so > "$2"', 'rm -f "$2"; echo so > "$2"'))
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    old = os.umask(0o002)
    try:
        so = ext._build(torch)
    finally:
        os.umask(old)
    assert so.stat().st_mode & 0o777 == 0o755
    assert ext._build(torch) == so and ncalls(calls) == 1


def test_lock_is_not_opened_through_a_link(env, monkeypatch):
    cxx, calls = fake_cxx(env)
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    so = ext._build(torch)
    lock = so.with_suffix(".lock")
    assert lock.is_file() and lock.stat().st_mode & 0o777 == 0o600
    so.unlink()
    lock.unlink()
    victim = env / "victim"
    victim.write_text("keep")
    lock.symlink_to(victim)
    with pytest.raises(ext.ExtensionUnavailable, match=f"lock {lock}.*symbolic link"):
        ext._build(torch)
    assert victim.read_text() == "keep" and ncalls(calls) == 1


def test_cxx_with_a_wrapper(env, monkeypatch):
    """CXX is split as a shell splits it: `ccache g++` runs ccache with g++
    as its first argument (here a wrapper in a folder with a space)."""
    d = env / "with space"
    d.mkdir()
    log = env / "wrapper.log"
    wrapper = script(d / "wrap", f'echo "$1" >> "{log}"\nexec "$@"\n')
    cxx, calls = fake_cxx(env)
    monkeypatch.setenv("CXX", f'"{wrapper}" {cxx}')
    so = ext._build(fake_torch(env))
    assert so.is_file()
    assert log.read_text().split() == [str(cxx)] and ncalls(calls) == 1


def test_missing_cxx_is_not_replaced(env, monkeypatch):
    """A CXX that cannot be run is an error naming it, even where another
    compiler is on the PATH."""
    bindir = env / "bin"
    bindir.mkdir()
    _, calls = fake_cxx(bindir, name="c++")
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("CXX", "no-such-compiler -O1")
    torch = fake_torch(env)
    with pytest.raises(ext.ExtensionUnavailable, match="CXX='no-such-compiler -O1' names 'no-such-compiler'"):
        ext._build(torch)
    assert ncalls(calls) == 0
    monkeypatch.delenv("CXX")  # unset: c++ from the PATH
    assert ext._build(torch).is_file() and ncalls(calls) == 1


def test_key_has_the_cpu_architecture(env, monkeypatch):
    """One cache shared by two architectures (a home directory on x86_64
    and aarch64 hosts) keeps one library for each."""
    cxx, calls = fake_cxx(env)
    monkeypatch.setenv("CXX", str(cxx))
    torch = fake_torch(env)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    a = ext._build(torch)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    b = ext._build(torch)
    assert a != b and ncalls(calls) == 2


def test_key_has_every_header(tmp_path, monkeypatch):
    """An upgrade that changes only one of the source's headers builds the
    extension anew."""
    torch = fake_torch(tmp_path)
    copies = []
    for h in ext.HEADERS:
        c = tmp_path / h.name
        c.write_bytes(h.read_bytes())
        copies.append(c)
    monkeypatch.setattr(ext, "HEADERS", tuple(copies))
    symm_inc = ext.symm_header_dir()
    keys = {ext._key(torch, ["c++"], [], symm_inc)}
    for c in copies:
        c.write_bytes(c.read_bytes() + b"\n// changed\n")
        keys.add(ext._key(torch, ["c++"], [], symm_inc))
    assert len(keys) == len(copies) + 1

def test_extension_headers_are_shipped():
    """Every header the source includes from its folder, directly or through
    another header, is part of the cache key and travels in the wheel and the
    source install."""
    root = ext.SOURCE.parents[2]
    included, todo = set(), [ext.SOURCE]
    while todo:
        for name in re.findall(r'#include "(_torch_ext[^"]*)"', todo.pop().read_text()):
            if name not in included:
                included.add(name)
                todo.append(ext.SOURCE.parent / name)
    assert included == {h.name for h in ext.HEADERS}
    pyproject = (root / "python" / "pyproject.toml").read_text()
    wheel = (root / "tools" / "build_wheel.py").read_text()
    for h in ext.HEADERS:
        assert h.is_file() and f'"{h.name}"' in pyproject and f'"{h.name}"' in wheel, h.name
