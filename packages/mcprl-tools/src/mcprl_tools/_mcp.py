"""The one module that imports the `mcp` SDK: connections to stdio, streamable HTTP and in-process servers.

Everything else in mcprl-tools sees plain `RawTool` / `RawResult` values and the `Connection` below, so an
SDK upgrade touches this file only. Stdio servers are spawned here too (not with the SDK's `stdio_client`):
the SDK leaves a server's descendants running when the server exits by itself or crashes, and its kill
escalation cannot be shortened for a server already known to be hung.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
import attrs
import mcp_types
import structlog
from mcp import Client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from mcprl_tools.config import ServerConfig

EPISODE_META_KEY = "mcprl/episode_id"

logger = structlog.get_logger()

# Escalation after stdin closes: wait for a clean exit, then SIGTERM the group, then SIGKILL it.
_EXIT_GRACE_S = 2.0
_TERM_GRACE_S = 2.0
_REAP_S = 2.0
_POLL_S = 0.005


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


class ConnectionLostError(ConnectionError):
    """The server's connection closed (process exited, stream ended) while a request was pending."""


class UnsendableRequestError(ValueError):
    """A request could not be encoded as JSON for the wire; it was not sent and the connection is intact."""


def encode_message(message: SessionMessage) -> bytes:
    """The newline-terminated JSON of one outgoing message.

    Raises:
        UnsendableRequestError: The SDK's serialiser cannot encode it (a lone surrogate, nesting past its
            depth limit, ...).
    """
    try:
        data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
    except (ValueError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
        detail = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
        raise UnsendableRequestError(detail) from exc
    return (data + "\n").encode()


class _EncodingWriteStream:
    """The write side handed to the SDK: encodes in the sender's task, so an unencodable message fails
    that one request (the SDK's dispatcher forgets it) instead of killing the task that writes the wire.

    With `forward_bytes`, the encoded bytes go on (stdio, whose writer only copies bytes); otherwise the
    message itself goes on to the SDK's own transport, which encodes it again the same way.
    """

    def __init__(self, inner: Any, *, forward_bytes: bool) -> None:
        self._inner = inner
        self._forward_bytes = forward_bytes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, message: SessionMessage) -> None:
        data = encode_message(message)
        await self._inner.send(data if self._forward_bytes else message)

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class RemoteError(Exception):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message


INVALID_PARAMS = mcp_types.INVALID_PARAMS
METHOD_NOT_FOUND = mcp_types.METHOD_NOT_FOUND


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


class _WatchedReadStream:
    """Wraps a transport's read stream and reports end-of-stream (the server went away)."""

    def __init__(self, inner: Any, on_eof: Callable[[], None]) -> None:
        self._inner = inner
        self._on_eof = on_eof

    def __getattr__(self, name: str) -> Any:  # last_context and friends
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_eof()
            raise

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched(transport: Any, on_eof: Callable[[], None], *, check_writes: bool) -> AsyncIterator[Any]:
    """`transport`'s streams, the read side reporting end-of-stream; with `check_writes`, each outgoing
    message is encoded in the sender's task first (for transports that encode in a task of their own)."""
    async with transport as (read_stream, write_stream):
        checked = _EncodingWriteStream(write_stream, forward_bytes=False) if check_writes else write_stream
        yield _WatchedReadStream(read_stream, on_eof), checked


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


class StderrTail:
    """Keeps the last `cap` bytes a server wrote to stderr (bounded memory, no files)."""

    def __init__(self, cap: int = 2048) -> None:
        self.cap = cap
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > 2 * self.cap:
            del self._buf[: -self.cap]

    def text(self) -> str:
        """The tail, decoded leniently."""
        return bytes(self._buf[-self.cap :]).decode("utf-8", errors="replace").strip()


async def _wait_exit(process: anyio.abc.Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await process.wait()
        return True
    return process.returncode is not None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _stop_process(process: anyio.abc.Process, grace: float) -> None:
    """stdin close → SIGTERM to the group → SIGKILL to the group; then SIGKILL the group once more.

    The last kill reaches descendants left in the server's process group after the server itself exited
    (crashed, or quit on stdin close): the SDK's own stdio client leaves those running.
    """
    pgid = process.pid  # start_new_session: the server leads its own group
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    if not await _wait_exit(process, grace):
        _signal_group(pgid, signal.SIGTERM)
        if not await _wait_exit(process, min(grace, _TERM_GRACE_S)):
            _signal_group(pgid, signal.SIGKILL)
            await _wait_exit(process, _REAP_S)
    _signal_group(pgid, signal.SIGKILL)
    # Non-child members cannot be waited for; poll (bounded) until the kernel has removed the group.
    for _ in range(int(_REAP_S / _POLL_S)):
        if not _group_alive(pgid):
            break
        await anyio.sleep(_POLL_S)
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.aclose()


@asynccontextmanager
async def _stdio_transport(
    cfg: ServerConfig, stderr: StderrTail | None, grace: Callable[[], float]
) -> AsyncIterator[tuple[Any, Any]]:
    """Newline-delimited JSON-RPC over a subprocess's stdin/stdout, in its own process group.

    Non-JSON-RPC lines on stdout are skipped. Lines are assembled from chunks without re-copying, so one
    huge line costs linear time.
    """
    assert cfg.command is not None
    process = await anyio.open_process(
        [cfg.command, *cfg.args],
        env=get_default_environment() | dict(cfg.env),
        stderr=subprocess.PIPE,
        cwd=cfg.cwd,
        start_new_session=True,
    )
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[bytes](0)

    async def deliver(line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            logger.debug(
                "mcp_stdout_not_jsonrpc", server=cfg.name, head=cfg.redact(line[:80].decode(errors="replace"))
            )
            return
        await read_send.send(SessionMessage(message))

    async def reader() -> None:
        assert process.stdout is not None
        pending: list[bytes] = []
        async with read_send:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    start = 0
                    while (newline := chunk.find(b"\n", start)) != -1:
                        pending.append(chunk[start:newline])
                        line = b"".join(pending)
                        pending.clear()
                        await deliver(line)
                        start = newline + 1
                    if start < len(chunk):
                        pending.append(chunk[start:])

    async def writer() -> None:
        assert process.stdin is not None
        async with write_recv:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for data in write_recv:
                    await process.stdin.send(data)

    async def drain_stderr() -> None:
        # Always drained: a server blocked on a full stderr pipe would look hung.
        assert process.stderr is not None
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                if stderr is not None:
                    stderr.feed(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        tg.start_soon(drain_stderr)
        try:
            yield read_recv, _EncodingWriteStream(write_send, forward_bytes=True)
        finally:
            with anyio.CancelScope(shield=True):
                write_send.close()
                read_recv.close()
                await _stop_process(process, grace())
            tg.cancel_scope.cancel()


@asynccontextmanager
async def connect(
    cfg: ServerConfig,
    *,
    on_lost: Callable[[], None],
    memory_server: object | None = None,
    stderr: StderrTail | None = None,
    shutdown_grace: Callable[[], float] = lambda: _EXIT_GRACE_S,
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
            target = _watched(_stdio_transport(cfg, stderr, shutdown_grace), on_lost, check_writes=False)
        case "http":
            assert cfg.url is not None
            http = create_mcp_http_client(headers=dict(cfg.headers) or None)
            target = _watched(streamable_http_client(cfg.url, http_client=http), on_lost, check_writes=True)
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
