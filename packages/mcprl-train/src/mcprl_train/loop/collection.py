"""Collection: many task groups concurrently through mcprl-env, with retries for infrastructure failures.

Model faults are data (the episode is scored and trained on); infrastructure faults are ours: a group whose
episodes died of them is re-run (bounded retries), leftovers stay masked out of baselines and loss
(`valid=False`), and the run aborts only when the invalid-episode rate of a step passes
`run.max_invalid_rate` — with a message that names the errors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import structlog

from mcprl_env import Environment, EpisodeGroup, Sampler, Task, aggregate_metrics
from mcprl_train import collectives
from mcprl_train.errors import InvalidRateError

logger = structlog.get_logger()


def count_invalid(group: EpisodeGroup) -> int:
    return sum(1 for e in group.episodes if not e.valid)


async def collect_groups(
    env: Environment,
    tasks: Sequence[Task],
    sampler: Sampler,
    *,
    group_size: int,
    max_concurrent_episodes: int,
    max_retries: int,
    namespace: str | None = None,
    on_group: Callable[[EpisodeGroup], None] | None = None,
    seed: int | None = None,
) -> list[EpisodeGroup]:
    """Run one group of `group_size` episodes per task, concurrently; retry groups hit by infra failures.

    A group is re-run (up to `max_retries` times, under a fresh episode-id namespace so stateful servers
    start clean) when more than half of its episodes are invalid, so a transient server crash does not cost
    the task's signal; the retry replaces the whole group so the group stays one draw from the current policy.

    Args:
        on_group: Called with each group as it finishes (progress bars).
        seed: The collection's sampling seed (`mcprl_env.turn_seed` derives each turn's seed from it and the
            episode id, retries included); None: the sampler's own randomness.

    Returns:
        One group per task, in task order.
    """
    groups = await env.run_groups(
        tasks,
        sampler,
        group_size=group_size,
        max_concurrent_episodes=max_concurrent_episodes,
        namespace=namespace,
        on_group=on_group,
        seed=seed,
    )
    for attempt in range(1, max_retries + 1):
        bad = [i for i, g in enumerate(groups) if 2 * count_invalid(g) > len(g.episodes)]
        if not bad:
            break
        logger.warning("rollout_retry", attempt=attempt, groups=len(bad))
        again = await env.run_groups(
            [tasks[i] for i in bad],
            sampler,
            group_size=group_size,
            max_concurrent_episodes=max_concurrent_episodes,
            namespace=f"{namespace or 'rollout'}.retry{attempt}",
            seed=seed,
        )
        for i, g in zip(bad, again, strict=True):
            groups[i] = g
    return groups


async def collect_share(
    env: Environment,
    tasks: Sequence[Task],
    sampler: Sampler,
    *,
    group_size: int,
    max_concurrent_episodes: int,
    max_retries: int,
    namespace: str,
    on_group: Callable[[EpisodeGroup], None] | None = None,
    seed: int | None = None,
) -> tuple[list[EpisodeGroup], list[EpisodeGroup]]:
    """`collect_groups` on this rank's share of ``tasks``; ``(this rank's groups, every rank's)`` (collective).

    Every rank takes the same tasks; a task's group never spans ranks, so its advantages need no
    communication. In one process both lists are the same groups. ``seed`` does not depend on the rank: an
    episode's id and turn pick its samples, whatever the number of ranks.
    """
    mine = await collect_groups(
        env,
        collectives.shard(tasks, collectives.rank(), collectives.world_size()),
        sampler,
        group_size=group_size,
        max_concurrent_episodes=max_concurrent_episodes,
        max_retries=max_retries,
        namespace=namespace,
        on_group=on_group,
        seed=seed,
    )
    return mine, [g for part in collectives.all_gather_objects(mine) for g in part]


def check_invalid_rate(groups: Sequence[EpisodeGroup], max_invalid_rate: float) -> float:
    """The step's invalid-episode fraction; raises when it passes the configured limit.

    Raises:
        InvalidRateError: naming the rate, the limit and the most common errors.
    """
    episodes = [e for g in groups for e in g.episodes]
    if not episodes:
        return 0.0
    invalid = [e for e in episodes if not e.valid]
    rate = len(invalid) / len(episodes)
    if rate > max_invalid_rate:
        errors = Counter(str(e.error or e.stop_reason) for e in invalid).most_common(3)
        user = sum(e.stop_reason == "user_code_error" for e in invalid)
        check = (
            f"{user} of them failed in a user checker or reward function (the user_code_error events in "
            "training.log hold the tracebacks); fix that code, check"
            if user
            else "Check"
        )
        raise InvalidRateError(
            f"{len(invalid)}/{len(episodes)} episodes ({rate:.1%}) failed for reasons other than the model, above "
            f"run.max_invalid_rate={max_invalid_rate:.1%}; most common: {errors}. {check} the tool servers "
            "(`mcprl-train doctor`) or raise the limit."
        )
    return rate


def rollout_metrics(groups: Sequence[EpisodeGroup], prefix: str = "rollout") -> dict[str, float]:
    """`mcprl_env.aggregate_metrics` of the groups, re-rooted under `prefix` when it is not `rollout`.

    Keys: `<prefix>/success_rate`, `<prefix>/reward_mean`, `<prefix>/turns_mean`, `<prefix>/tools/error_rate`,
    `<prefix>/reward/<component>_mean`, ... (`rollout`, `tools`, `reward` at the top level for training).
    """
    raw = aggregate_metrics(list(groups)) if groups else {}
    if prefix == "rollout":
        return dict(raw)
    out: dict[str, float] = {}
    for key, value in raw.items():
        head, _, rest = key.partition("/")
        out[f"{prefix}/{rest}" if head == "rollout" else f"{prefix}/{key}"] = value
    return out


@runtime_checkable
class StepMetered(Protocol):
    """A tool caller that reports its infrastructure events per step (`mcprl_tools.ToolManager`)."""

    def step_metrics(self) -> dict[str, float]: ...


def tool_step_metrics(env: Environment) -> dict[str, float]:
    """This process's tool-server events since the previous call: `tools/step/restarts`, `.../crashes`,
    `.../timeouts`, `.../infra_errors`, `.../queue_wait_max_ms`, per server too (`ToolManager.step_metrics`).

    Validation between steps counts toward the next step. Empty for a tool caller that does not report them.
    """
    return env.manager.step_metrics() if isinstance(env.manager, StepMetered) else {}
