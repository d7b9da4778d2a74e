"""Model text cannot break a connection: what JSON cannot carry is the model's fault, over real stdio servers.

RELIABILITY.md scenario 18.
"""

from __future__ import annotations

import anyio
import pytest
from tools_testkit import flaky_server, marked_processes

from mcprl_tools import ServersConfig, ToolManager
from mcprl_tools._mcp import UnsendableRequestError, connect

pytestmark = pytest.mark.anyio

HOSTILE: list[dict[str, object]] = [
    {"text": "\ud800"},
    {"text": "ok", "\udc80": "key"},
    {"text": "a\x00b"},
    {"text": "x", "extra": float("nan")},
    {"a": 10**5000, "b": 1},
    {"text": "x" * (2 << 20)},
]


def _config(marker: str, **options: object) -> ServersConfig:
    return ServersConfig.from_dict({"mcpServers": {"flaky": flaky_server(marker, **options)}}, source="<t>")


async def test_unencodable_request_fails_alone_and_the_connection_lives_on(marker: str) -> None:
    """Below the manager's own check: the adapter turns the SDK's serialisation error into one failed
    request while another call is in flight on the same session."""
    cfg = _config(marker, call_timeout=10).servers["flaky"]
    lost: list[bool] = []
    async with connect(cfg, on_lost=lambda: lost.append(True)) as conn:
        pid = (await conn.call_tool("pid", {}, None)).structured
        napped: list[str] = []

        async def nap() -> None:
            napped.append((await conn.call_tool("nap", {"seconds": 0.5, "text": "slept"}, None)).text)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(nap)
                with pytest.raises(UnsendableRequestError, match="surrogates not allowed"):
                    await conn.call_tool("echo", {"text": "lone \ud800 surrogate"}, None)
                with pytest.raises(UnsendableRequestError):
                    await conn.call_tool("echo", {"text": "fine"}, "episode-\udfff")
                deep: object = "x"
                for _ in range(5_000):
                    deep = [deep]
                with pytest.raises(UnsendableRequestError, match="depth"):
                    await conn.call_tool("echo", {"text": deep}, None)
            echoed = await conn.call_tool("echo", {"text": "still here"}, None)
            same_pid = (await conn.call_tool("pid", {}, None)).structured
    assert napped == ["slept"]
    assert echoed.text == "still here"
    assert same_pid == pid
    assert lost == []
    assert marked_processes(marker) == []


async def test_hostile_arguments_are_invalid_arguments_and_no_server_restarts(marker: str) -> None:
    cfg = _config(marker, call_timeout=10, max_argument_bytes=1 << 20)
    async with ToolManager(cfg) as manager:
        pid = (await manager.call("pid", {})).structured
        results = [await manager.call("echo", args) for args in HOSTILE]
        nested: object = "x"
        for _ in range(5000):
            nested = [nested]
        results.append(await manager.call("echo", {"text": nested}))
        after = await manager.call("pid", {})
        m = manager.metrics()
        step = manager.step_metrics()
    assert [(r.kind, r.error_type) for r in results] == [("tool_error", "invalid_arguments")] * len(results)
    assert all("nothing was sent" in r.text for r in results)
    assert all(r.generation is None for r in results)
    # The text goes back to the model: it must itself be encodable.
    for r in results:
        r.text.encode("utf-8")
    assert (after.structured, after.generation) == (pid, 1)
    assert m["tools/flaky/restarts"] == 0
    assert m.get("tools/errors/transport", 0) == 0
    assert (step["tools/step/infra_errors"], step["tools/step/restarts"]) == (0, 0)
    assert marked_processes(marker) == []
