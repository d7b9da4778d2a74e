"""Rollout/learn overlap (``collection.overlap``): step k+1 is collected while step k's update runs.

Without overlap a GRPO step collects from the weights after update k-1, then learns (update k), then syncs the
samplers. With it, the update of step k runs in a worker thread (torch releases the GIL in its kernels) while
the event loop collects step k+1 from a `mcprl_train.loop.snapshot.SamplingSnapshot`: a copy of the trainable weights that the update does
not touch, refreshed only at the step boundary. So the episodes of step k+1 were sampled by the weights after
update k-1 and learned on by the weights after update k: one step off-policy, recorded per step as
``rollout/policy_lag`` (1; 0 for a step collected on its own: the first, and the one after each scheduled
checkpoint, which drains the pipeline so a checkpoint holds nothing in flight). The PPO ratio's π_old is the
sampler's logprobs (``grpo.old_logprobs=sampler``), or TIS weighs the learner's recomputed π_old against them
(``grpo.tis``), so the importance correction covers the lag (`mcprl_train.config.Config` refuses overlap
otherwise).

`collect_step` is one step's whole collection (first round, back-fill rounds, retries, the invalid-rate guard)
as a value, `CollectedStep`, whether it runs on its own or beside an update (`learn_while_collecting`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
import attrs

from mcprl_policy.threads import split_threads, take_threads
from mcprl_train.config import Config
from mcprl_train.loop.collection import Collection, check_invalid_rate, rollout_metrics, tool_step_metrics
from mcprl_train.loop.learner import Learner, mean_over_ranks
from mcprl_train.loop.rollouts import Rollouts
from mcprl_train.loop.samples import Sample
from mcprl_train.loop.task_stream import StreamPosition, TaskStream

__all__ = ["CollectedStep", "collect_step", "learn_step", "learn_while_collecting"]


@attrs.frozen(kw_only=True)
class CollectedStep:
    """One GRPO step's collection, ready to learn from.

    Attributes:
        task_ids: Every task it took, back-fill rounds included, in order.
        collected: Every rank's groups (checks, back-fill decision, metrics).
        samples: The update's samples, from this rank's groups.
        position: The task stream's position after this step's tasks.
        metrics: Rollout, tool, sampler, advantage, retry and back-fill metrics of the collection, with
            ``rollout/policy_lag`` (the step minus 1 minus the GRPO step whose update the sampling weights
            came from) and ``perf/collect_s``.
    """

    task_ids: list[str]
    collected: Collection
    samples: list[Sample]
    position: StreamPosition
    metrics: dict[str, float]


async def collect_step(
    config: Config,
    step: int,
    *,
    stream: TaskStream,
    rollouts: Rollouts,
    learner: Learner,
    sampled_after: int,
) -> CollectedStep:
    """Collect GRPO step ``step``: ``grpo.tasks_per_step`` groups, back-filling zero-variance ones.

    The back-fill decision is taken on every rank's groups; the samples are this process's own. Only the
    rewards decide advantages and back-fill (`Learner.prepare` reads no weights), so this can run beside the
    previous step's update.

    Raises:
        InvalidRateError: a round's invalid-episode rate passed ``run.max_invalid_rate``.
    """
    cfg = config
    t0 = time.perf_counter()
    tasks = stream.take(cfg.grpo.tasks_per_step)
    rollouts.start_step(step)
    task_ids = [t.id for t in tasks]
    mine, collected = await rollouts.collect(tasks, step, round_=0)
    everyone = collected.groups
    invalid_rate = check_invalid_rate(everyone, cfg.run.max_invalid_rate)
    samples, adv = learner.prepare(everyone)
    rounds = 0
    while cfg.grpo.filter_zero_std and rounds < cfg.grpo.backfill_rounds:
        kept = int(adv["adv/groups"] * (1.0 - adv["adv/zero_std_frac"]))
        missing = cfg.grpo.tasks_per_step - kept
        if missing <= 0:
            break
        rounds += 1
        extra_tasks = stream.take(missing)
        task_ids += [t.id for t in extra_tasks]
        extra_mine, extra_all = await rollouts.collect(extra_tasks, step, round_=rounds)
        check_invalid_rate(extra_all.groups, cfg.run.max_invalid_rate)
        mine, collected = mine + extra_mine, collected + extra_all
        everyone = collected.groups
        samples, adv = learner.prepare(everyone)
    if len(mine.groups) != len(everyone):  # data-parallel: learn on this process's groups only
        samples, _ = learner.prepare(mine.groups)
    metrics = rollout_metrics(everyone)
    metrics.update(tool_step_metrics(rollouts.env))
    metrics.update(rollouts.sampler.metrics())
    metrics.update(adv)
    metrics["rollout/invalid_rate"] = invalid_rate
    metrics.update(collected.retry_metrics())
    metrics["adv/backfill_rounds"] = float(rounds)
    metrics["rollout/policy_lag"] = float(step - 1 - sampled_after)
    metrics["perf/collect_s"] = time.perf_counter() - t0
    return CollectedStep(
        task_ids=task_ids, collected=collected, samples=samples, position=stream.position, metrics=metrics
    )


def learn_step(learner: Learner, samples: list[Sample], step: int) -> dict[str, float]:
    """Step ``step``'s update on this process's samples (every rank's mean metrics); the reference follows."""
    metrics = mean_over_ranks(learner.update(samples))
    learner.step_reference(step)
    return metrics


async def learn_while_collecting(
    learn: Callable[[], dict[str, float]],
    collect: Callable[[], Awaitable[CollectedStep]] | None,
) -> tuple[dict[str, float], CollectedStep | None]:
    """Run ``learn`` in a worker thread while the event loop runs ``collect`` (when given); wait for both.

    The two share torch's CPU threads (`mcprl_policy.threads`): the update's thread and the decode engine's each
    run on half of the event loop thread's count, at least one.

    Returns:
        ``learn``'s metrics with ``perf/learn_s`` (its own wall time), and the collection (None without one).

    Raises:
        Exception: what ``learn`` or ``collect`` raised (unwrapped from the task group's exception group when
            it is the only one); it cancels the collection and propagates once the update has finished (a
            thread cannot be interrupted).
    """
    learned: dict[str, float] = {}
    ready: list[CollectedStep] = []

    def timed_learn() -> None:
        t0 = time.perf_counter()
        take_threads()
        learned.update(learn())
        learned["perf/learn_s"] = time.perf_counter() - t0

    async def run_collect(fetch: Callable[[], Awaitable[CollectedStep]]) -> None:
        ready.append(await fetch())

    if collect is None:
        timed_learn()
        return learned, None
    try:
        with split_threads(2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_collect, collect)
                await anyio.to_thread.run_sync(timed_learn)
    except BaseExceptionGroup as group:
        if (
            len(group.exceptions) == 1
        ):  # the run's own errors (InvalidRateError, ...) reach the CLI as they are
            raise group.exceptions[0] from None
        raise
    return learned, ready[0]
