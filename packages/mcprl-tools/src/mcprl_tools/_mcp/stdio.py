"""Stdio servers: spawned in their own process group, newline-delimited JSON-RPC on stdin/stdout, stopped
with an escalation that also reaches the descendants they leave behind.

Spawned here rather than with the SDK's `stdio_client`: the SDK leaves a server's descendants running when the
server exits by itself or crashes, and its kill escalation cannot be shortened for a server already known to
be hung.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.abc
import mcp_types
import structlog
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from mcprl_tools._mcp.streams import EncodingWriteStream
from mcprl_tools.config import ServerConfig

__all__ = ["EXIT_GRACE_S", "StderrTail", "stdio_transport"]

logger = structlog.get_logger()

# Escalation after stdin closes: wait for a clean exit, then SIGTERM the group, then SIGKILL it.
EXIT_GRACE_S = 2.0
_TERM_GRACE_S = 2.0
_REAP_S = 2.0
_POLL_S = 0.005


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
async def stdio_transport(
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
            yield read_recv, EncodingWriteStream(write_send, forward_bytes=True)
        finally:
            with anyio.CancelScope(shield=True):
                write_send.close()
                read_recv.close()
                await _stop_process(process, grace())
            tg.cancel_scope.cancel()
