"""Wrappers around a transport's streams: writes encoded in the sender's task, end-of-stream reported.

An unencodable request must fail that one request, not the task that writes the wire; a server that goes
away must be noticed by the session's owner, not only by the pending request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self

import anyio
from mcp.shared.message import SessionMessage

from mcprl_tools._mcp.errors import UnsendableRequestError

__all__ = ["EncodingWriteStream", "encode_message", "watched"]


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


class _StreamProxy:
    """A transport stream passed through: attributes (``last_context`` and friends), closing, ``async with``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class EncodingWriteStream(_StreamProxy):
    """The write side handed to the SDK: encodes in the sender's task, so an unencodable message fails
    that one request (the SDK's dispatcher forgets it) instead of killing the task that writes the wire.

    With `forward_bytes`, the encoded bytes go on (stdio, whose writer only copies bytes); otherwise the
    message itself goes on to the SDK's own transport, which encodes it again the same way.
    """

    def __init__(self, inner: Any, *, forward_bytes: bool) -> None:
        super().__init__(inner)
        self._forward_bytes = forward_bytes

    async def send(self, message: SessionMessage) -> None:
        data = encode_message(message)
        await self._inner.send(data if self._forward_bytes else message)

    def close(self) -> None:
        self._inner.close()


class _WatchedReadStream(_StreamProxy):
    """Wraps a transport's read stream and reports end-of-stream (the server went away)."""

    def __init__(self, inner: Any, on_eof: Callable[[], None]) -> None:
        super().__init__(inner)
        self._on_eof = on_eof

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


@asynccontextmanager
async def watched(transport: Any, on_eof: Callable[[], None], *, check_writes: bool) -> AsyncIterator[Any]:
    """`transport`'s streams, the read side reporting end-of-stream; with `check_writes`, each outgoing
    message is encoded in the sender's task first (for transports that encode in a task of their own)."""
    async with transport as (read_stream, write_stream):
        checked = EncodingWriteStream(write_stream, forward_bytes=False) if check_writes else write_stream
        yield _WatchedReadStream(read_stream, on_eof), checked
