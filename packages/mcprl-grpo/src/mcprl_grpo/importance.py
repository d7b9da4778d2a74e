"""Importance ratios between the current policy and the policy that produced the data.

All token tensors share one shape: padded ``(B, T)`` or packed ``(L,)``; sequence-level functions take
``seq_ids`` ``(L,)`` for the packed layout. Log-probabilities are those of the sampled tokens (`token_logprobs`).
Masked-out positions get log-ratio 0 (ratio 1) by ``torch.where`` before ``exp``, so garbage there can neither
overflow nor reach a gradient.
"""

from __future__ import annotations

from typing import assert_never

import torch

from mcprl_grpo._checks import as_float, as_mask, check_float, check_positive, check_same_shape
from mcprl_grpo._segments import segment_sum, segments
from mcprl_grpo.choices import RatioLevel as RatioLevel
from mcprl_grpo.choices import TISMode as TISMode
from mcprl_grpo.kl import token_kl
from mcprl_grpo.masked import masked_mean
from mcprl_grpo.packed_layout import SeqIds
from mcprl_grpo.token_mask import MaskLike


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: MaskLike) -> torch.Tensor:
    """``log π_θ(y_t) - log π_old(y_t)`` on masked positions, 0 elsewhere.

    Args:
        logprobs: ``(B, T)`` or ``(L,)`` current log-probabilities (with gradient).
        old_logprobs: Same shape; behaviour log-probabilities (no gradient is taken through them).
        mask: Same shape; bool or 0/1.

    Returns:
        Same shape, float32 (float64 for float64 input).
    """
    check_float("logprobs", logprobs)
    check_float("old_logprobs", old_logprobs)
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    m = as_mask("mask", mask, "logprobs", logprobs)
    lp = as_float(logprobs)
    diff = lp - old_logprobs.detach().to(lp.dtype)
    return torch.where(m, diff, torch.zeros((), dtype=lp.dtype, device=lp.device))


def token_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: MaskLike) -> torch.Tensor:
    """Per-token ratios ``r_t = π_θ(y_t)/π_old(y_t)`` (Schulman et al. 2017, PPO eq. 6); 1 outside the mask.

    Returns:
        Same shape as ``logprobs`` (``(B, T)`` or ``(L,)``).
    """
    return torch.exp(log_ratio(logprobs, old_logprobs, mask))


def sequence_ratios(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    seq_ids: SeqIds | None = None,
) -> torch.Tensor:
    """GSPO sequence ratios ``s_i = exp(1/|y_i| Σ_t log r_{i,t})`` (Zheng et al. 2025, GSPO eq. 7).

    Args:
        logprobs: ``(B, T)``, or packed ``(L,)`` with ``seq_ids``.
        old_logprobs: Same shape.
        mask: Same shape; bool or 0/1.
        seq_ids: ``(L,)`` sequence index of each packed token; None for ``(B, T)``.

    Returns:
        ``(B,)`` (or ``(S,)``) ratios; 1 for sequences without masked tokens.
    """
    lr = log_ratio(logprobs, old_logprobs, mask)
    ids, n = segments(lr, seq_ids, name="logprobs")
    m = as_mask("mask", mask, "logprobs", logprobs)
    total = segment_sum(lr, ids, n)
    count = segment_sum(m.to(lr.dtype), ids, n)
    return torch.exp(total / count.clamp(min=1.0))


def gspo_token_ratios(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    seq_ids: SeqIds | None = None,
) -> torch.Tensor:
    """GSPO-token ratios ``s_{i,t} = sg[s_i] · π_θ(y_t)/sg[π_θ(y_t)]`` (Zheng et al. 2025, GSPO eq. 13).

    Every token of sequence ``i`` has the value ``s_i``; the gradient of ``s_{i,t}`` is ``s_i ∇log π_θ(y_t)``,
    so with a per-sequence advantage and ``"seq-mean-token-mean"`` aggregation the clipped loss equals GSPO's
    sequence objective (eq. 5) exactly, while still allowing per-token advantages.

    Returns:
        Same shape as ``logprobs``; 1 outside the mask.
    """
    m = as_mask("mask", mask, "logprobs", logprobs)
    ids, _ = segments(m, seq_ids, name="logprobs")
    seq = sequence_ratios(logprobs, old_logprobs, mask, seq_ids=seq_ids).detach()
    lp = as_float(logprobs)
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    live = torch.where(m, lp - lp.detach(), zero)
    return torch.where(m, seq[ids].reshape(m.shape) * torch.exp(live), torch.ones_like(live))


