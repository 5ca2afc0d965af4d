"""Put first on PYTHONPATH by `symm run`: makes libsymm PyTorch's allocator
when the process imports torch (symm/_autoload.py), then runs the
sitecustomize this one hides, if the environment has one, as Python would
have.

Only the standard library is imported unless SYMM_TORCH_ALLOCATOR is set.
The package this file belongs to is importable from here even in a checkout
that is not on sys.path (its parent directory is appended, so an installed
symm still comes first).
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Runs the next sitecustomize on sys.path, skipping this directory."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# The same "off" words as symm._autoload: anything else (a bad value too,
# which it raises at torch's import) imports it.
if os.environ.get("SYMM_TORCH_ALLOCATOR", "").strip().lower() not in ("", "0", "false", "no", "off"):
    try:
        import symm._autoload  # noqa: F401
    except ImportError:
        sys.path.append(os.path.dirname(os.path.dirname(_HERE)))
        import symm._autoload  # noqa: F401
_chain()
