"""The multi-turn episode loop: sample, parse, call tools, append, repeat — token-exact.

`run_episode` is the episode boundary: whatever goes wrong inside becomes the episode's recorded error
(``valid=False``); only cancellation propagates. Model faults (malformed calls, unknown tools, invalid
arguments, tool errors) become tool observations and are counted; infrastructure errors end the episode
invalid, and so does a stateful server restarting under the episode (`SessionWatch`); budget stops end
it with an explicit stop reason. The wall-clock budget counts the episode's own time, not its waits in the
sampler's or the tool servers' queues (`mcprl_env.episode_clock`): past it the episode stops with
``wall_clock`` (valid); past the hard limit, which counts the waits, with ``queue_timeout`` (invalid). A
turn's tool calls are run by `mcprl_env.tool_turn`; the tools a task may use are
`mcprl_env.access.ToolAccess` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import anyio
import attrs
import structlog

from mcprl_env.access import ToolAccess
from mcprl_env.checkers import check_outcome
from mcprl_env.config import EnvConfig
from mcprl_env.episode import Episode
from mcprl_env.episode_clock import EpisodeClock
from mcprl_env.errors import CheckerInfraError, TemplateDriftError, UserCodeError
from mcprl_env.finished import FinishedEpisode
from mcprl_env.metrics import EpisodeStats
from mcprl_env.parsing import ParsedTurn, ToolCallParser
from mcprl_env.protocols import ChatTokenizer, Sampler, ToolCaller
from mcprl_env.rewards import RewardContext, combine_rewards, user_reward_values
from mcprl_env.seeds import turn_seed
from mcprl_env.sessions import SessionWatch
from mcprl_env.tasks import Task
from mcprl_env.tool_turn import CallsAborted, ToolTurns
from mcprl_env.transcript import Transcript

__all__ = ["ToolAccess", "run_episode"]

log = structlog.get_logger()


@attrs.frozen
class _Stop:
    """Why the loop ended."""

    reason: str
    valid: bool = attrs.field(default=True, kw_only=True)
    error: str | None = attrs.field(default=None, kw_only=True)


class _Rollout:
    def __init__(
        self,
        *,
        task: Task,
        sampler: Sampler,
        manager: ToolCaller,
        tokenizer: ChatTokenizer,
        config: EnvConfig,
        parser: ToolCallParser,
        access: ToolAccess | Callable[[Task], ToolAccess] | None,
        episode_id: str,
        group_id: str,
        seed: int | None,
        clock: EpisodeClock,
    ) -> None:
        self.clock = clock
        self.sessions = SessionWatch(manager)
        self.task, self.sampler, self.manager, self.tok = task, sampler, self.sessions, tokenizer
        self.config, self.parser = config, parser
        self._access: ToolAccess | None = access if isinstance(access, ToolAccess) else None
        self._resolve = access if callable(access) else partial(ToolAccess.for_task, manager)
        self.episode_id, self.group_id, self.seed = episode_id, group_id, seed
        self.max_turns = config.max_turns_for(task.difficulty, task.max_turns)
        self.stats = EpisodeStats()
        self.transcript = Transcript(
            tokenizer, on_drift=config.on_template_drift, template_kwargs=config.template_kwargs()
        )
        self.answer: str | None = None
        self.tool_turns = ToolTurns(
            sessions=self.sessions,
            tokenizer=tokenizer,
            config=config,
            stats=self.stats,
            clock=clock,
            episode_id=episode_id,
        )

    @property
    def access(self) -> ToolAccess:
        if self._access is None:
            self._access = self._resolve(self.task)
        return self._access

    async def loop(self) -> _Stop:
        self.transcript.start(self.task.initial_messages(), tools=self.access.schemas)
        if self.config.max_total_tokens - len(self.transcript.token_ids) < self.config.min_new_tokens:
            return _Stop("token_budget", valid=False, error="the prompt leaves no room in max_total_tokens")
        while True:
            if self.clock.spent:
                return _Stop("wall_clock")
            remaining = self.config.max_total_tokens - len(self.transcript.token_ids)
            if remaining < self.config.min_new_tokens:
                return _Stop("token_budget")
            max_new = min(self.config.max_new_tokens_per_turn, remaining)
            seed = None if self.seed is None else turn_seed(self.seed, self.episode_id, self.stats.turns)
            self.clock.step()
            completion = await self.sampler.sample(
                list(self.transcript.token_ids), max_new_tokens=max_new, seed=seed
            )
            if len(completion.token_ids) > max_new:
                raise ValueError(
                    f"sampler returned {len(completion.token_ids)} ids for max_new_tokens={max_new}"
                )
            self.clock.sampled(completion.queue_s)
            self.transcript.add_sampled(completion)
            self.stats.turns += 1
            if self.clock.spent:
                return _Stop("wall_clock")
            if completion.finish_reason == "length":
                return _Stop("token_budget" if max_new == remaining else "sampler_length")
            parsed = self.parser.parse(completion.text, tools=self.access.schemas)
            if parsed.is_final:
                self.answer = parsed.answer
                return _Stop("answer")
            stop = await self.step(parsed)
            if stop is not None:
                return stop

    async def step(self, parsed: ParsedTurn) -> _Stop | None:
        """Answer one tool-calling turn; a stop when the episode must end before the next turn."""
        for error in parsed.errors:
            self.stats.parse_errors[error.kind] += 1
        self.stats.tool_calls += len(parsed.calls)
        if self.stats.turns >= self.max_turns:
            return _Stop("max_turns")
        if self.stats.tool_calls > self.config.max_tool_calls:
            return _Stop("max_tool_calls")
        self.clock.step()
        observations = await self.tool_turns.execute(parsed.items, self.access)
        if isinstance(observations, CallsAborted):
            return _Stop(observations.reason, valid=False, error=observations.error)
        if self.tool_turns.consecutive_invalid >= self.config.max_consecutive_invalid:
            return _Stop("consecutive_invalid")
        suffix = self.transcript.env_suffix(observations)
        if (
            len(self.transcript.token_ids) + len(suffix.ids) + self.config.min_new_tokens
            > self.config.max_total_tokens
        ):
            return _Stop("token_budget")
        self.transcript.commit_env(suffix)
        return None

    def finished(self, reason: str, context: RewardContext | None = None) -> FinishedEpisode:
        """The episode as user code sees it."""
        return FinishedEpisode(
            task=self.task,
            episode_id=self.episode_id,
            messages=tuple(dict(m) for m in self.transcript.messages),
            answer=self.answer,
            tool_calls=tuple(self.tool_turns.records),
            stop_reason=reason,
            manager=self.manager,
            context=context,
        )

    def queue_timeout(self, hard_s: float) -> _Stop:
        """Why an episode the hard limit cut ends invalid: its own time was within budget, the rest waited."""
        c = self.clock
        c.cut()
        error = (
            f"the episode's hard limit of {hard_s:g} s passed after {c.own_s:.1f} s of its own time and "
            f"{c.queue_s:.1f} s counted in queues: it was waiting on the sampler or a tool server"
        )
        return _Stop("queue_timeout", valid=False, error=error)

    async def finish(self, stop: _Stop) -> Episode:
        valid, error, success = stop.valid, stop.error, False
        if valid:
            check = await check_outcome(
                self.task,
                self.answer,
                manager=self.manager,
                episode_id=self.episode_id,
                episode=self.finished(stop.reason),
            )
            if check.user_error is not None:
                return self.user_code_failed(check.user_error, stop.reason)
            if check.infra_error is not None:
                valid, error = False, f"checker: {check.infra_error}"
                stop = _Stop("infra_error", valid=False, error=error)
            success = check.correct
            if valid and self.sessions.restart is not None:
                valid, error = False, self.sessions.restart
                stop = _Stop("server_restarted", valid=False, error=error)
        user_values: dict[str, float] = {}
        if valid:
            try:
                user_values = await user_reward_values(
                    self.config.reward, self.finished(stop.reason, self.context(stop.reason, success))
                )
            except UserCodeError as exc:
                return self.user_code_failed(exc, stop.reason)
            except CheckerInfraError as exc:
                valid, error, success = False, f"reward: {exc}", False
                stop = _Stop("infra_error", valid=False, error=error)
        return self.record(stop.reason, valid=valid, error=error, success=success, user_values=user_values)

    def user_code_failed(self, exc: UserCodeError, reason: str) -> Episode:
        """The episode, invalid: a user's checker or reward function failed on it (not the model's fault)."""
        log.error(
            "user_code_error",
            episode_id=self.episode_id,
            task_id=self.task.id,
            function=exc.spec,
            stop_reason=reason,
            error=str(exc),
            traceback=exc.traceback_text,
        )
        return self.record("user_code_error", valid=False, error=f"user code: {exc}", success=False)

    def context(self, reason: str, success: bool) -> RewardContext:
        return RewardContext(
            success=success,
            answered=reason == "answer",
            stop_reason=reason,
            turns=self.stats.turns,
            max_turns=self.max_turns,
            tool_calls=self.stats.tool_calls,
            tool_calls_ok=self.stats.tool_calls_ok,
            invalid_calls=self.stats.invalid_calls,
            parse_errors=sum(self.stats.parse_errors.values()),
            invalid_call_cap=self.config.reward.invalid_call_cap,
            answer_given=bool(self.answer and self.answer.strip()),
        )

    def record(
        self,
        reason: str,
        *,
        valid: bool,
        error: str | None,
        success: bool,
        user_values: dict[str, float] | None = None,
    ) -> Episode:
        if valid:
            reward, components = combine_rewards(
                self.context(reason, success), self.config.reward, user_values
            )
        else:
            reward, components = 0.0, dict.fromkeys(self.config.reward.weights, 0.0)
        t = self.transcript
        metrics = self.stats.as_metrics()
        metrics.update(
            {
                "tokens/total": float(len(t.token_ids)),
                "tokens/sampled": float(t.sampled_tokens),
                "tokens/env": float(t.env_tokens),
                "template_drift": float(t.drift_count),
                **self.clock.metrics(),
            }
        )
        # Debug: a training step finishes hundreds of episodes; each is in the trajectories, the step is logged.
        log.debug(
            "episode_finished",
            episode_id=self.episode_id,
            stop_reason=reason,
            valid=valid,
            success=success and valid,
            reward=round(reward, 4),
            turns=self.stats.turns,
            tool_calls=self.stats.tool_calls,
        )
        return Episode(
            episode_id=self.episode_id,
            task_id=self.task.id,
            group_id=self.group_id,
            token_ids=list(t.token_ids),
            prompt_length=t.prompt_length,
            loss_mask=list(t.loss_mask),
            sampler_logprobs=list(t.logprobs),
            messages=[dict(m) for m in t.messages],
            reward=reward,
            reward_components=components,
            valid=valid,
            success=success and valid,
            stop_reason=reason,
            error=error,
            answer=self.answer,
            metrics=metrics,
        )


async def run_episode(
    task: Task,
    sampler: Sampler,
    *,
    manager: ToolCaller,
    tokenizer: ChatTokenizer,
    config: EnvConfig,
    parser: ToolCallParser,
    episode_id: str,
    group_id: str,
    access: ToolAccess | Callable[[Task], ToolAccess] | None = None,
    seed: int | None = None,
) -> Episode:
    """Run one episode to its end; never raises except on cancellation.

    Args:
        task: The task.
        sampler: Produces assistant turns.
        manager: Runs tool calls (and state checks).
        tokenizer: Renders the chat template and encodes/decodes.
        config: Limits, template-drift policy and reward weights.
        parser: Tool-call parser for the model family.
        episode_id: Unique id, sent with every tool call.
        group_id: The group's id.
        access: The task's tools, or a function of the task returning them (computed inside the episode
            boundary, so a failure becomes the episode's error); None: `ToolAccess.for_task`.
        seed: The collection's seed: turn ``t`` is sampled with ``turn_seed(seed, episode_id, t)``, so the
            episode does not depend on what else the sampler is serving; None: the sampler's own randomness.

    Returns:
        The episode; ``valid=False`` with ``error`` set when something other than the model failed. Its
        metrics hold ``wall_s``, ``own_s`` (what the budget counts) and ``queue_s`` (sampler and tool queues).
    """
    rollout = _Rollout(
        task=task,
        sampler=sampler,
        manager=manager,
        tokenizer=tokenizer,
        config=config,
        parser=parser,
        access=access,
        episode_id=episode_id,
        group_id=group_id,
        seed=seed,
        clock=EpisodeClock(budget_s=config.episode_timeout_s),
    )
    hard = config.hard_timeout_s()
    try:
        stop: _Stop | None = None
        with anyio.move_on_after(hard if hard is not None else math.inf):
            stop = await rollout.loop()
        if stop is None:
            assert hard is not None
            stop = rollout.queue_timeout(hard)
        return await rollout.finish(stop)
    except TemplateDriftError as exc:
        return rollout.record("template_drift", valid=False, error=str(exc), success=False)
    except Exception as exc:  # the episode boundary: one bad episode never escapes its group
        log.warning("episode_failed", episode_id=episode_id, error=f"{type(exc).__name__}: {exc}")
        return rollout.record("error", valid=False, error=f"{type(exc).__name__}: {exc}", success=False)
