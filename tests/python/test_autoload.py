"""SYMM_TORCH_ALLOCATOR=1 and `symm run`: libsymm becomes PyTorch's allocator
when a process finishes importing torch, with no edit to the script
(python/symm/_autoload.py, python/symm/_boot/sitecustomize.py).

torch is a stand-in package here (no GPU, no torch on CI machines): it has
what use_as_default() touches on the fallback path (SYMM_TORCH_EXT=0) and
records change_current_allocator, which refuses once "CUDA is initialized",
as PyTorch's does. The real thing, under torchrun with set_device as the
script's first line and DataLoader workers, is tests/device/test_unchanged_script.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import PYTHON_DIR, ROOT, child_env

BOOT = PYTHON_DIR / "symm" / "_boot"
TOOL = ROOT / "build" / "symm"

STAND_IN = {
    "torch/__init__.py": """
        import os
        from . import _C, cuda
        __version__ = "0+stand-in"
        if os.environ.get("STAND_IN_CUDA_INIT") == "1":
            cuda._initialized = True  # as if torch's import had initialized CUDA
    """,
    "torch/_C.py": """
        def _cuda_customAllocator(alloc, free):
            return None
    """,
    "torch/cuda/__init__.py": """
        _initialized = False
        from . import memory
    """,
    "torch/cuda/memory.py": """
        current = None

        class _CUDAAllocator:
            def __init__(self, raw):
                self._raw = raw

        class _Raw:
            def __getattr__(self, name):
                if name.startswith("set_"):
                    return lambda *a: None
                raise AttributeError(name)

        class CUDAPluggableAllocator(_CUDAAllocator):
            def __init__(self, path, alloc, free):
                super().__init__(_Raw())

            def allocator(self):
                return self._raw

        def change_current_allocator(a):
            global current
            from . import _initialized
            if _initialized:
                raise RuntimeError("Can't swap an already initialized allocator")
            current = a
    """,
}

CHECK = """
import sys
import torch
import symm
assert torch.cuda.memory.current is symm.pool_allocator(), torch.cuda.memory.current
assert symm.is_default()
print("installed at torch's import")
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    for name, text in STAND_IN.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def run(code: str, stand_in: Path, env_vars: dict, boot: bool = True, argv: list | None = None):
    env = child_env({"SYMM_TORCH_EXT": "0", **env_vars})
    env["PYTHONPATH"] = ":".join(filter(None, [str(BOOT) if boot else "", str(stand_in), env["PYTHONPATH"]]))
    cmd = argv or [sys.executable, "-c", code]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=str(stand_in))


def test_libsymm_is_the_allocator_once_torch_is_imported(stand_in):
    p = run(CHECK, stand_in, {"SYMM_TORCH_ALLOCATOR": "1"})
    assert p.returncode == 0, p.stderr
    assert "installed at torch's import" in p.stdout


def test_nothing_happens_without_the_variable(stand_in):
    code = "import sys, torch; assert torch.cuda.memory.current is None; assert 'symm' not in sys.modules; print('ok')"
    for value in ("", "0", "off"):
        p = run(code, stand_in, {"SYMM_TORCH_ALLOCATOR": value})
        assert p.returncode == 0 and "ok" in p.stdout, (value, p.stderr)


def test_a_bad_value_fails_the_import_of_torch_naming_it(stand_in):
    p = run("import torch", stand_in, {"SYMM_TORCH_ALLOCATOR": "maybe"})
    assert p.returncode != 0
    assert "SYMM_TORCH_ALLOCATOR='maybe': expected 1" in p.stderr


def test_too_late_is_raised_from_the_import_of_torch(stand_in):
    p = run("import torch", stand_in, {"SYMM_TORCH_ALLOCATOR": "1", "STAND_IN_CUDA_INIT": "1"})
    assert p.returncode != 0
    assert "SYMM_TORCH_ALLOCATOR=1: libsymm could not become PyTorch's allocator" in p.stderr
    assert "came too late" in p.stderr


def test_the_hidden_sitecustomize_still_runs(stand_in, tmp_path_factory):
    theirs = tmp_path_factory.mktemp("theirs")
    (theirs / "sitecustomize.py").write_text("import builtins; builtins.THEIRS_RAN = True\n")
    code = "import builtins; assert builtins.THEIRS_RAN;" + CHECK
    # PYTHONPATH: _boot first, then theirs: both run, ours first.
    full = child_env({"SYMM_TORCH_EXT": "0", "SYMM_TORCH_ALLOCATOR": "1"})
    full["PYTHONPATH"] = ":".join([str(BOOT), str(theirs), str(stand_in), full["PYTHONPATH"]])
    p = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(not TOOL.is_file(), reason="needs build/symm (make cli)")
def test_symm_run_reaches_a_child_python_unchanged(stand_in):
    script = stand_in / "train.py"
    script.write_text(CHECK)
    # Not through _boot on PYTHONPATH here: symm run puts it there.
    p = run("", stand_in, {}, boot=False, argv=[str(TOOL), "run", "--", sys.executable, str(script)])
    assert p.returncode == 0, p.stderr
    assert "installed at torch's import" in p.stdout


