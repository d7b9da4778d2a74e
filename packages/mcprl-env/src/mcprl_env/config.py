"""Configuration of episodes and rewards (attrs, frozen, validated)."""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from mcprl_env.errors import ConfigError
from mcprl_env.template_clock import fixed_strftime_now

__all__ = ["DEFAULT_REWARD_WEIGHTS", "HARD_TIMEOUT_FACTOR", "EnvConfig", "RewardConfig"]

DEFAULT_REWARD_WEIGHTS: dict[str, float] = {
    "outcome": 1.0,
    "format": 0.1,
    "tool_success": 0.1,
    "turn_cost": 0.0,
    "invalid_call": 0.1,
    "forced": 0.2,
}
"""Weights of the built-in reward functions (see `mcprl_env.rewards`)."""

_DIFFICULTIES = ("easy", "medium", "hard")


def _check_weights(instance: object, attribute: object, value: Mapping[str, float]) -> None:
    del instance, attribute
    from mcprl_env.rewards import resolve_user_reward, reward_function_names  # functions register there
    from mcprl_env.user_code import is_user_spec

    known = reward_function_names()
    for name, weight in value.items():
        if is_user_spec(name):
            resolve_user_reward(name)
        elif name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known: {known}"
            raise ConfigError(f"unknown reward function {name!r}{hint}")
        if not isinstance(weight, int | float) or isinstance(weight, bool):
            raise ConfigError(f"reward weight {name!r} must be a number, got {weight!r}")


@attrs.frozen(kw_only=True)
class RewardConfig:
    """Weights of the reward functions combined into an episode's reward.

    Attributes:
        weights: Reward function name → weight. Each component is reported as ``weight * value``; the
            episode's reward is their sum. Names must be registered (`mcprl_env.register_reward_function`) or
            name a user's function, ``file.py:function`` (relative to the current directory) or
            ``package.module:function``, called with the whole `mcprl_env.FinishedEpisode` and imported here,
            so a typo fails when the config is built.
        invalid_call_cap: Invalid calls at which the invalid-call penalty saturates at -1.
    """

    weights: dict[str, float] = attrs.field(
        factory=lambda: dict(DEFAULT_REWARD_WEIGHTS), converter=dict, validator=_check_weights
    )
    invalid_call_cap: int = attrs.field(default=3, validator=attrs.validators.ge(1))


