"""A streamable HTTP server on loopback (a real uvicorn subprocess): calls, meta, and a crash mid-call."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest
from anyio.streams.text import TextReceiveStream
from tools_testkit import FLAKY, MARKER_VAR, marked_processes

from mcprl_tools import ServersConfig, ToolManager
from mcprl_tools._mcp import UnsendableRequestError, connect

pytestmark = pytest.mark.anyio


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
async def http_server(marker: str) -> AsyncIterator[tuple[str, anyio.abc.Process]]:
    """The flaky server over streamable HTTP; yields its URL once uvicorn reports it is listening."""
    port = _free_port()
    env = {MARKER_VAR: marker, "PATH": "/usr/bin:/bin"}
    process = await anyio.open_process([sys.executable, str(FLAKY), "--http-port", str(port)], env=env)
    try:
        assert process.stderr is not None
        with anyio.fail_after(30):
            seen = ""
            async for chunk in TextReceiveStream(process.stderr):
                seen += chunk
                if "Uvicorn running on" in seen or "Application startup complete" in seen:
                    break
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
        await process.aclose()


async def test_calls_over_streamable_http(http_server: tuple[str, anyio.abc.Process], marker: str) -> None:
    url, _ = http_server
    cfg = ServersConfig.from_dict({"mcpServers": {"web": {"url": url, "call_timeout": 10}}})
    async with ToolManager(cfg) as manager:
        assert "add" in {t.name for t in manager.tools}
        added = await manager.call("add", {"a": 20, "b": 22})
        who = await manager.call("web.whoami", {}, episode_id="ep-http")
        results = []

        async def one(i: int) -> None:
            results.append((await manager.call("nap", {"seconds": 0.01, "text": str(i)})).text)

        async with anyio.create_task_group() as tg:
            for i in range(32):
                tg.start_soon(one, i)
    assert added.text == "42"
    assert who.text == "ep-http"
    assert sorted(results, key=int) == [str(i) for i in range(32)]


async def test_http_server_killed_mid_call_is_an_infra_error_within_a_second(
    http_server: tuple[str, anyio.abc.Process], marker: str
) -> None:
    url, process = http_server
    cfg = ServersConfig.from_dict(
        {"mcpServers": {"web": {"url": url, "call_timeout": 10, "ping_timeout": 1, "start_timeout": 2}}}
    )
    async with ToolManager(cfg) as manager:
        t0 = time.monotonic()
        crashed = await manager.call("crash", {})
        elapsed = time.monotonic() - t0
        with anyio.fail_after(15):
            later = await manager.call("add", {"a": 1, "b": 1})
    await process.wait()
    assert crashed.kind == "infra_error"
    assert crashed.error_type in ("crashed", "transport")
    assert elapsed < 1.0
    assert later.is_infra_error
    assert marked_processes(marker) == []


async def test_an_unencodable_request_over_http_fails_alone(
    http_server: tuple[str, anyio.abc.Process],
) -> None:
    """The adapter encodes in the caller's task, so the SDK's HTTP writer never sees what it cannot send."""
    url, _ = http_server
    cfg = ServersConfig.from_dict({"mcpServers": {"web": {"url": url, "call_timeout": 10}}}).servers["web"]
    lost: list[bool] = []
    with anyio.fail_after(30):
        async with connect(cfg, on_lost=lambda: lost.append(True)) as conn:
            with pytest.raises(UnsendableRequestError, match="surrogates not allowed"):
                await conn.call_tool("echo", {"text": "\ud800"}, None)
            echoed = await conn.call_tool("echo", {"text": "after"}, None)
    assert (echoed.text, lost) == ("after", [])
