"""Errors raised by mcprl-tools.

Tool and infrastructure faults during a call are *returned* as `ToolResult`s, never raised; the classes
here cover configuration, start-up, replay and programming errors.
"""

from __future__ import annotations


class ToolsError(Exception):
    """Base class of every error raised by mcprl-tools."""


class ConfigError(ToolsError, ValueError):
    """A servers configuration is invalid (names the file, server and key)."""


class MissingVariableError(ConfigError, KeyError):
    """A `${VAR}` reference in a server's configuration names an unset environment variable."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ServerStartError(ToolsError, RuntimeError):
    """One or more servers could not start within their start timeout."""


class ManagerNotStartedError(ToolsError, RuntimeError):
    """The manager was used outside its `async with` block."""


class CassetteError(ToolsError, ValueError):
    """A record/replay cassette is unreadable or has no entry for a call being replayed."""
