"""Typed tool specs and call results."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

ResultKind = Literal["ok", "tool_error", "infra_error"]
ErrorType = Literal[
    "unknown_tool",
    "invalid_arguments",
    "tool_error",
    "timeout",
    "crashed",
    "transport",
    "unavailable",
    "catalogue_changed",
    "replay_miss",
]
TOOL_ERROR_TYPES: frozenset[str] = frozenset({"unknown_tool", "invalid_arguments", "tool_error"})
INFRA_ERROR_TYPES: frozenset[str] = frozenset(
    {"timeout", "crashed", "transport", "unavailable", "catalogue_changed", "replay_miss"}
)


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool as the manager exposes it.

    Attributes:
        name: Exposed name: the tool's own name when unique across servers, `server.tool` otherwise.
        server: Server that owns it.
        tool: Server-side tool name.
        description: Tool description from the server.
        input_schema: JSON schema of its arguments.
    """

    name: str
    server: str
    tool: str
    description: str
    input_schema: Mapping[str, Any]

    @property
    def qualified_name(self) -> str:
        """`server.tool`, which always resolves."""
        return f"{self.server}.{self.tool}"

    def function_schema(self) -> dict[str, Any]:
        """The `{"type": "function", "function": {...}}` form chat templates take."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.input_schema),
            },
        }


@attrs.frozen(kw_only=True)
class ToolResult:
    """Outcome of one tool call.

    `tool_error` is the model's fault (shown to it, penalised); `infra_error` is ours (episode invalid).

    Attributes:
        kind: `"ok"`, `"tool_error"` or `"infra_error"`.
        text: What the model sees, already truncated with a marker when over the cap.
        structured: The tool's structured content, if any.
        name: Tool name as called.
        server: Server that handled it, None when the tool is unknown.
        error_type: Why it failed (None when ok).
        latency_s: Wall time of the call as seen by the caller.
        truncated: Whether `text` was cut at the output cap.
        generation: Which process of the server handled the call (1 for the first start, +1 per restart);
            None when the call never reached a server (unknown tool, invalid arguments, unavailable).
        stateful: The server keeps state between calls (`ServerConfig.stateful`), so a change of
            `generation` within an episode means the episode's state was lost.
        queue_s: Of `latency_s`, the time before the call was dispatched to the server: waiting for its
            session and for a slot under its concurrency cap (0 when it never reached a server). Queueing
            behind other callers, not the tool's own time.
    """

    kind: ResultKind
    text: str
    structured: object | None = None
    name: str
    server: str | None = None
    error_type: ErrorType | None = None
    latency_s: float = 0.0
    truncated: bool = False
    generation: int | None = None
    stateful: bool = False
    queue_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the tool ran and succeeded."""
        return self.kind == "ok"

    @property
    def is_infra_error(self) -> bool:
        """True when the failure is ours (crash, hang, transport, start failure)."""
        return self.kind == "infra_error"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (cassettes, trajectories)."""
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolResult:
        """Inverse of `to_json`."""
        return cls(**dict(data))
