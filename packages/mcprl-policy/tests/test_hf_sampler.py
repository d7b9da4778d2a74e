from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import attrs
import pytest
import torch

from mcprl_policy import Completion, HFSampler, Policy, PolicySampler, SamplerError, SamplingParams
from mcprl_policy.decode import DecodeRequest
from mcprl_policy.prefix_blocks import BLOCK_TOKENS, common_length


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> Policy:
    return Policy.from_pretrained(str(tiny_dir))


def _prompts(policy: Policy, n: int) -> list[list[int]]:
    tok = policy.tokenizer
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} times the price of ACME?" + " Please." * (i % 4)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


async def _sample_all(
    sampler: HFSampler, prompts: Sequence[list[int]], max_new: Sequence[int]
) -> list[Completion]:
    results: list[Completion | None] = [None] * len(prompts)

    async def one(i: int) -> None:
        results[i] = await sampler.sample(prompts[i], max_new_tokens=max_new[i])

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _signal_first_decode_step(sampler: HFSampler, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once the engine has run a decode step (i.e. some request is mid-generation)."""
    event = threading.Event()
    original = sampler.engine._decode_step

    def step(device: torch.device) -> list[DecodeRequest]:
        finished = original(device)
        event.set()
        return finished

    monkeypatch.setattr(sampler.engine, "_decode_step", step)
    return event


def test_hf_sampler_satisfies_the_sampler_protocol(policy: Policy) -> None:
    sampler: PolicySampler = HFSampler(policy)  # pyright checks the signatures, isinstance only the names
    assert isinstance(sampler, PolicySampler)
    assert sampler.sync_weights() is False


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, top_p=0.9, top_k=50, seed=2)],
)
def test_sampler_logprobs_equal_forward_packed_logprobs(policy: Policy, params: SamplingParams) -> None:
    prompts = _prompts(policy, 6)
    sampler = HFSampler(policy, params)
    completions = anyio.run(_sample_all, sampler, prompts, [12 + i for i in range(6)])
    with torch.no_grad():
        out = policy.forward_packed(
            [p + c.token_ids for p, c in zip(prompts, completions, strict=True)],
            temperature=params.temperature,
        )
    for prompt, completion, logprobs in zip(prompts, completions, out.split("logprobs"), strict=True):
        assert len(completion.token_ids) == len(completion.logprobs) > 0
        torch.testing.assert_close(
            logprobs[len(prompt) :], torch.tensor(completion.logprobs), atol=1e-4, rtol=0.0
        )
        assert completion.text == policy.tokenizer.decode(completion.token_ids, skip_special_tokens=True)


def test_concurrent_requests_share_forward_passes(policy: Policy) -> None:
    prompts = _prompts(policy, 32)
    sampler = HFSampler(policy, SamplingParams(temperature=1.0, seed=0), max_batch_size=64, max_wait_ms=50)
    completions = anyio.run(_sample_all, sampler, prompts, [16] * 32)
    stats = sampler.engine.stats
    assert stats.prefill_rows == 32
    assert stats.prefill_calls <= 4, stats
    assert stats.max_rows >= 16
    # one request at a time would need 32 prefills and 32 * 15 decode passes
    assert stats.decode_calls < 4 * 16
    assert all(c.finish_reason in ("stop", "length") for c in completions)
    assert sampler.metrics()["sampler/kv_pool"] == 1.0  # the tiny model is full attention: the pool


def test_batched_greedy_equals_one_at_a_time_greedy(policy: Policy) -> None:
    prompts = _prompts(policy, 8)
    max_new = [5 + 3 * i for i in range(8)]  # rows finish at different steps and leave the batch
    batched = anyio.run(_sample_all, HFSampler(policy, SamplingParams(temperature=0.0)), prompts, max_new)
    single = HFSampler(policy, SamplingParams(temperature=0.0), max_batch_size=1)
    for prompt, n, completion in zip(prompts, max_new, batched, strict=True):
        alone = anyio.run(lambda p=prompt, n=n: single.sample(p, max_new_tokens=n))
        assert alone.token_ids == completion.token_ids
        torch.testing.assert_close(
            torch.tensor(alone.logprobs), torch.tensor(completion.logprobs), atol=1e-4, rtol=0
        )
        assert completion.finish_reason == "length"
        assert len(completion.token_ids) == n


def test_requests_join_a_running_batch_between_decode_steps(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(policy, 3)
    sampler = HFSampler(policy, SamplingParams(temperature=0.0), max_wait_ms=0)
    reference = HFSampler(policy, SamplingParams(temperature=0.0), max_batch_size=1)
    decoding = _signal_first_decode_step(sampler, monkeypatch)

    async def main() -> tuple[Completion, list[Completion]]:
        long: list[Completion] = []
        late: list[Completion] = []
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                long.append(await sampler.sample(prompts[0], max_new_tokens=60))

            tg.start_soon(first)
            await anyio.to_thread.run_sync(
                decoding.wait, abandon_on_cancel=True
            )  # the long request is decoding in the worker thread
            late = await _sample_all(sampler, prompts[1:], [4, 7])
        return long[0], late

    long, late = anyio.run(main)
    assert sampler.engine.stats.max_rows == 3
    assert sampler.engine.stats.prefill_calls >= 2
    for prompt, completion in zip(prompts, [long, *late], strict=True):
        alone = anyio.run(lambda p=prompt, c=completion: reference.sample(p, max_new_tokens=len(c.token_ids)))
        assert alone.token_ids == completion.token_ids


def test_stop_string_ends_the_turn_and_keeps_its_tokens(policy: Policy) -> None:
    prompt = _prompts(policy, 1)[0]
    params = SamplingParams(temperature=1.0, seed=3)
    free = anyio.run(lambda: HFSampler(policy, params).sample(prompt, max_new_tokens=16))
    pieces = [policy.tokenizer.decode([t], skip_special_tokens=True) for t in free.token_ids]
    stop = next(p.strip() for p in pieces[2:] if p.strip())
    first = next(i for i in range(16) if stop in policy.tokenizer.decode(free.token_ids[: i + 1]))
    sampler = HFSampler(policy, attrs.evolve(params, stop=(stop,)))
    completion = anyio.run(lambda: sampler.sample(prompt, max_new_tokens=16))
    assert completion.finish_reason == "stop"
    assert completion.token_ids == free.token_ids[: first + 1]


def test_end_of_turn_token_stops_and_is_included(policy: Policy) -> None:
    prompt = _prompts(policy, 1)[0]
    params = SamplingParams(temperature=1.0, seed=4)
    free = anyio.run(lambda: HFSampler(policy, params).sample(prompt, max_new_tokens=16))
    first = next(i for i in range(1, 16) if free.token_ids[i] not in free.token_ids[:i])
    sampler = HFSampler(policy, params)
    # Make that token an end-of-turn id for this sampler's engine.
    sampler.engine.stop_token_ids = frozenset({free.token_ids[first]})
    completion = anyio.run(lambda: sampler.sample(prompt, max_new_tokens=16))
    assert completion.finish_reason == "stop"
    assert completion.token_ids == free.token_ids[: first + 1]


def test_a_cancelled_request_does_not_disturb_the_others(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(policy, 4)
    sampler = HFSampler(policy, SamplingParams(temperature=0.0), max_wait_ms=0)
    decoding = _signal_first_decode_step(sampler, monkeypatch)
    reference = HFSampler(policy, SamplingParams(temperature=0.0), max_batch_size=1)

    async def main() -> list[Completion]:
        done: list[Completion] = []
        scopes: list[anyio.CancelScope] = []
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:

                async def victim() -> None:
                    with anyio.CancelScope() as scope:
                        scopes.append(scope)
                        await sampler.sample(prompts[0], max_new_tokens=200)

                tg.start_soon(victim)
                await anyio.to_thread.run_sync(decoding.wait, abandon_on_cancel=True)
                scopes[0].cancel()
                done.extend(await _sample_all(sampler, prompts[1:], [6, 6, 6]))
        return done

    completions = anyio.run(main)
    for prompt, completion in zip(prompts[1:], completions, strict=True):
        alone = anyio.run(lambda p=prompt: reference.sample(p, max_new_tokens=6))
        assert alone.token_ids == completion.token_ids
    assert sampler.engine.idle, (sampler.engine.active, list(sampler.engine.pending))


@pytest.mark.parametrize(
    ("prompt", "max_new", "message"),
    [([], 4, "empty prompt"), ([1, 2], 0, "max_new_tokens"), ([1, 10**9], 4, "outside the vocabulary")],
)
def test_bad_requests_raise_sampler_errors(
    policy: Policy, prompt: list[int], max_new: int, message: str
) -> None:
    sampler = HFSampler(policy)
    with pytest.raises(SamplerError, match=message):
        anyio.run(lambda: sampler.sample(prompt, max_new_tokens=max_new))


def test_identical_first_turns_of_a_group_share_one_cached_prefix(policy: Policy) -> None:
    prompt = _prompts(policy, 1)[0]
    sampler = HFSampler(policy, SamplingParams(temperature=0.0), prefix_cache_mb=64)
    first = anyio.run(_sample_all, sampler, [prompt] * 4, [5] * 4)  # greedy: the same turn 4 times
    assert len({tuple(c.token_ids) for c in first}) == 1
    assert len(sampler.engine.prefix) == 1
    nxt = [_next_turn(policy, prompt, c, i) for i, c in enumerate(first)]
    anyio.run(_sample_all, sampler, nxt, [3] * 4)
    assert sampler.engine.stats.prefix_hits == 4


def _next_turn(policy: Policy, prompt: list[int], completion: Completion, i: int) -> list[int]:
    """The episode's next prompt: its prompt, the sampled tokens, a tool response and a new assistant header."""
    tool = policy.tokenizer.apply_chat_template(
        [{"role": "tool", "content": f'{{"price": {i}.5}}' * (1 + i % 3)}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return [*prompt, *completion.token_ids, *tool]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_next_turns_reuse_the_cached_prefix_and_sample_exactly_as_a_full_prefill(
    policy: Policy, temperature: float
) -> None:
    prompts = _prompts(policy, 6)
    params = SamplingParams(temperature=temperature, seed=3)
    cached = HFSampler(policy, params, prefix_cache_mb=64)
    first = anyio.run(_sample_all, cached, prompts, [6 + i for i in range(6)])
    second_prompts = [
        _next_turn(policy, p, c, i) for i, (p, c) in enumerate(zip(prompts, first, strict=True))
    ]
    second = anyio.run(_sample_all, cached, second_prompts, [8] * 6)
    stats = cached.engine.stats
    assert stats.prefix_hits == 6
    assert stats.prefix_tokens == sum(
        len(p) + len(c.token_ids) - 1 for p, c in zip(prompts, first, strict=True)
    )
    assert cached.metrics()["sampler/prefix_hits"] == 6
    # The reused KV gives the logprobs a whole-sequence forward gives, and greedy picks the same tokens.
    with torch.no_grad():
        out = policy.forward_packed(
            [p + c.token_ids for p, c in zip(second_prompts, second, strict=True)], temperature=1.0
        )
    for prompt, completion, logprobs in zip(second_prompts, second, out.split("logprobs"), strict=True):
        torch.testing.assert_close(
            logprobs[len(prompt) :], torch.tensor(completion.logprobs), atol=1e-4, rtol=0.0
        )
    if temperature == 0.0:
        whole = anyio.run(_sample_all, HFSampler(policy, params), second_prompts, [8] * 6)
        assert [c.token_ids for c in whole] == [c.token_ids for c in second]


def test_the_prefix_cache_is_dropped_when_the_weights_change(tmp_path: Path, tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir))
    sampler = HFSampler(policy, SamplingParams(temperature=0.0), prefix_cache_mb=64)
    prompts = _prompts(policy, 2)
    first = anyio.run(_sample_all, sampler, prompts, [4, 4])
    nxt = [_next_turn(policy, p, c, i) for i, (p, c) in enumerate(zip(prompts, first, strict=True))]
    assert len(sampler.engine.prefix) == 2
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    policy.model(torch.tensor([prompts[0]])).logits.sum().backward()
    optimizer.step()
    second = anyio.run(_sample_all, sampler, nxt, [4, 4])
    assert sampler.engine.stats.prefix_hits == 0  # stale KV is never reused
    whole = anyio.run(_sample_all, HFSampler(policy, SamplingParams(temperature=0.0)), nxt, [4, 4])
    assert [c.token_ids for c in whole] == [c.token_ids for c in second]


def test_without_a_prefix_cache_every_turn_is_prefilled_whole(policy: Policy) -> None:
    sampler = HFSampler(policy, SamplingParams(temperature=0.0))
    prompts = _prompts(policy, 2)
    first = anyio.run(_sample_all, sampler, prompts, [4, 4])
    anyio.run(
        _sample_all,
        sampler,
        [_next_turn(policy, p, c, 0) for p, c in zip(prompts, first, strict=True)],
        [4, 4],
    )
    assert sampler.engine.stats.prefix_hits == 0
    assert len(sampler.engine.prefix) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0, top_p=0.9, seed=7), SamplingParams(temperature=0.0)]
)
def test_sampler_runs_on_cuda_reproducibly_with_the_learners_logprobs(
    tiny_dir: Path, params: SamplingParams
) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), device="cuda")
    assert policy.device.type == "cuda"
    prompts = _prompts(policy, 4)
    runs = [
        anyio.run(_sample_all, HFSampler(policy, params, prefix_cache_mb=64), prompts, [10] * 4)
        for _ in range(2)
    ]
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]  # same seed, same tokens
    with torch.no_grad():
        out = policy.forward_packed(
            [p + c.token_ids for p, c in zip(prompts, runs[0], strict=True)],
            temperature=params.logprob_temperature,
        )
    for prompt, completion, logprobs in zip(prompts, runs[0], out.split("logprobs"), strict=True):
        torch.testing.assert_close(
            logprobs[len(prompt) :].cpu(), torch.tensor(completion.logprobs), atol=2e-3, rtol=0.0
        )


