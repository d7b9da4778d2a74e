"""Per-episode counters and the aggregate metrics of a batch of groups.

Metric keys are namespaced and stable (``rollout/turns_mean``, ``tools/error_rate``, ``reward/outcome_mean``)
so the trainer can log them as they are.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from mcprl_env.episode import EpisodeGroup

__all__ = ["EpisodeStats", "aggregate_metrics"]

MODEL_FAULT_TOOL_ERRORS = frozenset({"unknown_tool", "invalid_arguments", "too_many_calls"})
"""Tool error types that make a call invalid (the model's fault before anything ran)."""


@attrs.define(kw_only=True)
class EpisodeStats:
    """What happened in one episode, counted as it runs."""

    turns: int = 0
    tool_calls: int = 0
    tool_calls_ok: int = 0
    parse_errors: Counter[str] = attrs.field(factory=Counter)
    tool_errors: Counter[str] = attrs.field(factory=Counter)
    infra_errors: int = 0
    truncated_outputs: int = 0
    invalid_turns: int = 0

    @property
    def invalid_calls(self) -> int:
        """Malformed calls plus calls rejected before running (unknown tool, bad arguments, over the cap)."""
        rejected = sum(n for kind, n in self.tool_errors.items() if kind in MODEL_FAULT_TOOL_ERRORS)
        return sum(self.parse_errors.values()) + rejected

    def as_metrics(self) -> dict[str, float]:
        """Flat metrics: counts plus ``parse_errors/<kind>`` and ``tool_errors/<kind>``."""
        out: dict[str, float] = {
            "turns": float(self.turns),
            "tool_calls": float(self.tool_calls),
            "tool_calls_ok": float(self.tool_calls_ok),
            "parse_errors": float(sum(self.parse_errors.values())),
            "tool_errors": float(sum(self.tool_errors.values())),
            "invalid_calls": float(self.invalid_calls),
            "infra_errors": float(self.infra_errors),
            "truncated_outputs": float(self.truncated_outputs),
            "invalid_turns": float(self.invalid_turns),
        }
        out.update({f"parse_errors/{k}": float(v) for k, v in sorted(self.parse_errors.items())})
        out.update({f"tool_errors/{k}": float(v) for k, v in sorted(self.tool_errors.items())})
        return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mu = _mean(values)
    return math.sqrt(sum((v - mu) ** 2 for v in values) / len(values))


def aggregate_metrics(groups: Sequence[EpisodeGroup]) -> dict[str, float]:
    """Metrics of a batch of groups.

    Means over valid episodes unless named otherwise. Keys: ``rollout/episodes``, ``rollout/groups``,
    ``rollout/valid_frac``, ``rollout/invalid_episodes``, ``rollout/success_rate``, ``rollout/reward_mean``,
    ``rollout/reward_std``, ``rollout/turns_mean``, ``rollout/tool_calls_mean``, ``rollout/tokens_mean``,
    ``rollout/sampled_tokens_mean``, ``rollout/uniform_reward_groups`` (groups whose valid episodes all
    scored the same), ``rollout/stop/<reason>`` (fraction of all episodes), ``rollout/queue_timeouts``
    (episodes cut by the hard limit while waiting on our queues: invalid, counted), ``rollout/queue_s_mean``
    and ``rollout/own_s_mean`` (over all episodes: seconds waited in the sampler's and tool servers' queues,
    and the own time the wall-clock budget counts), ``tools/calls``,
    ``tools/error_rate``, ``tools/invalid_call_rate``, ``tools/parse_errors``, ``tools/parse_errors/<kind>``,
    ``tools/errors/<kind>``, ``tools/infra_errors``, ``reward/<component>_mean``.
    """
    episodes = [ep for g in groups for ep in g.episodes]
    valid = [ep for ep in episodes if ep.valid]
    out: dict[str, float] = {
        "rollout/groups": float(len(groups)),
        "rollout/episodes": float(len(episodes)),
        "rollout/invalid_episodes": float(len(episodes) - len(valid)),
        "rollout/valid_frac": len(valid) / len(episodes) if episodes else 0.0,
        "rollout/success_rate": _mean([float(ep.success) for ep in valid]),
        "rollout/reward_mean": _mean([ep.reward for ep in valid]),
        "rollout/reward_std": _std([ep.reward for ep in valid]),
        "rollout/turns_mean": _mean([ep.metrics.get("turns", 0.0) for ep in valid]),
        "rollout/tool_calls_mean": _mean([ep.metrics.get("tool_calls", 0.0) for ep in valid]),
        "rollout/tokens_mean": _mean([float(len(ep.token_ids)) for ep in valid]),
        "rollout/sampled_tokens_mean": _mean([float(sum(ep.loss_mask)) for ep in valid]),
    }
    uniform = 0
    for group in groups:
        rewards = {ep.reward for ep in group.episodes if ep.valid}
        uniform += int(len(rewards) == 1)
    out["rollout/uniform_reward_groups"] = float(uniform)
    stops = Counter(ep.stop_reason for ep in episodes)
    for reason, n in sorted(stops.items()):
        out[f"rollout/stop/{reason}"] = n / len(episodes)
    out["rollout/queue_timeouts"] = float(stops["queue_timeout"])
    out["rollout/queue_s_mean"] = _mean([ep.metrics.get("queue_s", 0.0) for ep in episodes])
    out["rollout/own_s_mean"] = _mean([ep.metrics.get("own_s", 0.0) for ep in episodes])
    totals: Counter[str] = Counter()
    for ep in episodes:
        totals.update(
            {k: v for k, v in ep.metrics.items() if k.startswith(("parse_errors/", "tool_errors/"))}
        )
    calls = sum(ep.metrics.get("tool_calls", 0.0) for ep in episodes)
    errors = sum(ep.metrics.get("tool_errors", 0.0) for ep in episodes)
    attempts = calls + sum(ep.metrics.get("parse_errors", 0.0) for ep in episodes)
    out["tools/calls"] = calls
    out["tools/error_rate"] = errors / calls if calls else 0.0
    out["tools/invalid_call_rate"] = (
        sum(ep.metrics.get("invalid_calls", 0.0) for ep in episodes) / attempts if attempts else 0.0
    )
    out["tools/parse_errors"] = sum(ep.metrics.get("parse_errors", 0.0) for ep in episodes)
    out["tools/infra_errors"] = sum(ep.metrics.get("infra_errors", 0.0) for ep in episodes)
    for key, value in sorted(totals.items()):
        prefix, _, kind = key.partition("/")
        out[f"tools/{'parse_errors' if prefix == 'parse_errors' else 'errors'}/{kind}"] = value
    names = sorted({name for ep in valid for name in ep.reward_components})
    for name in names:
        out[f"reward/{name}_mean"] = _mean([ep.reward_components.get(name, 0.0) for ep in valid])
    return out
