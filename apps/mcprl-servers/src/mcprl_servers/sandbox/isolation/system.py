"""What every isolation step shares: the error that refuses to run the code, and the C library handle."""

from __future__ import annotations

import ctypes
import os

__all__ = ["SetupError", "errno_text", "libc"]

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """Isolation could not be set up; the code is not run."""


def errno_text() -> str:
    """The message of the C library's last ``errno``."""
    return os.strerror(ctypes.get_errno())
