"""The enumerations of include/symm.h that Python passes to the library or
reads from it, besides the error codes (``_errors.ErrorCode``): each is an
IntEnum whose members are the header's, checked against the header by
tests/python/test_binding.py, so that a new value is one header line plus
one line here (the test names what is missing).

A member's name is the C name after its prefix (SYMM_FLOAT32 -> FLOAT32);
the name the Python API takes is that in lower case ("float32", "two_shot").
"""

from __future__ import annotations

import enum


class Dtype(enum.IntEnum):
    """SYMM_DTYPES: the collectives' element types, each with its size in
    bytes (``Dtype.BFLOAT16.size == 2``). The torch dtype of the same name
    (torch.bfloat16) is the one a tensor of it has."""

    FLOAT32 = 0, 4
    BFLOAT16 = 1, 2
    FLOAT16 = 2, 2

    def __new__(cls, code: int, size: int):
        member = int.__new__(cls, code)
        member._value_ = code
        member.size = size
        return member


class ReduceOp(enum.IntEnum):
    """The reduce operations (SYMM_SUM)."""

    SUM = 0


class AllReduceAlgorithm(enum.IntEnum):
    """SYMM_ALL_REDUCE_*: the all-reduce algorithms, AUTO letting libsymm
    choose."""

    AUTO = 0
    PUSH = 1
    TWO_SHOT = 2
    ONE_SHOT = 3


class TorchMode(enum.IntEnum):
    """SYMM_TORCH_*: how PyTorch uses libsymm (symm_torch_mode())."""

    NONE = 0
    REPLACE = 1
    MEMPOOL = 2


def names(enum_type) -> dict[str, int]:
    """The Python API's names of enum_type's members (lower case) -> code."""
    return {m.name.lower(): m for m in enum_type}
