"""pool_allocator() with a CUDA build of torch, without touching a GPU.

Skipped where torch is missing (as on the development machines); the GPU
checks of the whole integration are in tests/device/test_torch_pool.py.
Building a CUDAPluggableAllocator and attaching hooks initializes nothing,
so this runs in-process.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not hasattr(torch._C, "_cuda_customAllocator"), reason="torch has no CUDA support"
)


def test_pool_allocator_is_cached_and_uses_the_loaded_library():
    import symm

    a = symm.pool_allocator()
    assert a is symm.pool_allocator()
    assert isinstance(a, torch.cuda.memory.CUDAPluggableAllocator)
    raw = a.allocator()
    for setter in ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_record_stream_fn"):
        assert hasattr(raw, setter)
    assert not symm.is_default()
