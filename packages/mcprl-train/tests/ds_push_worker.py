"""One rank of ``test_ds_push.py`` (started by torchrun, gloo, CPU): ZeRO-3's per-bucket push against a full gather.

Usage: ``torchrun --nproc-per-node 2 ds_push_worker.py MODE OUT_DIR``. Every rank builds the tiny model under a
real ZeRO-3 engine (parameters partitioned over the ranks), moves it by one optimizer step, and writes
``OUT_DIR/<MODE>-rank-<r>.json``:

- ``stream``: the push's stream (`mcprl_policy.weight_push`, gathered per bucket by `ZeroParameters`) against
  the state dict under today's full gather (`GatheredWeights`), for the full model and for a LoRA model
  (merged, against peft's ``merge_adapter`` under a full gather: TRL's ``_move_model_to_vllm``). No vLLM.
- ``vllm`` / ``vllm-lora``: the same into the rank's own vLLM engine (``external_launcher``): the engine's
  readable tensors and greedy logprobs after a per-bucket push against those after a full-gather push, each
  push made over weights scrambled in between.

Each gather is hooked: the bytes it holds full (``numel`` at full size × element size) are recorded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mcprl_policy import Policy
from mcprl_policy.weight_push import (
    ParameterGather,
    merged_lora_weights,
    streamed_weights,
    vllm_name,
)
from mcprl_train.config import Config
from mcprl_train.loop.samples import Sample
from mcprl_train.loop.update import adamw
from mcprl_train.parallel.deepspeed import deepspeed_config, init_distributed, require_deepspeed
from mcprl_train.parallel.ds_backend import DeepSpeedBackend, deepspeed_backend
from mcprl_train.parallel.gathered import ZeroParameters

BUDGET = 512 * 1024  # bytes: above the tiny model's largest tensor (464 KiB in fp32), ~1/6 of its 2.8 MiB
ENGINE = {"max_model_len": 256, "enforce_eager": True, "max_num_seqs": 8}
IDS = [1, 5, 9, 14, 3, 7, 11, 2]


class RecordingGather:
    """`ZeroParameters` with a record of every bucket it gathered (its full bytes) and whether it re-partitioned."""

    def __init__(self, inner: ParameterGather) -> None:
        self.inner = inner
        self.buckets: list[int] = []
        self.repartitioned = True

    @property
    def collective(self) -> bool:
        return self.inner.collective

    def full_numel(self, param: nn.Parameter) -> int:
        return self.inner.full_numel(param)

    @contextmanager
    def _hold(self, params: Sequence[nn.Parameter]) -> Generator[None]:
        self.buckets.append(sum(self.full_numel(p) * p.element_size() for p in params))
        with self.inner.gathered(params):
            yield
        self.repartitioned &= all(p.data.numel() == 0 for p in params)

    def gathered(self, params: Sequence[nn.Parameter]) -> AbstractContextManager[object]:
        return self._hold(params)


def _config(lora: bool) -> Config:
    overrides = [
        "model.name=tiny",
        "model.device=cpu",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "distributed.bf16=false",
        "distributed.zero_stage=3",
        "sampler.backend=vllm",
        "grpo.tasks_per_step=2",
        "optim.lr=1e-2",
        "optim.warmup_steps=0",
    ]
    if lora:
        overrides += ["lora.r=8", "lora.alpha=16", "reference.every=0"]
    return Config.load(profile="a100x2", overrides=overrides)


def _sample() -> Sample:
    return Sample(
        token_ids=torch.tensor(IDS),
        action_mask=torch.ones(len(IDS), dtype=torch.bool),
        old_logprobs=torch.zeros(len(IDS)),
        advantages=torch.ones(len(IDS)),
    )


def _full_model() -> tuple[DeepSpeedBackend, Policy]:
    backend = deepspeed_backend(_config(lora=False))
    backend.lay_out([[_sample()]])
    backend.zero_grad()
    out = backend.forward([IDS], temperature=1.0, values=False)
    backend.backward(-out.logprobs.sum())
    backend.step()
    return backend, backend.policy


def _lora_model() -> tuple[Any, Policy]:
    """A LoRA policy in a ZeRO-3 engine of its own (the trainer's backend refuses LoRA), adapters moved."""
    from mcprl_train.build import build_policy

    deepspeed = require_deepspeed()
    config = _config(lora=True)
    policy = build_policy(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:  # zero at init: nothing to merge otherwise
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=policy.model,
        optimizer=adamw(params, config.optim),
        model_parameters=params,
        config=deepspeed_config(config),
    )
    return engine, policy


def _full_gather_pairs(model: nn.Module, lora: bool) -> list[tuple[str, torch.Tensor]]:
    """Today's push (full model) or TRL's (LoRA): everything gathered at once, the state dict read, released."""
    deepspeed = require_deepspeed()
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        if not lora:
            return [(n, t.detach().clone()) for n, t in model.state_dict().items()]
        model.merge_adapter()  # pyright: ignore[reportCallIssue]
        pairs = [(vllm_name(n), t.detach().clone()) for n, t in model.state_dict().items()]
        model.unmerge_adapter()  # pyright: ignore[reportCallIssue]
        return [(n, t) for n, t in pairs if n is not None]


def _stream(model: nn.Module, lora: bool, gather: ParameterGather) -> Iterator[tuple[str, torch.Tensor]]:
    push = merged_lora_weights if lora else streamed_weights
    return push(model, gather=gather, bucket_bytes=BUDGET)


def _stream_report(model: nn.Module, lora: bool) -> dict[str, Any]:
    gather = RecordingGather(ZeroParameters())
    streamed = [(n, t.clone()) for n, t in _stream(model, lora, gather)]
    full = _full_gather_pairs(model, lora)
    return {
        "names_equal": [n for n, _ in streamed] == [n for n, _ in full],
        "unequal": [a for (a, x), (_, y) in zip(streamed, full, strict=True) if not torch.equal(x, y)],
        "tensors": len(streamed),
        "full_bytes": sum(t.numel() * t.element_size() for _, t in full),
        "largest": max(t.numel() * t.element_size() for _, t in full),
        "buckets": gather.buckets,
        "repartitioned": gather.repartitioned,
        "partitioned_before": all(p.data.numel() == 0 for p in model.parameters()),
    }


def _vllm_model(sampler: Any) -> nn.Module:
    return sampler.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()


def _engine_state(
    sampler: Any, prompts: list[list[int]]
) -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    import anyio

    model = _vllm_model(sampler)
    tensors = {
        n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()] if t.numel()
    }

    async def greedy() -> list[list[float]]:
        return [(await sampler.sample(p, max_new_tokens=6)).logprobs for p in prompts]

    return tensors, anyio.run(greedy)


