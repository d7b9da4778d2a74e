"""Episode deadlines with the real HF sampler on the embedded tiny model: an episode's budget counts its own
turn, not its wait behind other episodes in the sampler's queue (``sampler.max_batch_size`` 1 makes every
request wait for the ones ahead, and `EngineGate` holds the engine as a long batch would); the hard limit ends
a queued episode invalid, counted in the metrics.

The untrained tiny model rarely samples its end-of-turn id and never a tool call, so each episode is one turn,
mostly run to ``max_new_tokens`` (``sampler_length``), sometimes ended early (``answer``). Budgets are set in
multiples of one such episode's own time on this machine (`Solo`), measured first, plus `NOISE_S`.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import AsyncIterator, Sequence

import anyio
import attrs
import pytest
from mcp.server.mcpserver import MCPServer

from mcprl_env import Completion, EnvConfig, Environment, Episode, Sampler, Task, task_from_dict
from mcprl_policy import HFSampler, Policy, SamplingParams
from mcprl_policy.decode import DecodeRequest
from mcprl_tools import ToolManager
from mcprl_train.loop.collection import collect_groups
from mcprl_train.loop.evaluation import evaluate_tasks
from mcprl_train.typed_torch import manual_seed

pytestmark = pytest.mark.anyio

NEW_TOKENS = 48
NOISE_S = 1.0
"""Slack for timing jitter: on a loaded 2-core machine an episode's turn takes up to ~4x its measured time."""


@pytest.fixture(scope="module")
def policy() -> Policy:
    manual_seed(0)
    return Policy.from_pretrained("tiny", value_head=False)


@pytest.fixture
async def manager() -> AsyncIterator[ToolManager]:
    server = MCPServer("calc")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    async with ToolManager.in_memory({"calc": server}) as m:
        yield m


@pytest.fixture
def sampler(policy: Policy) -> HFSampler:
    """Serves one request at a time: every other request waits in its queue."""
    return HFSampler(policy, SamplingParams(temperature=1.0, seed=0), max_batch_size=1, max_wait_ms=0)


@attrs.frozen
class Solo:
    """One episode's own time alone in the sampler, fastest and median of four (after a warm-up)."""

    fast_s: float
    typical_s: float


@pytest.fixture
async def solo(manager: ToolManager, policy: Policy, sampler: HFSampler) -> Solo:
    env = _env(manager, policy, budget_s=None, hard_s=None)
    times: list[float] = []
    for _ in range(5):
        [ep] = await _run(env, sampler, _tasks(1))
        times.append(ep.metrics["own_s"])
    return Solo(min(times[1:]), statistics.median(times[1:]))


class EngineGate:
    """Holds ``sampler``'s decode engine closed until `open`: meanwhile every request waits in its queue, none
    is admitted, as behind a long batch of other episodes' turns."""

    def __init__(self, sampler: HFSampler, monkeypatch: pytest.MonkeyPatch) -> None:
        self._opened = threading.Event()
        run = sampler.engine.run_until_finished

        def held() -> list[DecodeRequest]:
            self._opened.wait()
            return run()

        monkeypatch.setattr(sampler.engine, "run_until_finished", held)

    def open(self) -> None:
        self._opened.set()


class Arrivals:
    """Passes requests to ``inner``; `all_in` is set once ``expected`` requests have been made."""

    def __init__(self, inner: Sampler, expected: int) -> None:
        self.inner, self.expected, self.made = inner, expected, 0
        self.all_in = anyio.Event()

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Completion:
        self.made += 1
        if self.made == self.expected:
            self.all_in.set()
        return await self.inner.sample(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)


def _tasks(n: int) -> list[Task]:
    return [
        task_from_dict({"id": f"add-{i}", "prompt": f"What is {i} + 2?", "answer": str(i + 2)})
        for i in range(n)
    ]


def _env(
    manager: ToolManager,
    policy: Policy,
    *,
    budget_s: float | None,
    hard_s: float | None,
    new_tokens: int = NEW_TOKENS,
) -> Environment:
    config = EnvConfig(
        max_new_tokens_per_turn=new_tokens, episode_timeout_s=budget_s, episode_hard_timeout_s=hard_s
    )
    return Environment(manager=manager, tokenizer=policy.tokenizer, config=config)


