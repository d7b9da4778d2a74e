"""The GPU paths of the GPU profiles, on a CUDA device: sampler, bf16 learner step, QLoRA, ZeRO-3, vLLM.

Each test runs the project's own code path (`build_policy`, `HFSampler`, `Learner`, `deepspeed_backend`,
`VLLMSampler`) on the embedded tiny model or the real-vocabulary stand-in, with the profile's settings and
only the sizes shrunk. They skip without CUDA (here: CI and the 2-core machines); `scripts/test-gpu.sh` runs them
on a GPU machine. A backend that is not installed there (bitsandbytes, deepspeed, vllm) skips its test with the
reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
import pytest
import torch
from e2e_testkit import StandinModel
from train_testkit import synthetic_groups

from mcprl_policy import Completion, HFSampler, Policy, SamplingParams
from mcprl_train.build import build_policy
from mcprl_train.config import Config
from mcprl_train.loop.learner import Learner
from mcprl_train.typed_torch import manual_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (scripts/test-gpu.sh runs these on one)"
    ),
]


SMALL = [
    "model.name=tiny",
    "model.device=cuda",
    "grpo.kl_coef=0.0",
    "grpo.filter_zero_std=false",
    "optim.lr=1e-3",
    "optim.warmup_steps=0",
    "optim.micro_batch_tokens=128",
]
"""The profile's path at the embedded tiny model's size (a large lr so that one step visibly moves bf16 weights)."""


def _one_update(learner: Learner, policy: Policy) -> dict[str, float]:
    samples, advantages = learner.prepare(synthetic_groups(policy, n_groups=2, success_every=2))
    metrics = learner.update(samples)
    assert metrics["optim/steps"] >= 1, metrics
    for key, value in {**metrics, **advantages}.items():
        assert math.isfinite(value), (key, value)
    return metrics


async def _sample(
    sampler: HFSampler, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None]
) -> list[Completion]:
    results: dict[int, Completion] = {}

    async def one(i: int) -> None:
        results[i] = await sampler.sample(prompts[i], max_new_tokens=16, seed=seeds[i])

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return [results[i] for i in range(len(prompts))]


def test_hf_sampler_samples_the_standin_in_bf16_with_every_generator_on_the_gpu(
    standin_model: StandinModel,
) -> None:
    policy = Policy.from_pretrained(
        str(standin_model("qwen3", "Qwen-Qwen3-0.6B.jinja")),
        device="cuda",
        dtype="bfloat16",
        value_head=False,
    )
    tokenizer = policy.tokenizer
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is the price of ACME times {i}?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(4)
    ]
    sampler = HFSampler(policy, SamplingParams(temperature=1.0, top_p=0.95, seed=3))
    # Two requests draw from the engine's generator, two from their own (seeded) ones.
    completions = anyio.run(_sample, sampler, prompts, [None, None, 11, 12])
    generators = sampler.engine._generators  # pyright: ignore[reportPrivateUsage]
    assert generators, "the engine drew no token"
    assert {d.type for d in generators} == {"cuda"}
    assert all(g.device.type == "cuda" for g in generators.values())
    for completion in completions:
        assert completion.token_ids, completion
        assert max(completion.token_ids) < len(
            tokenizer
        )  # the 151,936-row head is cut to the tokenizer's ids
        assert all(math.isfinite(x) and x <= 0.0 for x in completion.logprobs)
    again = anyio.run(
        _sample, HFSampler(policy, SamplingParams(temperature=1.0, top_p=0.95, seed=3)), prompts[2:], [11, 12]
    )
    assert [c.token_ids for c in again] == [c.token_ids for c in completions[2:]]  # seeded rows reproduce


def test_learner_full_fine_tune_step_in_bf16_on_cuda() -> None:
    config = Config.load("single-gpu-lora", overrides=[*SMALL, "quantization=null", "lora=null"])
    assert config.model.dtype == "bfloat16"
    manual_seed(0)
    policy = build_policy(config)
    params = policy.trainable_parameters()
    assert {(p.device.type, p.dtype) for p in params} == {("cuda", torch.bfloat16)}
    before = [p.detach().clone() for p in params]
    learner = Learner(policy=policy, config=config, total_steps=1, seed=0)
    _one_update(learner, policy)
    changed = [not torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters(), strict=True)]
    assert sum(changed) > len(changed) // 2, f"{sum(changed)} of {len(changed)} tensors moved"
    for state in learner.optimizer.state.values():
        assert all(t.device.type == "cuda" for t in state.values() if isinstance(t, torch.Tensor) and t.dim())


def test_qlora_loads_the_base_in_nf4_on_cuda_and_one_step_moves_only_the_adapters() -> None:
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (the qlora extra)")
    config = Config.load("single-gpu-lora", overrides=SMALL)
    assert config.quantization == "nf4"
    manual_seed(0)
    policy = build_policy(config)
    four_bit = [m for m in policy.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert four_bit, "no Linear4bit layer in the loaded model"
    assert all(m.weight.device.type == "cuda" for m in four_bit)
    assert all(getattr(m.weight, "quant_state", None) is not None for m in four_bit)
    trainable = dict(policy.named_trainable_parameters())
    assert trainable
    assert all("lora_" in n or "value_head" in n for n in trainable), sorted(trainable)[:5]
    before = {n: p.detach().clone() for n, p in trainable.items() if "lora_" in n}
    learner = Learner(policy=policy, config=config, total_steps=1, seed=0)
    _one_update(learner, policy)
    optimized = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert not any(
        m.weight.requires_grad or m.weight.grad is not None or id(m.weight) in optimized for m in four_bit
    )
    moved = [
        n for n, p in policy.named_trainable_parameters() if n in before and not torch.equal(before[n], p)
    ]
    assert len(moved) >= len(before) // 2, f"{len(moved)} of {len(before)} adapter tensors moved"


@pytest.mark.usefixtures("one_process_group")
@pytest.mark.parametrize("sampling", ["engine", "replica"])
def test_deepspeed_zero3_update_on_one_gpu_reaches_the_samplers_weights(sampling: str) -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (the deepspeed extra)")
    from mcprl_train.parallel.deepspeed import init_distributed
    from mcprl_train.parallel.ds_backend import deepspeed_backend

    config = Config.load(
        "a100x2",
        overrides=[*SMALL, "reference.every=0", "distributed.num_gpus=1", f"distributed.sampling={sampling}"],
    )
    assert (config.distributed.zero_stage, config.distributed.bf16) == (3, True)
    assert init_distributed() == (0, 1)
    manual_seed(0)
    backend = deepspeed_backend(config)
    backend.publish()
    sampled = backend.sampling_policy
    assert sampled.device.type == "cuda"
    before = [p.detach().clone() for p in sampled.model.parameters()]
    assert all(t.numel() > 0 for t in before), "the samplers' weights are not full size after publish"
    learner = Learner(policy=backend.policy, config=config, total_steps=1, seed=0, backend=backend)
    _one_update(learner, sampled)
    backend.publish()
    after = list(sampled.model.parameters())
    assert [t.shape for t in after] == [t.shape for t in before]
    moved = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
    assert sum(moved) > len(moved) // 2, f"{sum(moved)} of {len(moved)} sampled tensors moved"


def test_vllm_sampler_on_cuda_matches_the_learners_logprobs() -> None:
    pytest.importorskip(
        "vllm", reason="vllm is not installed (it cannot travel as a wheel: scripts/test-gpu.sh)"
    )
    from mcprl_policy.vllm_sampler import VLLMSampler

    policy = Policy.from_pretrained("tiny", device="cuda", dtype="bfloat16", value_head=False)
    engine = {"max_model_len": 512, "enforce_eager": True, "max_num_seqs": 16, "gpu_memory_utilization": 0.2}
    sampler = VLLMSampler(policy, SamplingParams(temperature=1.0, seed=0), engine_kwargs=engine)
    prompts = [policy.tokenizer.encode(f"What is {i} times the price of ACME?") for i in range(4)]

    async def run() -> list[Completion]:
        return [await sampler.sample(p, max_new_tokens=16) for p in prompts]

    completions = anyio.run(run)
    with torch.no_grad():
        out = policy.forward_packed(
            [p + c.token_ids for p, c in zip(prompts, completions, strict=True)], values=False
        )
    for prompt, completion, logprobs in zip(prompts, completions, out.split("logprobs"), strict=True):
        assert completion.token_ids
        # bf16 weights, different kernels: the sampler/learner mismatch stays small, not zero.
        diff = (logprobs[len(prompt) :].float().cpu() - torch.tensor(completion.logprobs)).abs().max()
        assert float(diff) < 0.1, float(diff)
