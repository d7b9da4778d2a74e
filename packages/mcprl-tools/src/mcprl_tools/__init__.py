"""MCP tool-server manager: launch, pool, time out, restart, call."""

from mcprl_tools.config import MissingVariables, RestartPolicy, ServerConfig, ServersConfig
from mcprl_tools.errors import (
    CassetteError,
    ConfigError,
    ManagerNotStartedError,
    MissingVariableError,
    ServerStartError,
    ToolsError,
)
from mcprl_tools.manager import ToolManager
from mcprl_tools.output import truncate_text, truncation_marker
from mcprl_tools.results import ToolResult, ToolSpec

__all__ = [
    "CassetteError",
    "ConfigError",
    "ManagerNotStartedError",
    "MissingVariableError",
    "MissingVariables",
    "RestartPolicy",
    "ServerConfig",
    "ServerStartError",
    "ServersConfig",
    "ToolManager",
    "ToolResult",
    "ToolSpec",
    "ToolsError",
    "truncate_text",
    "truncation_marker",
]
