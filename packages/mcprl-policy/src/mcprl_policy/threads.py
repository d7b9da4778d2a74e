"""torch's CPU threads when two working threads run torch at once: each takes its share of the cores.

torch runs a CPU kernel on the calling thread's OpenMP (and MKL) team, sized by that thread's own setting:
`torch.set_num_threads` in one thread leaves every other thread's team as it was. So when two threads run torch
work at the same time (``collection.overlap``: the update in one worker thread, the decode engine in another),
each asks for every core and the cores are oversubscribed; on the 2-core demo machine a GRPO step took 4.21 s
with 2 threads each against 3.77-3.88 s with one each (``benchmarks/RESULTS.md``, "prefix-grouped update").

`split_threads` marks the work started inside it (its tasks and anyio's worker threads inherit the context) as
sharing the calling thread's torch threads ``ways`` ways; `take_threads`, called by a working thread before its torch
work, sets that thread's count: its share inside a split, the splitting thread's whole count outside one.
Setting it outside a split too matters because threads are pooled and torch's count is sticky: a worker thread
that ran a share keeps it, and a thread created while another held a share starts from that share (torch
initialises a new thread's count from the last `torch.set_num_threads` of any thread). Before the first split
`take_threads` changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["split_threads", "take_threads"]

_share: ContextVar[int | None] = ContextVar("mcprl_torch_threads_share", default=None)
_whole: int | None = None  # the torch threads of the thread that opened the latest split


@contextmanager
def split_threads(ways: int) -> Iterator[int]:
    """Within: torch work started from this context runs on ``1/ways`` of this thread's torch threads.

    Yields:
        Each working thread's share: ``torch.get_num_threads() // ways``, at least 1.

    Raises:
        ValueError: ``ways < 1``.
    """
    global _whole
    if ways < 1:
        raise ValueError(f"split_threads(ways={ways}): ways must be >= 1")
    _whole = torch.get_num_threads()
    share = max(1, _whole // ways)
    token = _share.set(share)
    try:
        yield share
    finally:
        _share.reset(token)


def take_threads() -> None:
    """Size this thread's torch threads for the work it runs next: its share inside a split, else the whole."""
    wanted = _share.get() or _whole
    if wanted is not None and wanted != torch.get_num_threads():
        torch.set_num_threads(wanted)
