"""Per-token KL estimators against a reference policy, as a reward penalty or as a loss term.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). Samples come from the
current policy π_θ; with ``log ρ = log π_ref(y) - log π_θ(y)``:

- ``k1 = -log ρ`` — unbiased for KL(π_θ‖π_ref), high variance, can be negative per token;
- ``k2 = ½ (log ρ)²`` — low variance, biased, always ≥ 0;
- ``k3 = (ρ - 1) - log ρ`` — unbiased, always ≥ 0 (``e^x ≥ 1 + x``); the GRPO loss term
  (Shao et al. 2024, DeepSeekMath eq. 4).

All three are 0 when the two log-probabilities are equal. Token tensors are ``(B, T)`` or packed ``(L,)``.
"""

from __future__ import annotations

from typing import assert_never

import torch

from mcprl_grpo._checks import as_float, as_mask, check_float, check_same_shape
from mcprl_grpo._select import zero_outside
from mcprl_grpo.aggregate import reduce_zeroed
from mcprl_grpo.choices import AggregationMode
from mcprl_grpo.choices import KLEstimator as KLEstimator
from mcprl_grpo.packed_layout import SeqIds
from mcprl_grpo.token_mask import MaskLike


def token_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    estimator: KLEstimator = "k3",
) -> torch.Tensor:
    """Per-token KL(π_θ‖π_ref) estimate (gradient flows through ``logprobs`` only).

    Args:
        logprobs: ``(B, T)``/``(L,)`` current-policy log-probabilities of the sampled tokens.
        ref_logprobs: Same shape; reference-policy log-probabilities.
        mask: Same shape; bool or 0/1.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (see module docstring).

    Returns:
        Same shape, 0 outside the mask; float32 (float64 for float64 input).
    """
    check_float("logprobs", logprobs)
    check_float("ref_logprobs", ref_logprobs)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    m = as_mask("mask", mask, "logprobs", logprobs)
    lp = as_float(logprobs)
    ref = ref_logprobs.detach().to(lp.dtype)
    # Each full-size temporary costs page faults as well as arithmetic on CPU: fresh results are updated in
    # place where autograd does not need their old value.
    match estimator:
        case "k1":
            kl = zero_outside(lp - ref, m)
        case "k2":
            kl = zero_outside(ref - lp, m).square().mul_(0.5)
        case "k3":
            # exp(x) - x - 1 rather than expm1: expm1 is ~8x slower on CPU. The absolute error is about
            # ulp(1) (6e-8 in float32, 1e-16 in float64); clamping at 0 keeps the estimator's sign exact.
            log_rho = zero_outside(ref - lp, m)
            kl = (torch.exp(log_rho) - log_rho).sub_(1.0).clamp_(min=0.0)
        case _:
            assert_never(estimator)
    # log ρ is exactly 0 outside the mask, and so is every estimator.
    return kl


def kl_penalty_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """Per-token rewards with the KL penalty folded in: ``r_t - β · KL_t`` (detached).

    Ouyang et al. 2022, InstructGPT eq. (2) / Stiennon et al. 2020: the KL to the reference is a per-token
    reward penalty, used with GAE or REINFORCE++ instead of a KL loss term.

    Args:
        rewards: ``(B, T)``/``(L,)`` per-token rewards (e.g. from `rewards_at_last_token`).
        logprobs: Same shape; current (or old) policy log-probabilities.
        ref_logprobs: Same shape; reference log-probabilities.
        mask: Same shape; bool or 0/1.
        coef: β (0 disables the penalty).
        estimator: Which KL estimator.

    Returns:
        Same shape, detached; 0 outside the mask.
    """
    check_float("rewards", rewards)
    check_same_shape("rewards", rewards, "logprobs", logprobs)
    kl = token_kl(logprobs.detach(), ref_logprobs, mask, estimator=estimator)
    m = as_mask("mask", mask, "logprobs", logprobs)
    r = as_float(rewards).detach()
    return zero_outside(r - coef * kl.to(r.dtype), m)


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: MaskLike,
    *,
    estimator: KLEstimator = "k3",
    mode: AggregationMode = "token-mean",
    normalizer: float | torch.Tensor | None = None,
    seq_ids: SeqIds | None = None,
) -> torch.Tensor:
    """KL as a loss term: `token_kl` reduced by `aggregate_loss` (multiply by β and add to the policy loss).

    Shao et al. 2024, DeepSeekMath eq. (3)–(4): the GRPO objective subtracts ``β D_KL`` estimated with k3.

    Returns:
        Scalar tensor with gradient.
    """
    m = as_mask("mask", mask, "logprobs", logprobs)
    per_token = token_kl(logprobs, ref_logprobs, m, estimator=estimator)
    return reduce_zeroed(per_token, m, mode=mode, normalizer=normalizer, max_tokens=None, seq_ids=seq_ids)