_SYSTEM = (
    "You are an agent that answers with tools. Tools: "
    + '{"name": "quote", "description": "The price of a stock", "parameters": {"symbol": "string"}} ' * 3
)


def _task_prompts(policy: Policy, n: int) -> list[list[int]]:
    """First turns of different tasks on the same tools: one long system prompt, then each task's question."""
    return [
        policy.tokenizer.apply_chat_template(
            [
                {"role": "system", "content": _SYSTEM},
                {"role": "user", "content": f"Price of stock {i}?" * (1 + i)},
            ],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def _sample_one(sampler: HFSampler, prompt: list[int], seed: int) -> Completion:
    return anyio.run(lambda: sampler.sample(prompt, max_new_tokens=12, seed=seed))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_different_prompt_sharing_a_long_prefix_prefills_only_its_own_tail(
    policy: Policy, temperature: float
) -> None:
    first, second = _task_prompts(policy, 2)
    shared = common_length(first, second)
    assert shared >= 2 * BLOCK_TOKENS
    params = SamplingParams(temperature=temperature, seed=3)
    sampler = HFSampler(policy, params, prefix_cache_mb=64)
    _sample_one(sampler, first, 1)
    before = sampler.engine.stats.prefill_tokens
    completion = _sample_one(sampler, second, 2)
    stats = sampler.engine.stats
    assert stats.prefill_tokens - before == len(second) - shared
    assert sampler.metrics()["sampler/prefix_hits"] == 1
    assert sampler.metrics()["sampler/prefix_reused_tokens"] == shared
    cold = _sample_one(HFSampler(policy, params), second, 2)
    assert completion.token_ids == cold.token_ids
    torch.testing.assert_close(
        torch.tensor(completion.logprobs), torch.tensor(cold.logprobs), atol=1e-4, rtol=0.0
    )
    with torch.no_grad():
        out = policy.forward_packed([second + completion.token_ids], temperature=1.0)
    torch.testing.assert_close(
        out.split("logprobs")[0][len(second) :], torch.tensor(completion.logprobs), atol=1e-4, rtol=0.0
    )


def test_prompts_admitted_together_prefill_their_shared_prefix_once_and_keep_it(policy: Policy) -> None:
    prompts = _task_prompts(policy, 5)
    shared = min(common_length(prompts[0], p) for p in prompts[1:4])
    params = SamplingParams(temperature=0.0)
    sampler = HFSampler(policy, params, max_batch_size=4, max_wait_ms=1_000, prefix_cache_mb=64)
    together = anyio.run(_sample_all, sampler, prompts[:4], [10] * 4)
    stats = sampler.engine.stats
    assert stats.max_rows == 4
    assert stats.prefill_tokens == shared + sum(len(p) - shared for p in prompts[:4])
    assert stats.shared_tokens == 3 * shared
    assert stats.prefix_hits == 0
    alone = [anyio.run(_sample_all, HFSampler(policy, params), [p], [10])[0] for p in prompts[:4]]
    for a, b in zip(together, alone, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0.0)
    later = anyio.run(_sample_all, sampler, [prompts[4]], [10])[0]  # the shared prefix was cached
    assert stats.prefix_hits == 1
    assert stats.prefix_tokens >= shared
    assert (
        later.token_ids == anyio.run(_sample_all, HFSampler(policy, params), [prompts[4]], [10])[0].token_ids
    )


def test_a_shared_prefix_is_not_reused_after_the_weights_change(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir))
    first, second = _task_prompts(policy, 2)
    sampler = HFSampler(policy, SamplingParams(temperature=0.0), prefix_cache_mb=64)
    _sample_one(sampler, first, 1)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    policy.model(torch.tensor([first])).logits.sum().backward()
    optimizer.step()
    before = sampler.engine.stats.prefill_tokens
    completion = _sample_one(sampler, second, 2)
    assert sampler.engine.stats.prefix_hits == 0
    assert sampler.engine.stats.prefill_tokens - before == len(second)
    assert (
        completion.token_ids
        == _sample_one(HFSampler(policy, SamplingParams(temperature=0.0)), second, 2).token_ids
    )
