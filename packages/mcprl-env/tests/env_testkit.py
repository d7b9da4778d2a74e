"""Test kit for mcprl-env: small in-process MCP servers and helpers to script assistant turns."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_env import Task, task_from_dict
from mcprl_tools import ServersConfig, ToolManager

CRASHY = Path(__file__).parent / "servers" / "crashy.py"


def call(name: str, **arguments: Any) -> str:
    """One Hermes-style tool call as a model writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def make_calc() -> MCPServer:
    """Arithmetic tools plus misbehaving ones."""
    server = MCPServer("calc")

    @server.tool(description="Multiply two numbers.")
    def multiply(a: float, b: float) -> str:
        return f"{a * b:g}"

    @server.tool(description="Divide a by b.")
    def divide(a: float, b: float) -> str:
        if b == 0:
            raise ToolError("division by zero")
        return f"{a / b:g}"

    @server.tool(description="Return n copies of a character.")
    def big(n: int, char: str = "x") -> str:
        return char * n

    @server.tool(description="Never answers.")
    async def hang() -> str:
        await anyio.Event().wait()
        return "unreachable"

    return server


def make_messaging() -> MCPServer:
    """A tiny messaging server keyed by the episode id in the request _meta."""
    server = MCPServer("messaging")
    posts: dict[tuple[str, str], list[str]] = defaultdict(list)

    def episode(ctx: Context[Any, Any]) -> str:
        meta: Any = ctx.request_context.meta or {}
        return str(meta.get("mcprl/episode_id", "default"))

    @server.tool(description="Post a message to a channel.")
    def post_message(channel: str, text: str, ctx: Context[Any, Any]) -> str:
        posts[(episode(ctx), channel)].append(text)
        return json.dumps({"ok": True})

    @server.tool(description="Read a channel's messages.")
    def read_messages(channel: str, ctx: Context[Any, Any], limit: int = 20) -> str:
        return json.dumps({"messages": [{"text": t} for t in posts[(episode(ctx), channel)][-limit:]]})

    return server


def memory_manager(**options: Any) -> ToolManager:
    """A manager over the in-process calc and messaging servers."""
    return ToolManager.in_memory({"calc": make_calc(), "messaging": make_messaging()}, **options)


def crashy_manager() -> ToolManager:
    """A manager over a real stdio server whose `crash` tool kills the server process."""
    entry = {"command": sys.executable, "args": [str(CRASHY)], "start_timeout": 30, "call_timeout": 10}
    return ToolManager(ServersConfig.from_dict({"mcpServers": {"crashy": entry}}, source="<test>"))


def make_task(**fields: Any) -> Task:
    """A numeric calc task, overridable field by field."""
    raw: dict[str, Any] = {
        "id": "mul-1",
        "prompt": "What is 3 times 4.5?",
        "servers": ["calc"],
        "difficulty": "easy",
        "answer": "13.5",
        "checker": {"type": "numeric", "rel_tol": 1e-6, "abs_tol": 0.005},
    }
    raw.update(fields)
    return task_from_dict(raw)
