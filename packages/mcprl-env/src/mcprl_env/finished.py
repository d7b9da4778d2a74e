"""What a user checker or reward function is given: the whole finished episode.

A checker (``{"type": "python", "function": "checks.py:grade"}`` in a task file) returns ``True``/``False``;
a reward function (an ``env.reward.weights`` key such as ``checks.py:brevity``) returns a finite number that
is multiplied by its weight. Either may be ``async`` (to query the servers through ``episode.manager``).
A walk-through with a runnable example: ``docs/own-task-family.md``::

    from mcprl_env import FinishedEpisode

    def grade(episode: FinishedEpisode) -> bool:
        searched = any(c.name == "search" and c.ok for c in episode.tool_calls)
        return searched and episode.answer is not None and (episode.task.answer or "") in episode.answer

    def brevity(episode: FinishedEpisode) -> float:
        return -len(episode.answer or "") / 1000
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from mcprl_env.protocols import ToolCaller, ToolOutcome

if TYPE_CHECKING:  # both import the user-code loader, which imports this module
    from mcprl_env.rewards import RewardContext
    from mcprl_env.tasks import Task

__all__ = ["FinishedEpisode", "ToolCallRecord"]


@attrs.frozen(kw_only=True)
class ToolCallRecord:
    """One tool call the model wrote, and what came back.

    Attributes:
        turn: The assistant turn (1-based) that made the call.
        name: The tool name as called (``""`` when the call could not be parsed).
        arguments: Its JSON-object arguments (empty when the call could not be parsed).
        ok: The tool ran and returned without error.
        error_type: Why it did not (a tool error type such as ``invalid_arguments``, ``unknown_tool``,
            ``too_many_calls``, or the parse error kind); None when ``ok``.
        result: The text the model was shown for it (after truncation).
    """

    turn: int
    name: str
    arguments: Mapping[str, Any]
    ok: bool
    error_type: str | None
    result: str

    @classmethod
    def of(
        cls, turn: int, name: str, arguments: Mapping[str, Any], outcome: ToolOutcome, shown: str
    ) -> ToolCallRecord:
        """The record of a call that reached a server (``outcome`` is what the manager returned)."""
        ok = outcome.kind == "ok"
        return cls(
            turn=turn,
            name=name,
            arguments=dict(arguments),
            ok=ok,
            error_type=None if ok else (outcome.error_type or outcome.kind),
            result=shown,
        )


@attrs.frozen(kw_only=True)
class FinishedEpisode:
    """A finished episode as user code sees it.

    Attributes:
        task: The task (``id``, ``prompt``, ``answer``, ``metadata``, ...).
        episode_id: The episode's id, the key of its state on stateful servers (pass it to ``manager.call``).
        messages: The conversation: the opening messages, each assistant turn as sampled, each tool response as
            shown to the model.
        answer: The final answer (the text of the last turn, or inside ``<answer>`` tags), None when the episode
            stopped without one.
        tool_calls: Every call the model wrote, in order, with its result.
        stop_reason: Why the episode stopped (`mcprl_env.StopReason`).
        manager: The tool manager: ``await episode.manager.call("server.tool", {...},
            episode_id=episode.episode_id)`` reads the servers' state for this episode.
        context: For reward functions: the counts and the checker's verdict (``context.success``); None for a
            checker (the verdict is what it decides).
    """

    task: Task
    episode_id: str
    messages: tuple[Mapping[str, Any], ...]
    answer: str | None
    tool_calls: tuple[ToolCallRecord, ...]
    stop_reason: str
    manager: ToolCaller = attrs.field(repr=False)
    context: RewardContext | None = None
