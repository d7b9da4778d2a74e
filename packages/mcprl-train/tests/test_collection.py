"""Collection's per-step tool metrics: what the manager saw since the previous step, for metrics.jsonl."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
from mcp.server.mcpserver import MCPServer

from mcprl_env import Environment, task_from_dict
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager, ToolResult
from mcprl_train.loop.collection import tool_step_metrics

pytestmark = pytest.mark.anyio


def _calculator() -> MCPServer:
    server = MCPServer("calc")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    return server


async def test_tool_step_metrics_cover_one_step_each() -> None:
    tok = CharTokenizer()
    task = task_from_dict({"id": "t", "prompt": "1+2?", "answer": "3"})
    turns = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "<answer>3</answer>"]
    async with ToolManager.in_memory({"calc": _calculator()}) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        group = await env.run_group(task, ScriptedSampler(tok, turns), group_size=3)
        step = tool_step_metrics(env)
        nothing_since = tool_step_metrics(env)
    assert all(ep.success for ep in group.episodes)
    assert step["tools/step/calls"] == 3
    assert step["tools/step/restarts"] == step["tools/step/infra_errors"] == step["tools/step/timeouts"] == 0
    assert step["tools/step/calc/restarts"] == 0
    assert step["tools/step/queue_wait_max_ms"] >= 0
    assert nothing_since["tools/step/calls"] == 0
    json.dumps(step)  # one line of metrics.jsonl


async def test_a_tool_caller_without_step_metrics_adds_none() -> None:

    class Caller:
        tools = ()

        def tool_schemas(self, servers: object = None) -> list[dict[str, object]]:
            return []

        async def call(
            self, name: str, arguments: Mapping[str, object] | None = None, *, episode_id: str | None = None
        ) -> ToolResult:
            raise AssertionError("not called")

    env = Environment(manager=Caller(), tokenizer=CharTokenizer())
    assert tool_step_metrics(env) == {}
