"""Seeded requests: a request's tokens depend on its prompt, seed and the weights, not on its batch.

The logits of a row are not bit-identical across batch compositions on the CPU (left padding and the batch
size change the reductions' order: up to ~3e-7 on the tiny model), so the reported logprobs may differ in
their last bits; the sampled tokens, drawn from each row's own generator, are the same.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from mcprl_policy import Completion, HFSampler, Policy, SamplerError, SamplingParams

MAX_NEW = 20
LOGPROB_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> Policy:
    return Policy.from_pretrained(str(tiny_dir))


def _prompts(policy: Policy, n: int) -> list[list[int]]:
    return [
        policy.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} times ACME?" + " Please." * (i % 5)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


async def _sample(
    sampler: HFSampler,
    prompts: Sequence[list[int]],
    seeds: Sequence[int | None],
    order: Sequence[int],
    jitter: random.Random | None = None,
) -> list[Completion]:
    results: dict[int, Completion] = {}

    async def one(i: int) -> None:
        if jitter is not None:
            await anyio.sleep(jitter.random() * 0.03)
        results[i] = await sampler.sample(prompts[i], max_new_tokens=MAX_NEW, seed=seeds[i])

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in order:
                tg.start_soon(one, i)
    return [results[i] for i in range(len(prompts))]


def _assert_same(a: Sequence[Completion], b: Sequence[Completion]) -> None:
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b, strict=True):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) <= LOGPROB_TOLERANCE


def test_a_seeded_request_samples_alike_alone_batched_reordered_and_under_jittered_arrivals(
    policy: Policy,
) -> None:
    n = 8
    prompts = _prompts(policy, n)
    seeds = [1_000 + i for i in range(n)]
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=0)
    alone = [
        anyio.run(_sample, HFSampler(policy, params, max_batch_size=1), [p], [s], [0])[0]
        for p, s in zip(prompts, seeds, strict=True)
    ]
    batched = anyio.run(_sample, HFSampler(policy, params, max_wait_ms=50), prompts, seeds, range(n))
    reversed_ = anyio.run(
        _sample, HFSampler(policy, params, max_wait_ms=50), prompts, seeds, list(reversed(range(n)))
    )
    jittered = anyio.run(
        _sample,
        HFSampler(policy, params, max_batch_size=4, max_wait_ms=1),
        prompts,
        seeds,
        range(n),
        random.Random(5),
    )
    for run in (batched, reversed_, jittered):
        _assert_same(run, alone)
    assert len({tuple(c.token_ids) for c in alone}) > 1


def test_a_seeded_request_ignores_the_engine_seed_and_the_seed_matters(policy: Policy) -> None:
    prompt = _prompts(policy, 1)
    one = anyio.run(
        _sample, HFSampler(policy, SamplingParams(temperature=1.0, seed=1)), prompt * 6, [7] * 6, range(6)
    )
    other_engine = anyio.run(
        _sample, HFSampler(policy, SamplingParams(temperature=1.0, seed=2)), prompt, [7], [0]
    )
    assert {tuple(c.token_ids) for c in one} == {
        tuple(other_engine[0].token_ids)
    }  # a GRPO group: same seed, same
    seeds = list(range(6))
    distinct = anyio.run(
        _sample, HFSampler(policy, SamplingParams(temperature=1.0)), prompt * 6, seeds, range(6)
    )
    assert len({tuple(c.token_ids) for c in distinct}) > 1


def test_unseeded_requests_keep_sharing_the_engine_generator(policy: Policy) -> None:
    prompts = _prompts(policy, 4)
    params = SamplingParams(temperature=1.0, seed=3)
    runs = [
        anyio.run(_sample, HFSampler(policy, params, max_wait_ms=50), prompts, [None] * 4, range(4))
        for _ in "ab"
    ]
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_outside_the_generator_range_is_refused(policy: Policy, seed: int) -> None:
    sampler = HFSampler(policy)
    with pytest.raises(SamplerError, match=r"seed must be in \[0, 2\*\*64\)"):
        anyio.run(lambda: sampler.sample(_prompts(policy, 1)[0], max_new_tokens=4, seed=seed))
