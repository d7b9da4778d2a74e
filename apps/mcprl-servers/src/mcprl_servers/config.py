"""``mcpServers`` configuration launching the bundled servers with the current interpreter."""

from __future__ import annotations

import os
import sys
from typing import Literal, get_args

__all__ = ["SERVER_NAMES", "ServerName", "default_servers_config"]

ServerName = Literal["calculator", "finance", "search", "python", "messaging"]
SERVER_NAMES: tuple[ServerName, ...] = get_args(ServerName)
_MODULES: dict[str, str] = {
    "calculator": "mcprl_servers.calculator",
    "finance": "mcprl_servers.finance",
    "search": "mcprl_servers.search",
    "python": "mcprl_servers.python_sandbox",
    "messaging": "mcprl_servers.messaging",
}
_STATEFUL = frozenset({"messaging"})
"""Servers that keep per-episode state between calls (a restart loses it; the others keep nothing)."""


def default_servers_config(names: list[str] | tuple[str, ...] | None = None) -> dict[str, object]:
    """An ``{"mcpServers": {...}}`` dict that starts the chosen bundled servers as stdio subprocesses.

    Args:
        names: Servers to include (``calculator``, ``finance``, ``search``, ``python``, ``messaging``);
            all of them when None.

    Returns:
        A config in the standard ``mcpServers`` shape: ``command`` is ``sys.executable`` and ``args`` is
        ``["-m", "mcprl_servers.<module>"]``; ``stateful`` says whether a restart loses episode state.

    Raises:
        ValueError: A name is not one of the bundled servers.
    """
    chosen = list(SERVER_NAMES) if names is None else list(names)
    servers: dict[str, object] = {}
    for name in chosen:
        if name not in _MODULES:
            raise ValueError(f"unknown bundled server {name!r}; choose from {', '.join(SERVER_NAMES)}")
        module = _MODULES[name]
        entry: dict[str, object] = {
            "command": sys.executable,
            "args": ["-m", module],
            "stateful": name in _STATEFUL,
        }
        servers[name] = entry | _sandbox_call_limits() if name == "python" else entry
    return {"mcpServers": servers}


SANDBOX_DEADLINE_SLACK_S = 5.0
"""The caller's deadline of a ``run_python`` call beyond the sandbox's own (start-up, transport, kill)."""


def _sandbox_call_limits() -> dict[str, object]:
    """The caller's limits for the python server, derived from the sandbox's (``MCPRL_SANDBOX_*``).

    The caller waits past the sandbox's own wall-clock deadline, so code that runs out of time ends as the
    sandbox's ``timed out`` (the model's fault, shown to it), never as the caller giving up (an
    infrastructure fault that would excuse it). And the caller sends no more calls at once than the
    sandbox runs at once: calls queue on the caller's side, where the deadline starts at dispatch and the
    wait is measured, instead of inside the server, where queueing would eat the deadline unseen.
    """
    from mcprl_servers.sandbox.config import ENV_PREFIX, SandboxConfig

    sandbox = SandboxConfig.from_env()
    limits: dict[str, object] = {
        "call_timeout": sandbox.deadline_s + SANDBOX_DEADLINE_SLACK_S,
        "max_concurrency": sandbox.max_concurrency,
    }
    # MCP clients start a server with a minimal environment: hand it the settings these limits came from.
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    return limits | ({"env": forwarded} if forwarded else {})
