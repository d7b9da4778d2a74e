"""Errors raised by the offline servers' libraries (never by the MCP tools themselves, which raise ToolError)."""

from __future__ import annotations

__all__ = ["ExpressionError", "FixtureError", "SandboxUnavailableError", "ServersError"]


class ServersError(Exception):
    """Base class of every mcprl_servers error."""


class ExpressionError(ServersError, ValueError):
    """An arithmetic expression is malformed, unsafe or cannot be evaluated (the message is model-facing)."""


class FixtureError(ServersError, RuntimeError):
    """A shipped data file (finance fixture, search corpus) is missing or does not match its generator."""


class SandboxUnavailableError(ServersError, RuntimeError):
    """The python server's isolation cannot be set up on this machine; the server refuses to start."""
