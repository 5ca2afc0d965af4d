"""The C++ way into the collectives and signals (``_torch_ext_ops.h`` in
libsymm's PyTorch extension): one pybind11 call that checks the tensors,
takes the current stream and calls the C API, instead of Python's checks
and a ctypes call. symm.one_shot_all_reduce, two_shot_all_reduce,
reduce_scatter, all_gather and Handle.put_signal / wait_signal / barrier
take it for CUDA tensors whose handle is known, where the extension is
built; everything else (and every call it passes on, with nothing done)
goes the ctypes way, whose checks word the errors.

The extension is built at first use, as for the allocator, and cached
(``_torch_ext``): SYMM_TORCH_EXT=0 keeps the ctypes way; a build that fails
warns once and keeps it too (SYMM_TORCH_EXT=1 makes that an error).
"""

from __future__ import annotations

import threading
import warnings

PASS = -1  # the extension passed the call on: nothing was done

# None: not tried yet; False: not available; else the module. Callers on
# the hot path read it directly (one attribute load) and call ops() only
# while it is None.
loaded = None
_lock = threading.Lock()


def ops():
    """The extension module with its operators ready, or False."""
    global loaded
    m = loaded
    if m is None:
        with _lock:
            if loaded is None:
                loaded = _load()
            m = loaded
    return m


def _load():
    from . import _torch_ext
    from ._loader import library_path

    mode = _torch_ext.mode()
    if mode == "off":
        return False
    try:
        mod = _torch_ext.load()
        mod.ops_init(str(library_path()))
        return mod
    except Exception as e:  # noqa: BLE001 - reported; the ctypes way keeps working
        if mode == "require":
            raise
        warnings.warn(f"symm: libsymm's PyTorch extension is not available for the collectives ({e}); "
                      f"they go through ctypes ({_torch_ext.ENV_MODE}=0 silences this)", RuntimeWarning, stacklevel=4)
        return False
