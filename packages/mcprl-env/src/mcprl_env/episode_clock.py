"""An episode's own time: its wall time less what it spent waiting in our queues.

An episode's budget (`EnvConfig.episode_timeout_s`) is about the model: how long its turns take to generate
and its tool calls take to run. The time its requests wait in the sampler's queue behind other episodes' (a
batching sampler serving more episodes than its batch holds), or its calls wait for a session or a slot on a
busy tool server, is ours. Samplers report each request's wait (`Completion.queue_s`), tool results each
call's (`ToolOutcome.queue_s`), and `EpisodeClock` subtracts them.

A request's wait is known only once it is answered, so the budget is checked between steps, before each turn
and when it is sampled: a step that starts within the budget runs to its end, which its own limits bound
(``max_new_tokens``, the tool server's per-call deadline), and a turn that ends past the budget ends the
episode (``wall_clock``) before its answer or calls count. The hard limit (`EnvConfig.hard_timeout_s`) cuts an
episode wherever it is; the episode's own time was under budget at its last check, so what pushed it past the
hard limit was waiting on us (or a step that never returned): it ends invalid, ``queue_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs

__all__ = ["EpisodeClock"]


@attrs.define(kw_only=True)
class EpisodeClock:
    """Wall time, queue time and own time of one episode (monotonic seconds).

    Args:
        budget_s: The own-time budget (``episode_timeout_s``); None: unlimited.
        started: `time.monotonic` at the episode's start.
    """

    budget_s: float | None
    started: float = attrs.field(factory=time.monotonic)
    queue_s: float = attrs.field(default=0.0, init=False)
    _own_at_step: float = attrs.field(default=0.0, init=False)

    def step(self) -> None:
        """A step (a sampler request, a turn's tool calls) starts: its time is unattributed until it ends."""
        self._own_at_step = self.own_s

    def cut(self) -> None:
        """The hard limit cut the step in flight: count its time as waiting.

        The sampler reports a request's wait only with its answer, and a step cut while its own time was
        within budget was held up by us (`mcprl_env.episode_clock`).
        """
        self.queue_s = max(self.wall_s - self._own_at_step, self.queue_s)

    def sampled(self, queue_s: float) -> None:
        """Count a sampler request's wait before it was served (`Completion.queue_s`)."""
        self.queue_s += max(queue_s, 0.0)

    def called(self, queue_s: Iterable[float]) -> None:
        """Count one turn's tool-call waits before dispatch (`ToolOutcome.queue_s`, one per call run).

        The calls of a turn run concurrently, so only the wait before the first of them was dispatched is time
        in which none of them ran: the shortest wait.
        """
        waits = list(queue_s)
        if waits:
            self.queue_s += max(min(waits), 0.0)

    @property
    def wall_s(self) -> float:
        """Seconds since the episode started."""
        return time.monotonic() - self.started

    @property
    def own_s(self) -> float:
        """Seconds of the episode's own time: wall time less the waits counted so far."""
        return max(self.wall_s - self.queue_s, 0.0)

    @property
    def spent(self) -> bool:
        """Whether the own-time budget is used up."""
        return self.budget_s is not None and self.own_s >= self.budget_s

    def metrics(self) -> dict[str, float]:
        """``wall_s``, ``own_s`` and ``queue_s`` of the episode so far."""
        wall = self.wall_s
        return {"wall_s": wall, "own_s": max(wall - self.queue_s, 0.0), "queue_s": self.queue_s}
