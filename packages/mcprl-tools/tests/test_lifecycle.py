"""Lifecycle over real stdio subprocess servers: crash, hang, start failures, junk, load, cancellation, cleanup.

RELIABILITY.md scenarios 1, 2, 3, 11, 12 (client side).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import anyio
import pytest
from tools_testkit import flaky_server, marked_processes, open_fds

from mcprl_tools import ServersConfig, ServerStartError, ToolManager

pytestmark = pytest.mark.anyio


def _config(**servers: dict[str, object]) -> ServersConfig:
    return ServersConfig.from_dict({"mcpServers": servers}, source="<test>")


async def test_sigkill_mid_call_is_an_infra_error_within_a_second_then_restarts(marker: str) -> None:
    cfg = _config(flaky=flaky_server(marker, call_timeout=10, restart={"backoff_initial": 0.1}))
    async with ToolManager(cfg) as manager:
        first_pid = (await manager.call("pid", {})).structured
        t0 = time.monotonic()
        crashed = await manager.call("crash", {})
        elapsed = time.monotonic() - t0
        with anyio.fail_after(30):
            after = await manager.call("pid", {})
        m = manager.metrics()
    assert crashed.kind == "infra_error"
    assert crashed.error_type == "crashed"
    assert elapsed < 1.0
    assert after.ok
    assert after.structured != first_pid
    assert m["tools/flaky/restarts"] == 1
    assert m["tools/errors/crashed"] == 1
    assert marked_processes(marker) == []


async def test_pending_calls_on_a_crashing_server_all_fail_promptly(marker: str) -> None:
    cfg = _config(flaky=flaky_server(marker, call_timeout=10, restart={"backoff_initial": 0.1}))
    async with ToolManager(cfg) as manager:
        results = []

        async def pending() -> None:
            results.append(await manager.call("nap", {"seconds": 30, "text": "never"}))

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(pending)
            with anyio.fail_after(5):
                while manager.metrics()["tools/flaky/inflight"] < 5:
                    await anyio.lowlevel.checkpoint()
            await manager.call("crash", {})
        elapsed = time.monotonic() - t0
    assert [r.error_type for r in results] == ["crashed"] * 5
    assert elapsed < 2.0


async def test_server_past_its_crash_budget_becomes_unavailable(marker: str) -> None:
    cfg = _config(flaky=flaky_server(marker, restart={"max_crashes": 0}))
    async with ToolManager(cfg) as manager:
        crashed = await manager.call("crash", {})
        t0 = time.monotonic()
        refused = await manager.call("add", {"a": 1, "b": 1})
        elapsed = time.monotonic() - t0
        assert manager.server_state("flaky") == "unavailable"
        assert manager.metrics()["tools/flaky/available"] == 0
    assert crashed.error_type == "crashed"
    assert refused.error_type == "unavailable"
    assert refused.is_infra_error
    assert elapsed < 1.0
    assert marked_processes(marker) == []


async def test_hang_hits_the_deadline_then_the_server_is_replaced(marker: str) -> None:
    cfg = _config(
        flaky=flaky_server(
            marker, "--ignore-sigterm", call_timeout=1.0, ping_timeout=0.5, restart={"backoff_initial": 0.1}
        )
    )
    async with ToolManager(cfg) as manager:
        hung_pid = (await manager.call("pid", {})).structured
        t0 = time.monotonic()
        hung = await manager.call("hang", {})
        elapsed = time.monotonic() - t0
        with anyio.fail_after(30):
            after = await manager.call("pid", {})
        m = manager.metrics()
    assert hung.kind == "infra_error"
    assert hung.error_type == "timeout"
    assert 0.9 <= elapsed <= 1.1  # caller-side deadline within 10 %
    assert after.ok
    assert after.structured != hung_pid
    assert m["tools/flaky/restarts"] == 1
    # the hung process ignored SIGTERM: only the SIGKILL escalation could have removed it
    assert marked_processes(marker) == []


async def test_periodic_health_probe_replaces_a_server_that_froze_while_idle(marker: str) -> None:
    cfg = _config(
        flaky=flaky_server(marker, health_interval=0.3, ping_timeout=0.5, restart={"backoff_initial": 0.1})
    )
    async with ToolManager(cfg) as manager:
        frozen_pid = (await manager.call("pid", {})).text
        os.kill(int(frozen_pid), signal.SIGSTOP)  # alive but answers nothing; no call is in flight
        with anyio.fail_after(20):
            while manager.metrics()["tools/flaky/restarts"] < 1:  # noqa: ASYNC110 (polling a metric)
                await anyio.sleep(0.05)
        after = await manager.call("pid", {})
    assert after.ok
    assert after.text != frozen_pid
    assert marked_processes(marker) == []


async def test_bad_command_fails_fast_with_a_clear_error(marker: str) -> None:
    cfg = _config(broken={"command": "/nonexistent/mcp-server", "start_timeout": 10})
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=r"broken.*(FileNotFoundError|No such file)"):
        async with ToolManager(cfg):
            pass
    assert time.monotonic() - t0 < 2.0


async def test_server_exiting_before_initialize_fails_fast_with_its_stderr(marker: str) -> None:
    cfg = _config(early=flaky_server(marker, "--exit-before-init", start_timeout=20))
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="exiting before initialize on purpose"):
        async with ToolManager(cfg):
            pass
    assert time.monotonic() - t0 < 5.0
    assert marked_processes(marker) == []


async def test_server_that_never_speaks_mcp_fails_at_the_start_deadline(marker: str) -> None:
    script = "import sys, time; print('hello, not json'); print('starting', file=sys.stderr, flush=True); time.sleep(60)"
    cfg = _config(mute={"command": sys.executable, "args": ["-c", script], "env": {"MCPRL_TOOLS_TEST_MARKER": marker},
                        "start_timeout": 1.0})  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=r"(?s)did not start within 1 s.*starting"):
        async with ToolManager(cfg):
            pass
    assert time.monotonic() - t0 < 8.0
    assert marked_processes(marker) == []


async def test_optional_server_that_fails_leaves_the_others_running(marker: str) -> None:
    cfg = _config(
        good=flaky_server(marker),
        broken={"command": "/nonexistent/mcp-server", "optional": True},
    )
    async with ToolManager(cfg) as manager:
        assert manager.server_state("broken") == "unavailable"
        assert all(t.server == "good" for t in manager.tools)
        ok = await manager.call("add", {"a": 1, "b": 2})
        missing = await manager.call("broken.add", {"a": 1, "b": 2})
        assert manager.metrics()["tools/broken/available"] == 0
    assert ok.ok
    assert missing.error_type == "unknown_tool"


async def test_junk_on_stdout_before_and_during_serving_is_skipped(marker: str) -> None:
    cfg = _config(junky=flaky_server(marker, "--junk-at-start"))
    async with ToolManager(cfg) as manager:
        mid = await manager.call("junk", {})
        after = await manager.call("add", {"a": 2, "b": 2})
    assert mid.ok
    assert mid.text == "still fine"
    assert after.text == "4"


async def test_shutdown_leaves_no_processes(marker: str) -> None:
    cfg = _config(one=flaky_server(marker), two=flaky_server(marker))
    async with ToolManager(cfg) as manager:
        assert len(marked_processes(marker)) == 2
        assert (await manager.call("one.add", {"a": 1, "b": 1})).ok
    assert marked_processes(marker) == []


@pytest.mark.parametrize("how", ["crash", "shutdown"])
async def test_grandchildren_of_a_server_are_killed_with_it(marker: str, how: str) -> None:
    cfg = _config(parent=flaky_server(marker, restart={"max_crashes": 0}))
    async with ToolManager(cfg) as manager:
        child = (await manager.call("spawn_child", {})).structured
        assert isinstance(child, dict)
        assert child["result"] in marked_processes(marker)
        if how == "crash":
            assert (await manager.call("crash", {})).error_type == "crashed"
            assert (await manager.call("add", {"a": 1, "b": 1})).error_type == "unavailable"
    assert marked_processes(marker) == []


async def test_200_concurrent_calls_are_all_correct_and_respect_the_cap(
    stdio_manager: tuple[ToolManager, str],
) -> None:
    manager, _ = stdio_manager
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        r = await manager.call("nap", {"seconds": 0.02, "text": f"call-{i}"})
        results[i] = r.text

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(one, i)
    server_max = (await manager.call("max_inflight", {})).structured
    assert results == {i: f"call-{i}" for i in range(200)}
    assert manager.metrics()["tools/flaky/inflight_max"] == 8
    assert server_max == {"result": 8}


async def test_episode_ids_reach_a_stdio_server(stdio_manager: tuple[ToolManager, str]) -> None:
    manager, _ = stdio_manager
    got = [await manager.call("whoami", {}, episode_id=f"ep-{i}") for i in range(3)]
    assert [r.text for r in got] == ["ep-0", "ep-1", "ep-2"]


async def test_large_output_is_truncated_on_the_client_side(stdio_manager: tuple[ToolManager, str]) -> None:
    manager, _ = stdio_manager
    result = await manager.call("big", {"n": 3_000_000})
    assert result.truncated
    assert len(result.text.encode()) < 16384 + 64
    assert result.text.endswith(f"…[truncated {3_000_000 - 16384} bytes]")


async def test_a_server_writing_megabytes_to_stderr_never_blocks(
    stdio_manager: tuple[ToolManager, str],
) -> None:
    manager, _ = stdio_manager
    with anyio.fail_after(10):
        results = [await manager.call("shout", {"n": 1_000_000}) for _ in range(3)]
    assert [r.text for r in results] == ["said"] * 3


async def test_cancellation_churn_leaks_nothing(stdio_manager: tuple[ToolManager, str]) -> None:
    manager, mark = stdio_manager
    rng = random.Random(0)
    await manager.call("add", {"a": 1, "b": 1})
    fds_before = open_fds()
    procs_before = marked_processes(mark)
    cancelled = 0

    async def doomed(delay: float) -> None:
        nonlocal cancelled
        with anyio.move_on_after(delay) as scope:
            await manager.call("nap", {"seconds": 5, "text": "late"})
        cancelled += scope.cancelled_caught

    for _ in range(10):
        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(doomed, rng.uniform(0.0, 0.02))
    assert cancelled == 1000
    with anyio.fail_after(10):
        after = await manager.call("add", {"a": 2, "b": 3})
    assert after.ok
    assert manager.metrics()["tools/flaky/inflight"] == 0
    assert marked_processes(mark) == procs_before
    assert open_fds() <= fds_before + 2
