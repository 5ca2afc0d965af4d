"""Put first on PYTHONPATH by `symm run`: makes libsymm PyTorch's allocator
when the process imports torch (symm/_autoload.py), then runs the
sitecustomize this one hides, if the environment has one, as Python would
have.

Only the standard library is imported unless SYMM_TORCH_ALLOCATOR is on
(symm_autoload.py, beside this file, has its words). The package this file
belongs to is importable from here even in a checkout that is not on
sys.path (its parent directory is appended, so an installed symm still
comes first).
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


# symm_autoload (beside this file, first on sys.path) owns the variable's
# words: anything but an off word (a bad value too, which symm._autoload
# raises at torch's import) imports symm._autoload.
import symm_autoload  # noqa: E402

if symm_autoload.start_wanted():
    try:
        import symm._autoload  # noqa: F401
    except ImportError:
        sys.path.append(os.path.dirname(os.path.dirname(_HERE)))
        import symm._autoload  # noqa: F401
_chain()
