"""The GRPO learner on a DeepSpeed engine: `mcprl_train.loop.learner.Learner`'s math, data-parallel over ranks.

`DeepSpeedLearner` keeps everything `Learner` does — training targets from episodes, packing, the trainer-side
recompute of old/reference logprobs, PPO epochs × minibatches, the clipped surrogate with KL, entropy and
value terms, the ratio-health check, the LR schedule — and replaces only what data parallelism changes:

- **The model lives in a DeepSpeed engine** (``deepspeed.initialize`` with the config generated from
  ``distributed``: ZeRO stage, bf16, clipping). The torch AdamW that `Learner` builds is handed to the engine
  (DeepSpeed's own optimizers are JIT-compiled on first use); the engine does backward (``engine.backward``),
  the gradient reduction, clipping and the optimizer step (``engine.step``).
- **One objective over all ranks.** A minibatch's loss normaliser (tokens or sequences, per
  ``grpo.aggregation``) is summed over the ranks and each rank's loss is multiplied by the world size,
  undoing DeepSpeed's gradient averaging: the update is the one a single process would make on every rank's
  samples together (up to packing and float summation order). Advantages are per task group and a group
  never spans ranks (`mcprl_train.parallel.deepspeed.shard_groups`), so they need no communication.
- **Every rank runs the same forward passes.** Under ZeRO-3 each module call all-gathers that module's
  parameter shards collectively, so the ranks must make the same module calls in the same order. Before an
  update the ranks agree on the number of micro-batches (the largest) and, per micro-batch, on the number of
  logits chunks (the output head is called once per chunk of `Policy.logits_chunk_size` rows, forward and
  again in the recomputing backward); a rank tops its micro-batches up with filler sequences whose action
  mask is empty (they add no loss, only the collective calls). A rank with no sample at all still takes
  part with filler micro-batches; when no rank has a sample the update is skipped everywhere.
- **Checkpoints** of the partitioned parameters and optimizer states go through ``engine.save_checkpoint`` /
  ``engine.load_checkpoint`` (one file per rank); `state_dict` keeps the scheduler and the shuffling RNG.
  Resuming needs the same number of ranks.
- `full_state_dict` gathers the full parameters on every rank (the trainer loads them into each rank's
  sampling replica after every step).

Every public method that touches the engine is collective: all ranks call it together.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mcprl_policy import PackedForward
from mcprl_train.errors import DistributedError
from mcprl_train.forward import policy_forward
from mcprl_train.loop.learner import Learner, Sample, _Micro, _micro
from mcprl_train.parallel import collectives
from mcprl_train.parallel.deepspeed import deepspeed_config, require_deepspeed

__all__ = ["ENGINE_TAG", "DeepSpeedLearner", "filler_sample", "logit_chunks", "pad_to_chunks"]

ENGINE_TAG = "engine"


class _EngineModule(nn.Module):
    """What the engine wraps: the policy's model (and value head when it trains) behind the training forward.

    Returns plain tensors ``(logprobs, entropies, values, valid)``, each ``(N,)`` over the packed tokens
    (``values`` empty when not computed), so DeepSpeed can hook the outputs.
    """

    def __init__(self, policy: Any, *, layout: Any, with_values: bool) -> None:
        super().__init__()
        self.model = policy.model
        if with_values:
            self.value_head = policy.value_head
        self._policy = policy
        self._layout = layout

    def forward(
        self, sequences: list[list[int]], temperature: float, values: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        out = policy_forward(
            self._policy, sequences, temperature=temperature, values=values, layout=self._layout
        )
        v = out.values if out.values is not None else out.logprobs.new_zeros(0)
        return out.logprobs, out.entropies, v, out.valid


def logit_chunks(lengths: Sequence[int], chunk_size: int) -> int:
    """How many times one forward calls the output head: ``ceil(rows / chunk_size)``, rows = Σ(len − 1)."""
    rows = sum(n - 1 for n in lengths)
    return -(-rows // chunk_size)


def filler_sample(length: int, token_id: int) -> Sample:
    """A sequence of ``length`` copies of ``token_id`` that trains on nothing (empty action mask)."""
    return Sample(
        token_ids=torch.full((length,), token_id, dtype=torch.long),
        action_mask=torch.zeros(length, dtype=torch.bool),
        old_logprobs=torch.zeros(length),
        advantages=torch.zeros(length),
    )


def pad_to_chunks(samples: list[Sample], target: int, chunk_size: int, token_id: int) -> list[Sample]:
    """``samples`` plus, if they make fewer than ``target`` logits chunks, one filler sequence reaching it.

    The filler adds exactly enough rows for ``target`` chunks: ``(target − 1) · chunk_size + 1`` rows in all.
    """
    have = logit_chunks([int(s.token_ids.numel()) for s in samples], chunk_size)
    if have >= target:
        return samples
    rows = sum(int(s.token_ids.numel()) - 1 for s in samples)
    need_rows = (target - 1) * chunk_size + 1 - rows
    return [*samples, filler_sample(need_rows + 1, token_id)]


class DeepSpeedLearner(Learner):
    """`Learner` with the policy in a DeepSpeed engine (see the module docstring).

    Args:
        policy: The trained `mcprl_policy.Policy` (full fine-tune; ZeRO-3 partitions its parameters).
        config: The run config (also ``distributed`` for the engine).
        total_steps: Training steps, for the LR schedule.
        seed: Seed of the minibatch shuffling (the same on every rank).
        reference: The KL reference, a full local copy on each rank (no collective in its forward).
    """

    def __init__(
        self, *, policy: Any, config: Any, total_steps: int, seed: int, reference: Any = None
    ) -> None:
        deepspeed = require_deepspeed()
        if config.lora is not None:
            raise DistributedError(
                "distributed.backend=deepspeed trains the full model; lora is not wired under "
                "DeepSpeed (use one process: --set distributed.backend=none --set distributed.zero_stage=0)"
            )
        with_values = config.grpo.estimator == "gae"
        if policy.value_head is not None and not with_values:
            # Nothing reads the value head without GAE; frozen, it stays out of the engine (as in one process,
            # where it never receives a gradient).
            policy.value_head.requires_grad_(False)
        super().__init__(
            policy=policy, config=config, total_steps=total_steps, seed=seed, reference=reference
        )
        self.world = collectives.world_size()
        self.chunk_size = int(getattr(policy, "logits_chunk_size", 1024))
        tokenizer = policy.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.filler_token = int(pad or 0)
        self.fillers = 0  # filler sequences added by the last `equalize`
        self.module = _EngineModule(policy, layout=self.optim_cfg.layout, with_values=with_values)
        self.engine, *_ = deepspeed.initialize(
            model=self.module,
            optimizer=self.optimizer,
            model_parameters=self.params,
            config=deepspeed_config(config),
        )

    # -- Learner hooks ------------------------------------------------------------------------------------

    def forward(self, m: _Micro) -> Any:
        logprobs, entropies, values, valid = self.engine(m.ids, self.temperature, self.needs_values)
        return PackedForward(
            logprobs=logprobs,
            entropies=entropies,
            values=values if self.needs_values else None,
            valid=valid,
            seq_lens=tuple(len(i) for i in m.ids),
        )

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        return collectives.all_reduce_tensor(value, "sum")

    def reduce_max(self, value: float) -> float:
        return collectives.all_reduce_scalar(value, "max")

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        # The engine averages gradients over the ranks; the normaliser was already summed over them.
        self.engine.backward(loss * self.world)

    def optimizer_step(self) -> float:
        """``engine.step`` (reduction, clipping at ``optim.max_grad_norm``, AdamW); the pre-clip norm."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    # -- the update ---------------------------------------------------------------------------------------

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """`Learner.update` on this rank's samples, with every rank making the same module calls."""
        if collectives.all_reduce_scalar(float(len(samples))) == 0:
            return {"optim/skipped": 1.0}
        self.policy.train()
        micros = self.equalize(self.build_micro_batches(samples) if samples else [])
        metrics = self.update_micro_batches(micros)
        metrics["perf/filler_sequences"] = float(self.fillers)
        return metrics

    def equalize(self, micros: list[_Micro]) -> list[_Micro]:
        """Pad to the ranks' largest micro-batch count and, per index, their largest logits-chunk count."""
        count = int(collectives.all_reduce_scalar(float(len(micros)), "max"))
        batches = [m.samples for m in micros]
        batches += [[filler_sample(2, self.filler_token)] for _ in range(count - len(batches))]
        chunks = torch.tensor(
            [logit_chunks([int(s.token_ids.numel()) for s in b], self.chunk_size) for b in batches],
            dtype=torch.float64,
        )
        targets = collectives.all_reduce_tensor(chunks, "max").long().tolist()
        padded = [
            pad_to_chunks(b, int(t), self.chunk_size, self.filler_token)
            for b, t in zip(batches, targets, strict=True)
        ]
        self.fillers = (
            count - len(micros) + sum(len(p) - len(b) for p, b in zip(padded, batches, strict=True))
        )
        return [_micro(p) for p in padded]

    # -- state --------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Scheduler and shuffling RNG (the same on every rank); the optimizer is in the engine checkpoint."""
        return {"scheduler": self.scheduler.state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.setstate(state["rng"])

    def save_engine(self, directory: Path) -> Path:
        """Write this rank's part of the engine state to ``directory/engine`` (collective); returns that dir."""
        self.engine.save_checkpoint(str(directory), tag=ENGINE_TAG, save_latest=False)
        return directory / ENGINE_TAG

    def load_engine(self, directory: Path) -> None:
        """Restore parameters and optimizer partitions saved by `save_engine` under ``directory`` (collective).

        Raises:
            DistributedError: nothing loadable there (missing files, or saved by a different number of ranks).
        """
        path, _ = self.engine.load_checkpoint(
            str(directory), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise DistributedError(
                f"no DeepSpeed engine state under {str(directory / ENGINE_TAG)!r} (a checkpoint resumes only "
                "with the number of ranks that saved it)"
            )

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every engine parameter gathered to full size on every rank, on CPU (collective).

        Keys are ``model.<name>`` (and ``value_head.<name>`` when the value head trains).
        """
        deepspeed = require_deepspeed()
        out: dict[str, torch.Tensor] = {}
        for name, param in self.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                out[name] = param.detach().to("cpu", copy=True)
        return out


def load_full_state(policy: Any, state: dict[str, torch.Tensor]) -> None:
    """Copy `DeepSpeedLearner.full_state_dict` into another policy of the same architecture (a replica)."""
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            param.copy_(state[f"model.{name}"].to(param.dtype))
        if policy.value_head is not None:
            for name, param in policy.value_head.named_parameters():
                key = f"value_head.{name}"
                if key in state:
                    param.copy_(state[key].to(param.dtype))
