"""Generalised advantage estimation over policy tokens only, and per-token reward placement.

In a multi-turn episode the token sequence interleaves policy tokens (sampled by the model, mask 1) with
tool/observation and prompt tokens (mask 0) that the environment appended. Those tokens are not actions: they
get no advantage, no return, and the recursion skips over them, so the value of the next *policy* token
bootstraps the current one and γ discounts once per policy token, not per tool-output token.
"""

from __future__ import annotations

import torch

from mcprl_grpo._checks import (
    as_float,
    as_mask,
    check_float,
    check_ndim,
    check_same_shape,
    check_unit_interval,
)
from mcprl_grpo.errors import ShapeError
from mcprl_grpo.token_mask import MaskLike


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: MaskLike,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(γ, λ) advantages and returns over the policy tokens of each sequence.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", eqs. (11)–(16), applied to the
    subsequence ``s_0 < s_1 < … < s_{L-1}`` of positions where ``mask`` is true (the episode ends after
    ``s_{L-1}``, so ``V(s_L) = 0``):

        δ_k = r_{s_k} + γ V_{s_{k+1}} - V_{s_k},     Â_{s_k} = δ_k + γλ Â_{s_{k+1}},     R_{s_k} = Â_{s_k} + V_{s_k}.

    Rewards and values at masked-out positions are ignored (place rewards on policy tokens, e.g. with
    `rewards_at_last_token`). The loop runs over positions, vectorised over the batch; no gradient flows.

    Args:
        rewards: ``(B, T)`` per-token rewards (e.g. outcome reward on the last policy token, minus a KL penalty).
        values: ``(B, T)`` value estimates ``V(s_t)`` from the value head (old values).
        mask: ``(B, T)`` bool or 0/1, true on policy tokens.
        gamma: Discount γ in [0, 1].
        lam: GAE λ in [0, 1].

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` float32 (float64 for float64 input), 0 outside the mask.
    """
    check_unit_interval("gamma", gamma)
    check_unit_interval("lam", lam)
    check_float("rewards", rewards)
    check_float("values", values)
    check_ndim("rewards", rewards, 2, "(B, T)")
    check_same_shape("values", values, "rewards", rewards)
    m = as_mask("mask", mask, "rewards", rewards)
    with torch.no_grad():
        dtype = torch.promote_types(as_float(rewards).dtype, as_float(values).dtype)
        zero = torch.zeros((), dtype=dtype, device=rewards.device)
        r = torch.where(m, rewards.to(dtype), zero)
        v = torch.where(m, values.to(dtype), zero)
        # Stable sort puts each row's policy positions first, in order: the recursion runs on that prefix.
        order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices
        rc, vc, mc = r.gather(1, order), v.gather(1, order), m.gather(1, order).to(dtype)
        steps = int(m.sum(dim=1).max()) if m.numel() else 0
        adv_c = torch.zeros_like(rc)
        last = torch.zeros(rc.shape[0], dtype=dtype, device=rc.device)
        next_v = torch.zeros_like(last)
        next_m = torch.zeros_like(last)
        for t in range(steps - 1, -1, -1):
            delta = rc[:, t] + gamma * next_v * next_m - vc[:, t]
            last = (delta + gamma * lam * next_m * last) * mc[:, t]
            adv_c[:, t] = last
            next_v, next_m = vc[:, t], mc[:, t]
        adv = torch.zeros_like(adv_c).scatter_(1, order, adv_c)
        returns = torch.where(m, adv + v, zero)
    return adv, returns


def rewards_at_last_token(rewards: torch.Tensor, mask: MaskLike) -> torch.Tensor:
    """Place each sequence's scalar reward on its last policy token (the usual outcome-reward layout).

    Args:
        rewards: ``(B,)`` float.
        mask: ``(B, T)`` bool or 0/1 policy-token mask.

    Returns:
        ``(B, T)`` with ``rewards[b]`` at the last true position of row ``b`` and 0 elsewhere (all-zero rows
        for sequences without policy tokens).
    """
    check_float("rewards", rewards)
    check_ndim("rewards", rewards, 1, "(B,)")
    m = as_mask("mask", mask, "mask", None)
    if m.dim() != 2 or m.shape[0] != rewards.shape[0]:
        raise ShapeError("mask", m.shape, f"({rewards.shape[0]}, T) to match rewards (B,)")
    t = m.shape[1]
    positions = torch.arange(t, device=m.device).expand_as(m)
    last = torch.where(m, positions, torch.full_like(positions, -1)).amax(dim=1, keepdim=True) if t else None
    out = torch.zeros(m.shape, dtype=as_float(rewards).dtype, device=rewards.device)
    if last is None:
        return out
    hit = (positions == last) & m
    return torch.where(hit, as_float(rewards).unsqueeze(-1), out)
