"""A stdio MCP test server whose `crash` tool kills its own process mid-call."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("crashy")


@server.tool(description="Echo text.")
def echo(text: str) -> str:
    return text


@server.tool(description="Kill the server process.")
def crash() -> str:
    os._exit(1)


if __name__ == "__main__":
    server.run()
