"""Per-token targets an update's passes read, filled into a `MicroBatch` before the first pass.

When the learner recomputes the old policy (`Learner.recompute_old`), its logprobs replace the sampler's as
``π_old``; the sampler's stay in `MicroBatch.sampler` and are compared with them (`mcprl_grpo.mismatch_metrics`)
and, with ``grpo.tis``, turned into truncated importance weights (Yao et al. 2025). For ``gae`` the old values
give per-token advantages and returns, from token rewards that carry the KL penalty with ``grpo.kl_in_reward``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mcprl_grpo import (
    gae_advantages,
    kl_penalty_rewards,
    mismatch_metrics,
    rewards_at_last_token,
    tis_weights,
)
from mcprl_policy import PackedForward
from mcprl_train.config import GRPOConfig
from mcprl_train.loop.samples import MicroBatch

__all__ = ["gae_targets", "kl_reward_metrics", "old_policy_targets", "sampler_mismatch"]


def _padded(parts: Sequence[torch.Tensor], fill: float | bool) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(list(parts), batch_first=True, padding_value=fill)


def old_policy_targets(m: MicroBatch, out: PackedForward, grpo: GRPOConfig, *, values: bool) -> torch.Tensor:
    """Take the learner's no-grad forward ``out`` of ``m`` as ``π_old`` (and the old values, GAE targets).

    Everything stays on the device of ``m`` and ``out`` (no host synchronisation).

    Returns:
        The KL reward penalty β·Σ_t KL_t over ``m``'s sequences, a scalar (0 without ``grpo.kl_in_reward``).
    """
    m.old = out.logprobs.detach().float()
    m.learner_old = m.old
    if grpo.tis is not None:
        m.tis = tis_weights(m.old, m.sampler, m.mask, cap=grpo.tis)
    if not values:
        return torch.zeros((), device=m.old.device)
    if out.values is None:
        raise ValueError("the estimator needs values but the forward returned none (model.value_head=false?)")
    m.old_values = out.values.detach().float()
    return gae_targets(m, grpo)


def gae_targets(m: MicroBatch, grpo: GRPOConfig) -> torch.Tensor:
    """Per-token GAE advantages and returns from the old values (credit only on policy tokens).

    With ``grpo.kl_in_reward`` the token rewards are ``r_t - β·KL_t(π_old‖π_ref)`` first
    (`mcprl_grpo.kl_penalty_rewards`, Ouyang et al. 2022 eq. 2; verl's ``apply_kl_penalty``).

    Returns:
        The penalty β·Σ_t KL_t summed over the micro-batch's sequences, a scalar (0 without ``kl_in_reward``).
    """
    if m.old_values is None:
        raise ValueError("gae_targets needs the old values (old_policy_targets with values=True)")
    lens = m.lengths
    mask = _padded(list(torch.split(m.mask, lens)), False)
    values = _padded(list(torch.split(m.old_values, lens)), 0.0)
    outcome = rewards_at_last_token(torch.tensor([s.reward for s in m.samples], device=mask.device), mask)
    rewards = outcome
    if grpo.kl_in_reward:
        if m.ref is None:
            raise ValueError("grpo.kl_in_reward needs the reference logprobs of the micro-batch (m.ref)")
        old = _padded(list(torch.split(m.old, lens)), 0.0)
        ref = _padded(list(torch.split(m.ref, lens)), 0.0)
        rewards = kl_penalty_rewards(outcome, old, ref, mask, coef=grpo.kl_coef, estimator=grpo.kl_estimator)
    adv, ret = gae_advantages(rewards, values, mask, gamma=grpo.gamma, lam=grpo.lam)
    m.adv = torch.cat([adv[i, :n] for i, n in enumerate(lens)])
    m.returns = torch.cat([ret[i, :n] for i, n in enumerate(lens)])
    return (outcome - rewards).sum()


def sampler_mismatch(micros: Sequence[MicroBatch], grpo: GRPOConfig) -> dict[str, float]:
    """``mismatch/*`` over every token of ``micros`` whose `MicroBatch.learner_old` is known."""
    seen = [m for m in micros if m.learner_old is not None]
    if not seen:
        return {}
    return mismatch_metrics(
        torch.cat([m.learner_old for m in seen if m.learner_old is not None]),
        torch.cat([m.sampler for m in seen]),
        torch.cat([m.mask for m in seen]),
        cap=grpo.tis,
    )


def kl_reward_metrics(micros: Sequence[MicroBatch], *, penalty: torch.Tensor | float) -> dict[str, float]:
    """``kl/reward_penalty``: the mean β·Σ_t KL_t per sequence that ``grpo.kl_in_reward`` took from the rewards."""
    return {"kl/reward_penalty": float(penalty) / max(1, sum(len(m.samples) for m in micros))}
