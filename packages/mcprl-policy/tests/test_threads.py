"""Two working threads share torch's CPU threads inside a split; outside one each runs on the whole count."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
import torch

from mcprl_policy import HFSampler, Policy, SamplingParams
from mcprl_policy.decode import DecodeRequest
from mcprl_policy.threads import split_threads, take_threads


@pytest.fixture
def four_threads() -> Iterator[None]:
    """The calling thread at 4 torch threads (more than this machine's cores is allowed), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def counted() -> int:
    take_threads()
    return torch.get_num_threads()


def test_a_worker_thread_runs_on_its_share_inside_a_split_and_on_the_whole_after(four_threads: None) -> None:
    one_thread = anyio.CapacityLimiter(1)  # the same pooled thread runs all three

    async def main() -> tuple[int, int, int]:
        with split_threads(2) as share:
            inside = await anyio.to_thread.run_sync(counted, limiter=one_thread)
        after = await anyio.to_thread.run_sync(counted, limiter=one_thread)
        return share, inside, after

    assert anyio.run(main) == (2, 2, 4)
    assert torch.get_num_threads() == 4  # the splitting thread keeps its own


def test_the_share_reaches_threads_started_from_tasks_of_the_split(four_threads: None) -> None:
    seen: list[int] = []

    async def task() -> None:
        seen.append(await anyio.to_thread.run_sync(counted))

    async def main() -> None:
        with split_threads(4):
            async with anyio.create_task_group() as tg:
                tg.start_soon(task)
                tg.start_soon(task)

    anyio.run(main)
    assert seen == [1, 1]


def test_a_share_is_at_least_one_thread_and_ways_must_be_positive(four_threads: None) -> None:
    with split_threads(8) as share:
        assert share == 1
    with pytest.raises(ValueError, match="ways must be >= 1"), split_threads(0):
        pass


def test_the_decode_engine_runs_on_its_share_inside_a_split(
    tiny_dir: Path, four_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler's worker thread takes the split's share before its forwards, and the whole count after."""
    policy = Policy.from_pretrained(str(tiny_dir))
    sampler = HFSampler(policy, SamplingParams(temperature=1.0, seed=0))
    threads_per_step: list[int] = []
    decode_step = sampler.engine._decode_step

    def step(device: torch.device) -> list[DecodeRequest]:
        threads_per_step.append(torch.get_num_threads())
        return decode_step(device)

    monkeypatch.setattr(sampler.engine, "_decode_step", step)
    prompt = policy.tokenizer.encode("What is the price of ACME?")

    async def main() -> None:
        with split_threads(2):
            await sampler.sample(prompt, max_new_tokens=4)
        inside = len(threads_per_step)
        await sampler.sample(prompt, max_new_tokens=4)
        assert set(threads_per_step[:inside]) == {2}
        assert set(threads_per_step[inside:]) == {4}

    anyio.run(main)
