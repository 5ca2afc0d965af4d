"""Builds and loads libsymm's PyTorch extension (``_torch_ext.cpp``).

The extension is a C++ subclass of torch's ``CUDAPluggableAllocator`` that
answers from libsymm's pool what the plain pluggable class refuses: memory
statistics, ``cacheInfo`` (cudnn.benchmark), ``torch.cuda.OutOfMemoryError``,
memory history and snapshots, the checks and checkpoints of
``torch.compile(mode="reduce-overhead")``. It must be compiled against the
torch the user runs (PyTorch's C++ ABI changes between releases), so it is
built here, at first use, and cached:

- the compiler is ``$CXX`` or ``c++`` (g++ or clang++), called directly:
  no ninja, no setuptools;
- headers: torch's own (``torch/include``), libsymm's ``symm.h`` (shipped in
  the package, or the repository's ``include/``), and the CUDA runtime's
  ``cuda_runtime_api.h``, looked for in ``$CUDA_HOME/include``,
  ``$CUDA_PATH/include``, ``/usr/local/cuda/include`` and pip's NVIDIA wheels
  in site-packages (``nvidia/cu13/include`` for CUDA 13, ``nvidia/cuda_runtime/include``
  for CUDA 12, which PyTorch's CUDA wheels install);
- the library lands in ``$SYMM_TORCH_EXT_CACHE`` (default
  ``$XDG_CACHE_HOME/libsymm/torch_ext``, else ``~/.cache/libsymm/torch_ext``) under a name keyed by the source, ``symm.h``,
  torch's version and git revision, Python's version and the compiler, so a
  new torch or a new libsymm builds a new one and processes that start
  together (torchrun) build it once, under a file lock.

``SYMM_TORCH_EXT=0`` skips the extension (the ctypes path with hooks);
``SYMM_TORCH_EXT=1`` makes a failure to build it an error instead of a warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ENV_MODE = "SYMM_TORCH_EXT"
ENV_CACHE = "SYMM_TORCH_EXT_CACHE"
SOURCE = Path(__file__).resolve().parent / "_torch_ext.cpp"
# Headers the source includes from its own folder (part of the cache key).
HEADERS = (SOURCE.parent / "_torch_ext_ipc.h",)

# What a user loses when the extension cannot be built (the warning says it).
LOST = (
    "torch.cuda.memory_allocated/memory_stats/memory_summary and "
    "reset_peak_memory_stats raise, cudnn.benchmark raises, out-of-memory is a "
    "RuntimeError rather than torch.cuda.OutOfMemoryError, "
    "torch.cuda.memory._record_memory_history/_snapshot raise (use "
    "symm.memory_snapshot()), torch.compile(mode='reduce-overhead') needs a MemPool"
)


class ExtensionUnavailable(RuntimeError):
    """The extension cannot be built here; the message says what is missing."""


_lock = threading.Lock()
_module = None
_build_seconds: float | None = None


def build_seconds() -> float | None:
    """Seconds the last build in this process took (None: it came from the cache)."""
    return _build_seconds


def mode() -> str:
    """'auto' (default), 'off' (SYMM_TORCH_EXT=0) or 'require' (SYMM_TORCH_EXT=1)."""
    v = os.environ.get(ENV_MODE, "")
    if v in ("", "auto"):
        return "auto"
    if v == "0":
        return "off"
    if v == "1":
        return "require"
    raise ValueError(f"{ENV_MODE}={v!r}: want 0 (off), 1 (required) or unset (auto)")


def symm_header_dir() -> Path:
    """Where symm.h is: the package's include/ (a wheel, or the checkout's link)."""
    here = Path(__file__).resolve().parent
    for d in (here / "include", here.parent.parent / "include"):
        if (d / "symm.h").is_file():
            return d
    raise ExtensionUnavailable(f"symm.h is not in {here / 'include'} (a broken install of the symm package?)")


def _site_dirs() -> list[Path]:
    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # virtualenv's old site.py
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    dirs.extend(p for p in sys.path if p.endswith("site-packages") or p.endswith("dist-packages"))
    seen, out = set(), []
    for d in dirs:
        if d and d not in seen:
            seen.add(d)
            out.append(Path(d))
    return out


def cuda_include_dirs() -> tuple[list[Path], list[str]]:
    """Include directories that give cuda_runtime_api.h (and what it includes),
    and every place looked at, for the error message."""
    looked: list[str] = []
    candidates: list[list[Path]] = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append([Path(os.environ[env]) / "include"])
    candidates.append([Path("/usr/local/cuda/include")])
    for sp in _site_dirs():
        # CUDA 13 wheels put every header under nvidia/cu13/include (runtime
        # and crt come from two wheels into the same folder); CUDA 12 wheels
        # have one folder per package.
        candidates.append([sp / "nvidia" / "cu13" / "include"])
        candidates.append([sp / "nvidia" / "cuda_runtime" / "include", sp / "nvidia" / "cuda_nvcc" / "include"])
    for dirs in candidates:
        looked.append(str(dirs[0]))
        have = [d for d in dirs if d.is_dir()]
        if not any((d / "cuda_runtime_api.h").is_file() for d in have):
            continue
        if not any((d / "crt" / "host_defines.h").is_file() for d in have):
            looked[-1] += " (cuda_runtime_api.h without crt/host_defines.h)"
            continue
        return have, looked
    return [], looked


def _compiler() -> str | None:
    cxx = os.environ.get("CXX") or "c++"
    return shutil.which(cxx) or shutil.which("g++") or shutil.which("clang++")


def _cache_dir() -> Path:
    d = os.environ.get(ENV_CACHE)
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "libsymm" / "torch_ext"


def compile_flags(torch_dir: Path, cuda_inc: list[Path], symm_inc: Path, name: str, cxx11_abi: bool = True) -> list[str]:
    """The compiler's flags for the extension, without linking: torch's
    headers (what torch.utils.cpp_extension.include_paths() gives), CUDA's,
    libsymm's and Python's. CI compiles the source with exactly these
    (tests/check_torch_ext.sh), against the torch headers of a wheel."""
    inc = torch_dir / "include"
    sysinc = [inc, inc / "torch" / "csrc" / "api" / "include", *cuda_inc, Path(sysconfig.get_paths()["include"])]
    return (["-fPIC", "-O2", "-std=c++17", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}",
             f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H", f"-I{symm_inc}"]
            + [f"-isystem{d}" for d in sysinc])


def link_flags(torch_dir: Path) -> list[str]:
    lib = torch_dir / "lib"
    return ["-shared", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu",
            "-ltorch_cuda", "-ltorch_python", "-ldl"]


def _flags(torch, cxx: str, cuda_inc: list[Path], symm_inc: Path, name: str) -> list[str]:
    torch_dir = Path(torch.__file__).resolve().parent
    abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return compile_flags(torch_dir, cuda_inc, symm_inc, name, abi) + link_flags(torch_dir)


def _key(torch, cxx: str, flags: list[str], symm_inc: Path) -> str:
    h = hashlib.sha256()
    for f in (SOURCE, *HEADERS, symm_inc / "symm.h"):
        h.update(f.read_bytes())
    for part in (torch.__version__, getattr(torch.version, "git_version", ""), sys.version, cxx, " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _build(torch) -> Path:
    """Compiles the extension unless the cache has it; returns the .so path."""
    global _build_seconds
    cxx = _compiler()
    if cxx is None:
        raise ExtensionUnavailable("no C++ compiler: none of $CXX, c++, g++, clang++ is on the PATH")
    if not (Path(torch.__file__).resolve().parent / "include" / "torch" / "csrc" / "cuda" / "CUDAPluggableAllocator.h").is_file():
        raise ExtensionUnavailable(f"torch {torch.__version__} has no C++ headers (torch/include/torch/csrc/cuda)")
    symm_inc = symm_header_dir()
    cuda_inc, looked = cuda_include_dirs()
    if not cuda_inc:
        raise ExtensionUnavailable(
            "no CUDA runtime headers (cuda_runtime_api.h with crt/host_defines.h) in " + ", ".join(looked)
            + "; set CUDA_HOME, or pip install nvidia-cuda-runtime nvidia-cuda-crt (CUDA 13) / "
            "nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 (CUDA 12)"
        )
    flags0 = _flags(torch, cxx, cuda_inc, symm_inc, "symm_torch_ext")
    key = _key(torch, cxx, flags0, symm_inc)
    name = f"symm_torch_ext_{key}"
    flags = _flags(torch, cxx, cuda_inc, symm_inc, name)
    cache = _cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExtensionUnavailable(f"cannot create the extension cache {cache}: {e} (set {ENV_CACHE})") from e
    out, failed = cache / f"{name}.so", cache / f"{name}.failed"

    def known():
        # A build that failed with these very inputs fails again: every
        # process of a job (torchrun's ranks, DataLoader workers) would pay
        # the compiler's time for nothing. The key changes with the inputs.
        if out.is_file():
            return out
        if failed.is_file():
            raise ExtensionUnavailable(failed.read_text() + f" (this build failed before: delete {failed} to retry)")
        return None

    if known():
        return out
    with open(cache / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per cache, whatever the processes
        if known():
            return out
        t0 = time.monotonic()
        fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".so.tmp", dir=cache)
        os.close(fd)
        cmd = [cxx, str(SOURCE), "-o", tmp] + flags
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                log = cache / f"{name}.log"
                log.write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
                tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-12:])
                msg = f"compiling {SOURCE.name} failed (full log: {log}):\n{tail}"
                failed.write_text(msg)
                raise ExtensionUnavailable(msg)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _build_seconds = time.monotonic() - t0
    return out


def load():
    """The extension module, built if needed. Raises ExtensionUnavailable."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        import torch

        path = _build(torch)
        name = path.stem
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
        mod = importlib.util.module_from_spec(spec)
        try:
            loader.exec_module(mod)
        except ImportError as e:
            raise ExtensionUnavailable(f"loading {path} failed: {e} (delete it to rebuild)") from e
        _module = mod
        return mod
