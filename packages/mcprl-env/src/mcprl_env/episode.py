"""Episode records: the exact tokens of one multi-turn episode, its reward and its metrics."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from mcprl_env.tasks import Task

__all__ = ["Episode", "EpisodeGroup", "StopReason"]

StopReason = Literal[
    "answer",
    "max_turns",
    "token_budget",
    "max_tool_calls",
    "consecutive_invalid",
    "sampler_length",
    "wall_clock",
    "infra_error",
    "queue_timeout",
    "server_restarted",
    "template_drift",
    "user_code_error",
    "error",
]
"""Why an episode stopped.

``answer``: the model gave a final answer. Budget stops (valid, penalised as forced): ``max_turns``,
``token_budget``, ``max_tool_calls``, ``consecutive_invalid``, ``sampler_length`` (the turn hit the per-turn
cap), ``wall_clock`` (the episode's own time passed ``episode_timeout_s``). Invalid episodes (never scored as
the model's fault): ``infra_error`` (a tool server or a state check failed), ``queue_timeout`` (the hard
wall-clock limit passed while the episode waited on the sampler's or a tool server's queue),
``server_restarted`` (a stateful server the episode used restarted under it, so its state was lost),
``template_drift``, ``user_code_error`` (a user's checker or reward function raised or returned a wrong type),
``error`` (any other exception, e.g. the sampler failed).
"""

INVALID_STOP_REASONS: frozenset[str] = frozenset(
    {"infra_error", "queue_timeout", "server_restarted", "template_drift", "user_code_error", "error"}
)


@attrs.frozen(kw_only=True)
class Episode:
    """One finished episode, token-exact.

    Attributes:
        episode_id: Unique id (``[namespace/]task_id/index``), also sent to stateful servers.
        task_id: The task's id.
        group_id: The group's id (``[namespace/]task_id``).
        token_ids: Prompt + every sampled turn + every environment suffix, exactly as trained on.
        prompt_length: Number of ids of the rendered opening prompt.
        loss_mask: 1 on ids the sampler produced, 0 elsewhere (same length as ``token_ids``).
        sampler_logprobs: The sampler's logprob for each sampled id, 0.0 where the mask is 0.
        messages: The conversation (assistant contents exactly as sampled, tool responses as shown).
        reward: Weighted sum of ``reward_components`` (0.0 for invalid episodes).
        reward_components: ``weight * value`` per reward function.
        valid: False when the episode died for reasons that are not the model's (mask it out).
        success: The task's checker accepted the outcome.
        stop_reason: One of `StopReason`.
        error: What went wrong, for invalid episodes.
        answer: The final answer, when the episode ended with one.
        metrics: Per-episode counts (``turns``, ``tool_calls``, ``parse_errors/<kind>``, ...).
    """

    episode_id: str
    task_id: str
    group_id: str
    token_ids: list[int]
    prompt_length: int
    loss_mask: list[int]
    sampler_logprobs: list[float]
    messages: list[dict[str, Any]]
    reward: float
    reward_components: dict[str, float]
    valid: bool
    success: bool
    stop_reason: str
    error: str | None
    answer: str | None
    metrics: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for trajectory files)."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class EpisodeGroup:
    """The G episodes of one task.

    Attributes:
        group_id: ``[namespace/]task_id``.
        task: The task.
        episodes: Its episodes, in index order.
    """

    group_id: str
    task: Task
    episodes: list[Episode]

    @property
    def rewards(self) -> list[float]:
        """Each episode's reward."""
        return [ep.reward for ep in self.episodes]

    @property
    def valid_mask(self) -> list[bool]:
        """Which episodes are valid (invalid ones are excluded from baselines and loss)."""
        return [ep.valid for ep in self.episodes]

    @property
    def num_valid(self) -> int:
        """How many episodes are valid."""
        return sum(self.valid_mask)
