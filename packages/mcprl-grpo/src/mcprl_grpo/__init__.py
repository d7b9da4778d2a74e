"""GRPO math on torch alone: advantages, importance ratios, clipped losses, KL estimators, aggregation, metrics.

Conventions used throughout:

- Episodes are flat: ``rewards`` ``(N,)``, ``group_ids`` ``(N,)`` int in ``[0, num_groups)``, ``valid`` ``(N,)``
  bool (infrastructure failures are excluded from baselines, never scored as 0).
- Token tensors are padded ``(B, T)`` with a ``(B, T)`` mask that is true on policy tokens, or packed ``(L,)``
  with ``seq_ids`` ``(L,)`` where a function needs sequence structure.
- Statistics are computed in float32 (float64 stays float64); empty masks give 0, never NaN.

The package imports lazily (PEP 562): ``import mcprl_grpo``, its errors and its choices (`mcprl_grpo.choices`)
load no torch, and each function is imported from its module on first access, so an app's config can name
`Estimator` or `AggregationMode` without paying for torch.
"""

import importlib
from typing import TYPE_CHECKING

from mcprl_grpo.choices import AggregationMode, Estimator, KLEstimator, RatioLevel, Scale, TISMode
from mcprl_grpo.errors import ArgumentError, DTypeError, GrpoError, MaskError, ShapeError

if TYPE_CHECKING:
    from mcprl_grpo.advantages import (
        contiguous_group_ids,
        expand_to_tokens,
        filter_zero_variance,
        group_advantages,
        zero_variance_groups,
    )
    from mcprl_grpo.aggregate import aggregate_loss, aggregation_normalizer
    from mcprl_grpo.gae import gae_advantages, rewards_at_last_token
    from mcprl_grpo.importance import (
        gspo_token_ratios,
        log_ratio,
        mismatch_metrics,
        sequence_ratios,
        tis_weights,
        token_ratios,
    )
    from mcprl_grpo.kl import kl_loss, kl_penalty_rewards, token_kl
    from mcprl_grpo.logprobs import entropy_from_logits, token_logprobs
    from mcprl_grpo.losses import clipped_surrogate_loss, entropy_loss, value_loss
    from mcprl_grpo.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten
    from mcprl_grpo.metrics import (
        clip_metrics,
        explained_variance,
        group_metrics,
        ratio_metrics,
        value_metrics,
    )
    from mcprl_grpo.packed_layout import PackedLayout
    from mcprl_grpo.token_mask import TokenMask

__all__ = [
    "AggregationMode",
    "ArgumentError",
    "DTypeError",
    "Estimator",
    "GrpoError",
    "KLEstimator",
    "MaskError",
    "PackedLayout",
    "RatioLevel",
    "Scale",
    "ShapeError",
    "TISMode",
    "TokenMask",
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
    "mismatch_metrics",
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

# The torch-backed names, each with the module that defines it; the same list as the block above.
_LAZY: dict[str, str] = {
    "contiguous_group_ids": "advantages",
    "expand_to_tokens": "advantages",
    "filter_zero_variance": "advantages",
    "group_advantages": "advantages",
    "zero_variance_groups": "advantages",
    "aggregate_loss": "aggregate",
    "aggregation_normalizer": "aggregate",
    "gae_advantages": "gae",
    "rewards_at_last_token": "gae",
    "gspo_token_ratios": "importance",
    "log_ratio": "importance",
    "mismatch_metrics": "importance",
    "sequence_ratios": "importance",
    "tis_weights": "importance",
    "token_ratios": "importance",
    "kl_loss": "kl",
    "kl_penalty_rewards": "kl",
    "token_kl": "kl",
    "entropy_from_logits": "logprobs",
    "token_logprobs": "logprobs",
    "clipped_surrogate_loss": "losses",
    "entropy_loss": "losses",
    "value_loss": "losses",
    "masked_count": "masked",
    "masked_mean": "masked",
    "masked_sum": "masked",
    "masked_var": "masked",
    "masked_whiten": "masked",
    "clip_metrics": "metrics",
    "explained_variance": "metrics",
    "group_metrics": "metrics",
    "ratio_metrics": "metrics",
    "value_metrics": "metrics",
    "TokenMask": "token_mask",
    "PackedLayout": "packed_layout",
}

if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # later look-ups are plain module attributes
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
