"""GRPO math on torch alone: advantages, importance ratios, clipped losses, KL estimators, aggregation, metrics.

Conventions used throughout:

- Episodes are flat: ``rewards`` ``(N,)``, ``group_ids`` ``(N,)`` int in ``[0, num_groups)``, ``valid`` ``(N,)``
  bool (infrastructure failures are excluded from baselines, never scored as 0).
- Token tensors are padded ``(B, T)`` with a ``(B, T)`` mask that is true on policy tokens, or packed ``(L,)``
  with ``seq_ids`` ``(L,)`` where a function needs sequence structure.
- Statistics are computed in float32 (float64 stays float64); empty masks give 0, never NaN.
"""

from mcprl_grpo.advantages import (
    Estimator,
    Scale,
    contiguous_group_ids,
    expand_to_tokens,
    filter_zero_variance,
    group_advantages,
    zero_variance_groups,
)
from mcprl_grpo.aggregate import AggregationMode, aggregate_loss, aggregation_normalizer
from mcprl_grpo.errors import ArgumentError, DTypeError, GrpoError, MaskError, ShapeError
from mcprl_grpo.gae import gae_advantages, rewards_at_last_token
from mcprl_grpo.importance import (
    RatioLevel,
    TISMode,
    gspo_token_ratios,
    log_ratio,
    sequence_ratios,
    tis_weights,
    token_ratios,
)
from mcprl_grpo.kl import KLEstimator, kl_loss, kl_penalty_rewards, token_kl
from mcprl_grpo.logprobs import entropy_from_logits, token_logprobs
from mcprl_grpo.losses import clipped_surrogate_loss, entropy_loss, value_loss
from mcprl_grpo.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten
from mcprl_grpo.metrics import clip_metrics, explained_variance, group_metrics, ratio_metrics, value_metrics

__all__ = [
    "AggregationMode",
    "ArgumentError",
    "DTypeError",
    "Estimator",
    "GrpoError",
    "KLEstimator",
    "MaskError",
    "RatioLevel",
    "Scale",
    "ShapeError",
    "TISMode",
    "aggregate_loss",
    "aggregation_normalizer",
    "clip_metrics",
    "clipped_surrogate_loss",
    "contiguous_group_ids",
    "entropy_from_logits",
    "entropy_loss",
    "expand_to_tokens",
    "explained_variance",
    "filter_zero_variance",
    "gae_advantages",
    "group_advantages",
    "group_metrics",
    "gspo_token_ratios",
    "kl_loss",
    "kl_penalty_rewards",
    "log_ratio",
    "masked_count",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ratio_metrics",
    "rewards_at_last_token",
    "sequence_ratios",
    "tis_weights",
    "token_kl",
    "token_logprobs",
    "token_ratios",
    "value_loss",
    "value_metrics",
    "zero_variance_groups",
]
