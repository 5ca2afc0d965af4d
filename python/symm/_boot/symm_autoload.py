"""SYMM_TORCH_ALLOCATOR's words, in the one place that has them, and the
start-up step that arms libsymm as PyTorch's allocator (symm/_autoload.py)
when the variable asks for it.

Three readers, one list:
- ``symm_autoload.pth`` (site-packages' top, from an installed package) runs
  at every Python start-up; its one line imports this module, installed
  beside it, only when the variable is set and not empty, so a process
  without it pays one environment lookup, and one with an off word this
  standard-library module and no more;
- ``sitecustomize.py`` beside this file (``symm run`` puts this directory
  first on PYTHONPATH) imports it the same way;
- ``symm._autoload`` reads the words from here (as
  ``symm._boot.symm_autoload``).

Only the standard library is imported here, and symm._autoload (with the
package) only when the variable is not off: a bad value imports it too,
which raises it, naming the variable, at torch's import (start-up could
only print it).
"""

import os
import sys

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


def start() -> None:
    """The start-up step: imports symm._autoload unless the variable is off.
    From _boot in a checkout that is not on sys.path, the checkout's package
    directory is appended (so an installed symm still comes first)."""
    try:
        if not wanted():
            return
    except ValueError:
        pass  # symm._autoload raises it when torch is imported
    try:
        import symm._autoload  # noqa: F401
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        if os.path.basename(here) != "_boot":
            raise
        sys.path.append(os.path.dirname(os.path.dirname(here)))
        import symm._autoload  # noqa: F401
