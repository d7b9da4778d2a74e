"""One rank of ``test_vllm_ranks.py`` (started by torchrun): its own vLLM engine inside a gloo process group.

Usage: ``torchrun --nproc-per-node 2 vllm_rank_worker.py MODEL_DIR OUT_DIR``. Each rank moves its policy's weights
by a rank-specific amount, builds a `VLLMSampler`, samples a rank-specific number of prompts and writes
``OUT_DIR/rank-<r>.json``: what vLLM was built with (executor, the worker's rank and local rank), how many
completions it produced and the largest difference between their logprobs and the policy's own forward.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import torch
import torch.distributed as dist

from mcprl_policy import Completion, Policy, SamplingParams
from mcprl_policy.vllm_engine import close_engines
from mcprl_policy.vllm_sampler import VLLMSampler

ENGINE = {"max_model_len": 256, "enforce_eager": True, "max_num_seqs": 8}


def _move(policy: Policy, rank: int) -> None:
    """A change of every MLP weight large enough to move the tiny model's tokens, different on every rank."""
    generator = torch.Generator().manual_seed(100 + rank)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "mlp" in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.05 * (rank + 1))


async def _sample(sampler: VLLMSampler, prompts: list[list[int]]) -> list[Completion]:
    out: dict[int, Completion] = {}

    async def one(i: int) -> None:
        out[i] = await sampler.sample(prompts[i], max_new_tokens=12)

    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return [out[i] for i in range(len(prompts))]


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    policy = Policy.from_pretrained(model_dir, device="cpu", dtype="float32", value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=1.0, seed=rank), engine_kwargs=ENGINE)
    llm_engine = sampler.llm.llm_engine
    worker = llm_engine.model_executor.driver_worker.worker
    _move(policy, rank)
    pushed = sampler.sync_weights()
    prompts = [policy.tokenizer.encode(f"Quote {i} of rank {rank}:") for i in range(2 + 3 * rank)]
    completions = anyio.run(_sample, sampler, prompts)
    with torch.no_grad():
        forward = policy.forward_packed(
            [p + c.token_ids for p, c in zip(prompts, completions, strict=True)], values=False
        )
    diff = max(
        float((lp[len(p) :] - torch.tensor(c.logprobs)).abs().max())
        for p, c, lp in zip(prompts, completions, forward.split("logprobs"), strict=True)
    )
    result = {
        "rank": rank,
        "executor": llm_engine.vllm_config.parallel_config.distributed_executor_backend,
        "worker_rank": worker.rank,
        "worker_local_rank": worker.local_rank,
        "pushed": pushed,
        "completions": len(completions),
        "tokens": sum(len(c.token_ids) for c in completions),
        "logprob_diff_max": diff,
    }
    dist.barrier()
    result["closed"] = close_engines()
    result["group_destroyed"] = not dist.is_initialized()  # vLLM's shutdown takes the default group with it
    (Path(out_dir) / f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
