"""Reward shaping: small reward functions combined with weights from `RewardConfig`.

Each function maps a `RewardContext` (what happened in the episode) to a value, by convention in [0, 1] for
bonuses and [-1, 0] for penalties. A weight key of the form ``file.py:function`` or ``package.module:function``
names a user's function instead, called with the whole `mcprl_env.FinishedEpisode` (sync or async; a relative
file is found from the current directory) and imported when the `RewardConfig` is built. The episode's reward is
``sum(weight * value)`` and every weighted term is reported in ``Episode.reward_components``. Infrastructure failures never reach this module: such episodes are
``valid=False`` and score 0 by construction, to be masked out by the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from mcprl_env.config import RewardConfig
from mcprl_env.errors import UserCodeError
from mcprl_env.user_code import UserFunction, call_user_function, is_user_spec, load_user_function

if TYPE_CHECKING:
    from mcprl_env.finished import FinishedEpisode

__all__ = [
    "RewardContext",
    "RewardFunction",
    "combine_rewards",
    "register_reward_function",
    "resolve_user_reward",
    "reward_function_names",
    "user_reward_values",
]


@attrs.frozen(kw_only=True)
class RewardContext:
    """The facts of a finished episode that rewards are computed from.

    Attributes:
        success: The task's checker accepted the outcome.
        answered: The episode ended with a final answer turn.
        stop_reason: Why the episode stopped.
        turns: Assistant turns sampled.
        max_turns: The episode's turn limit.
        tool_calls: Well-formed calls the model made (run or rejected).
        tool_calls_ok: Calls that returned a result without error.
        invalid_calls: Parse errors + unknown tools + schema-invalid arguments + calls over the per-turn cap.
        parse_errors: Malformed tool calls.
        invalid_call_cap: Invalid calls at which the penalty saturates.
        answer_given: The final answer is not empty.
    """

    success: bool
    answered: bool
    stop_reason: str
    turns: int
    max_turns: int
    tool_calls: int
    tool_calls_ok: int
    invalid_calls: int
    parse_errors: int
    invalid_call_cap: int = 3
    answer_given: bool = True


RewardFunction = Callable[[RewardContext], float]


def outcome_reward(ctx: RewardContext) -> float:
    """1 when the checker accepts the outcome, else 0."""
    return 1.0 if ctx.success else 0.0


def format_reward(ctx: RewardContext) -> float:
    """1 when the episode ended with a non-empty final answer and no tool call was malformed, else 0."""
    return 1.0 if ctx.answered and ctx.answer_given and ctx.parse_errors == 0 else 0.0


def tool_success_reward(ctx: RewardContext) -> float:
    """Fraction of the model's calls that succeeded (0 with no calls)."""
    return ctx.tool_calls_ok / ctx.tool_calls if ctx.tool_calls else 0.0


def turn_cost(ctx: RewardContext) -> float:
    """``-turns / max_turns``: a cost per assistant turn."""
    return -ctx.turns / max(ctx.max_turns, 1)


def invalid_call_penalty(ctx: RewardContext) -> float:
    """``-min(1, invalid_calls / invalid_call_cap)``."""
    return -min(1.0, ctx.invalid_calls / ctx.invalid_call_cap)


def forced_action_penalty(ctx: RewardContext) -> float:
    """-1 when the environment had to end the episode (a budget stop) instead of the model answering."""
    return 0.0 if ctx.answered else -1.0


_FUNCTIONS: dict[str, RewardFunction] = {
    "outcome": outcome_reward,
    "format": format_reward,
    "tool_success": tool_success_reward,
    "turn_cost": turn_cost,
    "invalid_call": invalid_call_penalty,
    "forced": forced_action_penalty,
}


def register_reward_function(name: str, function: RewardFunction) -> None:
    """Make ``function`` available to `RewardConfig` weights under ``name``."""
    _FUNCTIONS[name] = function


def reward_function_names() -> list[str]:
    """Names usable as `RewardConfig` weight keys."""
    return sorted(_FUNCTIONS)


_USER_FUNCTIONS: dict[str, UserFunction] = {}


def resolve_user_reward(spec: str) -> UserFunction:
    """Import the user reward function ``spec`` names (once per process; a relative file from the cwd).

    Raises:
        UserCodeImportError: The file or module cannot be imported, or has no such function.
    """
    user = _USER_FUNCTIONS.get(spec)
    if user is None:
        user = _USER_FUNCTIONS[spec] = load_user_function(spec)
    return user


async def user_reward_values(config: RewardConfig, episode: FinishedEpisode) -> dict[str, float]:
    """The (unweighted) values of the user reward functions among ``config.weights``, one call each.

    Raises:
        UserCodeError: A function raised, or returned something other than a finite number.
    """
    values: dict[str, float] = {}
    for spec in config.weights:
        if not is_user_spec(spec):
            continue
        value = await call_user_function(resolve_user_reward(spec), episode)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise UserCodeError(
                f"{spec} returned {value!r} ({type(value).__name__}); a reward function returns a finite number",
                spec=spec,
                task_id=episode.task.id,
                traceback_text="",
            )
        values[spec] = float(value)
    return values


def combine_rewards(
    ctx: RewardContext, config: RewardConfig, user_values: Mapping[str, float] | None = None
) -> tuple[float, dict[str, float]]:
    """The weighted reward and its components (``weight * value`` per function).

    Args:
        ctx: The episode's counts and verdict, for the built-in functions.
        config: The weights.
        user_values: The values of the user functions among the weights (`user_reward_values`).

    Raises:
        ValueError: A user function's value is missing from ``user_values``.
    """
    given = user_values or {}
    components: dict[str, float] = {}
    for name, weight in config.weights.items():
        if is_user_spec(name):
            if name not in given:
                raise ValueError(f"no value for the user reward function {name!r} (see user_reward_values)")
            components[name] = float(weight) * given[name]
        else:
            components[name] = float(weight) * _FUNCTIONS[name](ctx)
    return sum(components.values()), components
