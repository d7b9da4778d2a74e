"""Collection: many task groups concurrently through mcprl-env, with retries for infrastructure failures.

Model faults are data (the episode is scored and trained on); infrastructure faults are ours: a group whose
episodes died of them is re-run (bounded retries), leftovers stay masked out of baselines and loss
(`valid=False`), and the run aborts only when the invalid-episode rate of a step passes
`run.max_invalid_rate` — with a message that names the errors. How many episodes run at once follows what
the sampler serves at once (`episode_concurrency`).
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs
import structlog

from mcprl_env import Environment, EpisodeGroup, Sampler, Task, aggregate_metrics
from mcprl_train.config import CollectionConfig, SamplerConfig
from mcprl_train.errors import InvalidRateError

logger = structlog.get_logger()

EPISODES_PER_SAMPLER_ROW = 2
"""Episodes in flight per request the sampler serves at once (`episode_concurrency`)."""


def episode_concurrency(collection: CollectionConfig, sampler: SamplerConfig) -> int:
    """Episodes to run at once: ``collection.max_concurrent_episodes``, at most `EPISODES_PER_SAMPLER_ROW`
    times ``sampler.max_batch_size`` (the requests the HF sampler decodes together; vLLM's ``max_num_seqs``).

    An episode spends part of its time in tool calls and rendering, so twice the batch keeps the sampler's
    batch full while at most about one batch of requests waits behind it: a request waits for about one turn
    of the batch ahead, not for many. More episodes would only queue in the sampler, where their wait counts
    against their hard wall-clock limit (`mcprl_env.EnvConfig.episode_hard_timeout_s`), not their budget.
    """
    return min(collection.max_concurrent_episodes, EPISODES_PER_SAMPLER_ROW * sampler.max_batch_size)


def count_invalid(group: EpisodeGroup) -> int:
    return sum(1 for e in group.episodes if not e.valid)


def needs_retry(group: EpisodeGroup) -> bool:
    """More than half of the group's episodes are invalid: the group carries too little signal to keep."""
    return 2 * count_invalid(group) > len(group.episodes)


def discard_reason(group: EpisodeGroup) -> str:
    """Why a group's attempt was thrown away, e.g. ``infrastructure: 5/8 episodes invalid (server_restarted: 4, ...)``."""
    reasons = Counter(e.stop_reason for e in group.episodes if not e.valid).most_common()
    detail = ", ".join(f"{reason}: {n}" for reason, n in reasons)
    return f"infrastructure: {count_invalid(group)}/{len(group.episodes)} episodes invalid ({detail})"


@attrs.frozen(kw_only=True)
class Discarded:
    """A group's attempt that was re-run: kept for the record, never trained on.

    Attributes:
        attempt: 0 for the first attempt, k for the k-th retry.
        group: The attempt's episodes.
        reason: `discard_reason` of the group.
    """

    attempt: int
    group: EpisodeGroup
    reason: str


@attrs.frozen(kw_only=True)
class Collection:
    """What a collection produced: the groups to learn from and every attempt that was thrown away.

    Attributes:
        groups: One group per task, in task order (after retries).
        attempts: The attempt each of `groups` came from (0: first, k: k-th retry), aligned with `groups`.
        discarded: The attempts that were re-run, in the order they were thrown away.
    """

    groups: list[EpisodeGroup]
    attempts: list[int]
    discarded: list[Discarded]

    def __add__(self, other: Collection) -> Collection:
        return Collection(
            groups=[*self.groups, *other.groups],
            attempts=[*self.attempts, *other.attempts],
            discarded=[*self.discarded, *other.discarded],
        )

    @classmethod
    def concat(cls, parts: Sequence[Collection]) -> Collection:
        """The parts (ranks, back-fill rounds) as one collection."""
        return functools.reduce(operator.add, parts, cls(groups=[], attempts=[], discarded=[]))

    def retry_metrics(self) -> dict[str, float]:
        """Invalid counts before the retries, and the retries that ran.

        Keys: `rollout/pre_retry/invalid_episodes`, `.../invalid_rate` and `.../invalid_groups` (over every
        group's first attempt: the rate `rollout/invalid_rate` would have had without retries; groups more than
        half invalid), `rollout/retries` (retry rounds that ran), `rollout/retried_groups` (re-runs of a group,
        all rounds), `rollout/discarded_episodes` (episodes of the attempts thrown away, written to the
        trajectories with ``discarded``), and per retry round k that ran `rollout/retry_<k>/episodes`,
        `.../invalid_episodes`, `.../invalid_groups`.
        """
        ran = [*zip(self.attempts, self.groups, strict=True), *((d.attempt, d.group) for d in self.discarded)]
        rounds = max((attempt for attempt, _ in ran), default=0)
        out: dict[str, float] = {}
        for attempt in range(rounds + 1):
            groups = [g for a, g in ran if a == attempt]
            episodes = sum(len(g.episodes) for g in groups)
            invalid = sum(count_invalid(g) for g in groups)
            key = "rollout/pre_retry" if attempt == 0 else f"rollout/retry_{attempt}"
            out[f"{key}/episodes"] = float(episodes)
            out[f"{key}/invalid_episodes"] = float(invalid)
            out[f"{key}/invalid_groups"] = float(sum(needs_retry(g) for g in groups))
            if attempt == 0:
                out[f"{key}/invalid_rate"] = invalid / episodes if episodes else 0.0
        out["rollout/retries"] = float(rounds)
        out["rollout/retried_groups"] = float(len(self.discarded))
        out["rollout/discarded_episodes"] = float(sum(len(d.group.episodes) for d in self.discarded))
        return out

    def trajectory_records(self) -> list[Mapping[str, object]]:
        """One record per episode for ``trajectories.jsonl``: the kept ones, then the discarded attempts.

        Each is ``Episode.to_dict()`` plus ``attempt`` (0: first, k: k-th retry) and ``discarded`` (None for
        an episode that is trained on; the attempt's reason, ``infrastructure: ...``, for one that was re-run).
        """
        kept = [
            {**e.to_dict(), "attempt": attempt, "discarded": None}
            for attempt, g in zip(self.attempts, self.groups, strict=True)
            for e in g.episodes
        ]
        thrown = [
            {**e.to_dict(), "attempt": d.attempt, "discarded": d.reason}
            for d in self.discarded
            for e in d.group.episodes
        ]
        return [*kept, *thrown]


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
) -> Collection:
    """Run one group of `group_size` episodes per task, concurrently; retry groups hit by infra failures.

    A group is re-run (up to `max_retries` times, under a fresh episode-id namespace so stateful servers
    start clean) when more than half of its episodes are invalid (`needs_retry`), so a transient server crash
    does not cost the task's signal; the retry replaces the whole group so the group stays one draw from the
    current policy. The replaced attempt is kept in `Collection.discarded`.

    Args:
        on_group: Called with each group as it finishes (progress bars).
        seed: The collection's sampling seed (`mcprl_env.turn_seed` derives each turn's seed from it and the
            episode id, retries included); None: the sampler's own randomness.
    """
    run = functools.partial(
        env.run_groups,
        sampler=sampler,
        group_size=group_size,
        max_concurrent_episodes=max_concurrent_episodes,
        seed=seed,
    )
    groups = await run(tasks, namespace=namespace, on_group=on_group)
    attempts = [0] * len(groups)
    discarded: list[Discarded] = []
    for attempt in range(1, max_retries + 1):
        bad = [i for i, g in enumerate(groups) if needs_retry(g)]
        if not bad:
            break
        logger.warning(
            "rollout_retry",
            attempt=attempt,
            groups=len(bad),
            invalid_episodes=sum(count_invalid(groups[i]) for i in bad),
            reasons=dict(Counter(e.stop_reason for i in bad for e in groups[i].episodes if not e.valid)),
        )
        discarded += [
            Discarded(attempt=attempts[i], group=groups[i], reason=discard_reason(groups[i])) for i in bad
        ]
        again = await run([tasks[i] for i in bad], namespace=f"{namespace or 'rollout'}.retry{attempt}")
        for i, g in zip(bad, again, strict=True):
            groups[i] = g
            attempts[i] = attempt
    return Collection(groups=groups, attempts=attempts, discarded=discarded)


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
        queued = sum(e.stop_reason == "queue_timeout" for e in invalid)
        check = (
            f"{user} of them failed in a user checker or reward function (the user_code_error events in "
            "training.log hold the tracebacks); fix that code, check"
            if user
            else "Check"
        )
        if queued:
            check = (
                f"{queued} of them waited past env.episode_hard_timeout_s in the sampler's or a tool server's "
                "queue (queue_timeout): lower collection.max_concurrent_episodes or raise the hard limit. "
                + check
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
    `.../timeouts`, `.../infra_errors`, `.../queue_wait_max_ms`, per server too (`ToolManager.step_metrics`);
    empty for a tool caller that does not report them."""
    return env.manager.step_metrics() if isinstance(env.manager, StepMetered) else {}
