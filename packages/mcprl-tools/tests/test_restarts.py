"""Server generations, the cool-down after the crash budget, and per-step infrastructure metrics.

Real stdio servers (RELIABILITY.md scenarios 1, 19).
"""

from __future__ import annotations

import anyio
import pytest
from tools_testkit import flaky_server, marked_processes

from mcprl_tools import ServersConfig, ToolManager, ToolResult

pytestmark = pytest.mark.anyio


def _config(**servers: dict[str, object]) -> ServersConfig:
    return ServersConfig.from_dict({"mcpServers": servers}, source="<test>")


async def _until_ready(manager: ToolManager, server: str) -> None:
    with anyio.fail_after(30):
        assert await manager.wait_ready(server)


async def test_every_result_carries_the_generation_of_the_process_that_served_it(marker: str) -> None:
    cfg = _config(
        keeper=flaky_server(marker, restart={"backoff_initial": 0.05}),
        plain=flaky_server(marker, stateful=False),
    )
    async with ToolManager(cfg) as manager:
        before = await manager.call("keeper.pid", {})
        crashed = await manager.call("keeper.crash", {})
        await _until_ready(manager, "keeper")
        after = await manager.call("keeper.pid", {})
        stateless = await manager.call("plain.pid", {})
        unknown = await manager.call("nope", {})
    assert (before.generation, before.stateful) == (1, True)
    assert (crashed.error_type, crashed.generation) == ("crashed", 1)
    assert (after.ok, after.generation) == (True, 2)
    assert after.structured != before.structured
    assert (stateless.generation, stateless.stateful) == (1, False)
    assert (unknown.generation, unknown.stateful) == (None, False)
    assert marked_processes(marker) == []


async def test_an_unavailable_server_is_retried_after_its_cooldown(marker: str) -> None:
    cfg = _config(flaky=flaky_server(marker, restart={"max_crashes": 0, "cooldown": 0.5}))
    async with ToolManager(cfg) as manager:
        await manager.call("crash", {})
        refused = await manager.call("add", {"a": 1, "b": 2})
        assert manager.server_state("flaky") == "unavailable"
        await _until_ready(manager, "flaky")
        back = await manager.call("add", {"a": 1, "b": 2})
        m = manager.metrics()
    assert refused.error_type == "unavailable"
    assert (back.ok, back.text, back.generation) == (True, "3", 2)
    assert m["tools/flaky/available"] == 1
    assert m["tools/flaky/restarts"] == 1
    assert marked_processes(marker) == []


async def test_step_metrics_report_restarts_timeouts_and_queue_waits_once(marker: str) -> None:
    cfg = _config(
        flaky=flaky_server(marker, call_timeout=0.5, max_concurrency=1, restart={"backoff_initial": 0.05})
    )
    async with ToolManager(cfg) as manager:
        assert manager.step_metrics()["tools/step/calls"] == 0
        await manager.call("crash", {})
        await _until_ready(manager, "flaky")
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(manager.call, "nap", {"seconds": 0.3})
        timed_out = await manager.call("nap", {"seconds": 5})
        first = manager.step_metrics()
        second = manager.step_metrics()
    assert timed_out.error_type == "timeout"
    assert first["tools/step/calls"] == 4
    assert first["tools/step/restarts"] == first["tools/step/flaky/restarts"] == 1
    assert first["tools/step/crashes"] == 1
    assert first["tools/step/crashed_calls"] == 1
    assert first["tools/step/timeouts"] == first["tools/step/flaky/timeouts"] == 1
    assert first["tools/step/infra_errors"] == 2
    # One of the two naps queued behind the other (max_concurrency 1) for about its 0.3 s.
    assert 250 <= first["tools/step/flaky/queue_wait_max_ms"] < 2000
    assert second["tools/step/calls"] == second["tools/step/restarts"] == second["tools/step/timeouts"] == 0
    assert second["tools/step/queue_wait_max_ms"] == 0


async def test_a_call_queued_behind_a_crash_is_served_by_the_next_process(marker: str) -> None:
    cfg = _config(flaky=flaky_server(marker, max_concurrency=1, restart={"backoff_initial": 0.05}))
    async with ToolManager(cfg) as manager:
        results: dict[str, ToolResult] = {}

        async def run(key: str, tool: str) -> None:
            results[key] = await manager.call(tool, {})

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "crash", "crash")
                while manager.metrics()["tools/flaky/inflight"] < 1:
                    await anyio.lowlevel.checkpoint()
                tg.start_soon(run, "queued", "pid")
    assert (results["crash"].error_type, results["crash"].generation) == ("crashed", 1)
    assert (results["queued"].ok, results["queued"].generation) == (True, 2)
    assert marked_processes(marker) == []
