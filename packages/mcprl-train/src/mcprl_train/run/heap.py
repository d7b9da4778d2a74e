"""Freed heap memory handed back to the operating system where a run's phase ends (glibc's ``malloc_trim``).

On the CPU torch allocates tensors with the C library's ``malloc``. glibc keeps what is freed inside the
process: once its dynamic mmap threshold has grown, large blocks come from the heap instead of their own
mappings, and every thread has its own arena (the sampler decodes in a worker thread, the learner runs in the
main thread), so memory that one phase freed stays in the process's RSS and is not reusable by the other. On the
real model (``cpu-smollm2``) a run's RSS reached 19.0 GB while collecting a GRPO step; one ``malloc_trim(0)``
from outside brought it to 13.4 GB (``benchmarks/RESULTS.md``). `trim_heap` calls it; where the C library has
none (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

__all__ = ["trim_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)  # the C library this process runs on
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the heap's free pages to the OS (every arena's); whether any were returned (False without glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
