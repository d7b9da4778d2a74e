"""The DeepSpeed update backend: the learner's update on a ZeRO engine, data-parallel over ranks.

`DeepSpeedBackend` implements `mcprl_train.loop.update.UpdateBackend` (the package README's "DeepSpeed" section
describes the whole path). Each rank's loss is multiplied by the world size, undoing the engine's gradient
averaging, while the learner sums the loss normaliser over the ranks: one update equals a single process's
update on every rank's samples. The samplers read `sampling_policy`, set by ``distributed.sampling``:
``engine``, the engine's own module, whose ZeRO-3 parameters `publish` gathers to full size for collection and
evaluation and every engine call releases first (with vLLM, the push gathers them a bucket at a time instead);
or ``replica``, a second full copy that `publish` loads. A checkpoint holds the full weights as ``policy/``
and every rank's engine partition as ``engine/``; resuming needs the same number of ranks.

Every public method that touches the engine is collective: all ranks call it together.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mcprl_policy import Layout, PackedForward, Policy, policy_forward
from mcprl_policy.weight_push import ParameterGather
from mcprl_train import collectives
from mcprl_train.build import build_policy
from mcprl_train.config import Config
from mcprl_train.errors import DistributedError
from mcprl_train.loop.samples import Sample
from mcprl_train.loop.update import CheckpointWriter, adamw
from mcprl_train.parallel.deepspeed import deepspeed_config, require_deepspeed
from mcprl_train.parallel.ds_reference import PartitionedReference, partitioned_reference
from mcprl_train.parallel.gathered import GatheredWeights, ZeroParameters
from mcprl_train.typed_torch import tensor_list

__all__ = [
    "ENGINE_TAG",
    "DeepSpeedBackend",
    "deepspeed_backend",
    "filler_sample",
    "logit_chunks",
    "pad_to_chunks",
]

ENGINE_TAG = "engine"
_STAGING = ".engine-staging"


class _EngineModule(nn.Module):
    """What the engine wraps: the policy's model (and value head when it trains) behind the training forward.

    Returns plain tensors ``(logprobs, entropies, values, valid)``, each ``(N,)`` over the packed tokens
    (``values`` empty when not computed), so DeepSpeed can hook the outputs.
    """

    def __init__(self, policy: Policy, *, layout: Layout, with_values: bool) -> None:
        super().__init__()
        self.model = policy.model
        if with_values:
            self.value_head = policy.value_head
        self._policy = policy
        self._layout: Layout = layout

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


def deepspeed_backend(config: Config, *, source: str | None = None) -> DeepSpeedBackend:
    """This rank's trained policy in a DeepSpeed engine, and its sampling replica if asked for (collective).

    Args:
        config: The run config (``model.device`` already pointing at this rank's device).
        source: A saved policy directory to load instead of ``model.name`` (a checkpoint's ``policy/``).

    Raises:
        DistributedError: a part of the config that does not run under DeepSpeed, with the way out.
    """
    world = collectives.world_size()
    if config.sft.enabled:
        raise DistributedError(
            "sft.enabled=true: the SFT warm start runs in one process; run it there first "
            "(--set distributed.backend=none --set distributed.zero_stage=0 --set run.steps=0) and start "
            "GRPO from its checkpoint with --set model.name=<run>/checkpoints/<step>/policy"
        )
    if config.lora is not None:
        raise DistributedError(
            "distributed.backend=deepspeed trains the full model; lora is not wired under "
            "DeepSpeed (use one process: --set distributed.backend=none --set distributed.zero_stage=0)"
        )
    if config.grpo.tasks_per_step < world:
        raise DistributedError(
            f"grpo.tasks_per_step={config.grpo.tasks_per_step} is below the {world} ranks: every rank "
            "needs at least one task group per step"
        )
    # Rank 0 first: building or downloading a model fills a shared cache the others then read.
    if collectives.rank() != 0:
        collectives.barrier()
    policy = build_policy(config, source=source)
    replica = build_policy(config, source=source) if config.distributed.sampling == "replica" else None
    if collectives.rank() == 0:
        collectives.barrier()
    return DeepSpeedBackend(policy, replica, config)


class DeepSpeedBackend:
    """The trained policy in a DeepSpeed engine, sampled from directly or via a replica (module docstring).

    Args:
        policy: The trained policy (full fine-tune; ZeRO-3 partitions its parameters).
        replica: A second copy of the same policy for the samplers (eval mode, no gradients); None: the
            samplers read the engine's module (``distributed.sampling=engine``).
        config: The run config (``optim`` for AdamW and the layout, ``distributed`` for the engine, ``grpo``
            for whether the value head trains, ``reference`` for whether it reads the weights after updates).
    """

    def __init__(self, policy: Policy, replica: Policy | None, config: Config) -> None:
        deepspeed = require_deepspeed()
        with_values = config.grpo.estimator == "gae"
        if policy.value_head is not None and not with_values:
            # Nothing reads the value head without GAE; frozen, it stays out of the engine (as in one process,
            # where it never receives a gradient).
            policy.value_head.requires_grad_(False)
        self.policy = policy
        self.replica = replica
        self.sampling_policy = replica if replica is not None else policy
        if replica is not None:
            replica.eval()
            replica.model.requires_grad_(False)
        self.world = collectives.world_size()
        self.zero_stage = config.distributed.zero_stage
        self.sampling = config.distributed.sampling
        self.chunk_size = int(policy.logits_chunk_size)
        tokenizer = policy.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.filler_token = int(pad or 0)
        params = list(policy.trainable_parameters())
        self.optimizer = adamw(params, config.optim)
        self.module = _EngineModule(policy, layout=config.optim.layout, with_values=with_values)
        self.engine, *_ = deepspeed.initialize(
            model=self.module,
            optimizer=self.optimizer,
            model_parameters=params,
            config=deepspeed_config(config),
        )
        # A full-copy reference follows `sampling_policy`'s weights right after the update, before the trainer's
        # `publish`: they must be the updated weights by then. ZeRO-3's reference reads the engine's partitions.
        self.publish_after_step = (
            config.grpo.kl_coef > 0 and config.reference.every > 0 and self.zero_stage < 3
        )
        self.reference: PartitionedReference | None = None
        if config.grpo.kl_coef > 0 and self.zero_stage == 3:
            self.reference = partitioned_reference(config, policy)
        self.replica_stale = replica is not None
        self.gathered: GatheredWeights | None = None
        self.pushed_by_bucket = replica is None and self.zero_stage == 3 and config.sampler.backend == "vllm"
        self._push_gather = ZeroParameters() if self.pushed_by_bucket else None
        if replica is None and self.zero_stage == 3:
            self.gathered = GatheredWeights(self.engine)
            if not self.pushed_by_bucket:
                self.gathered.gather()

    # -- the update -----------------------------------------------------------------------------------------

    def forward(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float,
        values: bool,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        """Scores every token whatever ``needed`` says: under ZeRO-3 each head call gathers the head's
        weights on every rank, so the ranks must make the same number of calls, and `lay_out` evens them out
        by token counts (`pad_to_chunks`), not by the tokens each rank's loss reads."""
        del needed
        self._release()
        ids = [list(s) for s in sequences]
        logprobs, entropies, value_out, valid = self.engine(ids, temperature, values)
        return PackedForward(
            logprobs=logprobs,
            entropies=entropies,
            values=value_out if values else None,
            valid=valid,
            seq_lens=tuple(len(i) for i in ids),
        )

    def lay_out(self, batches: list[list[Sample]]) -> tuple[list[list[Sample]], int]:
        """Pad to the ranks' largest micro-batch count and, per index, their largest logits-chunk count."""
        self._release()
        count = int(collectives.all_reduce_scalar(float(len(batches)), "max"))
        given = len(batches)
        batches = [*batches, *([filler_sample(2, self.filler_token)] for _ in range(count - given))]
        chunks = torch.tensor(
            [logit_chunks([int(s.token_ids.numel()) for s in b], self.chunk_size) for b in batches],
            dtype=torch.float64,
        )
        targets = tensor_list(collectives.all_reduce_tensor(chunks, "max").long(), int)
        padded = [
            pad_to_chunks(b, int(t), self.chunk_size, self.filler_token)
            for b, t in zip(batches, targets, strict=True)
        ]
        fillers = count - given + sum(len(p) - len(b) for p, b in zip(padded, batches, strict=True))
        return padded, fillers

    def zero_grad(self) -> None:
        self._release()
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        self._release()
        # The engine averages gradients over the ranks; the normaliser was already summed over them.
        self.engine.backward(loss * self.world)

    def step(self) -> float:
        """``engine.step`` (reduction, clipping at ``optim.max_grad_norm``, AdamW); the pre-clip norm."""
        self._release()
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        self.replica_stale = self.replica is not None
        if self.publish_after_step:
            self.publish()
        return float(norm) if norm is not None else float("nan")

    def partitioned_reference(self) -> PartitionedReference | None:
        """The ZeRO-3 KL reference (`mcprl_train.parallel.ds_reference`); None: a full copy is built instead."""
        return self.reference

    # -- sampling -------------------------------------------------------------------------------------------

    def _release(self) -> None:
        """Back to the partitions before the engine computes (local: no collective)."""
        if self.gathered is not None:
            self.gathered.release()

    def weight_gather(self) -> ParameterGather | None:
        """ZeRO-3 with vLLM: the push's per-bucket gather (`ZeroParameters`); None: the weights are full."""
        return self._push_gather

    def publish(self) -> None:
        """Make the trained weights the samplers' (collective).

        ``engine`` sampling: ZeRO-3 gathers every parameter to full size (a no-op when they still are), except
        with vLLM, whose push gathers per bucket: what a checkpoint left gathered is released first (DeepSpeed
        refuses to gather a parameter an outer context holds); ZeRO 0-2 have nothing to do. ``replica``: gather
        every engine parameter and load it into the replica (once per optimizer step).
        """
        if self.pushed_by_bucket:
            self._release()
        elif self.gathered is not None:
            self.gathered.gather()
        if self.replica is None or not self.replica_stale:
            return
        self.replica_stale = False
        deepspeed = require_deepspeed()
        replica = {f"model.{n}": p for n, p in self.replica.model.named_parameters()}
        if self.replica.value_head is not None:
            replica.update({f"value_head.{n}": p for n, p in self.replica.value_head.named_parameters()})
        with torch.no_grad():
            for name, param in self.module.named_parameters():
                with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    full = param.detach().to("cpu", copy=True)
                if name in replica:
                    replica[name].copy_(full.to(replica[name].dtype))

    # -- checkpoints ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the optimizer states are partitioned into the engine's own checkpoint files."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def save_partitions(self, root: Path) -> dict[str, CheckpointWriter]:
        """Every rank's engine partition into a staging directory under ``root`` (collective).

        Returns the ``engine`` part for rank 0's checkpoint: it moves the staged files in. Gathered ZeRO-3
        weights are released for the engine's save and gathered again after it, for the ``policy/`` part (and
        the rank records a run's end writes after its last checkpoint); with vLLM they are gathered for this
        only, until the next engine call.
        """
        full = self.gathered is not None and self.gathered.full
        self._release()
        staging = root / _STAGING
        if collectives.rank() == 0:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob(f"{_STAGING}*"):
                shutil.rmtree(stale, ignore_errors=True)
        collectives.barrier()
        self.engine.save_checkpoint(str(staging), tag=ENGINE_TAG, save_latest=False)
        if self.reference is not None:
            self.reference.save_partition(staging / ENGINE_TAG)
        collectives.barrier()
        if full or self.pushed_by_bucket:
            assert self.gathered is not None
            self.gathered.gather()
        engine_dir = staging / ENGINE_TAG

        def move(target: Path) -> None:
            for item in sorted(engine_dir.iterdir()):
                os.replace(item, target / item.name)
            shutil.rmtree(staging, ignore_errors=True)

        return {"engine": move}

    def load_partitions(self, checkpoint: Path) -> None:
        """Restore parameters and optimizer partitions from ``checkpoint/engine`` (collective).

        Raises:
            DistributedError: nothing loadable there (missing files, or saved by a different number of ranks).
        """
        full = self.gathered is not None and self.gathered.full
        self._release()
        path, _ = self.engine.load_checkpoint(
            str(checkpoint), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        self.replica_stale = self.replica is not None
        if full:
            self.publish()
        if path is None:
            raise DistributedError(
                f"no DeepSpeed engine state under {str(checkpoint / ENGINE_TAG)!r} (a checkpoint resumes only "
                "with the number of ranks that saved it)"
            )
        if self.reference is not None:
            self.reference.load_partition(checkpoint / ENGINE_TAG)

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"world_size": self.world, "zero_stage": self.zero_stage, "sampling": self.sampling}
