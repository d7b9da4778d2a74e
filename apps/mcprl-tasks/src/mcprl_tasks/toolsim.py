"""The bundled servers' tool results computed in process, for demonstrations.

Each function runs the same code as the MCP tool (finance data, calculator, search index, messaging
workspace), so a demonstration's ``tool`` messages are byte-identical to what the servers return for a fresh
episode (a test replays demonstrations through the real servers). ``run_python`` is not simulated here: the
demonstration passes in the output of the code it wrote.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.calculator import calculate_text
from mcprl_servers.finance import FinanceData
from mcprl_servers.fixture import load_fixture
from mcprl_servers.results import to_json
from mcprl_servers.workspace import Workspace
from mcprl_tasks.errors import TasksError
from mcprl_tasks.search_families import search_index

__all__ = [
    "SIMULATED_TOOLS",
    "known_symbol",
    "simulate_tool",
    "simulate_tool_error",
    "tool_call",
    "tool_call_text",
]

_EPISODE = "mcprl-tasks-demo"  # never posted to: reads see exactly the seed state


@functools.cache
def _finance() -> FinanceData:
    return FinanceData(load_fixture())


@functools.cache
def _workspace() -> Workspace:
    return Workspace(max_episodes=1)


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One structured call of an assistant message's ``tool_calls`` (OpenAI's chat format)."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One tool call as text in the Hermes/Qwen form (what the embedded tiny model's template renders)."""
    return (
        "<tool_call>"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "</tool_call>"
    )


SIMULATED_TOOLS: frozenset[str] = frozenset(
    {
        "get_quote", "search_symbols", "get_profile", "calculate", "search", "fetch_document",
        "list_channels", "list_users", "read_messages", "search_messages", "post_message",
    }
)  # fmt: skip


def simulate_tool(name: str, arguments: dict[str, Any]) -> str:
    """What the bundled server returns for a successful call in a fresh episode.

    Raises:
        TasksError: ``name`` is not simulated (see :data:`SIMULATED_TOOLS`).
    """
    match name:
        case "get_quote":
            return to_json(_finance().quote(arguments["symbol"]))
        case "search_symbols":
            return to_json(_finance().search(arguments["query"]))
        case "get_profile":
            return to_json(_finance().profile(arguments["symbol"]))
        case "calculate":
            return calculate_text(arguments["expression"])
        case "search":
            return to_json(search_index().search(arguments["query"], arguments.get("k", 5)))
        case "fetch_document":
            return to_json(search_index().fetch(arguments["doc_id"]))
        case "list_channels":
            return to_json({"channels": _workspace().list_channels()})
        case "list_users":
            return to_json({"users": _workspace().list_users()})
        case "read_messages":
            return to_json(_workspace().read(_EPISODE, arguments["channel"], arguments.get("limit", 20)))
        case "search_messages":
            return to_json(_workspace().search(_EPISODE, arguments["query"]))
        case "post_message":
            return to_json({"ok": True, "channel": arguments["channel"].strip().lstrip("#").lower()})
        case _:
            raise TasksError(f"demonstrations do not cover tool {name!r}")


def known_symbol(symbol: str) -> bool:
    """Whether the finance fixture lists ``symbol`` (as ``get_quote`` normalises it)."""
    try:
        _finance().quote(symbol)
    except ToolError:
        return False
    return True


def simulate_tool_error(name: str, arguments: dict[str, Any]) -> str:
    """The tool result an agent sees for a call the server refuses, as the MCP SDK words it.

    Raises:
        TasksError: The call succeeds (there is no error to show), or ``name`` is not simulated.
    """
    try:
        simulate_tool(name, arguments)
    except ToolError as exc:
        return f"Error executing tool {name}: {exc}"
    raise TasksError(f"{name}({arguments}) succeeds; there is no error to simulate")
