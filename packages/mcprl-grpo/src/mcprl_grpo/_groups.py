"""Segment statistics over episode groups: the layout shared by advantages and metrics.

Layout: a batch of N episodes is flat. ``rewards`` is ``(N,)``, ``group_ids`` is ``(N,)`` int64 with values in
``[0, num_groups)`` (groups need not be contiguous or equal-sized), and ``valid`` is ``(N,)`` bool. Invalid
episodes (infrastructure failures) are excluded from every statistic; their reward may be anything, even NaN.
All statistics use ``index_add_``/``scatter_reduce_``: no Python loop over episodes or groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcprl_grpo._checks import as_float, as_mask, check_float, check_ndim, check_same_shape
from mcprl_grpo.errors import ArgumentError, DTypeError


@dataclass(frozen=True)
class GroupedRewards:
    """Validated rewards with per-group statistics over the valid members.

    Attributes:
        rewards: ``(N,)`` float32/float64, 0 where invalid.
        group_ids: ``(N,)`` int64.
        valid: ``(N,)`` bool.
        num_groups: K.
        count: ``(K,)`` number of valid members.
        mean: ``(K,)`` mean of valid rewards (0 for empty groups).
        std: ``(K,)`` unbiased std of valid rewards (0 with fewer than 2 members).
        flat: ``(K,)`` bool, at least one valid member and all valid rewards equal (within ``atol``).
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    valid: torch.Tensor
    num_groups: int
    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    flat: torch.Tensor


def group_rewards(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    num_groups: int | None = None,
    atol: float = 0.0,
) -> GroupedRewards:
    """Validate the flat layout and compute per-group count, mean, std and flatness."""
    check_float("rewards", rewards)
    check_ndim("rewards", rewards, 1, "(N,)")
    check_same_shape("group_ids", group_ids, "rewards", rewards)
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise DTypeError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    gid = group_ids.long()
    v = (
        torch.ones_like(gid, dtype=torch.bool)
        if valid is None
        else as_mask("valid", valid, "rewards", rewards)
    )
    n = gid.numel()
    lo = int(gid.min()) if n else 0
    hi = int(gid.max()) + 1 if n else 0
    k = hi if num_groups is None else num_groups
    if lo < 0 or hi > k:
        raise ArgumentError(f"group_ids must lie in [0, num_groups={k}), found values in [{lo}, {hi - 1}]")
    r = torch.where(
        v, as_float(rewards), torch.zeros((), dtype=as_float(rewards).dtype, device=rewards.device)
    )
    vf = v.to(r.dtype)
    count = r.new_zeros(k).index_add_(0, gid, vf)
    mean = r.new_zeros(k).index_add_(0, gid, r) / count.clamp(min=1.0)
    dev = torch.where(v, r - mean[gid], torch.zeros((), dtype=r.dtype, device=r.device))
    sq = r.new_zeros(k).index_add_(0, gid, dev * dev)
    std = torch.where(count > 1, sq / (count - 1.0).clamp(min=1.0), torch.zeros_like(sq)).sqrt()
    inf = torch.full((), float("inf"), dtype=r.dtype, device=r.device)
    gmax = r.new_full((k,), -float("inf")).scatter_reduce_(0, gid, torch.where(v, r, -inf), "amax")
    gmin = r.new_full((k,), float("inf")).scatter_reduce_(0, gid, torch.where(v, r, inf), "amin")
    flat = (count > 0) & ((gmax - gmin) <= atol)
    return GroupedRewards(
        rewards=r, group_ids=gid, valid=v, num_groups=k, count=count, mean=mean, std=std, flat=flat
    )
