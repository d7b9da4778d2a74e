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


@pytest.mark.parametrize(("size", "wait"), [(0, 5.0), (1, -1.0)])
def test_bad_limits_are_refused(size: int, wait: float) -> None:
    with pytest.raises(ValueError, match="must be >= "):
        Batcher(max_batch_size=size, max_wait_ms=wait)
