"""libsymm as PyTorch's allocator with no edit to the script.

With ``SYMM_TORCH_ALLOCATOR=1`` in the environment, the moment a process
finishes importing torch, symm.use_as_default() runs: every CUDA tensor of
the process then comes from libsymm, as if the script's first line had been
that call. It gets here two ways:

- an installed wheel puts ``symm_autoload.pth`` (and ``symm_autoload.py``)
  into site-packages; Python runs its one line at start-up, which imports
  this module only when the variable is on (so a process without it pays
  one environment lookup);
- ``symm run -- CMD ...`` sets the variable and puts ``symm/_boot`` (a
  ``sitecustomize`` that imports this module, then the one it hides) first on
  PYTHONPATH, which reaches a checkout's package too, where no .pth runs.

``_boot/symm_autoload.py`` owns the variable's on and off words for all three.

Why at torch's import, not at Python's start: importing torch then (and
building libsymm's extension) would slow every Python process of a job,
torchrun's launcher and each DataLoader worker included, whether it touches
CUDA or not. Torch's import initializes no CUDA, so its end is the earliest
moment that is still early enough: a script's ``torch.cuda.set_device(rank)``
comes after it, and PyTorch refuses to swap its allocator only once CUDA is
initialized.

Invariants:
- The finder is on sys.meta_path until torch's import ends, then removes
  itself; it never imports anything but the spec's own loader in between.
- A failure to install libsymm is raised from ``import torch`` with its
  cause, never swallowed: the user asked for libsymm, and a job that silently
  ran on another allocator would mislead them.
- A forked child (DataLoader workers, torch.multiprocessing's fork) inherits
  the installed allocator; a spawned one imports torch again and installs
  it again, as its parent did.
- A process whose PyTorch settings name an allocator backend
  (``backend:cudaMallocAsync`` or ``backend:native`` in the variable torch
  reads) asked PyTorch for that allocator: it gets it, with one warning, and
  libsymm is not installed. Such a process is typically a child that
  inherited SYMM_TORCH_ALLOCATOR=1 and chose its own allocator (PyTorch's
  own tests start children so); failing it would break a program that runs
  on PyTorch's allocator.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import warnings

# The variable and its on and off words: _boot/symm_autoload.py has them,
# for the start-up line and symm run's sitecustomize too.
from ._boot.symm_autoload import ENV, wanted


# The variables torch 2.11 reads its allocator settings from, the first one
# set winning (allocator/torchconf.go reads them in the same order).
_SETTINGS_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_BACKEND = re.compile(r"(?:^|,)\s*backend\s*:\s*([^,\s]*)")


def asked_backend() -> tuple[str, str] | None:
    """(variable, backend) when PyTorch's settings name an allocator backend
    (backend:native, backend:cudaMallocAsync), else None."""
    for var in _SETTINGS_VARS:
        text = os.environ.get(var, "")
        if text:
            m = _BACKEND.search(text)
            return (var, m.group(1)) if m else None
    return None


def _install_now() -> None:
    """Makes libsymm PyTorch's current allocator; torch is imported."""
    from .torch_allocator import use_as_default

    if (asked := asked_backend()) is not None:
        var, backend = asked
        warnings.warn(
            f"{ENV}=1 is not applied: {var} asks for PyTorch's {backend!r} allocator backend, "
            f"so this process uses that allocator, not libsymm's pool (remove backend:{backend} to use libsymm)",
            RuntimeWarning,
            stacklevel=2,
        )
        return

    try:
        use_as_default()
    except Exception as e:
        raise RuntimeError(f"{ENV}=1: libsymm could not become PyTorch's allocator: {e}") from e


class _Loader(importlib.abc.Loader):
    """torch's own loader, and libsymm installed once its module has run."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        if wanted():  # raises on a bad value, which start-up could only print
            _install_now()

    def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self._inner, name)


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Finds torch through the other finders and wraps its loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        _remove()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if find is not None and (spec := find(fullname, path, target)) is not None:
                    break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def _remove() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchFinder)]


def install() -> bool:
    """Arranges for libsymm to become PyTorch's allocator when torch is
    imported (at once when torch already is). Returns whether it will;
    nothing happens when SYMM_TORCH_ALLOCATOR is off."""
    if not wanted():
        return False
    if "torch" in sys.modules:
        _install_now()
        return True
    if not any(isinstance(f, _TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())
    return True


# The .pth line and symm/_boot/sitecustomize.py import this module for its
# effect: a bad value stops nothing at start-up (Python only prints a .pth
# line's error), so it is checked again, and raised, when torch is imported.
try:
    install()
except ValueError:
    sys.meta_path.insert(0, _TorchFinder())
