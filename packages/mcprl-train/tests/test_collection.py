"""Collection: per-step tool metrics, and the retries of groups lost to infrastructure faults (their pre-retry
counts in metrics.jsonl, the discarded attempts in trajectories.jsonl)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from mcp.server.mcpserver import MCPServer

from mcprl_env import Environment, task_from_dict
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager, ToolResult
from mcprl_train.config import Config
from mcprl_train.loop.collection import Collection, collect_groups, episode_concurrency, tool_step_metrics
from mcprl_train.run.run_dir import RunDir

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


class _CrashingFor:
    """The in-memory calculator, except that calls of the episodes `crashed` picks fail as a crashed server's
    would (``infra_error``): a stand-in for a server process dying, which the CLI test
    tests/test_server_killed_mid_step.py does for real."""

    def __init__(self, manager: ToolManager, crashed: Callable[[str], bool]) -> None:
        self._manager, self._crashed = manager, crashed
        self.tools = manager.tools

    def tool_schemas(self, servers: object = None) -> list[dict[str, object]]:
        return self._manager.tool_schemas()

    async def call(
        self, name: str, arguments: Mapping[str, object] | None = None, *, episode_id: str | None = None
    ) -> ToolResult:
        if episode_id is not None and self._crashed(episode_id):
            return ToolResult(
                kind="infra_error", text="server crashed", name=name, server="calc", error_type="crashed"
            )
        return await self._manager.call(name, arguments, episode_id=episode_id)


ADD = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "<answer>3</answer>"]
TASKS = [task_from_dict({"id": t, "prompt": "1+2?", "answer": "3"}) for t in ("a", "b")]


async def _collect(crashed: Callable[[str], bool], *, max_retries: int) -> Collection:
    tok = CharTokenizer()
    async with ToolManager.in_memory({"calc": _calculator()}) as manager:
        env = Environment(manager=_CrashingFor(manager, crashed), tokenizer=tok)
        return await collect_groups(
            env,
            TASKS,
            ScriptedSampler(tok, ADD),
            group_size=4,
            max_concurrent_episodes=8,
            max_retries=max_retries,
            namespace="step-1",
        )


def _first_attempt_of_a_loses_three_and_b_one(episode_id: str) -> bool:
    return episode_id in {"step-1/a/0", "step-1/a/1", "step-1/a/2", "step-1/b/0"}


async def test_a_retried_group_leaves_its_pre_retry_counts_in_the_metrics() -> None:
    got = await _collect(_first_attempt_of_a_loses_three_and_b_one, max_retries=1)
    assert got.attempts == [1, 0]  # a re-run once; b (1 of 4 invalid) kept with its invalid episode masked
    assert [e.valid for e in got.groups[0].episodes] == [True] * 4
    assert [e.valid for e in got.groups[1].episodes] == [False, True, True, True]
    [thrown] = got.discarded
    assert (thrown.attempt, thrown.group.group_id) == (0, "step-1/a")
    assert thrown.reason == "infrastructure: 3/4 episodes invalid (infra_error: 3)"
    assert got.retry_metrics() == {
        "rollout/pre_retry/episodes": 8.0,
        "rollout/pre_retry/invalid_episodes": 4.0,
        "rollout/pre_retry/invalid_groups": 1.0,
        "rollout/pre_retry/invalid_rate": 0.5,
        "rollout/retry_1/episodes": 4.0,
        "rollout/retry_1/invalid_episodes": 0.0,
        "rollout/retry_1/invalid_groups": 0.0,
        "rollout/retries": 1.0,
        "rollout/retried_groups": 1.0,
        "rollout/discarded_episodes": 4.0,
    }
    both = Collection.concat([got, got]).retry_metrics()  # two ranks' shares, or a step and its back-fill
    assert (
        both["rollout/retried_groups"],
        both["rollout/retries"],
        both["rollout/pre_retry/invalid_rate"],
    ) == (
        2.0,
        1.0,
        0.5,
    )


async def test_retries_stop_at_the_limit_and_each_round_is_counted() -> None:
    got = await _collect(lambda episode_id: episode_id.split("/")[1] == "a", max_retries=2)
    assert got.attempts == [2, 0]
    assert [d.attempt for d in got.discarded] == [0, 1]
    assert [e.stop_reason for e in got.groups[0].episodes] == ["infra_error"] * 4  # kept, masked out
    metrics = got.retry_metrics()
    assert metrics["rollout/retries"] == 2.0
    assert metrics["rollout/retried_groups"] == 2.0
    assert metrics["rollout/pre_retry/invalid_rate"] == 0.5
    assert metrics["rollout/retry_1/invalid_episodes"] == metrics["rollout/retry_2/invalid_episodes"] == 4.0
    assert metrics["rollout/retry_2/invalid_groups"] == 1.0


async def test_a_clean_collection_reports_zero_retries() -> None:
    got = await _collect(lambda _episode_id: False, max_retries=1)
    assert got.discarded == []
    assert got.retry_metrics() == {
        "rollout/pre_retry/episodes": 8.0,
        "rollout/pre_retry/invalid_episodes": 0.0,
        "rollout/pre_retry/invalid_groups": 0.0,
        "rollout/pre_retry/invalid_rate": 0.0,
        "rollout/retries": 0.0,
        "rollout/retried_groups": 0.0,
        "rollout/discarded_episodes": 0.0,
    }


async def test_discarded_attempts_are_written_to_the_trajectories_marked_as_such(tmp_path: Path) -> None:
    got = await _collect(_first_attempt_of_a_loses_three_and_b_one, max_retries=1)
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    run_dir.write_episodes(1, got.trajectory_records())
    records = run_dir.read_trajectories().records
    assert len(records) == 12  # 8 trained on + the 4 of the thrown-away attempt: nothing lost
    kept = [r for r in records if r["discarded"] is None]
    thrown = [r for r in records if r["discarded"] is not None]
    assert sorted((r["episode_id"], r["attempt"]) for r in kept) == sorted(
        [(f"step-1.retry1/a/{i}", 1) for i in range(4)] + [(f"step-1/b/{i}", 0) for i in range(4)]
    )
    assert sorted(r["episode_id"] for r in thrown) == [f"step-1/a/{i}" for i in range(4)]
    assert {(r["attempt"], r["discarded"]) for r in thrown} == {
        (0, "infrastructure: 3/4 episodes invalid (infra_error: 3)")
    }
    assert [r["valid"] for r in sorted(thrown, key=lambda r: str(r["episode_id"]))] == [
        False,
        False,
        False,
        True,
    ]


def test_episodes_in_flight_follow_what_the_sampler_serves_at_once() -> None:
    demo = Config.load("cpu")
    # The demo: 256 episodes over a batch of 128, as configured.
    assert episode_concurrency(demo.collection, demo.sampler) == 256
    small = Config.load(
        "cpu", overrides=["sampler.max_batch_size=8", "collection.max_concurrent_episodes=88"]
    )
    assert episode_concurrency(small.collection, small.sampler) == 16
    few = Config.load("cpu", overrides=["collection.max_concurrent_episodes=4"])
    assert episode_concurrency(few.collection, few.sampler) == 4
