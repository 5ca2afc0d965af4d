"""Builds and loads libsymm's PyTorch extension (``_torch_ext.cpp``).

The extension is a C++ subclass of torch's ``CUDAPluggableAllocator`` that
answers from libsymm's pool what the plain pluggable class refuses: memory
statistics, ``cacheInfo`` (cudnn.benchmark), ``torch.cuda.OutOfMemoryError``,
memory history and snapshots, the checks and checkpoints of
``torch.compile(mode="reduce-overhead")``. It must be compiled against the
torch the user runs (PyTorch's C++ ABI changes between releases), so it is
built here, at first use, and cached:

- the compiler is ``$CXX``, split as a shell splits it (so ``ccache g++``
  works; a ``$CXX`` that is not on the PATH is an error, never replaced), else
  the first of ``c++``, ``g++``, ``clang++``; it is called directly (no ninja,
  no setuptools) and stopped after ``$SYMM_TORCH_EXT_TIMEOUT`` (default 10
  minutes);
- headers: torch's own (``torch/include``), libsymm's ``symm.h`` (shipped in
  the package, or the repository's ``include/``), and the CUDA runtime's
  ``cuda_runtime_api.h``, looked for in ``$CUDA_HOME/include``,
  ``$CUDA_PATH/include``, ``/usr/local/cuda/include`` and pip's NVIDIA wheels
  in site-packages (``nvidia/cu13/include`` for CUDA 13, ``nvidia/cuda_runtime/include``
  for CUDA 12, which PyTorch's CUDA wheels install);
- the library lands in ``$SYMM_TORCH_EXT_CACHE`` (default
  ``$XDG_CACHE_HOME/libsymm/torch_ext``, else ``~/.cache/libsymm/torch_ext``) under a name keyed by the source and the headers beside it, ``symm.h``,
  torch's version and git revision, Python's version, the CPU architecture
  and the compiler, so a new torch or a new libsymm builds a new one and
  processes that start together (torchrun) build it once, under a file lock;
- the cache is code this process loads: a cache directory, library or lock
  that is not this user's, or that another user can write, is refused;
- a build that failed with a compiler's error is remembered (``.failed``,
  with the log's tail), so the other processes of a job do not retry it; one
  that was stopped (a signal, the time limit, a full disk, no memory) is not.

``SYMM_TORCH_EXT=0`` skips the extension (the ctypes path with hooks);
``SYMM_TORCH_EXT=1`` makes a failure to build it an error instead of a warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import pwd
import re
import shlex
import shutil
import signal
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ENV_MODE = "SYMM_TORCH_EXT"
ENV_CACHE = "SYMM_TORCH_EXT_CACHE"
ENV_TIMEOUT = "SYMM_TORCH_EXT_TIMEOUT"
DEFAULT_TIMEOUT = 600.0  # seconds; a build takes about 33 s (H100 host, 16 cores, torch 2.11)
SOURCE = Path(__file__).resolve().parent / "_torch_ext.cpp"
# Headers the source includes from its own folder, directly or through
# another of them (one translation unit, split by concern): part of the cache
# key, so that an upgrade that changes only a header rebuilds.
HEADERS = tuple(SOURCE.parent / h for h in (
    "_torch_ext_api.h", "_torch_ext_stats.h", "_torch_ext_graphs.h", "_torch_ext_cuda_ipc.h", "_torch_ext_ipc.h",
    "_torch_ext_snapshot.h", "_torch_ext_ops.h"))

# A compiler that failed with one of these did not find an error in the
# source: the machine was short of something. Such a failure is not remembered.
TRANSIENT = ("No space left on device", "Disk quota exceeded", "Killed signal terminated program",
             "internal compiler error: Killed", "virtual memory exhausted", "Cannot allocate memory",
             "out of memory allocating")

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


def build_timeout() -> float:
    """Seconds a build may take: $SYMM_TORCH_EXT_TIMEOUT, seconds or a
    duration such as 300s or 10m (default 600)."""
    v = os.environ.get(ENV_TIMEOUT, "").strip()
    if not v:
        return DEFAULT_TIMEOUT
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)?", v)
    secs = float(m.group(1)) * {None: 1, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}[m.group(2)] if m else 0
    if secs <= 0:
        raise ValueError(f"{ENV_TIMEOUT}={v!r}: want seconds or a duration such as 300s or 10m, more than 0")
    return secs


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


def _compiler() -> list[str]:
    """The compiler's command: $CXX split as a shell splits it (a wrapper such
    as ``ccache g++`` works), else the first of c++, g++, clang++ on the PATH.
    A $CXX that cannot be run is an error: another compiler in its place
    would build with what the user did not choose."""
    env = os.environ.get("CXX", "").strip()
    if not env:
        for name in ("c++", "g++", "clang++"):
            exe = shutil.which(name)
            if exe:
                return [exe]
        raise ExtensionUnavailable("no C++ compiler: none of c++, g++, clang++ is on the PATH (or set CXX)")
    try:
        argv = shlex.split(env)
    except ValueError as e:
        raise ExtensionUnavailable(f"no C++ compiler: CXX={env!r} cannot be split into words: {e}") from e
    exe = shutil.which(argv[0]) if argv and argv[0] else None
    if exe is None:
        raise ExtensionUnavailable(
            f"no C++ compiler: CXX={env!r} names {argv[0] if argv else ''!r}, which is not an executable on the PATH "
            "(fix CXX, or unset it to use c++, g++ or clang++)")
    return [exe, *argv[1:]]


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_owned(path: Path, st: os.stat_result, what: str) -> None:
    """Refuses what another user wrote or can write: the extension is code
    this process runs."""
    euid = os.geteuid()
    if st.st_uid != euid:
        raise ExtensionUnavailable(
            f"the extension's {what} {path} belongs to {_user(st.st_uid)}, not to this user ({_user(euid)}): "
            f"refused (set {ENV_CACHE} to a directory of your own)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ExtensionUnavailable(
            f"the extension's {what} {path} (owner {_user(st.st_uid)}, mode {stat.filemode(st.st_mode)}) can be "
            f"written by other users: refused (chmod go-w {path}, or set {ENV_CACHE} to a directory of your own)")


def _owned_file(path: Path, what: str) -> bool:
    """Whether path exists, as a regular file of this user's that no other
    user can write (else ExtensionUnavailable)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise ExtensionUnavailable(f"the extension's {what} {path}: {e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise ExtensionUnavailable(f"the extension's {what} {path} is not a regular file (a symbolic link?): refused "
                                   f"(delete it)")
    _check_owned(path, st, what)
    return True


