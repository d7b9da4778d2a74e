"""``mcpServers`` configuration launching the bundled servers with the current interpreter."""

from __future__ import annotations

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
        servers[name] = {"command": sys.executable, "args": ["-m", module], "stateful": name in _STATEFUL}
    return {"mcpServers": servers}
