"""Outcome-reward advantages for groups of episodes: GRPO, Dr.GRPO, RLOO, REINFORCE++ (baseline).

Layout (one convention for the whole package): a batch of N episodes is flat. ``rewards`` is ``(N,)`` float,
``group_ids`` is ``(N,)`` integer with values in ``[0, num_groups)`` naming each episode's group (the G samples
of one prompt), and ``valid`` is an optional ``(N,)`` bool mask. Groups may be of any size, interleaved, and
may contain invalid members: an episode that died from an infrastructure failure is not a reward of 0, so it is
removed from every baseline and statistic and receives advantage exactly 0 (its reward may even be NaN). For a
``(num_groups, G)`` reward matrix use ``rewards.reshape(-1)`` with `contiguous_group_ids`.

Groups whose valid rewards are all equal ("zero-variance" groups) carry no learning signal: every estimator
returns exactly 0 for them (not a rounding residue), `zero_variance_groups` finds them and
`filter_zero_variance` gives the mask of episodes worth training on.
"""

from __future__ import annotations

from typing import assert_never

import torch

from mcprl_grpo._checks import as_mask, check_float, check_ndim, check_non_negative
from mcprl_grpo._groups import group_rewards
from mcprl_grpo._segments import segments
from mcprl_grpo._select import zero_outside
from mcprl_grpo.choices import Estimator as Estimator
from mcprl_grpo.choices import Scale as Scale
from mcprl_grpo.errors import ShapeError
from mcprl_grpo.packed_layout import SeqIds
from mcprl_grpo.token_mask import MaskLike, TokenMask

