"""Messaging MCP server: a Slack-like workspace with per-episode isolation.

Each request's episode comes from ``_meta["mcprl/episode_id"]`` (``"default"`` when absent); an episode sees
the seed messages plus its own posts, never another episode's. Run it with ``python -m mcprl_servers.messaging``
(state lives in an in-memory SQLite database owned by the server process).
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.results import episode_id_of, to_json
from mcprl_servers.workspace import Workspace, WorkspaceError

__all__ = ["build_server", "main"]


def build_server(workspace: Workspace | None = None) -> MCPServer:
    """Build the messaging server.

    Args:
        workspace: Store to serve; a fresh in-memory workspace with the seed state when None.
    """
    store = workspace if workspace is not None else Workspace()
    server = MCPServer(
        "messaging", instructions="Team chat: channels, users and messages.", log_level="WARNING"
    )

    @server.tool(structured_output=False)
    def list_channels() -> str:
        """List the workspace's channels with their topics."""
        return to_json({"channels": store.list_channels()})

    @server.tool(structured_output=False)
    def list_users() -> str:
        """List the workspace's users with their names and titles."""
        return to_json({"users": store.list_users()})

    @server.tool(structured_output=False)
    def post_message(channel: str, text: str, ctx: Context[Any, Any]) -> str:
        """Post a message to a channel, e.g. channel 'markets'."""
        try:
            return to_json(store.post(episode_id_of(ctx), channel, text))
        except WorkspaceError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(structured_output=False)
    def read_messages(channel: str, ctx: Context[Any, Any], limit: int = 20) -> str:
        """Read the most recent messages of a channel (oldest first), at most `limit` (1-100)."""
        try:
            return to_json(store.read(episode_id_of(ctx), channel, limit))
        except WorkspaceError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(structured_output=False)
    def search_messages(query: str, ctx: Context[Any, Any]) -> str:
        """Find messages containing all words of the query, newest first."""
        try:
            return to_json(store.search(episode_id_of(ctx), query))
        except WorkspaceError as exc:
            raise ToolError(str(exc)) from None

    return server


def main() -> None:
    """Serve the messaging workspace over stdio."""
    build_server().run()


if __name__ == "__main__":
    main()
