"""Which process of each stateful tool server an episode's calls reached.

A stateful server (the messaging server: per-episode channels) that restarts mid-episode has lost the
episode's state; scoring what happens next would blame the model for our fault. Results that say which
session served them (`mcprl_tools.ToolResult.generation` and `stateful`) let the episode notice the change
and end invalid instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from mcprl_env.protocols import ToolCaller, ToolOutcome, ToolSpecLike

__all__ = ["SessionTagged", "SessionWatch"]


@runtime_checkable
class SessionTagged(Protocol):
    """A tool result that names the server session which served it (satisfied by `mcprl_tools.ToolResult`)."""

    @property
    def server(self) -> str | None: ...
    @property
    def generation(self) -> int | None: ...
    @property
    def stateful(self) -> bool: ...


class SessionWatch:
    """A `ToolCaller` that passes calls through and remembers each stateful server's first generation.

    Attributes:
        restart: How a stateful server changed under the episode (None while none did).
    """

    def __init__(self, inner: ToolCaller) -> None:
        self._inner = inner
        self._first: dict[str, int] = {}
        self.restart: str | None = None

    @property
    def tools(self) -> Sequence[ToolSpecLike]:
        return self._inner.tools

    def tool_schemas(self, servers: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return self._inner.tool_schemas(servers)

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, episode_id: str | None = None
    ) -> ToolOutcome:
        result = await self._inner.call(name, arguments, episode_id=episode_id)
        self.observe(result)
        return result

    def observe(self, result: ToolOutcome) -> None:
        """Note the session that served `result`; the first change of a stateful server's is kept."""
        if not isinstance(result, SessionTagged):
            return
        server, generation = result.server, result.generation
        if server is None or generation is None or not result.stateful:
            return
        first = self._first.setdefault(server, generation)
        if generation != first and self.restart is None:
            self.restart = (
                f"stateful server {server!r} restarted during the episode (session {first} -> {generation}); "
                "the episode's state on it was lost"
            )
