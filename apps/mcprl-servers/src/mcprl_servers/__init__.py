"""Offline MCP servers: calculator, finance, search, python sandbox, messaging.

Each server is a module runnable as ``python -m mcprl_servers.<name>`` whose ``build_server()`` returns the
``MCPServer`` for in-process use. This package root imports no server module (so ``python -m`` never
imports a server twice); it re-exports the configuration helper and the errors.
"""

from mcprl_servers.config import SERVER_NAMES, ServerName, default_servers_config
from mcprl_servers.errors import ExpressionError, FixtureError, ServersError

__all__ = [
    "SERVER_NAMES",
    "ExpressionError",
    "FixtureError",
    "ServerName",
    "ServersError",
    "default_servers_config",
]