_DEFAULT_SCALE: dict[str, Scale] = {
    "grpo": "group",
    "dr_grpo": "none",
    "rloo": "none",
    "reinforce_pp": "batch",
}


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    estimator: Estimator = "grpo",
    valid: torch.Tensor | None = None,
    num_groups: int | None = None,
    scale: Scale | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-episode advantages from outcome rewards, with a baseline computed inside each group.

    With ``g`` the group of episode ``i``, ``n_g`` its number of valid members, ``μ_g``/``σ_g`` the mean and
    unbiased std of its valid rewards:

    - ``"grpo"`` — Shao et al. 2024, DeepSeekMath §4.1.2 (outcome supervision):
      ``Â_i = (r_i - μ_g) / (σ_g + ε)``. Default scale ``"group"``.
    - ``"dr_grpo"`` — Liu et al. 2025, "Understanding R1-Zero-Like Training", Dr. GRPO (their eq. 3 drops the
      std): ``Â_i = r_i - μ_g``. Default scale ``"none"``.
    - ``"rloo"`` — Ahmadian et al. 2024, "Back to Basics", eq. (5), leave-one-out baseline:
      ``Â_i = r_i - 1/(n_g - 1) Σ_{j≠i} r_j = n_g/(n_g - 1) · (r_i - μ_g)``; 0 when ``n_g = 1``.
      Default scale ``"none"``.
    - ``"reinforce_pp"`` — Hu et al. 2025, "REINFORCE++", REINFORCE++-baseline: ``A'_i = r_i - μ_g``, then
      batch normalisation ``(A'_i - mean_batch A') / (std_batch A' + ε)``. Default scale ``"batch"``; the
      batch mean of group-centred advantages is identically 0, so the normalisation is the batch-std division.

    ``scale`` overrides the estimator's divisor: ``"group"`` divides by ``σ_g + ε``, ``"batch"`` by the unbiased
    std of the centred advantages over all valid episodes ``+ ε``, ``"none"`` leaves them centred.

    Args:
        rewards: ``(N,)`` float rewards (any float dtype; computed in float32, float64 stays float64).
        group_ids: ``(N,)`` integer group index of each episode, in ``[0, num_groups)``.
        estimator: Which estimator.
        valid: ``(N,)`` bool; False removes the episode from baselines and gives it advantage 0.
        num_groups: K; default ``group_ids.max() + 1``.
        scale: Override the divisor (see above); None uses the estimator's default.
        eps: ε ≥ 0 added to the std.

    Returns:
        ``(N,)`` advantages; exactly 0 for invalid episodes, singleton groups and zero-variance groups.

    Raises:
        ShapeError: ``rewards``/``group_ids``/``valid`` are not ``(N,)`` alike.
        DTypeError: float ``group_ids`` or non-float ``rewards``.
        ArgumentError: ids outside ``[0, num_groups)`` or ``eps < 0``.
    """
    check_non_negative("eps", eps)
    g = group_rewards(rewards, group_ids, valid=valid, num_groups=num_groups)
    zero = torch.zeros((), dtype=g.rewards.dtype, device=g.rewards.device)
    centred = g.rewards - g.mean[g.group_ids]
    match estimator:
        case "grpo" | "dr_grpo" | "reinforce_pp":
            pass
        case "rloo":
            n = g.count[g.group_ids]
            centred = torch.where(n > 1, centred * n / (n - 1.0).clamp(min=1.0), zero)
        case _:
            assert_never(estimator)
    keep = g.valid & ~g.flat[g.group_ids]
    centred = torch.where(keep, centred, zero)
    chosen: Scale = _DEFAULT_SCALE[estimator] if scale is None else scale
    match chosen:
        case "group":
            adv = centred / (g.std[g.group_ids] + eps)
        case "batch":
            # Batch statistics over every valid episode, zero-variance groups included (their A' is 0).
            k = g.valid.to(centred.dtype).sum()
            mu = centred.sum() / k.clamp(min=1.0)
            var = (torch.where(g.valid, centred - mu, zero) ** 2).sum() / (k - 1.0).clamp(min=1.0)
            adv = (centred - mu) / (var.sqrt() + eps) if bool(var > 0) or eps > 0 else centred - mu
        case "none":
            adv = centred
        case _:
            assert_never(chosen)
    return torch.where(keep, adv, zero)


def zero_variance_groups(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    num_groups: int | None = None,
    atol: float = 0.0,
) -> torch.Tensor:
    """Which groups have at least one valid member and all valid rewards equal (within ``atol``).

    Such groups give every episode advantage 0 (DAPO, Yu et al. 2025, §3.2 "dynamic sampling" filters them).
    A group with one valid member counts; a group with no valid member does not (it is empty, not flat).

    Args:
        rewards: ``(N,)`` float.
        group_ids: ``(N,)`` integer in ``[0, num_groups)``.
        valid: ``(N,)`` bool, or None for all valid.
        num_groups: K; default ``group_ids.max() + 1``.
        atol: Rewards within ``atol`` of each other count as equal.

    Returns:
        ``(K,)`` bool.
    """
    check_non_negative("atol", atol)
    return group_rewards(rewards, group_ids, valid=valid, num_groups=num_groups, atol=atol).flat


def filter_zero_variance(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    num_groups: int | None = None,
    atol: float = 0.0,
) -> torch.Tensor:
    """Mask of episodes worth training on: valid and in a group that is not zero-variance.

    Index any per-episode tensor or list with it (``tokens[keep]``); the caller decides whether to back-fill.

    Returns:
        ``(N,)`` bool.
    """
    check_non_negative("atol", atol)
    g = group_rewards(rewards, group_ids, valid=valid, num_groups=num_groups, atol=atol)
    return g.valid & ~g.flat[g.group_ids]


def contiguous_group_ids(
    num_groups: int, group_size: int, *, device: torch.device | None = None
) -> torch.Tensor:
    """Group ids ``[0]*G + [1]*G + …`` for a ``(num_groups, G)`` reward matrix flattened row-major.

    Returns:
        ``(num_groups * group_size,)`` int64.
    """
    check_non_negative("num_groups", num_groups)
    check_non_negative("group_size", group_size)
    return torch.arange(num_groups, device=device).repeat_interleave(group_size)


def expand_to_tokens(
    advantages: torch.Tensor, mask: MaskLike, *, seq_ids: SeqIds | None = None
) -> torch.Tensor:
    """Broadcast per-episode advantages to every policy token of the episode.

    Args:
        advantages: ``(B,)`` float.
        mask: ``(B, T)`` policy-token mask (bool or 0/1), or packed ``(L,)`` together with ``seq_ids``.
        seq_ids: ``(L,)`` episode index in ``[0, B)`` of each packed token; None for ``(B, T)``.

    Returns:
        Shape of ``mask``: the token's episode advantage where ``mask`` is true, else 0.
    """
    check_float("advantages", advantages)
    check_ndim("advantages", advantages, 1, "(B,)")
    m = as_mask("mask", mask, "mask", None)
    if seq_ids is None:
        if m.dim() != 2 or m.shape[0] != advantages.shape[0]:
            raise ShapeError("mask", mask.shape, f"({advantages.shape[0]}, T) to match advantages (B,)")
        if (
            isinstance(mask, TokenMask)
            and advantages.dtype == torch.float32
            and bool(torch.isfinite(advantages).all())
        ):
            # Finite values times the validated 0/1 weights: each token's advantage or 0, one multiply.
            return advantages.unsqueeze(-1) * mask.weights
        return zero_outside(advantages.unsqueeze(-1).expand(m.shape), m)
    ids, n = segments(m, seq_ids, name="mask")
    if n > advantages.shape[0]:
        raise ShapeError("advantages", advantages.shape, f"at least ({n},) for seq_ids up to {n - 1}")
    return zero_outside(advantages[ids], m)
