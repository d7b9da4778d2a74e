"""Validation: the policy on held-out tasks, one episode each, greedy unless configured otherwise (the loop's
validations and ``mcprl-train eval``)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import structlog

from mcprl_env import Environment, EpisodeGroup, Sampler, Task
from mcprl_train import collectives
from mcprl_train.loop.collection import collect_groups, rollout_metrics

logger = structlog.get_logger()


def family_of(task: Task) -> str | None:
    fam = task.metadata.get("family")
    return str(fam) if fam is not None else None


async def evaluate_tasks(
    env: Environment,
    tasks: Sequence[Task],
    sampler: Sampler,
    *,
    max_concurrent_episodes: int,
    max_retries: int = 1,
    prefix: str = "val",
    namespace: str | None = None,
    on_group: Callable[[EpisodeGroup], None] | None = None,
) -> tuple[dict[str, float], list[EpisodeGroup]]:
    """Run one episode per task and summarise; in a data-parallel run each rank runs its share (collective).

    No ZeRO collective is needed while generating: the sampler reads a full copy of the weights on each rank.

    Returns:
        `(metrics, groups)`: metrics over every rank's groups, keyed `<prefix>/...` (`success_rate`,
        `reward_mean`, `turns_mean`, `tools/error_rate`, `family/<name>/success_rate`, `time_s`), and every
        rank's episode groups (for logging).
    """
    t0 = time.perf_counter()
    mine = collectives.shard(tasks, collectives.rank(), collectives.world_size())
    collection = await collect_groups(
        env,
        mine,
        sampler,
        group_size=1,
        max_concurrent_episodes=max_concurrent_episodes,
        max_retries=max_retries,
        namespace=namespace,
        on_group=on_group,
    )
    parts = collectives.all_gather_objects((mine, collection.groups))
    every_task = [t for part_tasks, _ in parts for t in part_tasks]
    every_group = [g for _, part_groups in parts for g in part_groups]
    elapsed = time.perf_counter() - t0
    return evaluation_metrics(every_task, every_group, prefix=prefix, elapsed_s=elapsed), every_group


def evaluation_metrics(
    tasks: Sequence[Task], groups: Sequence[EpisodeGroup], *, prefix: str = "val", elapsed_s: float
) -> dict[str, float]:
    """Metrics of evaluated groups (one per task, aligned with `tasks`): `rollout_metrics` re-rooted under
    `prefix`, success per task family, and `<prefix>/time_s`."""
    metrics = rollout_metrics(groups, prefix=prefix)
    by_family: dict[str, list[float]] = defaultdict(list)
    for task, group in zip(tasks, groups, strict=True):
        fam = family_of(task)
        if fam is None:
            continue
        by_family[fam].extend(float(e.success) for e in group.episodes if e.valid)
    for fam, xs in sorted(by_family.items()):
        if xs:
            metrics[f"{prefix}/family/{fam}/success_rate"] = sum(xs) / len(xs)
    metrics[f"{prefix}/time_s"] = elapsed_s
    return metrics
