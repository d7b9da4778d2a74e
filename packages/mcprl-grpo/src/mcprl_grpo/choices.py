"""The package's fixed choices as ``Literal`` types, importable without torch.

Each is re-exported by the module whose functions take it (`Estimator` by `mcprl_grpo.advantages`, ...) and by
the package; a config that only names a choice (an app's config file loader) imports it from here and so never
loads torch.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["AggregationMode", "Estimator", "KLEstimator", "RatioLevel", "Scale", "TISMode"]

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
"""Outcome advantage estimators; see `mcprl_grpo.group_advantages`."""

Scale = Literal["group", "batch", "none"]
"""Divisor applied after centring: group std, batch std, or nothing."""

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
"""How per-token losses become one scalar; see `mcprl_grpo.aggregate_loss`."""

RatioLevel = Literal["token", "sequence"]
"""``"token"``: PPO/GRPO per-token ratios; ``"sequence"``: GSPO length-normalised sequence ratios."""

TISMode = Literal["truncate", "mask"]
"""``"truncate"``: min(w, cap) (TIS); ``"mask"``: w if w <= cap else 0 (masked importance sampling)."""

KLEstimator = Literal["k1", "k2", "k3"]
"""Schulman's per-token KL estimators; see `mcprl_grpo.token_kl`."""
