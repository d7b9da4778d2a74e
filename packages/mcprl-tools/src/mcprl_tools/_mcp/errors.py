"""What can go wrong on a connection, in terms that do not name the SDK: the connection ended, a request
could not be encoded, the server answered with a JSON-RPC error."""

from __future__ import annotations

import mcp_types

__all__ = [
    "INVALID_PARAMS",
    "METHOD_NOT_FOUND",
    "ConnectionLostError",
    "RemoteError",
    "UnsendableRequestError",
]


class ConnectionLostError(ConnectionError):
    """The server's connection closed (process exited, stream ended) while a request was pending."""


class UnsendableRequestError(ValueError):
    """A request could not be encoded as JSON for the wire; it was not sent and the connection is intact."""


class RemoteError(Exception):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message


INVALID_PARAMS = mcp_types.INVALID_PARAMS
METHOD_NOT_FOUND = mcp_types.METHOD_NOT_FOUND


INVALID_PARAMS = mcp_types.INVALID_PARAMS
METHOD_NOT_FOUND = mcp_types.METHOD_NOT_FOUND