@pytest.mark.parametrize("var", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
@pytest.mark.parametrize("backend", ["cudaMallocAsync", "native"])
def test_a_child_that_names_a_backend_gets_it_with_one_warning(stand_in, var, backend):
    """A process that inherited SYMM_TORCH_ALLOCATOR=1 and asks PyTorch for an
    allocator backend (as PyTorch's own tests do) gets PyTorch's allocator."""
    code = "import torch, symm; assert torch.cuda.memory.current is None; assert not symm.is_default(); print('theirs')"
    p = run(code, stand_in, {"SYMM_TORCH_ALLOCATOR": "1", var: f"max_split_size_mb:20,backend:{backend},release_lock_on_cudamalloc:none"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "theirs"
    assert p.stderr.count("RuntimeWarning") == 1, p.stderr
    assert f"asks for PyTorch's '{backend}' allocator backend" in p.stderr


def test_settings_without_a_backend_still_get_libsymm(stand_in):
    p = run(CHECK, stand_in, {"SYMM_TORCH_ALLOCATOR": "1", "PYTORCH_ALLOC_CONF": "max_split_size_mb:20,expandable_segments:True"})
    assert p.returncode == 0, p.stderr
    assert "installed at torch's import" in p.stdout


# The variable's words have one owner, _boot/symm_autoload.py: the .pth line
# (site-packages' top, with the module installed beside it), symm run's
# sitecustomize and symm._autoload all go through it.
SITE_CHECK = """
import os, site, sys
site.addsitedir(sys.argv[1])
print(",".join(m for m in ("symm_autoload", "symm._autoload", "symm") if m in sys.modules) or "none")
"""


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    """site-packages as an installed package leaves its top: the .pth and the module it imports."""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("symm_autoload.pth", "symm_autoload.py"):
        (site / name).write_bytes((BOOT / name).read_bytes())
    return site


@pytest.mark.parametrize("value,want", [
    (None, "none"),  # unset: one environment lookup, no import
    ("", "none"),
    (" 0 ", "symm_autoload"),  # an off word: the words' module, not the package
    ("Off", "symm_autoload"),
    ("no", "symm_autoload"),
    ("false", "symm_autoload"),
    ("1", "symm_autoload,symm._autoload,symm"),
    ("YES", "symm_autoload,symm._autoload,symm"),
    ("maybe", "symm_autoload,symm._autoload,symm"),  # raised at torch's import
])
def test_the_start_up_line_imports_the_package_only_when_on(site_dir, value, want):
    env = child_env({}, unset=("SYMM_TORCH_ALLOCATOR",))
    if value is not None:
        env["SYMM_TORCH_ALLOCATOR"] = value
    p = subprocess.run([sys.executable, "-c", SITE_CHECK, str(site_dir)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == want, p.stderr


def test_every_reader_takes_the_words_from_one_module():
    import symm._autoload as autoload
    from symm._boot import symm_autoload as words

    assert autoload.wanted is words.wanted and autoload.ENV == words.ENV == "SYMM_TORCH_ALLOCATOR"
    assert not set(words.ON) & set(words.OFF) and "" in words.OFF
    for value in words.ON:
        assert words.wanted({words.ENV: f" {value.upper()} "}) is True
    for value in words.OFF:
        assert words.wanted({words.ENV: value}) is False
    assert words.wanted({}) is False
    with pytest.raises(ValueError, match="SYMM_TORCH_ALLOCATOR='maybe'"):
        words.wanted({words.ENV: "maybe"})
    assert words.start_wanted({words.ENV: "maybe"}) and words.start_wanted({words.ENV: "1"})
    assert not any(words.start_wanted({words.ENV: value}) for value in words.OFF)
    # The start-up line names the variable (it must not import anything to
    # test it) and nothing else: no word of its own.
    line = (BOOT / "symm_autoload.pth").read_text().strip()
    assert "\n" not in line and line.startswith("import ")
    assert f'os.environ.get("{words.ENV}") and __import__("symm_autoload").start_wanted()' in line
    for text in (line, (BOOT / "sitecustomize.py").read_text(), Path(autoload.__file__).read_text()):
        assert '"off"' not in text and '"false"' not in text


@pytest.mark.skipif(not TOOL.is_file() or not (ROOT / "build" / "libsymm.so").is_file(),
                    reason="needs build/libsymm.so and build/symm (make lib cli)")
def test_the_wheel_puts_the_words_beside_its_start_up_line(tmp_path):
    """make wheel's layout: the .pth and symm_autoload.py at site-packages'
    top, the package's _boot copy for symm run; an unpacked wheel arms
    libsymm at start-up for 1, and imports only the words for 0."""
    import zipfile

    out = tmp_path / "dist"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "build_wheel.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob("symm-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(site)
    assert {"symm_autoload.pth", "symm_autoload.py", "symm/_boot/symm_autoload.py", "symm/_boot/sitecustomize.py",
            "symm/_autoload.py"} <= names
    for value, want in (("0", "symm_autoload"), ("1", "symm_autoload,symm._autoload,symm")):
        env = {"PATH": "/usr/bin:/bin", "SYMM_TORCH_ALLOCATOR": value, "SYMM_DEVICE": "host"}
        p = subprocess.run([sys.executable, "-c", SITE_CHECK, str(site)], env=env, capture_output=True, text=True,
                           timeout=60, cwd=str(tmp_path))
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == want, (value, p.stderr)
