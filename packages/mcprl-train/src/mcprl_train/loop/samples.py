"""Training samples: episodes as per-token targets, and their packing into micro-batches.

A `Sample` is one valid episode as tensors aligned with its token ids; a `MicroBatch` is the concatenation of
several samples, the unit of one forward/backward. Position ``t`` of every per-token field refers to token
``t``, predicted from the tokens before it, so the first token of every sequence is never a target
(`without_first_token`): nothing predicts it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from mcprl_env import Episode
from mcprl_train.typed_torch import tensor_list

__all__ = ["MicroBatch", "Sample", "episode_sample", "micro_batch", "pack_indices", "without_first_token"]


def without_first_token(mask: torch.Tensor) -> torch.Tensor:
    """A copy of one sequence's target mask `(L,)` with its first position cleared (it has no prefix)."""
    out = mask.clone()
    out[0] = False if out.dtype == torch.bool else 0
    return out


@attrs.frozen(kw_only=True)
class Sample:
    """One valid episode as training targets; tensors are `(L,)`, aligned with `token_ids`."""

    token_ids: torch.Tensor
    action_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    reward: float = 0.0


def episode_sample(episode: Episode, advantage: float) -> Sample:
    """Training targets of one `mcprl_env.Episode` with a scalar (per-episode) advantage."""
    ids = torch.tensor(episode.token_ids, dtype=torch.long)
    mask = torch.tensor(episode.loss_mask, dtype=torch.bool)
    old = torch.tensor(episode.sampler_logprobs, dtype=torch.float32)
    if not (ids.shape == mask.shape == old.shape):
        raise ValueError(
            f"episode {episode.episode_id}: token_ids {tuple(ids.shape)}, loss_mask {tuple(mask.shape)} and "
            f"sampler_logprobs {tuple(old.shape)} differ in length"
        )
    mask = without_first_token(mask)
    adv = torch.where(mask, torch.tensor(float(advantage)), torch.tensor(0.0))
    return Sample(
        token_ids=ids, action_mask=mask, old_logprobs=old, advantages=adv, reward=float(episode.reward)
    )


def pack_indices(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing packing of sequences into bins of at most `max_tokens` tokens.

    Returns index lists into `lengths`; a sequence longer than `max_tokens` gets a bin of its own (never cut).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


@attrs.define
class MicroBatch:
    """Samples concatenated: per-token fields `(N,)` over all of them, `seq_ids` naming each token's sample.

    Every tensor lives on the device the micro-batch was built for (the model's: `micro_batch`). `sampler` holds
    the sampler's logprobs and `old` starts as them; when the learner recomputes the old logprobs it replaces
    `old` (and `tis`, the truncated importance weights against `sampler`). `learner_old` is the learner's own
    logprobs before the update, what the sampler's are compared with (`mismatch/*`): the recompute's, or the
    forward of the single pass when nothing is recomputed. `ref`, `old_values`, `returns` and (for GAE) `adv`
    are filled in before the update's passes.
    """

    samples: list[Sample]
    ids: list[list[int]]
    seq_ids: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor
    old: torch.Tensor
    sampler: torch.Tensor
    tis: torch.Tensor | None = None
    learner_old: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(i) for i in self.ids]


def micro_batch(samples: list[Sample], *, device: torch.device | str = "cpu") -> MicroBatch:
    """``samples`` concatenated, per-token tensors on ``device`` (where the forward's outputs will be)."""
    sampler = torch.cat([s.old_logprobs for s in samples]).to(device)
    return MicroBatch(
        samples=samples,
        ids=[tensor_list(s.token_ids, int) for s in samples],
        seq_ids=torch.cat([torch.full((s.token_ids.numel(),), i) for i, s in enumerate(samples)]).to(device),
        mask=torch.cat([s.action_mask for s in samples]).to(device),
        adv=torch.cat([s.advantages for s in samples]).to(device),
        old=sampler,
        sampler=sampler,
    )
