"""The samplers' bounded-wait request batcher: concurrent callers share batches, with no background task.

Each caller queues its request (in the sampler's own queue) and calls `Batcher.serve`. Whichever caller finds
nobody driving becomes the *driver*: its ``drive`` callback waits a bounded time for more requests
(`Batcher.gather`: until ``max_batch_size`` are queued, at most ``max_wait_ms``), then runs generation,
waking the callers whose requests finished. When the driver returns (its own request done, or cancelled, or
failed) the role passes to a waiting caller the sampler picks (``hand_off``). A caller that leaves early
(cancelled while waiting, perhaps just after being picked to drive) first withdraws its request
(``abandon``), then passes the role on itself when nobody drives, so the role never goes to a caller that is
gone. Generation only runs while some caller awaits it, so nothing outlives the callers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import attrs

__all__ = ["Batcher", "Wakeup"]


@attrs.define(eq=False)
class Wakeup:
    """A waiting caller's alarm: `set` makes it re-check its request (finished, or its turn to drive)."""

    _event: anyio.Event = attrs.field(factory=anyio.Event, init=False)

    def set(self) -> None:
        """Wake the caller (idempotent until it has woken)."""
        self._event.set()

    async def wait(self) -> None:
        """Sleep until `set`, then re-arm."""
        await self._event.wait()
        self._event = anyio.Event()


class Batcher:
    """Driver election and the bounded wait that fills a batch.

    Args:
        max_batch_size: requests that start a batch at once, without waiting out ``max_wait_ms``.
        max_wait_ms: how long an idle driver waits for more requests before it starts a batch; 0 starts at
            once.
    """

    def __init__(self, *, max_batch_size: int, max_wait_ms: float) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self._driving = False
        self._batch_full = anyio.Event()

    @property
    def driving(self) -> bool:
        """Whether some caller is driving generation now."""
        return self._driving

    def queued(self, waiting: int) -> None:
        """Tell the batcher a request was queued; ``waiting`` counts the requests not yet started."""
        if waiting >= self.max_batch_size:
            self._batch_full.set()

    async def serve(
        self,
        wake: Wakeup,
        *,
        finished: Callable[[], bool],
        drive: Callable[[], Awaitable[None]],
        hand_off: Callable[[], None],
        abandon: Callable[[], None],
    ) -> None:
        """Return once ``finished()``; drive whenever nobody else does, else sleep on ``wake``.

        Args:
            wake: this caller's alarm, set by the driver when its request finishes or it is to drive.
            finished: whether this caller's request is done (result or error).
            drive: generate until this caller's request is done (or as far as the sampler goes per turn);
                it starts with `gather`.
            hand_off: called when a drive ends, to `Wakeup.set` one caller whose request still needs
                generating (or to clean up when there is none).
            abandon: called when this caller leaves on an exception (cancelled, or its drive failed), before
                any hand-off: withdraw its request so that ``hand_off`` never picks it.
        """
        try:
            while not finished():
                if not self._driving:
                    self._driving = True
                    try:
                        await drive()
                    finally:
                        self._driving = False
                    hand_off()
                else:
                    await wake.wait()
        except BaseException:
            abandon()
            # A cancelled waiter may have been picked to drive an instant before its cancellation landed.
            if not self._driving:
                hand_off()
            raise

    async def gather(self, waiting: int, *, busy: bool = False) -> None:
        """The driver's bounded wait for a fuller batch.

        Args:
            waiting: requests queued and not yet started.
            busy: generation is already under way (new requests join it), so there is nothing to wait for.
        """
        if self.max_wait_s > 0 and not busy and waiting < self.max_batch_size:
            with anyio.move_on_after(self.max_wait_s):
                await self._batch_full.wait()
        self._batch_full = anyio.Event()
