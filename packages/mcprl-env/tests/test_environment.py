"""Groups: G episodes per task concurrently, many tasks at once, one failure never escapes."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from env_testkit import call, make_task, memory_manager

from mcprl_env import EnvConfig, Environment, EpisodeGroup, aggregate_metrics, episode_id_for
from mcprl_env.testing import CharTokenizer, ScriptedCompletion, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio


async def test_group_runs_g_episodes_with_deterministic_unique_ids(manager: ToolManager) -> None:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok)
    sampler = ScriptedSampler(tok, [call("multiply", a=3, b=4.5), "13.5"])
    group = await env.run_group(make_task(), sampler, group_size=4, namespace="step-3")
    assert isinstance(group, EpisodeGroup)
    assert group.group_id == "step-3/mul-1"
    assert [ep.episode_id for ep in group.episodes] == [f"step-3/mul-1/{i}" for i in range(4)]
    assert group.rewards == [group.episodes[0].reward] * 4
    assert group.num_valid == 4
    assert episode_id_for("mul-1", 2) == "mul-1/2"


async def test_one_infra_failure_in_a_group_is_masked_and_the_rest_survive() -> None:
    """RELIABILITY scenario 13 (environment side): the failing episode is valid=False, the others are scored."""
    tok = CharTokenizer()

    def script(prompt: str, turn: int) -> str:
        del prompt
        return [call("hang") if script.calls == 2 else call("multiply", a=3, b=4.5), "13.5"][min(turn, 1)]

    script.calls = 0  # type: ignore[attr-defined]

    def counted(prompt: str, turn: int) -> str:
        if turn == 0:
            script.calls += 1  # type: ignore[attr-defined]
        return script(prompt, turn)

    async with memory_manager(call_timeout=0.3) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        group = await env.run_group(make_task(), ScriptedSampler(tok, counted), group_size=4)
    assert group.valid_mask.count(False) == 1
    bad = next(ep for ep in group.episodes if not ep.valid)
    assert bad.stop_reason == "infra_error"
    assert bad.reward == 0.0
    assert all(ep.success for ep in group.episodes if ep.valid)
    metrics = aggregate_metrics([group])
    assert metrics["rollout/invalid_episodes"] == 1
    assert metrics["rollout/valid_frac"] == 0.75
    assert metrics["rollout/success_rate"] == 1.0
    assert metrics["tools/infra_errors"] == 1


async def test_a_raising_sampler_never_escapes_run_group(manager: ToolManager) -> None:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok)
    group = await env.run_group(make_task(), ScriptedSampler(tok, [ValueError("boom")]), group_size=3)
    assert [ep.stop_reason for ep in group.episodes] == ["error"] * 3
    assert all(ep.error == "ValueError: boom" for ep in group.episodes)


class GaugedSampler:
    """Answers after every concurrent caller has arrived or the cap is reached; records peak concurrency."""

    def __init__(self, tok: CharTokenizer, release_at: int) -> None:
        self.inner = ScriptedSampler(tok, ["13.5"])
        self.in_flight = 0
        self.peak = 0
        self.release_at = release_at
        self.released = anyio.Event()

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> ScriptedCompletion:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= self.release_at:
            self.released.set()
        await self.released.wait()
        self.in_flight -= 1
        return await self.inner.sample(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)


async def test_run_groups_caps_concurrent_episodes_and_keeps_task_order(manager: ToolManager) -> None:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok)
    tasks = [make_task(id=f"task-{i}") for i in range(5)]
    sampler = GaugedSampler(tok, release_at=6)
    with anyio.fail_after(20):
        groups = await env.run_groups(tasks, sampler, group_size=4, max_concurrent_episodes=6)
    assert sampler.peak == 6
    assert [g.task.id for g in groups] == [t.id for t in tasks]
    assert all(len(g.episodes) == 4 and g.num_valid == 4 for g in groups)
    ids = [ep.episode_id for g in groups for ep in g.episodes]
    assert len(set(ids)) == 20


async def test_run_groups_refuses_duplicate_task_ids(manager: ToolManager) -> None:
    env = Environment(manager=manager, tokenizer=CharTokenizer())
    with pytest.raises(ValueError, match="distinct"):
        await env.run_groups(
            [make_task(), make_task()], ScriptedSampler(CharTokenizer(), ["x"]), group_size=1
        )


async def test_runaway_agent_calling_one_tool_a_thousand_times_is_stopped(manager: ToolManager) -> None:
    """RELIABILITY scenario 10: caps on calls, turns and invalid streaks end the episode explicitly."""
    tok = CharTokenizer()
    env = Environment(
        manager=manager,
        tokenizer=tok,
        config=EnvConfig(max_total_tokens=200_000, max_new_tokens_per_turn=100_000),
    )
    burst = "".join(call("multiply", a=1, b=1) for _ in range(1000))
    ep = await env.run_episode(make_task(max_turns=1000), ScriptedSampler(tok, [burst]))
    assert ep.stop_reason == "max_tool_calls"
    assert ep.metrics["turns"] == 1
    assert ep.metrics["tool_calls_ok"] == 0
    ping = await env.run_episode(
        make_task(max_turns=1000), ScriptedSampler(tok, [call("multiply", a=1, b=1)])
    )
    assert ping.stop_reason == "max_tool_calls"
    assert ping.metrics["tool_calls_ok"] == 16
    assert ping.metrics["turns"] == 17


def test_aggregate_metrics_of_no_groups_is_well_defined() -> None:
    metrics = aggregate_metrics([])
    assert metrics["rollout/episodes"] == 0
    assert metrics["tools/error_rate"] == 0.0
