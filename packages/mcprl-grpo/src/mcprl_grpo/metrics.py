"""Diagnostics as ``dict[str, float]`` with stable namespaced keys (``ratio/mean``, ``clip/frac_low``, …).

Every value is a finite Python float: empty masks give 0.0, never NaN. Statistics are computed without
gradient, in float32 (float64 for float64 input).
"""

from __future__ import annotations

import torch

from mcprl_grpo._checks import as_float, as_mask, check_float, check_same_shape
from mcprl_grpo._groups import group_rewards
from mcprl_grpo.importance import log_ratio
from mcprl_grpo.losses import check_clip
from mcprl_grpo.masked import masked_mean, masked_var
from mcprl_grpo.token_mask import MaskLike


def ratio_metrics(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: MaskLike) -> dict[str, float]:
    """Importance-ratio health over masked tokens.

    Keys: ``ratio/mean``, ``ratio/std``, ``ratio/min``, ``ratio/max``, ``ratio/max_abs_dev`` (max ``|r - 1|``),
    ``kl/approx`` (mean k3 of π_old‖π_θ, Schulman 2020), ``kl/approx_k1`` (mean ``-log r``).

    Args:
        logprobs: ``(B, T)``/``(L,)`` current log-probabilities.
        old_logprobs: Same shape; behaviour log-probabilities.
        mask: Same shape; bool or 0/1.
    """
    with torch.no_grad():
        m = as_mask("mask", mask, "logprobs", logprobs)
        lr = log_ratio(logprobs.detach(), old_logprobs, m)
        ratio = torch.exp(lr)
        any_token = bool(m.any())
        inf = torch.full((), float("inf"), dtype=ratio.dtype, device=ratio.device)
        return {
            "ratio/mean": float(masked_mean(ratio, m)),
            "ratio/std": float(masked_var(ratio, m).sqrt()),
            "ratio/min": float(torch.where(m, ratio, inf).min()) if any_token else 0.0,
            "ratio/max": float(torch.where(m, ratio, -inf).max()) if any_token else 0.0,
            "ratio/max_abs_dev": float(torch.where(m, (ratio - 1.0).abs(), 0.0).max()) if any_token else 0.0,
            "kl/approx": float(masked_mean(torch.expm1(lr) - lr, m)),  # off the hot path: precise
            "kl/approx_k1": float(masked_mean(-lr, m)),
        }


def clip_metrics(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: MaskLike,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
) -> dict[str, float]:
    """Fractions of masked tokens where each clip is active (its gradient is zero or capped).

    Keys: ``clip/frac_low`` (``Â < 0`` and ``r < 1 - ε_low``), ``clip/frac_high`` (``Â > 0`` and
    ``r > 1 + ε_high``), ``clip/frac`` (their sum), ``clip/frac_dual`` (``Â < 0`` and ``r > c``; 0 without
    dual-clip).

    Args:
        logprobs: ``(B, T)``/``(L,)`` current log-probabilities.
        old_logprobs: Same shape.
        advantages: Same shape as ``logprobs`` (per token).
        mask: Same shape; bool or 0/1.
        eps_low: ε_low. eps_high: ε_high (None = ε_low). dual_clip: c or None.
    """
    high = check_clip(eps_low, eps_high, dual_clip)
    check_float("advantages", advantages)
    check_same_shape("advantages", advantages, "logprobs", logprobs)
    with torch.no_grad():
        m = as_mask("mask", mask, "logprobs", logprobs)
        ratio = torch.exp(log_ratio(logprobs.detach(), old_logprobs, m))
        adv = as_float(advantages.detach())
        low = (adv < 0) & (ratio < 1.0 - eps_low)
        up = (adv > 0) & (ratio > 1.0 + high)
        dual = (adv < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(m)
        f_low = float(masked_mean(low.to(ratio.dtype), m))
        f_high = float(masked_mean(up.to(ratio.dtype), m))
        return {
            "clip/frac_low": f_low,
            "clip/frac_high": f_high,
            "clip/frac": f_low + f_high,
            "clip/frac_dual": float(masked_mean(dual.to(ratio.dtype), m)),
        }


def group_metrics(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    num_groups: int | None = None,
) -> dict[str, float]:
    """Reward and group statistics in the flat ``(N,)`` layout of `group_advantages`.

    Keys: ``adv/zero_std_frac`` (zero-variance groups / non-empty groups), ``adv/groups`` (non-empty groups),
    ``reward/mean``, ``reward/std`` (over valid episodes), ``episodes/valid_frac``.
    """
    g = group_rewards(rewards, group_ids, valid=valid, num_groups=num_groups)
    nonempty = float((g.count > 0).sum())
    n = g.valid.numel()
    return {
        "adv/zero_std_frac": float(g.flat.sum()) / nonempty if nonempty else 0.0,
        "adv/groups": nonempty,
        "reward/mean": float(masked_mean(g.rewards, g.valid)),
        "reward/std": float(masked_var(g.rewards, g.valid).sqrt()),
        "episodes/valid_frac": float(g.valid.sum()) / n if n else 0.0,
    }


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: MaskLike) -> float:
    """``1 - Var[R - V] / Var[R]`` over masked tokens; 0.0 when ``Var[R]`` is 0 or the mask is empty.

    1 is a perfect value function, 0 no better than a constant, negative worse than a constant.

    Args:
        values: ``(B, T)``/``(L,)`` value predictions.
        returns: Same shape; return targets.
        mask: Same shape; bool or 0/1.
    """
    check_float("values", values)
    check_float("returns", returns)
    check_same_shape("returns", returns, "values", values)
    with torch.no_grad():
        m = as_mask("mask", mask, "values", values)
        v = as_float(values.detach())
        r = returns.detach().to(v.dtype)
        var_r = masked_var(r, m)
        if not bool(var_r > 0):
            return 0.0
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        return float(1.0 - masked_var(torch.where(m, r - v, zero), m) / var_r)


def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: MaskLike) -> dict[str, float]:
    """Keys: ``value/explained_var``, ``value/mean``, ``value/return_mean``, ``value/mse``."""
    with torch.no_grad():
        m = as_mask("mask", mask, "values", values)
        v = as_float(values.detach())
        r = returns.detach().to(v.dtype)
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        err = torch.where(m, r - v, zero)
        return {
            "value/explained_var": explained_variance(values, returns, mask),
            "value/mean": float(masked_mean(v, m)),
            "value/return_mean": float(masked_mean(r, m)),
            "value/mse": float(masked_mean(err * err, m)),
        }
