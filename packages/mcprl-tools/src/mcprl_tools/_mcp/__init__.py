"""The one package that imports the `mcp` SDK: connections to stdio, streamable HTTP and in-process servers.

Everything else in mcprl-tools sees plain `RawTool` / `RawResult` values, the errors below and `Connection`,
so an SDK upgrade touches this package only. Its modules: `connection` (a session and how it is opened),
`stdio` (spawning and stopping stdio servers), `streams` (the wrappers around a transport's streams),
`errors` (what can go wrong on a connection).
"""

from mcprl_tools._mcp.connection import (
    EPISODE_META_KEY,
    Connection,
    RawResult,
    RawTool,
    connect,
    is_server_instance,
)
from mcprl_tools._mcp.errors import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    ConnectionLostError,
    RemoteError,
    UnsendableRequestError,
)
from mcprl_tools._mcp.stdio import StderrTail
from mcprl_tools._mcp.streams import encode_message

__all__ = [
    "EPISODE_META_KEY",
    "INVALID_PARAMS",
    "METHOD_NOT_FOUND",
    "Connection",
    "ConnectionLostError",
    "RawResult",
    "RawTool",
    "RemoteError",
    "StderrTail",
    "UnsendableRequestError",
    "connect",
    "encode_message",
    "is_server_instance",
]
