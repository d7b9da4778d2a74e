"""The episode's own time: waits in the sampler's and the tool servers' queues are not the model's.

Scripted samplers whose turns take real time (a nap stands for generation), one served at a time when they
queue; the real `EpisodeClock` and episode loop; real in-memory tool servers with a concurrency cap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import pytest
from env_testkit import call, make_task
from mcp.server.mcpserver import MCPServer

from mcprl_env import EnvConfig, Environment, aggregate_metrics
from mcprl_env.episode_clock import EpisodeClock
from mcprl_env.errors import ConfigError
from mcprl_env.testing import CharTokenizer, ScriptedCompletion, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio

TWO_TURNS = [call("multiply", a=3, b=4.5), "<answer>13.5</answer>"]


class OneAtATimeSampler:
    """Serves one request at a time, each for ``serve_s`` seconds; reports each request's wait for its turn."""

    def __init__(self, tok: CharTokenizer, script: list[str], *, serve_s: float) -> None:
        self.inner = ScriptedSampler(tok, script)
        self.serve_s = serve_s
        self.slot = anyio.Lock()

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> ScriptedCompletion:
        arrived = time.monotonic()
        async with self.slot:
            waited = time.monotonic() - arrived
            await anyio.sleep(self.serve_s)
            out = await self.inner.sample(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
        return ScriptedCompletion(
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            text=out.text,
            finish_reason=out.finish_reason,
            queue_s=waited,
        )


def _napper() -> MCPServer:
    server = MCPServer("slow")

    @server.tool(description="Sleep without blocking.")
    async def nap(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "rested"

    return server


async def test_time_queued_in_the_sampler_is_not_counted_against_the_budget(manager: ToolManager) -> None:
    tok = CharTokenizer()
    sampler = OneAtATimeSampler(tok, TWO_TURNS, serve_s=0.05)
    config = EnvConfig(episode_timeout_s=0.4, episode_hard_timeout_s=30.0)
    env = Environment(manager=manager, tokenizer=tok, config=config)
    tasks = [make_task(id=f"mul-{i}") for i in range(3)]
    with anyio.fail_after(30):
        groups = await env.run_groups(tasks, sampler, group_size=4, max_concurrent_episodes=12)
    episodes = [ep for g in groups for ep in g.episodes]
    # 24 turns served one at a time take ~1.2 s: most episodes waited past their 0.4 s budget, all finished.
    assert {(ep.stop_reason, ep.valid, ep.success) for ep in episodes} == {("answer", True, True)}
    assert max(ep.metrics["wall_s"] for ep in episodes) > 0.4
    assert max(ep.metrics["queue_s"] for ep in episodes) > 0.4
    assert all(ep.metrics["own_s"] < 0.4 for ep in episodes)
    assert all(
        ep.metrics["own_s"] == pytest.approx(ep.metrics["wall_s"] - ep.metrics["queue_s"]) for ep in episodes
    )


async def test_own_time_past_the_budget_stops_with_wall_clock_as_a_valid_failure(
    manager: ToolManager,
) -> None:
    tok = CharTokenizer()
    turns = [call("multiply", a=3, b=4.5)] * 3 + ["<answer>13.5</answer>"]
    sampler = OneAtATimeSampler(tok, turns, serve_s=0.3)
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(episode_timeout_s=0.45))
    with anyio.fail_after(30):
        ep = await env.run_episode(make_task(), sampler)
    # Turn 1 ends at 0.3 s (its calls run), turn 2 at 0.6 s: past the budget, its calls never run.
    assert (ep.stop_reason, ep.valid, ep.success) == ("wall_clock", True, False)
    assert ep.metrics["turns"] == 2
    assert ep.metrics["tool_calls_ok"] == 1
    assert ep.reward_components["forced"] < 0
    assert ep.metrics["own_s"] >= 0.45
    assert ep.metrics["queue_s"] < 0.05


async def test_calls_queued_behind_a_full_tool_server_are_not_counted_against_the_budget() -> None:
    tok = CharTokenizer()
    script = [call("nap", seconds=0.1), "<answer>rested</answer>"]
    config = EnvConfig(episode_timeout_s=0.35, episode_hard_timeout_s=30.0)
    task = make_task(id="nap", servers=["slow"], answer="rested", checker={"type": "exact"})
    async with ToolManager.in_memory({"slow": _napper()}, max_concurrency=1) as slow:
        env = Environment(manager=slow, tokenizer=tok, config=config)
        with anyio.fail_after(30):
            group = await env.run_group(task, ScriptedSampler(tok, script), group_size=8)
    # Eight naps of 0.1 s, one at a time: the last call waited ~0.7 s for the server, ran 0.1 s.
    assert {(ep.stop_reason, ep.valid, ep.success) for ep in group.episodes} == {("answer", True, True)}
    assert max(ep.metrics["wall_s"] for ep in group.episodes) > 0.35
    assert max(ep.metrics["queue_s"] for ep in group.episodes) > 0.35


async def test_an_episode_cut_by_the_hard_limit_while_queued_is_invalid_and_counted(
    manager: ToolManager,
) -> None:
    tok = CharTokenizer()
    sampler = OneAtATimeSampler(tok, TWO_TURNS, serve_s=0.3)
    config = EnvConfig(episode_timeout_s=0.5, episode_hard_timeout_s=0.5)
    env = Environment(manager=manager, tokenizer=tok, config=config)
    with anyio.fail_after(30):
        group = await env.run_group(make_task(), sampler, group_size=3)
    # Three episodes' turns of 0.3 s, served one at a time: at the 0.5 s hard limit the first episode's second
    # turn waits behind the others' first, the second's is half served after a 0.3 s wait, the third's waits.
    assert {ep.stop_reason for ep in group.episodes} == {"queue_timeout"}
    assert all(not ep.valid and ep.reward == 0.0 and not ep.success for ep in group.episodes)
    assert all("waiting on the sampler or a tool server" in (ep.error or "") for ep in group.episodes)
    # What was in flight at the cut counts as waiting: each episode's own time stays what it was served.
    assert all(ep.metrics["own_s"] < 0.4 for ep in group.episodes)
    assert all(ep.metrics["queue_s"] > 0.1 for ep in group.episodes)
    metrics = aggregate_metrics([group])
    assert metrics["rollout/queue_timeouts"] == 3
    assert metrics["rollout/stop/queue_timeout"] == 1.0
    assert metrics["rollout/invalid_episodes"] == 3
    assert metrics["rollout/valid_frac"] == 0.0


def test_a_turns_concurrent_calls_count_only_the_shortest_wait() -> None:
    clock = EpisodeClock(budget_s=1.0)
    clock.called([0.3, 0.1, 0.2])
    clock.called([])
    clock.sampled(0.25)
    clock.sampled(-1.0)
    assert clock.queue_s == pytest.approx(0.35)


def test_a_step_cut_in_flight_counts_as_waiting() -> None:
    clock = EpisodeClock(budget_s=1.0, started=time.monotonic() - 2.0)
    clock.sampled(0.5)
    clock.step()
    own = clock.own_s
    clock.started -= 3.0  # three seconds pass in the step
    clock.cut()
    assert clock.own_s == pytest.approx(own, abs=0.01)
    assert clock.queue_s == pytest.approx(3.5, abs=0.01)


def test_the_hard_limit_defaults_to_four_budgets_and_is_never_below_the_budget() -> None:
    assert EnvConfig(episode_timeout_s=300.0).hard_timeout_s() == 1200.0
    assert EnvConfig(episode_timeout_s=300.0, episode_hard_timeout_s=400.0).hard_timeout_s() == 400.0
    assert EnvConfig(episode_timeout_s=None).hard_timeout_s() is None
    assert EnvConfig(episode_timeout_s=None, episode_hard_timeout_s=60.0).hard_timeout_s() == 60.0
    with pytest.raises(ConfigError, match="must be >= episode_timeout_s"):
        EnvConfig(episode_timeout_s=300.0, episode_hard_timeout_s=100.0)
