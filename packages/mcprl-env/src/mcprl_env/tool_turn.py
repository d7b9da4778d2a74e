"""One assistant turn's tool calls: reject what cannot run, run the rest concurrently, account for each.

`ToolTurns` answers the tool calls of every turn of one episode: parse errors, calls past the per-turn cap
and unknown tools become error observations without reaching a server; the others run concurrently through
the episode's `SessionWatch`. Model faults are counted in the episode's `EpisodeStats` and shown to the model;
an infrastructure error or a stateful server's restart ends the episode (`CallsAborted`). Each call is kept as
a `ToolCallRecord` for user checkers and reward functions. What the calls waited before dispatch goes to the
episode's `EpisodeClock`, which leaves it out of the episode's own time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import attrs

from mcprl_env.access import ToolAccess
from mcprl_env.config import EnvConfig
from mcprl_env.episode_clock import EpisodeClock
from mcprl_env.errors import ToolCallParseError
from mcprl_env.finished import ToolCallRecord
from mcprl_env.metrics import MODEL_FAULT_TOOL_ERRORS, EpisodeStats
from mcprl_env.parsing import ToolCall
from mcprl_env.protocols import ChatTokenizer, ToolOutcome
from mcprl_env.sessions import SessionWatch

__all__ = ["CallsAborted", "ToolTurns"]


@attrs.frozen(kw_only=True)
class CallsAborted:
    """A turn's calls that end the episode invalid: ``reason`` is its stop reason."""

    reason: str
    error: str


class ToolTurns:
    """Runs the tool calls of one episode's turns.

    Args:
        sessions: The episode's tool caller, watching for stateful servers restarting under it.
        tokenizer: Measures (and cuts) tool output in tokens.
        config: Per-turn call cap, output cap and truncation marker.
        stats: The episode's counters, updated by every turn.
        clock: The episode's clock, told what each turn's calls waited before dispatch.
        episode_id: Sent with every call.
    """

    def __init__(
        self,
        *,
        sessions: SessionWatch,
        tokenizer: ChatTokenizer,
        config: EnvConfig,
        stats: EpisodeStats,
        clock: EpisodeClock,
        episode_id: str,
    ) -> None:
        self.sessions, self.tok, self.config, self.stats = sessions, tokenizer, config, stats
        self.clock = clock
        self.episode_id = episode_id
        self.consecutive_invalid = 0
        self.records: list[ToolCallRecord] = []

    async def execute(
        self, items: Sequence[ToolCall | ToolCallParseError], access: ToolAccess
    ) -> list[dict[str, Any]] | CallsAborted:
        """The tool messages answering ``items``, in order; or why the episode must end."""
        texts: list[str] = [""] * len(items)
        names: list[str] = ["invalid_call"] * len(items)
        pending: list[tuple[int, ToolCall]] = []
        rejected: dict[int, str] = {}
        valid_calls = 0
        for i, item in enumerate(items):
            if isinstance(item, ToolCallParseError):
                texts[i] = f"Error: invalid tool call ({item.kind}): {item.reason}"
                rejected[i] = item.kind
                continue
            names[i] = item.name
            if len(pending) >= self.config.max_calls_per_turn:
                self.stats.tool_errors["too_many_calls"] += 1
                rejected[i] = "too_many_calls"
                texts[i] = f"Error: more than {self.config.max_calls_per_turn} calls in one turn; not run."
            elif item.name not in access.callable_names:
                self.stats.tool_errors["unknown_tool"] += 1
                rejected[i] = "unknown_tool"
                known = ", ".join(s["function"]["name"] for s in access.schemas)
                texts[i] = f"Error: unknown tool {item.name!r}. Available tools: {known}"
            else:
                pending.append((i, item))
        results: dict[int, ToolOutcome] = {}

        async def call(i: int, tool_call: ToolCall) -> None:
            results[i] = await self.sessions.call(
                tool_call.name, tool_call.arguments, episode_id=self.episode_id
            )

        async with anyio.create_task_group() as tg:
            for i, tool_call in pending:
                tg.start_soon(call, i, tool_call)
        self.clock.called(result.queue_s for result in results.values())
        if self.sessions.restart is not None:
            return CallsAborted(reason="server_restarted", error=self.sessions.restart)
        for i, _ in pending:
            result = results[i]
            if result.kind == "infra_error":
                self.stats.infra_errors += 1
                error = f"{names[i]}: {result.error_type}: {result.text}"
                return CallsAborted(reason="infra_error", error=error)
            if result.kind == "ok":
                self.stats.tool_calls_ok += 1
                valid_calls += 1
            else:
                kind = result.error_type or "tool_error"
                self.stats.tool_errors[kind] += 1
                valid_calls += int(kind not in MODEL_FAULT_TOOL_ERRORS)
            texts[i] = self.truncate(result.text, already_truncated=result.truncated)
        if valid_calls == 0:
            self.stats.invalid_turns += 1
            self.consecutive_invalid += 1
        else:
            self.consecutive_invalid = 0
        self.record_calls(items, results, rejected, texts)
        return [{"role": "tool", "name": names[i], "content": texts[i]} for i in range(len(items))]

    def record_calls(
        self,
        items: Sequence[ToolCall | ToolCallParseError],
        results: dict[int, ToolOutcome],
        rejected: dict[int, str],
        texts: list[str],
    ) -> None:
        """Keep what user checkers and reward functions see of this turn's calls (`FinishedEpisode.tool_calls`)."""
        for i, item in enumerate(items):
            name, arguments = (
                ("", {}) if isinstance(item, ToolCallParseError) else (item.name, item.arguments)
            )
            if i in results:
                self.records.append(
                    ToolCallRecord.of(self.stats.turns, name, arguments, results[i], texts[i])
                )
            else:
                self.records.append(
                    ToolCallRecord(
                        turn=self.stats.turns,
                        name=name,
                        arguments=arguments,
                        ok=False,
                        error_type=rejected[i],
                        result=texts[i],
                    )
                )

    def truncate(self, text: str, *, already_truncated: bool = False) -> str:
        """``text`` cut to ``config.max_tool_output_tokens`` tokens, with the truncation marker."""
        ids = self.tok.encode(text, add_special_tokens=False)
        cap = self.config.max_tool_output_tokens
        if len(ids) <= cap:
            self.stats.truncated_outputs += int(already_truncated)
            return text
        self.stats.truncated_outputs += 1
        shown = self.tok.decode(ids[:cap], skip_special_tokens=False)
        return shown + self.config.truncation_marker.format(shown=cap, total=len(ids))
