"""Episodes over the offline app servers (skipped when mcprl-servers is not installed, e.g. alone)."""

from __future__ import annotations

import pytest
from env_testkit import call

from mcprl_env import Environment, aggregate_metrics, task_from_dict
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager

servers = pytest.importorskip("mcprl_servers")

pytestmark = pytest.mark.anyio


async def test_calculate_then_post_is_checked_against_the_episodes_own_messages() -> None:
    from mcprl_servers import calculator, messaging

    task = task_from_dict(
        {
            "id": "post-mul",
            "prompt": "Compute 3*123.45 and post it to #general.",
            "servers": ["calculator", "messaging"],
            "difficulty": "medium",
            "checker": {"type": "message_posted", "channel": "general", "contains": "370.35"},
        }
    )
    tok = CharTokenizer()

    def script(prompt: str, turn: int) -> str:
        del prompt
        steps = [
            call("calculate", expression="3*123.45"),
            call("post_message", channel="general", text="The result is 370.35"),
            "<answer>posted</answer>",
        ]
        return steps[min(turn, 2)]

    managers = {"calculator": calculator.build_server(), "messaging": messaging.build_server()}
    async with ToolManager.in_memory(managers) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        group = await env.run_group(task, ScriptedSampler(tok, script), group_size=2)
        lazy = await env.run_episode(task, ScriptedSampler(tok, ["<answer>posted</answer>"]), index=5)
    assert [ep.success for ep in group.episodes] == [True, True]
    assert group.episodes[0].messages[2]["content"] == "370.35"
    assert not lazy.success
    assert lazy.valid
    metrics = aggregate_metrics([group])
    assert metrics["rollout/turns_mean"] == 3
    assert metrics["tools/error_rate"] == 0.0
