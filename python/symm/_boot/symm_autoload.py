"""SYMM_TORCH_ALLOCATOR's words, in the one place that has them.

Three readers, one list:
- ``symm_autoload.pth`` (site-packages' top, from an installed package) runs
  at every Python start-up; its one line imports this module, installed
  beside it, only when the variable is set and not empty, and imports
  symm._autoload (which arms libsymm as PyTorch's allocator) when
  start_wanted() says so: a process without the variable pays one
  environment lookup, one with an off word this small module and no more;
- ``sitecustomize.py`` beside this file (``symm run`` puts this directory
  first on PYTHONPATH) does the same;
- ``symm._autoload`` takes wanted() from here (as ``symm._boot.symm_autoload``).

Only the standard library is imported here, and nothing of symm: the
modules that import symm._autoload import this one, never the reverse.
"""

import os

ENV = "SYMM_TORCH_ALLOCATOR"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")


def wanted(environ=None) -> bool:
    """Whether SYMM_TORCH_ALLOCATOR asks for libsymm. A value that is
    neither on nor off raises ValueError naming the variable and the value."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"{ENV}={environ[ENV]!r}: expected 1 (libsymm is PyTorch's allocator) or 0")


def start_wanted(environ=None) -> bool:
    """Whether start-up imports symm._autoload: the variable is not off. A
    bad value is wanted too: symm._autoload raises it, naming the
    variable, at torch's import (start-up could only print it)."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV, "").strip().lower() not in OFF
