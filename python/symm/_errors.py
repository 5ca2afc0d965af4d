"""Error codes and exception types of libsymm, mirrored from include/symm.h.

The C library reports failures as a SYMM_ERR_* code plus a per-thread message;
Python sees them as one exception carrying both, so callers can branch on the
code and users read the library's own words.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """The SYMM_ERR_* values of include/symm.h (keep the two in step)."""

    OK = 0
    INVALID = 1
    OUT_OF_MEMORY = 2
    NO_DEVICE = 3
    UNKNOWN_POINTER = 4
    FORKED = 5
    DRIVER = 6
    INTERNAL = 7
    TIMEOUT = 8
    PEER = 9
    BUSY = 10
    MISMATCH = 11


class SymmError(RuntimeError):
    """A libsymm call failed.

    ``code`` is the SYMM_ERR_* value (an :class:`ErrorCode` when known) and
    ``message`` the text of symm_last_error(); ``str(err)`` is the message,
    unchanged, because it already names the driver error, size and device.
    """

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        try:
            self.code: int = ErrorCode(code)
        except ValueError:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        name = self.code.name if isinstance(self.code, ErrorCode) else str(self.code)
        return f"{type(self).__name__}({name}, {self.message!r})"


class OutOfMemoryError(SymmError, MemoryError):
    """The device, or the pool's limit, had no room for the request.

    Also a MemoryError, so code that already handles running out of memory
    catches it without knowing about libsymm.
    """


class LibraryNotFoundError(OSError):
    """libsymm.so could not be found or loaded; the message lists where we looked."""


def make_error(code: int, message: str) -> SymmError:
    """Builds the exception for a failure code: OOM gets its own type."""
    if not message:
        message = f"libsymm call failed with code {code} and no message"
    if code == ErrorCode.OUT_OF_MEMORY:
        return OutOfMemoryError(code, message)
    return SymmError(code, message)
