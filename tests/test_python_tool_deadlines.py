"""The bundled python tool's deadlines mean what they say, through the real manager and the real stdio server.

Code that runs past the sandbox's wall-clock deadline is the model's fault (``tool_error``, shown to it), and
calls queued behind the sandbox's concurrency limit wait on the caller's side, where the deadline starts at
dispatch: none of them becomes an infrastructure timeout.
"""

from __future__ import annotations

import anyio
import pytest

from mcprl_servers import default_servers_config
from mcprl_servers.config import SANDBOX_DEADLINE_SLACK_S
from mcprl_tools import ServersConfig, ToolManager, ToolResult

pytestmark = pytest.mark.anyio


@pytest.fixture
def sandbox_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPRL_SANDBOX_DEADLINE_S", "5")
    monkeypatch.setenv("MCPRL_SANDBOX_MAX_CONCURRENCY", "1")


@pytest.mark.usefixtures("sandbox_env")
def test_the_callers_limits_follow_the_sandboxs() -> None:
    python = ServersConfig.from_dict(default_servers_config(["python"])).servers["python"]
    assert python.call_timeout == 5 + SANDBOX_DEADLINE_SLACK_S
    assert python.max_concurrency == 1


@pytest.mark.usefixtures("sandbox_env")
async def test_overrunning_code_is_the_models_fault_and_queued_calls_keep_their_deadline() -> None:
    config = ServersConfig.from_dict(default_servers_config(["python"]))
    async with ToolManager(config) as manager:
        overrun = await manager.call("python.run_python", {"code": "import time; time.sleep(30)"})
        results: list[ToolResult] = []

        async def one(i: int) -> None:
            code = f"import time; time.sleep(2); print({i})"
            results.append(await manager.call("python.run_python", {"code": code}))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(6):  # 12 s and more one at a time: longer than one call's 10 s deadline
                    tg.start_soon(one, i)
    assert overrun.kind == "tool_error", overrun
    assert "timed out" in overrun.text
    assert [r.kind for r in results] == ["ok"] * 6, results
    assert sorted(r.text.strip() for r in results) == ["0", "1", "2", "3", "4", "5"]