def _scramble(sampler: Any, pairs: list[tuple[str, torch.Tensor]], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    junk = [(n, t + 0.02 * torch.randn(t.shape, generator=generator)) for n, t in pairs]
    sampler.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(junk)})
    sampler.llm.reset_prefix_cache()


def _same(
    a: tuple[dict[str, torch.Tensor], list[list[float]]], b: tuple[dict[str, torch.Tensor], list[list[float]]]
) -> bool:
    return a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0]) and a[1] == b[1]


def _vllm_report(
    model: nn.Module,
    policy: Policy,
    lora: bool,
    backend: DeepSpeedBackend | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    from mcprl_policy import SamplingParams
    from mcprl_policy.vllm_sampler import VLLMSampler

    gather = RecordingGather(ZeroParameters())
    sampler = VLLMSampler(
        policy,
        SamplingParams(temperature=0.0),
        engine_kwargs=ENGINE,
        weight_gather=gather,
        push_bucket_bytes=BUDGET,
        lora_push="merged",
    )
    engine = sampler._engine  # pyright: ignore[reportPrivateUsage]
    prompts = [policy.tokenizer.encode(f"Quote {i}:") for i in range(2)]
    reference = _full_gather_pairs(model, lora)

    def per_bucket() -> tuple[dict[str, torch.Tensor], list[list[float]]]:
        assert sampler.sync_weights(force=True)
        return _engine_state(sampler, prompts)

    def full_gather() -> tuple[dict[str, torch.Tensor], list[list[float]]]:
        sampler.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(_full_gather_pairs(model, lora))}
        )
        sampler.llm.reset_prefix_cache()
        return _engine_state(sampler, prompts)

    first = per_bucket()
    _scramble(sampler, reference, seed=1)
    scrambled = _engine_state(sampler, prompts)
    second = full_gather()
    _scramble(sampler, reference, seed=2)
    third = per_bucket()
    # On CPU vLLM packs each linear layer's weight for its GEMM and leaves an empty parameter: only the
    # embedding and the norms are readable; the logprobs cover the rest.
    pushed = {n for n, _ in reference} & set(first[0])
    after = _push_after_checkpoint(backend, sampler, out / "checkpoints") if backend and out else {}
    return {
        "after_checkpoint": after,
        "packed_empty": sum(1 for _, t in _vllm_model(sampler).named_parameters() if t.numel() == 0),
        "bucket_then_full": _same(first, second),
        "full_then_bucket": _same(second, third),
        "pushed_readable": sorted(pushed),
        "scramble_moved_every_pushed_tensor": all(
            not torch.equal(scrambled[0][k], first[0][k]) for k in pushed
        ),
        "scramble_moved_logprobs": scrambled[1] != first[1],
        "engine_tensors": len(first[0]),
        "engine_tensor_names": sorted(first[0]),
        "buckets": gather.buckets,
        "repartitioned": gather.repartitioned,
        "merged_lora": engine.merged_lora,
    }


def _push_after_checkpoint(backend: DeepSpeedBackend, sampler: Any, root: Path) -> dict[str, bool]:
    """A checkpoint leaves the whole model gathered (for its policy/); the next publish and push must still work."""
    assert backend.gathered is not None
    backend.save_partitions(root)
    full_after_save = backend.gathered.full
    backend.publish()
    return {
        "full_after_save": full_after_save,
        "full_after_publish": backend.gathered.full,
        "pushed": bool(sampler.sync_weights(force=True)),
    }


def main(mode: str, out_dir: str) -> None:
    rank, _ = init_distributed()
    report: dict[str, Any] = {"rank": rank, "budget": BUDGET}
    match mode:
        case "stream":
            backend, _ = _full_model()
            report["full"] = _stream_report(backend.policy.model, lora=False)
            engine, policy = _lora_model()
            report["lora"] = _stream_report(policy.model, lora=True)
            del engine
        case "vllm":
            backend, policy = _full_model()
            report["full"] = _vllm_report(
                policy.model, policy, lora=False, backend=backend, out=Path(out_dir)
            )
        case "vllm-lora":
            _, policy = _lora_model()
            report["lora"] = _vllm_report(policy.model, policy, lora=True)
        case _:
            raise SystemExit(f"unknown mode {mode!r}")
    torch.distributed.barrier()  # pyright: ignore[reportUnknownMemberType]
    if mode.startswith("vllm"):
        from mcprl_policy.vllm_engine import close_engines

        close_engines()
    (Path(out_dir) / f"{mode}-rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
