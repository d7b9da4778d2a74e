"""Reward functions, their weights and the config validation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from mcprl_env import (
    ConfigError,
    EnvConfig,
    RewardConfig,
    RewardContext,
    combine_rewards,
    register_reward_function,
)

CTX = RewardContext(
    success=True,
    answered=True,
    stop_reason="answer",
    turns=2,
    max_turns=5,
    tool_calls=4,
    tool_calls_ok=3,
    invalid_calls=1,
    parse_errors=0,
    invalid_call_cap=3,
)


def test_components_are_weighted_values_and_sum_to_the_reward() -> None:
    weights = {
        "outcome": 1.0,
        "format": 0.5,
        "tool_success": 0.4,
        "turn_cost": 0.1,
        "invalid_call": 0.3,
        "forced": 1.0,
    }
    reward, parts = combine_rewards(CTX, RewardConfig(weights=weights))
    assert parts == pytest.approx(
        {
            "outcome": 1.0,
            "format": 0.5,
            "tool_success": 0.3,
            "turn_cost": -0.04,
            "invalid_call": -0.1,
            "forced": 0.0,
        }
    )
    assert reward == pytest.approx(sum(parts.values()))


def test_penalties_apply_to_forced_stops_parse_errors_and_saturate() -> None:
    ctx = attrs.evolve(
        CTX, answered=False, stop_reason="max_turns", invalid_calls=10, parse_errors=2, success=False
    )
    _, parts = combine_rewards(ctx, RewardConfig())
    assert parts["forced"] == -0.2
    assert parts["invalid_call"] == -0.1
    assert parts["format"] == 0.0
    assert parts["outcome"] == 0.0


def test_no_calls_means_no_tool_success_bonus() -> None:
    _, parts = combine_rewards(attrs.evolve(CTX, tool_calls=0, tool_calls_ok=0), RewardConfig())
    assert parts["tool_success"] == 0.0


def test_custom_reward_functions_can_be_registered_and_weighted() -> None:
    register_reward_function("brevity", lambda ctx: -ctx.turns / 10)
    reward, parts = combine_rewards(CTX, RewardConfig(weights={"brevity": 2.0}))
    assert parts == {"brevity": -0.4}
    assert reward == -0.4


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RewardConfig(weights={"outcom": 1.0}), "did you mean 'outcome'"),
        (lambda: RewardConfig(weights={"outcome": "high"}), "must be a number"),
        (lambda: EnvConfig(max_turns_by_difficulty={"easy": 5}), "exactly the keys"),
        (lambda: EnvConfig(on_template_drift="ignore"), "on_template_drift"),
        (lambda: EnvConfig(max_total_tokens=0), "max_total_tokens"),
    ],
)
def test_invalid_configs_are_rejected_with_a_reason(build: Any, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        build()


def test_an_empty_final_answer_earns_no_format_reward() -> None:
    _, parts = combine_rewards(attrs.evolve(CTX, answer_given=False), RewardConfig())
    assert parts["format"] == 0.0
