"""The environment: runs groups of episodes concurrently over a sampler and a tool manager."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable

import anyio
import attrs

from mcprl_env.access import ToolAccess
from mcprl_env.config import EnvConfig
from mcprl_env.episode import Episode, EpisodeGroup
from mcprl_env.parsing import ToolCallParser, resolve_parser
from mcprl_env.protocols import ChatTokenizer, Sampler, ToolCaller
from mcprl_env.rollout import run_episode
from mcprl_env.tasks import Task

__all__ = ["Environment", "episode_id_for", "group_id_for"]


def group_id_for(task_id: str, namespace: str | None = None) -> str:
    """``task_id``, prefixed by ``namespace/`` when given."""
    return f"{namespace}/{task_id}" if namespace else task_id


def episode_id_for(task_id: str, index: int, namespace: str | None = None) -> str:
    """Deterministic episode id: ``[namespace/]task_id/index``.

    Stateful servers key their state by episode id, so a task run again (next step, next epoch) needs a new
    ``namespace`` (e.g. ``"step-12"``) to start from fresh state.
    """
    return f"{group_id_for(task_id, namespace)}/{index}"


class Environment:
    """Turns tasks, a sampler and a tool manager into scored, token-exact episodes.

    Args:
        manager: Tool manager (an entered `mcprl_tools.ToolManager`, or anything satisfying `ToolCaller`).
        tokenizer: Chat tokenizer whose template renders tools and tool responses.
        config: Episode limits, parser family and reward weights. Without ``config.template_date``, the
            environment's config fixes it on today, so its renders never see the date change.
        parser: Tool-call parser (default: ``resolve_parser(config.parser, tokenizer)``: the family named by
            ``config.parser``, or recognised from the chat template when it is ``"auto"``).

    Raises:
        UnknownToolCallFormatError: ``config.parser`` is ``"auto"`` and the template's tool-call format is not
            recognised.
    """

    def __init__(
        self,
        *,
        manager: ToolCaller,
        tokenizer: ChatTokenizer,
        config: EnvConfig | None = None,
        parser: ToolCallParser | None = None,
    ) -> None:
        self.manager = manager
        self.tokenizer = tokenizer
        config = config if config is not None else EnvConfig()
        if config.template_date is None:
            config = attrs.evolve(config, template_date=datetime.date.today())
        self.config = config
        self.parser = (
            parser
            if parser is not None
            else resolve_parser(self.config.parser, tokenizer, template_kwargs=self.config.template_kwargs())
        )
        self._access_cache: dict[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ToolAccess] = {}

    def tool_access(self, task: Task) -> ToolAccess:
        """The tools ``task`` may use (schemas for the prompt, names it may call); cached per tool set."""
        key = (task.servers, task.tools)
        access = self._access_cache.get(key)
        if access is None:
            access = self._access_cache[key] = ToolAccess.for_task(self.manager, task)
        return access

    async def run_episode(
        self,
        task: Task,
        sampler: Sampler,
        *,
        index: int = 0,
        namespace: str | None = None,
        seed: int | None = None,
    ) -> Episode:
        """Run one episode of ``task``; never raises except on cancellation (``seed``: see `run_group`)."""
        return await run_episode(
            task,
            sampler,
            manager=self.manager,
            tokenizer=self.tokenizer,
            config=self.config,
            parser=self.parser,
            episode_id=episode_id_for(task.id, index, namespace),
            group_id=group_id_for(task.id, namespace),
            access=self.tool_access,
            seed=seed,
        )

    async def run_group(
        self,
        task: Task,
        sampler: Sampler,
        *,
        group_size: int,
        namespace: str | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        seed: int | None = None,
    ) -> EpisodeGroup:
        """Run ``group_size`` episodes of ``task`` concurrently.

        Args:
            task: The task.
            sampler: Produces assistant turns (shared by every episode; it may batch them).
            group_size: G, the number of episodes.
            namespace: Prefix of episode and group ids (see `episode_id_for`).
            limiter: Caps concurrent episodes (shared across groups by `run_groups`); None runs all G at once.
            seed: Turn ``t`` of each episode is sampled with ``turn_seed(seed, episode_id, t)``
                (`mcprl_env.seeds`): episodes then do not depend on arrival order or batch composition.
                None: the sampler's own randomness.

        Returns:
            The group, episodes in index order. One failing episode is recorded invalid, never raised.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        episodes: list[Episode | None] = [None] * group_size

        async def one(i: int) -> None:
            async def go() -> Episode:
                return await run_episode(
                    task,
                    sampler,
                    manager=self.manager,
                    tokenizer=self.tokenizer,
                    config=self.config,
                    parser=self.parser,
                    episode_id=episode_id_for(task.id, i, namespace),
                    group_id=group_id_for(task.id, namespace),
                    access=self.tool_access,
                    seed=seed,
                )

            if limiter is None:
                episodes[i] = await go()
            else:
                async with limiter:
                    episodes[i] = await go()

        async with anyio.create_task_group() as tg:
            for i in range(group_size):
                tg.start_soon(one, i)
        done = [ep for ep in episodes if ep is not None]
        assert len(done) == group_size
        return EpisodeGroup(group_id=group_id_for(task.id, namespace), task=task, episodes=done)

    async def run_groups(
        self,
        tasks: Iterable[Task],
        sampler: Sampler,
        *,
        group_size: int,
        max_concurrent_episodes: int = 64,
        namespace: str | None = None,
        on_group: Callable[[EpisodeGroup], None] | None = None,
        seed: int | None = None,
    ) -> list[EpisodeGroup]:
        """Run a group per task, all at once, with at most ``max_concurrent_episodes`` episodes in flight.

        ``on_group`` is called with each group as it finishes (progress display); ``seed``: see `run_group`.

        Returns:
            The groups in task order.
        """
        if max_concurrent_episodes < 1:
            raise ValueError(f"max_concurrent_episodes must be >= 1, got {max_concurrent_episodes}")
        task_list = list(tasks)
        ids = [t.id for t in task_list]
        if len(set(ids)) != len(ids):
            raise ValueError("run_groups needs distinct task ids (episode ids derive from them)")
        limiter = anyio.CapacityLimiter(max_concurrent_episodes)
        groups: list[EpisodeGroup | None] = [None] * len(task_list)

        async def one(i: int, task: Task) -> None:
            groups[i] = group = await self.run_group(
                task, sampler, group_size=group_size, namespace=namespace, limiter=limiter, seed=seed
            )
            if on_group is not None:
                on_group(group)

        async with anyio.create_task_group() as tg:
            for i, task in enumerate(task_list):
                tg.start_soon(one, i, task)
        return [g for g in groups if g is not None]