async def _run(env: Environment, sampler: Sampler, tasks: list[Task]) -> list[Episode]:
    collection = await collect_groups(
        env, tasks, sampler, group_size=1, max_concurrent_episodes=len(tasks), max_retries=0, seed=1
    )
    return [ep for group in collection.groups for ep in group.episodes]


def _timing(ep: Episode) -> tuple[str, dict[str, float]]:
    return ep.stop_reason, {k: round(ep.metrics[k], 3) for k in ("wall_s", "own_s", "queue_s")}


def _served(ep: Episode) -> bool:
    return ep.valid and ep.stop_reason in ("sampler_length", "answer")


def _budget(solo: Solo) -> float:
    """A budget no episode served alone should use up: four times its typical own time, plus `NOISE_S`."""
    return 4 * solo.typical_s + NOISE_S


async def test_episodes_queued_behind_a_full_sampler_are_not_cut_by_their_budget(
    manager: ToolManager, policy: Policy, sampler: HFSampler, solo: Solo, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = _budget(solo)
    env = _env(manager, policy, budget_s=budget, hard_s=600.0)
    gate, arrivals = EngineGate(sampler, monkeypatch), Arrivals(sampler, 8)
    episodes: list[Episode] = []

    async def run() -> None:
        episodes.extend(await _run(env, arrivals, _tasks(8)))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                await arrivals.all_in.wait()
                await anyio.sleep(budget + 0.5)  # the engine is busy elsewhere for longer than the budget
            finally:
                gate.open()
    # Every episode waited longer than its budget, then was served one at a time, and finished.
    assert min(ep.metrics["queue_s"] for ep in episodes) > budget
    assert all(_served(ep) for ep in episodes), [_timing(ep) for ep in episodes]
    assert all(ep.metrics["own_s"] < budget for ep in episodes)


async def test_an_episode_whose_own_turn_outlasts_the_budget_stops_with_wall_clock(
    manager: ToolManager, policy: Policy, sampler: HFSampler, solo: Solo
) -> None:
    env = _env(manager, policy, budget_s=solo.fast_s, hard_s=600.0, new_tokens=8 * NEW_TOKENS)
    with anyio.fail_after(60):
        [ep] = await _run(env, sampler, _tasks(1))
    # Alone in the sampler, a turn eight times as long as the measured episode's is the episode's own time:
    # past its budget, a valid failure of the model.
    assert (ep.stop_reason, ep.valid, ep.success) == ("wall_clock", True, False), _timing(ep)
    assert ep.metrics["turns"] == 1
    assert ep.metrics["own_s"] > solo.fast_s
    assert ep.metrics["queue_s"] < solo.fast_s
    assert ep.reward_components["forced"] < 0


async def test_queued_episodes_cut_by_the_hard_limit_are_invalid_and_counted_in_validation_metrics(
    manager: ToolManager, policy: Policy, sampler: HFSampler, solo: Solo
) -> None:
    limit = _budget(solo)
    env = _env(manager, policy, budget_s=limit, hard_s=limit)
    # Every queued episode is cut at once when the limit passes: many cost little time.
    n = 128
    with anyio.fail_after(120):
        metrics, groups = await evaluate_tasks(
            env, _tasks(n), sampler, max_concurrent_episodes=n, max_retries=0
        )
    episodes = [ep for group in groups for ep in group.episodes]
    cut = [ep for ep in episodes if ep.stop_reason == "queue_timeout"]
    served = [ep for ep in episodes if ep.stop_reason != "queue_timeout"]
    # 128 turns one at a time take far longer than the limit: the first ones are served, the rest wait past
    # the hard limit; none of them is the model's failure.
    assert cut
    assert served
    assert all(not ep.valid and ep.reward == 0.0 and ep.metrics["own_s"] < limit for ep in cut)
    assert all(_served(ep) for ep in served), [_timing(ep) for ep in served]
    assert metrics["val/queue_timeouts"] == len(cut)
    assert metrics["val/stop/queue_timeout"] == pytest.approx(len(cut) / n)
    assert metrics["val/invalid_episodes"] == len(cut)
    assert metrics["val/valid_frac"] == pytest.approx(len(served) / n)
    assert "val/stop/wall_clock" not in metrics
