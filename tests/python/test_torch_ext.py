"""How symm finds what its PyTorch extension needs and what it does when it
cannot build it: no torch needed (a stand-in module names torch's folder).
Building, loading and running it against a real torch is the GPU machine's
tests/device/test_torch_replace.py; compiling it against a real torch's
headers is tests/check_torch_ext.sh (make test-torch-ext)."""

from __future__ import annotations

import os
import re
import stat
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


def test_extension_headers_are_shipped():
    """Every header the source includes from its folder is part of the cache
    key and travels in the wheel and the source install."""
    root = ext.SOURCE.parents[2]
    included = set(re.findall(r'#include "(_torch_ext[^"]*)"', ext.SOURCE.read_text()))
    assert included == {h.name for h in ext.HEADERS}
    pyproject = (root / "python" / "pyproject.toml").read_text()
    wheel = (root / "tools" / "build_wheel.py").read_text()
    for h in ext.HEADERS:
        assert h.is_file() and f'"{h.name}"' in pyproject and f'"{h.name}"' in wheel, h.name