def _write_file(path: Path, text: str) -> None:
    """Writes path whole or not at all (a temporary file moved into place:
    a full disk leaves no truncated file, and a link at path is replaced,
    never followed)."""
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _failure_is_transient(returncode: int, output: str) -> str | None:
    """Why a failed compiler run says nothing about the source (the machine
    was short of something, or the compiler was stopped), or None for a
    compile error."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the compiler was killed by {name}"
    for s in TRANSIENT:
        if s in output:
            return f"the compiler stopped: {s}"
    if not output.strip():
        return f"the compiler exited with code {returncode} and printed nothing"
    return None


def _run_compiler(cmd: list[str], timeout: float) -> tuple[int, str, str]:
    """Runs the compiler in a session of its own, so that its children
    (cc1plus, ld, a ccache) are stopped with it."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        raise
    return p.returncode, out, err


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


def _flags(torch, cuda_inc: list[Path], symm_inc: Path, name: str) -> list[str]:
    torch_dir = Path(torch.__file__).resolve().parent
    abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return compile_flags(torch_dir, cuda_inc, symm_inc, name, abi) + link_flags(torch_dir)


def _key(torch, cxx: list[str], flags: list[str], symm_inc: Path) -> str:
    h = hashlib.sha256()
    for f in (SOURCE, *HEADERS, symm_inc / "symm.h"):
        h.update(f.read_bytes())
    for part in (torch.__version__, getattr(torch.version, "git_version", ""), sys.version, platform.machine(),
                 shlex.join(cxx), " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _build(torch) -> Path:
    """Compiles the extension unless the cache has it; returns the .so path."""
    timeout = build_timeout()
    cxx, flags, name = _inputs(torch)
    cache = _open_cache()
    out, failed = cache / f"{name}.so", cache / f"{name}.failed"

    def known():
        # A build that failed with these very inputs fails again: every
        # process of a job (torchrun's ranks, DataLoader workers) would pay
        # the compiler's time for nothing. The key changes with the inputs.
        if _owned_file(out, "library"):
            return out
        if _owned_file(failed, "record of a failed build"):
            text = failed.read_text(errors="replace").strip()
            if text:  # an empty record says nothing: build again
                raise ExtensionUnavailable(text + f" (this build failed before: delete {failed} to retry)")
        return None

    if known():
        return out
    lock_path = cache / f"{name}.lock"
    lock = _open_lock(lock_path)
    try:
        _wait_for(lock, lock_path, timeout)
        if not known():
            _compile(cxx, flags, name, cache, timeout, out, failed)
    finally:
        os.close(lock)  # and the flock with it
    return known() or out


def _inputs(torch) -> tuple[list[str], list[str], str]:
    """The compiler, its flags and the extension's name (keyed by every
    input of the build), or ExtensionUnavailable naming what is missing."""
    cxx = _compiler()
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
    key = _key(torch, cxx, _flags(torch, cuda_inc, symm_inc, "symm_torch_ext"), symm_inc)
    name = f"symm_torch_ext_{key}"
    return cxx, _flags(torch, cuda_inc, symm_inc, name), name


def _open_cache() -> Path:
    """The cache directory, made if need be: a directory this user owns."""
    cache = _cache_dir()
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(cache)
    except OSError as e:
        raise ExtensionUnavailable(f"cannot create the extension cache {cache}: {e} (set {ENV_CACHE})") from e
    if not stat.S_ISDIR(st.st_mode):
        raise ExtensionUnavailable(f"the extension cache {cache} is not a directory (set {ENV_CACHE})")
    _check_owned(cache, st, "cache directory")
    return cache


def _open_lock(lock_path: Path) -> int:
    """The build's lock file, opened: never through a link, never another
    user's file, never anything but a regular file."""
    try:
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ExtensionUnavailable(f"cannot open the extension's lock {lock_path}: {e} (a symbolic link is refused)") from e
    try:
        lst = os.fstat(lock)
        if not stat.S_ISREG(lst.st_mode):
            raise ExtensionUnavailable(f"the extension's lock {lock_path} is not a regular file: refused (delete it)")
        _check_owned(lock_path, lst, "lock")
    except BaseException:
        os.close(lock)
        raise
    return lock


def _wait_for(lock: int, lock_path: Path, timeout: float) -> None:
    """Takes the lock: one build per cache, whatever the processes. A
    builder stops its compiler at the time limit; one that waits gives up a
    little later."""
    give_up = time.monotonic() + timeout + 60
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > give_up:
                raise ExtensionUnavailable(
                    f"another process has held {lock_path} for more than {timeout + 60:g} s while building the "
                    f"extension ({ENV_TIMEOUT} is {timeout:g} s)") from None
            time.sleep(0.2)


def _compile(cxx: list[str], flags: list[str], name: str, cache: Path, timeout: float, out: Path, failed: Path) -> None:
    """Compiles the extension into out, through a temporary file in cache
    (a reader never sees half a library); a compile error is recorded in
    failed (_failed). Called with the lock held."""
    global _build_seconds
    t0 = time.monotonic()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".so.tmp", dir=cache)
        os.close(fd)
    except OSError as e:
        raise ExtensionUnavailable(f"cannot write in the extension cache {cache}: {e}") from e
    cmd = [*cxx, str(SOURCE), "-o", tmp] + flags
    try:
        try:
            rc, stdout, stderr = _run_compiler(cmd, timeout)
        except subprocess.TimeoutExpired:
            raise ExtensionUnavailable(
                f"compiling {SOURCE.name} took more than {timeout:g} s and was stopped ({ENV_TIMEOUT} sets the "
                "limit; not remembered: the next process tries again)") from None
        except OSError as e:
            raise ExtensionUnavailable(f"running the compiler {shlex.join(cxx)} failed: {e}") from e
        if rc != 0:
            _failed(cmd, rc, stdout, stderr, cache / f"{name}.log", failed)
        try:
            os.chmod(tmp, 0o755)  # the linker's mode follows the umask
            os.replace(tmp, out)
        except OSError as e:
            raise ExtensionUnavailable(f"cannot put the extension in the cache {cache}: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _build_seconds = time.monotonic() - t0


def _failed(cmd: list[str], rc: int, stdout: str, stderr: str, log: Path, failed: Path):
    """Raises ExtensionUnavailable for a failed compiler run, with the log's
    tail; records a compile error in `failed`, never a passing failure."""
    output = stdout + stderr
    tail = "\n".join((stderr or stdout).strip().splitlines()[-12:])
    try:
        _write_file(log, shlex.join(cmd) + "\n\n" + output)
        where = f"full log: {log}"
    except OSError as e:
        where = f"no log: {e}"
    why = _failure_is_transient(rc, output)
    if why is not None:
        raise ExtensionUnavailable(f"compiling {SOURCE.name} failed: {why} ({where}; not remembered: the next "
                                   f"process tries again)" + (":\n" + tail if tail else ""))
    msg = f"compiling {SOURCE.name} failed ({where}):\n{tail}"
    try:
        _write_file(failed, msg)
    except OSError:
        pass  # not remembered: the next process tries again
    raise ExtensionUnavailable(msg)


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
