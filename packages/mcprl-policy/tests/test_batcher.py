"""The bounded-wait batcher, driven the way the vLLM sampler drives it (one batch per drive)."""

from __future__ import annotations

import anyio
import attrs
import pytest

from mcprl_policy.batcher import Batcher, Wakeup


@attrs.define(eq=False)
class _Request:
    value: int
    wake: Wakeup = attrs.field(factory=Wakeup)
    result: int | None = None


class _Doubler:
    """A toy sampler: each batch doubles its requests' values in a worker thread."""

    def __init__(self, *, max_batch_size: int, max_wait_ms: float) -> None:
        self.batcher = Batcher(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        self.pending: list[_Request] = []
        self.batches: list[list[int]] = []

    async def submit(self, value: int) -> int:
        request = _Request(value)
        self.pending.append(request)
        self.batcher.queued(len(self.pending))
        await self.batcher.serve(
            request.wake,
            finished=lambda: request.result is not None,
            drive=self._drive,
            hand_off=self._hand_off,
            abandon=lambda: self._abandon(request),
        )
        assert request.result is not None
        return request.result

    async def _drive(self) -> None:
        await self.batcher.gather(len(self.pending))
        size = self.batcher.max_batch_size
        batch, self.pending = self.pending[:size], self.pending[size:]
        self.batches.append([r.value for r in batch])
        results = await anyio.to_thread.run_sync(lambda: [2 * r.value for r in batch])
        for request, result in zip(batch, results, strict=True):
            request.result = result
            request.wake.set()

    def _hand_off(self) -> None:
        if self.pending:
            self.pending[0].wake.set()

    def _abandon(self, request: _Request) -> None:
        if request in self.pending:
            self.pending.remove(request)


async def _submit_all(doubler: _Doubler, values: list[int]) -> list[int]:
    results = [0] * len(values)

    async def one(i: int) -> None:
        results[i] = await doubler.submit(values[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(values)):
            tg.start_soon(one, i)
    return results


def test_concurrent_requests_within_the_wait_share_one_batch() -> None:
    doubler = _Doubler(max_batch_size=64, max_wait_ms=50)
    assert anyio.run(_submit_all, doubler, [1, 2, 3, 4]) == [2, 4, 6, 8]
    assert doubler.batches == [[1, 2, 3, 4]]


def test_a_full_batch_starts_without_waiting_out_the_wait() -> None:
    doubler = _Doubler(max_batch_size=3, max_wait_ms=60_000)

    async def main() -> list[int]:
        with anyio.fail_after(10):
            return await _submit_all(doubler, [1, 2, 3])

    assert anyio.run(main) == [2, 4, 6]


def test_the_driver_role_passes_on_until_every_request_is_served() -> None:
    doubler = _Doubler(max_batch_size=2, max_wait_ms=0)
    values = list(range(7))
    assert anyio.run(_submit_all, doubler, values) == [2 * v for v in values]
    assert all(len(b) <= 2 for b in doubler.batches)
    assert sorted(v for b in doubler.batches for v in b) == values


def test_a_waiter_cancelled_just_after_being_picked_to_drive_passes_the_role_on() -> None:
    """The driver's hand-off wakes a waiter whose cancellation has been requested but not yet delivered: the
    waiter leaves without driving, so it must pass the role on, or every other waiter sleeps forever."""
    doubler = _Doubler(max_batch_size=1, max_wait_ms=0)
    scopes: dict[str, anyio.CancelScope] = {}
    results: dict[str, int] = {}
    hand_off = doubler._hand_off

    def cancel_the_next_then_hand_off() -> None:
        if doubler.pending and doubler.pending[0].value == 2:
            scopes["second"].cancel()  # delivered before the wake-up is seen: the picked waiter never drives
        hand_off()

    doubler._hand_off = cancel_the_next_then_hand_off  # type: ignore[method-assign]

    async def submit(name: str, value: int) -> None:
        with scopes.setdefault(name, anyio.CancelScope()):
            results[name] = await doubler.submit(value)

    async def main() -> None:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for name, value in (("first", 1), ("second", 2), ("third", 3)):
                    tg.start_soon(submit, name, value)

    anyio.run(main)
    assert results == {"first": 2, "third": 6}
    assert doubler.batches == [[1], [3]]


@pytest.mark.parametrize(("size", "wait"), [(0, 5.0), (1, -1.0)])
def test_bad_limits_are_refused(size: int, wait: float) -> None:
    with pytest.raises(ValueError, match="must be >= "):
        Batcher(max_batch_size=size, max_wait_ms=wait)
