"""A live session with one server (`Connection`) and how one is opened (`connect`) over stdio, streamable
HTTP or in process; tool listings and results come out as plain `RawTool` / `RawResult` values."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import attrs
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from mcprl_tools._mcp.errors import ConnectionLostError, RemoteError, UnsendableRequestError
from mcprl_tools._mcp.stdio import EXIT_GRACE_S, StderrTail, stdio_transport
from mcprl_tools._mcp.streams import watched
from mcprl_tools.config import ServerConfig

__all__ = ["EPISODE_META_KEY", "Connection", "RawResult", "RawTool", "connect", "is_server_instance"]

EPISODE_META_KEY = "mcprl/episode_id"


@attrs.frozen(kw_only=True)
class RawTool:
    """A tool as listed by a server."""

    name: str
    description: str
    input_schema: dict[str, Any]


@attrs.frozen(kw_only=True)
class RawResult:
    """A `tools/call` result, content flattened to text."""

    text: str
    structured: object | None
    is_error: bool


def is_server_instance(obj: object) -> bool:
    """Whether `obj` is an in-process MCP server the SDK can connect to."""
    return isinstance(obj, MCPServer | Server)


def _block_text(block: mcp_types.ContentBlock) -> str:
    match block:
        case mcp_types.TextContent(text=text):
            return text
        case mcp_types.ImageContent(mime_type=mime, data=data):
            return f"[image {mime}, {len(data) * 3 // 4} bytes]"
        case mcp_types.AudioContent(mime_type=mime, data=data):
            return f"[audio {mime}, {len(data) * 3 // 4} bytes]"
        case mcp_types.EmbeddedResource(resource=mcp_types.TextResourceContents(text=text)):
            return text
        case mcp_types.EmbeddedResource(resource=mcp_types.BlobResourceContents(uri=uri, blob=blob)):
            return f"[resource {uri}, {len(blob) * 3 // 4} bytes]"
        case mcp_types.ResourceLink(uri=uri, name=name):
            return f"[resource link {name}: {uri}]"
        case _:
            return f"[{type(block).__name__}]"


class Connection:
    """A live, initialized session with one server. Enter and exit it in the same task."""

    def __init__(self, client: Client, on_lost: Callable[[], None]) -> None:
        self._client = client
        self._on_lost = on_lost

    async def list_tools(self) -> list[RawTool]:
        """All tools of the server (follows pagination)."""
        tools: list[RawTool] = []
        cursor: str | None = None
        while True:
            page = await self._guard(self._client.session.list_tools(params=_page(cursor)))
            tools.extend(
                RawTool(name=t.name, description=t.description or "", input_schema=dict(t.input_schema))
                for t in page.tools
            )
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], episode_id: str | None) -> RawResult:
        """One `tools/call`; `episode_id` travels in the request `_meta`.

        Raises:
            UnsendableRequestError: The SDK cannot encode the request (nothing was sent).
            ConnectionLostError: The connection ended while the call was pending.
            RemoteError: The server answered with a JSON-RPC error.
        """
        try:
            # The SDK dumps the request before its dispatcher writes it; what fails there (nesting past the
            # serialiser's depth limit) raises a bare ValueError that says nothing of where it came from.
            mcp_types.CallToolRequestParams(name=name, arguments=arguments).model_dump_json()
        except (ValueError, RecursionError) as exc:
            detail = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
            raise UnsendableRequestError(detail) from exc
        meta: Any = {EPISODE_META_KEY: episode_id} if episode_id is not None else None
        result = await self._guard(self._client.session.call_tool(name, arguments, meta=meta))
        text = "\n".join(_block_text(b) for b in result.content)
        return RawResult(text=text, structured=result.structured_content, is_error=bool(result.is_error))

    async def _guard(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._on_lost()
                raise ConnectionLostError(exc.message) from exc
            raise RemoteError(exc.code, exc.message) from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self._on_lost()
            raise ConnectionLostError(f"connection closed: {type(exc).__name__}") from exc


def _page(cursor: str | None) -> mcp_types.PaginatedRequestParams | None:
    return mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None


@asynccontextmanager
async def connect(
    cfg: ServerConfig,
    *,
    on_lost: Callable[[], None],
    memory_server: object | None = None,
    stderr: StderrTail | None = None,
    shutdown_grace: Callable[[], float] = lambda: EXIT_GRACE_S,
) -> AsyncIterator[Connection]:
    """Open and initialize a session with the server `cfg` describes.

    Args:
        cfg: The server's configuration.
        memory_server: The in-process server object for `transport == "memory"`.
        on_lost: Called when the connection ends (server exited, stream closed).
        stderr: Receives the tail of a stdio server's stderr.
        shutdown_grace: Asked at shutdown: seconds to wait after closing stdin (and after SIGTERM).

    Raises:
        ConnectionLostError: The server went away during initialize.
        RemoteError: The server rejected initialize.
        OSError: The command could not be spawned.
    """
    target: Any
    match cfg.transport:
        case "stdio":
            target = watched(stdio_transport(cfg, stderr, shutdown_grace), on_lost, check_writes=False)
        case "http":
            assert cfg.url is not None
            http = create_mcp_http_client(headers=dict(cfg.headers) or None)
            target = watched(streamable_http_client(cfg.url, http_client=http), on_lost, check_writes=True)
        case "memory":
            if not is_server_instance(memory_server):
                raise TypeError(
                    f"server {cfg.name!r}: in-memory server must be an MCPServer, got {memory_server!r}"
                )
            target = memory_server
    client = Client(target, cache=None)
    try:
        async with client:
            yield Connection(client, on_lost)
    except MCPError as exc:
        if exc.code == mcp_types.CONNECTION_CLOSED:
            raise ConnectionLostError(f"connection closed during initialize: {exc.message}") from exc
        raise RemoteError(exc.code, exc.message) from exc
    finally:
        if cfg.transport == "http":
            await http.aclose()  # pyright: ignore[reportPossiblyUnboundVariable]