def _check_parser(instance: object, attribute: object, value: str) -> None:
    del instance, attribute
    from mcprl_env.parsing import AUTO, parser_families

    known = [AUTO, *parser_families()]
    if value.lower() not in known:
        near = difflib.get_close_matches(value.lower(), known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; known: {known}"
        raise ConfigError(f"unknown tool-call parser family {value!r}{hint}")


def _check_turns(instance: object, attribute: object, value: Mapping[str, int]) -> None:
    del instance, attribute
    if set(value) != set(_DIFFICULTIES):
        raise ConfigError(
            f"max_turns_by_difficulty needs exactly the keys {list(_DIFFICULTIES)}, got {sorted(value)}"
        )
    if any(not isinstance(v, int) or v < 1 for v in value.values()):
        raise ConfigError("max_turns_by_difficulty values must be integers >= 1")


HARD_TIMEOUT_FACTOR = 4.0
"""The default hard wall-clock limit of an episode, in multiples of its own-time budget (`EnvConfig`)."""


def _to_date(value: datetime.date | str | None) -> datetime.date | None:
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError as exc:
            raise ConfigError(f"template_date {value!r} is not a date; expected YYYY-MM-DD") from exc
    return value


def _check_date(instance: object, attribute: object, value: object) -> None:
    del instance, attribute
    if value is not None and (not isinstance(value, datetime.date) or isinstance(value, datetime.datetime)):
        raise ConfigError(f"template_date must be a date (YYYY-MM-DD) or None, got {value!r}")


def _check_template_kwargs(instance: object, attribute: object, value: Mapping[str, Any]) -> None:
    del instance, attribute
    if "strftime_now" in value:
        raise ConfigError(
            "chat_template_kwargs cannot set strftime_now: set template_date (YYYY-MM-DD) to fix the date the "
            "template prints"
        )


@attrs.frozen(kw_only=True)
class EnvConfig:
    """How episodes run.

    Attributes:
        max_turns_by_difficulty: Assistant-turn limit per task difficulty (a task's ``max_turns`` wins).
        max_total_tokens: Token budget of the whole sequence (prompt + every turn).
        max_new_tokens_per_turn: Cap on one assistant turn.
        min_new_tokens: Stop with ``token_budget`` when fewer tokens than this remain for the next turn.
        max_tool_output_tokens: Tool responses longer than this are cut (by tokens) with a visible marker.
        truncation_marker: Appended to a cut tool response; ``{shown}`` and ``{total}`` are token counts.
        max_tool_calls: Calls allowed per episode; a turn that would exceed it stops with ``max_tool_calls``.
        max_calls_per_turn: Calls run per turn; further calls in the turn are answered with an error.
        max_consecutive_invalid: Turns in a row whose calls are all invalid before ``consecutive_invalid``.
        episode_timeout_s: Wall-clock budget of one episode's own time (stop reason ``wall_clock``, a valid
            budget stop): its sampler requests being served and its tool calls running, not the time they
            waited in the sampler's or a tool server's queue behind other episodes (`mcprl_env.episode_clock`).
            Checked before each turn and when it is sampled (a turn that ends past it ends the episode, its
            answer or calls unused); None disables it.
        episode_hard_timeout_s: Absolute wall-clock limit of one episode, queueing included, so that nothing
            hangs forever; an episode cut by it did not use up its own budget, so it ends invalid (stop reason
            ``queue_timeout``), never scored. None: ``HARD_TIMEOUT_FACTOR`` (4) times ``episode_timeout_s``
            (none when that is None too).
        parser: Tool-call parser family (`mcprl_env.get_parser`: ``"hermes"``, ``"qwen3_coder"``,
            ``"llama3_json"``, an alias such as ``"qwen3.5"``, or a registered one); ``"auto"`` (default)
            recognises it from what the chat template renders (`mcprl_env.detect_parser_family`).
        on_template_drift: ``"raise"``: re-rendering that changes earlier text ends the episode invalid with a
            `TemplateDriftError`; ``"report"``: keep the sampled tokens, append the new suffix, count
            ``template_drift`` in the episode's metrics. Neither applies to what a template rewrites by design
            (the think block of the turn just sampled, whitespace of the tool responses before it): that text
            stays as the model saw or generated it (see `mcprl_env.Transcript`).
        chat_template_kwargs: Extra keyword arguments for ``apply_chat_template`` (e.g. ``enable_thinking``).
        template_date: The day a template that prints today's date (``strftime_now``; Llama 3's
            ``date_string`` when ``chat_template_kwargs`` sets none) sees, at every render: re-renders and
            demonstrations then match what the model saw whatever the clock says. None (default): the day the
            `Environment` is created, fixed for its lifetime (see `mcprl_env.template_clock`).
        reward: Reward weights.
    """

    max_turns_by_difficulty: dict[str, int] = attrs.field(
        factory=lambda: {"easy": 5, "medium": 8, "hard": 10}, converter=dict, validator=_check_turns
    )
    max_total_tokens: int = attrs.field(default=4096, validator=attrs.validators.ge(16))
    max_new_tokens_per_turn: int = attrs.field(default=512, validator=attrs.validators.ge(1))
    min_new_tokens: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    max_tool_output_tokens: int = attrs.field(default=512, validator=attrs.validators.ge(1))
    truncation_marker: str = "\n[truncated: {shown} of {total} tokens shown]"
    max_tool_calls: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    max_calls_per_turn: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    max_consecutive_invalid: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    episode_timeout_s: float | None = attrs.field(
        default=300.0, validator=attrs.validators.optional(attrs.validators.gt(0.0))
    )
    episode_hard_timeout_s: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0.0))
    )
    parser: str = attrs.field(default="auto", validator=_check_parser)
    on_template_drift: Literal["raise", "report"] = attrs.field(
        default="raise", validator=attrs.validators.in_(("raise", "report"))
    )
    chat_template_kwargs: dict[str, Any] = attrs.field(
        factory=dict, converter=dict, validator=_check_template_kwargs
    )
    template_date: datetime.date | None = attrs.field(default=None, converter=_to_date, validator=_check_date)
    reward: RewardConfig = attrs.field(factory=RewardConfig)

    def __attrs_post_init__(self) -> None:
        hard, budget = self.episode_hard_timeout_s, self.episode_timeout_s
        if hard is not None and budget is not None and hard < budget:
            raise ConfigError(
                f"episode_hard_timeout_s ({hard:g}) must be >= episode_timeout_s ({budget:g}): the hard limit "
                "counts queueing on top of the episode's own time"
            )

    def max_turns_for(self, difficulty: str, override: int | None = None) -> int:
        """Turn limit of a task with ``difficulty`` (``override`` = the task's own ``max_turns``)."""
        return override if override is not None else self.max_turns_by_difficulty[difficulty]

    def hard_timeout_s(self) -> float | None:
        """The episode's absolute wall-clock limit (``episode_hard_timeout_s`` or its default); None: none."""
        if self.episode_hard_timeout_s is not None:
            return self.episode_hard_timeout_s
        if self.episode_timeout_s is None:
            return None
        return HARD_TIMEOUT_FACTOR * self.episode_timeout_s

    def template_kwargs(self) -> dict[str, Any]:
        """Every ``apply_chat_template`` keyword argument of a render: ``chat_template_kwargs``, and a
        ``strftime_now`` fixed on ``template_date`` when it is set."""
        if self.template_date is None:
            return dict(self.chat_template_kwargs)
        return {"strftime_now": fixed_strftime_now(self.template_date), **self.chat_template_kwargs}
