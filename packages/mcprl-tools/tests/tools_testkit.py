"""Test kit for mcprl-tools: in-memory servers, the flaky stdio server entry, process and fd scans."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

FLAKY = Path(__file__).parent / "servers" / "flaky.py"
MARKER_VAR = "MCPRL_TOOLS_TEST_MARKER"


def make_server(name: str, *, description_suffix: str = "") -> MCPServer:
    """An in-process server with a few tools (shared names across instances make collisions)."""
    server = MCPServer(name)

    @server.tool(description=f"Echo the text back{description_suffix}.")
    def echo(text: str) -> str:
        return f"{name}:{text}"

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Pretend to run code.")
    def run_code(code: str) -> str:
        return f"ran {code}"

    @server.tool(description="Raise a tool error.")
    def fail(message: str) -> str:
        raise ToolError(message)

    @server.tool(description="Return n copies of a character.")
    def big(n: int, char: str = "x") -> str:
        return char * n

    @server.tool(description="Return the episode id from the request _meta.")
    def whoami(ctx: Context) -> str:
        meta: Any = ctx.request_context.meta or {}
        return str(meta.get("mcprl/episode_id", "default"))

    @server.tool(description="Sleep without blocking.")
    async def nap(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "rested"

    return server


def flaky_server(marker: str, *args: str, **options: Any) -> dict[str, Any]:
    """An `mcpServers` entry for the flaky stdio test server, tagged with a marker env var."""
    entry: dict[str, Any] = {
        "command": sys.executable,
        "args": [str(FLAKY), *args],
        "env": {MARKER_VAR: marker},
        "start_timeout": 30,
    }
    entry.update(options)
    return entry


def marked_processes(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries the marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            status = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle in environ.split(b"\0") and ") Z " not in status:
            found.append(int(entry))
    return found


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