def tis_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    cap: float = 2.0,
    level: RatioLevel = "token",
    mode: TISMode = "truncate",
    seq_ids: SeqIds | None = None,
) -> torch.Tensor:
    """Truncated importance-sampling weights for sampler/trainer mismatch (no gradient).

    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training": the sampler
    (e.g. vLLM) and the trainer disagree on ``π_old``; the policy-gradient term is reweighted by
    ``w = min(π_trainer(y)/π_sampler(y), C)`` per token. ``level="sequence"`` uses the product over the
    sequence (``exp Σ_t log w_t``); ``mode="mask"`` zeroes weights above ``C`` instead of truncating them.

    Args:
        old_logprobs: ``(B, T)``/``(L,)`` trainer log-probabilities of the sampled tokens before the update.
        sampler_logprobs: Same shape; the sampler's log-probabilities.
        mask: Same shape; bool or 0/1.
        cap: C > 0.
        level: ``"token"`` or ``"sequence"``.
        mode: ``"truncate"`` or ``"mask"``.
        seq_ids: ``(L,)`` for the packed layout with ``level="sequence"``.

    Returns:
        Same shape as ``old_logprobs``, detached; 1 outside the mask.
    """
    check_positive("cap", cap)
    lr = log_ratio(old_logprobs.detach(), sampler_logprobs, mask)
    match level:
        case "token":
            w = torch.exp(lr)
        case "sequence":
            ids, n = segments(lr, seq_ids, name="old_logprobs")
            w = torch.exp(segment_sum(lr, ids, n))[ids].reshape(lr.shape)
        case _:
            assert_never(level)
    match mode:
        case "truncate":
            w = w.clamp(max=cap)
        case "mask":
            w = torch.where(w <= cap, w, torch.zeros_like(w))
        case _:
            assert_never(mode)
    m = as_mask("mask", mask, "old_logprobs", old_logprobs)
    return torch.where(m, w, torch.ones_like(w)).detach()


def mismatch_metrics(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    cap: float | None = None,
) -> dict[str, float]:
    """How far the trainer's ``π_old`` is from the sampler that produced the tokens (no gradient).

    The tokens were drawn from the sampler, so ``KL(π_sampler‖π_trainer)`` is estimated on them with
    Schulman 2020 ("Approximating KL Divergence") taking the sampler as the sampling policy: with
    ``log ρ = log π_trainer(y) - log π_sampler(y)``, ``k1 = -log ρ`` (unbiased, can be negative) and
    ``k3 = (ρ - 1) - log ρ`` (unbiased, ≥ 0). These are the ``kl``/``k3_kl`` of verl's rollout-correction
    metrics (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").

    Args:
        old_logprobs: ``(B, T)``/``(L,)`` trainer log-probabilities of the sampled tokens before the update.
        sampler_logprobs: Same shape; the sampler's log-probabilities.
        mask: Same shape; bool or 0/1.
        cap: The TIS cap C when truncation is on: adds the fraction of tokens whose ratio exceeds it and the
            mean truncated weight (`tis_weights`).

    Returns:
        ``mismatch/logprob_abs_diff_mean``, ``mismatch/logprob_abs_diff_max`` (over masked tokens; 0 when none),
        ``mismatch/kl_k1``, ``mismatch/kl_k3`` (token means), ``mismatch/tokens``, and with ``cap``
        ``mismatch/tis_capped_frac`` and ``mismatch/tis_weight_mean``.
    """
    m = as_mask("mask", mask, "old_logprobs", old_logprobs)
    with torch.no_grad():
        lr = log_ratio(old_logprobs.detach(), sampler_logprobs, m)
        diff = lr.abs()
        out = {
            "mismatch/logprob_abs_diff_mean": float(masked_mean(diff, m)),
            "mismatch/logprob_abs_diff_max": float(diff.max()) if diff.numel() else 0.0,
            "mismatch/kl_k1": float(
                masked_mean(token_kl(sampler_logprobs, old_logprobs, m, estimator="k1"), m)
            ),
            "mismatch/kl_k3": float(
                masked_mean(token_kl(sampler_logprobs, old_logprobs, m, estimator="k3"), m)
            ),
            "mismatch/tokens": float(m.sum()),
        }
        if cap is not None:
            check_positive("cap", cap)
            out["mismatch/tis_capped_frac"] = float(masked_mean((torch.exp(lr) > cap).to(lr.dtype), m))
            out["mismatch/tis_weight_mean"] = float(
                masked_mean(tis_weights(old_logprobs, sampler_logprobs, m, cap=cap), m)
            )
    return out
