"""Per-token loss terms: clipped policy surrogate (clip-higher, dual-clip, GSPO), clipped value loss, entropy.

Every function returns a per-token loss of the input's shape (``(B, T)`` or packed ``(L,)``), 0 outside the mask,
to be reduced with `aggregate_loss`. Losses are to be *minimised*. Masked-out positions never affect the value
or the gradient, whatever they hold.
"""

from __future__ import annotations

from typing import assert_never

import torch

from mcprl_grpo._checks import (
    as_float,
    as_mask,
    check_float,
    check_non_negative,
    check_same_shape,
)
from mcprl_grpo._select import zero_outside
from mcprl_grpo.errors import ArgumentError, ShapeError
from mcprl_grpo.importance import RatioLevel, gspo_token_ratios, token_ratios
from mcprl_grpo.packed_layout import SeqIds
from mcprl_grpo.token_mask import MaskLike


def _broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    check_float("advantages", advantages)
    if advantages.shape == like.shape:
        return advantages
    if like.dim() == 2 and advantages.shape == like.shape[:1]:
        return advantages.unsqueeze(-1).expand_as(like)
    raise ShapeError(
        "advantages", advantages.shape, f"{tuple(like.shape)} or ({like.shape[0]},) per sequence"
    )


def check_clip(eps_low: float, eps_high: float | None, dual_clip: float | None) -> float:
    """Validate clip arguments; returns the effective ``eps_high``."""
    if not 0.0 <= eps_low < 1.0:
        raise ArgumentError(f"eps_low must be in [0, 1), got {eps_low!r}")
    high = eps_low if eps_high is None else eps_high
    check_non_negative("eps_high", high)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ArgumentError(f"dual_clip must be > 1 (Ye et al. 2020), got {dual_clip!r}")
    return high


def clipped_surrogate_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: MaskLike,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "token",
    is_weights: torch.Tensor | None = None,
    seq_ids: SeqIds | None = None,
) -> torch.Tensor:
    """Per-token clipped surrogate loss ``-min(r·Â, clip(r, 1-ε_low, 1+ε_high)·Â)``.

    - PPO, Schulman et al. 2017, eq. (7); asymmetric ε_low/ε_high is DAPO's clip-higher (Yu et al. 2025, eq. 10).
    - ``dual_clip=c``: for ``Â < 0`` the loss is also capped at ``-c·Â`` (Ye et al. 2020, "Mastering Complex
      Control in MOBA Games", eq. 5: ``max(min(r·Â, clip(r)·Â), c·Â)``), so huge ratios cannot blow up.
    - ``ratio_level="sequence"``: ``r`` is the GSPO-token ratio (Zheng et al. 2025, eq. 13; value ``s_i`` of eq. 7);
      with per-sequence advantages and ``"seq-mean-token-mean"`` aggregation this is GSPO's eq. (5).
    - ``is_weights``: detached per-token weights multiplying the loss, e.g. `tis_weights` (Yao et al. 2025).

    Args:
        logprobs: ``(B, T)`` or packed ``(L,)`` current log-probabilities of the sampled tokens (with gradient).
        old_logprobs: Same shape; behaviour log-probabilities.
        advantages: Same shape, or ``(B,)`` per sequence for ``(B, T)`` input.
        mask: Same shape as ``logprobs``; bool or 0/1.
        eps_low: ε_low in [0, 1).
        eps_high: ε_high ≥ 0; None means ``eps_low``.
        dual_clip: c > 1, or None to disable.
        ratio_level: ``"token"`` or ``"sequence"`` (GSPO).
        is_weights: Same shape as ``logprobs``, or None.
        seq_ids: ``(L,)`` sequence ids for packed input with ``ratio_level="sequence"``.

    Returns:
        Per-token loss, same shape as ``logprobs``; 0 outside the mask.
    """
    high = check_clip(eps_low, eps_high, dual_clip)
    m = as_mask("mask", mask, "logprobs", logprobs)
    match ratio_level:
        case "token":
            ratio = token_ratios(logprobs, old_logprobs, m)
        case "sequence":
            ratio = gspo_token_ratios(logprobs, old_logprobs, m, seq_ids=seq_ids)
        case _:
            assert_never(ratio_level)
    # Masked positions have Â = 0 and r = 1, so every term below is exactly 0 there: no final mask needed.
    neg_adv = zero_outside(_broadcast_advantages(advantages, logprobs).detach().to(ratio.dtype), m).neg_()
    # In-place on the fresh clamp output (its value is not needed by autograd): one allocation fewer.
    loss = torch.maximum(neg_adv * ratio, ratio.clamp(1.0 - eps_low, 1.0 + high).mul_(neg_adv))
    if dual_clip is not None:
        # Cap -c·Â applies where Â < 0; elsewhere the cap is 0, which never binds because the loss
        # -Â·min(r, clip(r)) is <= 0 when Â >= 0.
        loss = torch.minimum(loss, (neg_adv * dual_clip).clamp_(min=0.0))
    if is_weights is not None:
        check_float("is_weights", is_weights)
        check_same_shape("is_weights", is_weights, "logprobs", logprobs)
        loss = loss * zero_outside(is_weights.detach().to(loss.dtype), m)
    return loss


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: MaskLike,
    *,
    clip: float | None = None,
) -> torch.Tensor:
    """Per-token value loss ``½ max((V - R)², (clip(V, V_old ± ε_v) - R)²)``.

    Clipped value objective of PPO's reference implementation (Dhariwal et al. 2017, OpenAI Baselines ppo2;
    discussed in Engstrom et al. 2020, "Implementation Matters", §3). ``clip=None`` is the plain ``½ (V - R)²``.

    Args:
        values: ``(B, T)``/``(L,)`` current value predictions (with gradient).
        old_values: Same shape; values at rollout time.
        returns: Same shape; targets (e.g. from `gae_advantages`).
        mask: Same shape; bool or 0/1.
        clip: ε_v ≥ 0, or None.

    Returns:
        Per-token loss, same shape; 0 outside the mask.
    """
    check_float("values", values)
    check_float("old_values", old_values)
    check_float("returns", returns)
    check_same_shape("old_values", old_values, "values", values)
    check_same_shape("returns", returns, "values", values)
    m = as_mask("mask", mask, "values", values)
    v = zero_outside(as_float(values), m)
    ret = zero_outside(returns.detach().to(v.dtype), m)
    loss = 0.5 * (v - ret) ** 2
    if clip is not None:
        check_non_negative("clip", clip)
        old = zero_outside(old_values.detach().to(v.dtype), m)
        v_clipped = old + (v - old).clamp(-clip, clip)
        loss = torch.maximum(loss, 0.5 * (v_clipped - ret) ** 2)
    return zero_outside(loss, m)


def entropy_loss(entropy: torch.Tensor, mask: MaskLike, *, coef: float) -> torch.Tensor:
    """Per-token entropy bonus as a loss term: ``-coef · H_t`` (minimising it raises entropy).

    Mnih et al. 2016 (A3C, eq. before §5) / Schulman et al. 2017, PPO eq. (9).

    Args:
        entropy: ``(B, T)``/``(L,)`` per-token entropies (e.g. `entropy_from_logits`), with gradient.
        mask: Same shape; bool or 0/1.
        coef: Bonus coefficient (≥ 0).

    Returns:
        Per-token loss, same shape; 0 outside the mask.
    """
    check_float("entropy", entropy)
    check_non_negative("coef", coef)
    m = as_mask("mask", mask, "entropy", entropy)
    return zero_outside(-coef * as_float(entropy), m)
