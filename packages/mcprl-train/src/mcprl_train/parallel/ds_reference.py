"""The KL reference under ZeRO-3: a frozen model partitioned like the engine, followed per partition.

Under ZeRO 0-2 every rank holds the full parameters anyway and the reference is a full frozen copy
(`mcprl_policy.ReferencePolicy`). Under ZeRO-3 that copy would be the largest thing on a rank that holds only
``1/N`` of the policy, so `PartitionedReference` is partitioned instead, as TRL's ``prepare_deepspeed`` does
(trl/models/utils.py: ``deepspeed.initialize`` on the frozen model with the run's stage-3 config and no
optimizer; verl keeps the reference in an FSDP worker of its own for the same reason):

- The model is built inside ``deepspeed.zero.Init`` from the policy's architecture, so no full copy exists at
  any point; its first `PartitionedReference.sync` (the trainer's, at the start) copies the engine's partitions.
- Its forward gathers each layer's parameters collectively, like the engine's. The learner calls it once per
  micro-batch after `DeepSpeedBackend.lay_out` has evened out the ranks' micro-batch counts and, per
  micro-batch, their logits-chunk counts; the reference reads the same micro-batches with the policy's chunk size
  (`mcprl_policy.reference.frozen_forward`), so it calls each module as often on every rank.
- EMA and re-sync (``reference.ema``, ``reference.every``) are local: ZeRO-3 partitions a parameter of
  ``n`` elements by flattening it, padding it to a multiple of the group's size ``N`` and giving rank ``r`` the
  elements ``[r·⌈n/N⌉, (r+1)·⌈n/N⌉)`` (``Init._partition_param`` in deepspeed/runtime/zero/partition_parameters.py:
  ``start = partition_size * rank``), whichever engine owns the parameter. Both engines partition over the
  same data-parallel group, so this rank's reference and engine partitions of one parameter hold the same
  elements; `PartitionedReference` checks the sizes and group ranks pairwise when it is built, and
  ``ref ← ema·ref + (1-ema)·policy`` runs on the two ``ds_tensor`` partitions. The engine's partition is what
  its optimizer step wrote (the compute-dtype copy of the master weights), the same values a full-copy
  reference reads from the gathered weights, so the result equals the full-copy reference's elementwise.
- A checkpoint holds each rank's partition as ``reference-rank-<r>.pt`` next to the engine's partition files
  (`DeepSpeedBackend.save_partitions`). Rebuilding it from the checkpointed ``policy/`` weights would be exact
  only for a reference that equals the policy at the checkpoint (re-synced at that very step); a fixed
  reference or an EMA one is no function of the current weights. `state_dict` is therefore empty (the
  learner's state, written by rank 0 alone, cannot hold other ranks' partitions); `load_state_dict` also takes
  the full tensors a full-copy reference checkpointed, slicing this rank's partition out of each.

Every method but `PartitionedReference.state_dict` and the size queries is collective or must run on every
rank at the same point (``logprobs``: collective; ``update``/``sync``: local but in step with the engine's).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from mcprl_policy import PackedForward, Policy
from mcprl_policy.reference import frozen_forward
from mcprl_train import collectives
from mcprl_train.config import Config
from mcprl_train.errors import CheckpointError, DistributedError
from mcprl_train.parallel.deepspeed import deepspeed_config, require_deepspeed

__all__ = ["PartitionedReference", "partition_file", "partitioned_reference"]


def partition_file(rank: int) -> str:
    """The file name of rank ``rank``'s reference partition inside a checkpoint's ``engine/``."""
    return f"reference-rank-{rank:05d}.pt"


class _ReferenceModule(nn.Module):
    """What the reference engine wraps: the frozen model behind the reference forward (plain tensors out)."""

    def __init__(self, policy: Policy, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._policy = policy

    def forward(
        self, sequences: list[list[int]], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = frozen_forward(self._policy, self.model, sequences, temperature)
        return out.logprobs, out.entropies, out.valid


def partitioned_reference(config: Config, policy: Policy) -> PartitionedReference:
    """A ZeRO-3 reference for the engine-wrapped ``policy`` (collective; every rank builds it at once).

    Args:
        config: The run config (the engine's DeepSpeed config is generated from it).
        policy: The trained policy, its parameters already partitioned by the engine.

    Raises:
        DistributedError: ZeRO stage below 3 (the reference is a full copy there), or the engine's parameters
            are not partitioned.
    """
    if config.distributed.zero_stage != 3:
        raise DistributedError(
            f"a partitioned reference needs ZeRO stage 3 (distributed.zero_stage={config.distributed.zero_stage} "
            "keeps full parameters on every rank: the reference is a full copy there)"
        )
    deepspeed = require_deepspeed()
    from transformers import AutoModelForCausalLM, PreTrainedModel
    from transformers.initialization import no_init_weights

    ds_config = deepspeed_config(config)
    dtype = next(policy.model.parameters()).dtype  # the engine's: what the EMA reads
    # zero.Init takes the dtype from the config's bf16/fp16 flags; its `dtype` argument is ignored on
    # accelerators without fp16 (bf16 on CPU whatever is asked: deepspeed 0.19 `Init._set_dtype`).
    init_config = ds_config | {
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16},
    }
    architecture = copy.deepcopy(policy.model.config)
    # As transformers builds a model under ZeRO-3 (modeling_utils `_from_config`): partitioned as each module is
    # made, no initialisation (the partitions are overwritten by the first `sync`).
    with no_init_weights(), deepspeed.zero.Init(config_dict_or_path=init_config):
        built: Any = AutoModelForCausalLM.from_config(architecture, dtype=dtype)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    model = cast(PreTrainedModel, built)
    model.tie_weights()  # init_weights ties them, skipped above
    model.requires_grad_(False)
    engine, *_ = deepspeed.initialize(model=_ReferenceModule(policy, model), config=ds_config)
    engine.eval()
    return PartitionedReference(engine, model, policy)


class PartitionedReference:
    """Reference logprobs from a ZeRO-3 partitioned frozen model (see the module docstring).

    Args:
        engine: The inference-only ``DeepSpeedEngine`` around the reference model.
        model: The reference model (its parameters ZeRO-3 partitioned).
        policy: The trained policy whose engine partitions the reference follows.
    """

    def __init__(self, engine: Any, model: nn.Module, policy: Policy) -> None:
        self.engine = engine
        self.model = model
        self.policy = policy
        self.restored = False
        own = dict(model.named_parameters())
        source = dict(policy.model.named_parameters())
        if own.keys() != source.keys():
            raise DistributedError(
                "the reference model's parameters differ from the policy's: "
                f"{sorted(own.keys() ^ source.keys())[:5]}"
            )
        self.pairs = [(name, own[name], source[name]) for name in own]
        for name, mine, theirs in self.pairs:
            _check_alike(name, mine, theirs)
        persistent = set(model.state_dict().keys())
        buffers = dict(policy.model.named_buffers())
        self.buffers = [
            (b, buffers[n]) for n, b in model.named_buffers() if n in persistent and b.is_floating_point()
        ]

    @property
    def shares_weights(self) -> bool:
        """False: the reference is a copy of its own (partitioned), which follows the policy and is checkpointed."""
        return False

    def partition_numel(self) -> int:
        """Parameter elements this rank holds (padding included): about ``1/N`` of `full_numel`."""
        return sum(_partition(p).numel() for _, p, _ in self.pairs)

    def full_numel(self) -> int:
        """Parameter elements of the whole reference model."""
        return sum(_numel(p) for _, p, _ in self.pairs)

    @torch.no_grad()
    def logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        """Per-token reference logprobs and entropies of packed ``sequences`` (collective; no values).

        Every token is scored, ``needed`` or not: ZeRO-3 gathers the head for each call, and the ranks must make
        the same calls (the training forward's rule under DeepSpeed).
        """
        ids = [list(s) for s in sequences]
        logprobs, entropies, valid = self.engine(ids, temperature)
        return PackedForward(
            logprobs=logprobs,
            entropies=entropies,
            values=None,
            valid=valid,
            seq_lens=tuple(len(i) for i in ids),
        )

    @torch.no_grad()
    def update(self, *, ema: float) -> None:
        """``ref ← ema·ref + (1-ema)·policy`` on this rank's partitions (and the full floating buffers)."""
        if not 0.0 <= ema <= 1.0:
            raise ValueError(f"ema must be in [0, 1], got {ema}")
        for target, source in self._tensors():
            target.mul_(ema).add_(source.to(target.dtype), alpha=1.0 - ema)

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the policy's partitions (and floating buffers) into the reference's."""
        for target, source in self._tensors():
            target.copy_(source)

    def _tensors(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(reference, policy) pairs: the parameters' partitions, then the persistent floating buffers."""
        self.engine.empty_partition_cache()  # a parameter still gathered would keep a stale full copy
        for _, mine, theirs in self.pairs:
            yield _partition(mine), _partition(theirs)
        yield from self.buffers

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Nothing: each rank's partition is in the checkpoint's engine files (`save_partition`)."""
        return {}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore from the learner's state: empty when `load_partition` restored the partition; full tensors
        (a full-copy reference's ``state_dict``) are sliced to this rank's partitions.

        Raises:
            CheckpointError: an empty state and no partition file loaded, or tensors that do not match.
        """
        if not state:
            if not self.restored:
                raise CheckpointError(
                    "the checkpoint has no reference partition for this rank (engine/"
                    f"{partition_file(collectives.rank())}) and no full reference weights"
                )
            return
        named = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        known = set(self.model.state_dict().keys())  # tied weights appear under every name
        missing, extra = sorted(named.keys() - state.keys()), sorted(state.keys() - known)
        if missing or extra:
            raise CheckpointError(
                f"reference state does not match the model: missing {missing[:5]}, unexpected {extra[:5]}"
            )
        self.engine.empty_partition_cache()
        for name, param in named.items():
            full = state[name]
            shape = _shape(param)
            if tuple(full.shape) != shape:
                raise CheckpointError(
                    f"reference state {name!r}: shape {tuple(full.shape)}, the model has {shape}"
                )
            _partition(param).copy_(_slice(full, param))
        for name, buffer in buffers.items():
            if name in state:
                buffer.copy_(state[name])

    def save_partition(self, directory: Path) -> None:
        """This rank's partitions and buffers into ``directory`` (every rank; the engine's checkpoint dir)."""
        rank = collectives.rank()
        tensors = {name: _partition(p).detach().to("cpu", copy=True) for name, p, _ in self.pairs}
        buffers = {f"buffer.{i}": b.detach().to("cpu", copy=True) for i, (b, _) in enumerate(self.buffers)}
        directory.mkdir(parents=True, exist_ok=True)
        payload = {"world_size": collectives.world_size(), "rank": rank, "tensors": tensors | buffers}
        torch.save(payload, directory / partition_file(rank))

    @torch.no_grad()
    def load_partition(self, directory: Path) -> None:
        """Restore this rank's partitions from ``directory`` if `save_partition` wrote them there.

        Raises:
            DistributedError: the file was written by another rank or world size.
        """
        path = directory / partition_file(collectives.rank())
        if not path.is_file():
            return
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if (payload["world_size"], payload["rank"]) != (collectives.world_size(), collectives.rank()):
            raise DistributedError(
                f"{path}: written by rank {payload['rank']} of {payload['world_size']}; this is rank "
                f"{collectives.rank()} of {collectives.world_size()}"
            )
        tensors: dict[str, torch.Tensor] = payload["tensors"]
        self.engine.empty_partition_cache()
        for name, param, _ in self.pairs:
            _partition(param).copy_(tensors[name])
        for i, (buffer, _) in enumerate(self.buffers):
            buffer.copy_(tensors[f"buffer.{i}"])
        self.restored = True


def _partition(param: torch.Tensor) -> torch.Tensor:
    """This rank's flat ZeRO-3 partition of ``param`` (padded to ``⌈n/N⌉`` elements)."""
    part: torch.Tensor = getattr(param, "ds_tensor")  # noqa: B009  # set by DeepSpeed, untyped
    return part


def _numel(param: torch.Tensor) -> int:
    """The full element count of a ZeRO-3 parameter (its own tensor is empty while partitioned)."""
    return int(getattr(param, "ds_numel"))  # noqa: B009


def _shape(param: torch.Tensor) -> tuple[int, ...]:
    """The full shape of a ZeRO-3 parameter."""
    shape: torch.Size = getattr(param, "ds_shape")  # noqa: B009
    return tuple(shape)


def _group_rank(param: torch.Tensor) -> tuple[int, int]:
    """This rank's position in the parameter's partition group, and the group's size."""
    group: torch.distributed.ProcessGroup = getattr(param, "ds_process_group")  # noqa: B009
    return torch.distributed.get_rank(group=group), torch.distributed.get_world_size(group=group)


def _check_alike(name: str, mine: torch.Tensor, theirs: torch.Tensor) -> None:
    """Both partitions of ``name`` cover the same elements: same size, same padding, same group position."""
    for p, whose in ((mine, "reference"), (theirs, "policy")):
        if not hasattr(p, "ds_tensor"):
            raise DistributedError(f"the {whose}'s parameter {name!r} is not ZeRO-3 partitioned")
        if getattr(_partition(p), "final_location", None) is not None:
            raise DistributedError(f"the {whose}'s parameter {name!r} is offloaded to NVMe: not supported")
    sizes = [(_numel(p), _partition(p).numel(), _group_rank(p)) for p in (mine, theirs)]
    if sizes[0] != sizes[1]:
        raise DistributedError(
            f"parameter {name!r} is partitioned differently: reference (numel, partition, (rank, group size)) "
            f"{sizes[0]}, policy {sizes[1]}"
        )


def _slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's partition of the full tensor ``full`` of ``param``, zero-padded as ZeRO-3 pads it."""
    size = _partition(param).numel()
    rank, _ = _group_rank(param)
    flat = full.reshape(-1)[rank * size : (rank + 1) * size]
    out = torch.zeros(size, dtype=_partition(param).dtype)
    out[: flat.numel()] = flat.to(out.dtype)
    return out
